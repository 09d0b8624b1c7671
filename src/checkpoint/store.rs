//! A folder of checkpoints, one sub-folder each (`ckpt-0000000140`), written atomically and
//! durably: every file goes to a temp name in the checkpoint's folder, is fsynced and renamed,
//! and the folder is fsynced; `manifest.json`, holding every other file's SHA-256, comes last
//! as the commit marker. A reader skips a folder without a manifest (unfinished) or whose
//! files do not match it (truncated, flipped, missing), saying why, and takes the one before.

use super::manifest::{FileEntry, MANIFEST, Manifest};
use super::tensors::{self, Entry, Reader, hex};
use super::{CheckpointError, Layout, Snapshot};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

const MODEL: &str = "model.safetensors";
const OPTIMIZER: &str = "optimizer.safetensors";
const BEST: &str = "best.safetensors";
/// A checkpoint folder being written.
const PARTIAL: &str = ".partial";
/// A checkpoint folder being replaced by a new one at the same step.
const OLD: &str = ".old";

/// A checkpoint folder as listed, before it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Its step, from its name.
    pub step: u64,
    /// Its folder.
    pub path: PathBuf,
    /// Whether its manifest (the commit marker) is there.
    pub committed: bool,
}

/// A checkpoint read and verified.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    /// Its folder.
    pub path: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Trainable values.
    pub params: Vec<f32>,
    /// Non-trainable values.
    pub state: Vec<f32>,
    /// Optimizer buffers by name.
    pub optimizer: Vec<(String, Vec<f32>)>,
    /// Early stopping's best weights (params, state), when saved.
    pub best: Option<(Vec<f32>, Vec<f32>)>,
}

/// The folder name of the checkpoint at `step`.
pub fn name(step: u64) -> String {
    format!("ckpt-{step:010}")
}

fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("ckpt-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Fsyncs a folder, so the names created or renamed in it survive a crash.
fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(CheckpointError::io(dir))
}

/// Writes `bytes` to `dir/name` atomically and durably.
fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
    let (tmp, path) = (dir.join(format!("{name}.tmp")), dir.join(name));
    let mut f = File::create(&tmp).map_err(CheckpointError::io(&tmp))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(CheckpointError::io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(CheckpointError::io(&path))
}

/// The manifest file: the manifest and the SHA-256 of its compact JSON, so that a flipped
/// digit in the manifest itself is caught like one in a tensor file.
fn manifest_bytes(m: &Manifest) -> Result<Vec<u8>, CheckpointError> {
    let value = serde_json::to_value(m).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    let compact = serde_json::to_vec(&value).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    let file = serde_json::json!({ "sha256": hex(&Sha256::digest(&compact)), "manifest": value });
    let mut text = serde_json::to_vec_pretty(&file).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    text.push(b'\n');
    Ok(text)
}

/// Reads and checks a manifest file.
pub fn read_manifest(dir: &Path) -> Result<Manifest, CheckpointError> {
    let path = dir.join(MANIFEST);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::Unfinished { dir: dir.to_path_buf() });
        }
        Err(e) => return Err(CheckpointError::io(&path)(e)),
    };
    parse_manifest(&path, &bytes)
}

/// Checks the bytes of the manifest file at `path`: JSON, its own checksum, the format.
pub fn parse_manifest(path: &Path, bytes: &[u8]) -> Result<Manifest, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { path: path.to_path_buf(), reason };
    let file: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not JSON: {e}")))?;
    let (Some(sha), Some(value)) = (file.get("sha256").and_then(|s| s.as_str()), file.get("manifest")) else {
        return Err(corrupt("it lacks `sha256` or `manifest`".into()));
    };
    let compact = serde_json::to_vec(value).map_err(|e| corrupt(e.to_string()))?;
    let found = hex(&Sha256::digest(&compact));
    if found != sha {
        return Err(corrupt(format!("its checksum is {found}, but it says {sha}")));
    }
    let manifest: Manifest = serde_json::from_value(value.clone()).map_err(|e| corrupt(e.to_string()))?;
    if manifest.format != super::manifest::FORMAT {
        return Err(corrupt(format!("format {} (this trainrun reads {})", manifest.format, super::manifest::FORMAT)));
    }
    Ok(manifest)
}

/// A folder of checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store {
    root: PathBuf,
}

impl Store {
    /// The store in `root` (created at the first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// Its folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The checkpoints present, oldest first; an absent folder holds none.
    pub fn list(&self) -> Result<Vec<Listed>, CheckpointError> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::io(&self.root)(e)),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let Some(step) = entry.file_name().to_str().and_then(step_of) else { continue };
            let path = entry.path();
            if path.is_dir() {
                out.push(Listed { step, committed: path.join(MANIFEST).is_file(), path });
            }
        }
        out.sort_by_key(|l| l.step);
        Ok(out)
    }

    /// Writes `snapshot` as the checkpoint at `manifest.step`; `manifest.files` is filled in
    /// here. Returns its folder.
    ///
    /// The checkpoint is written whole in `ckpt-<step>.partial` and renamed into place, so a
    /// write that fails (a full disk) touches no committed checkpoint, not even one at the same
    /// step (a resumed run passing it again), and removes what it wrote at once.
    pub fn write(&self, snapshot: &Snapshot, layout: &Layout, manifest: Manifest) -> Result<PathBuf, CheckpointError> {
        std::fs::create_dir_all(&self.root).map_err(CheckpointError::io(&self.root))?;
        self.remove_leftovers();
        let dir = self.root.join(name(manifest.step));
        let partial = self.root.join(format!("{}{PARTIAL}", name(manifest.step)));
        let written = std::fs::create_dir(&partial)
            .map_err(CheckpointError::io(&partial))
            .and_then(|()| write_into(&partial, snapshot, layout, manifest))
            .and_then(|()| self.put_in_place(&partial, &dir));
        match written {
            Ok(()) => Ok(dir),
            Err(e) => {
                // Best effort: the error to report is the write's.
                let _ = std::fs::remove_dir_all(&partial);
                let _ = sync_dir(&self.root);
                Err(e)
            }
        }
    }

    /// Folders a crash left half-written or set aside (`ckpt-….partial`, `ckpt-….old`).
    fn remove_leftovers(&self) {
        for entry in std::fs::read_dir(&self.root).into_iter().flatten().flatten() {
            let file = entry.file_name();
            let stem = file.to_str().and_then(|n| n.strip_suffix(PARTIAL).or_else(|| n.strip_suffix(OLD)));
            if stem.and_then(step_of).is_some() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// Renames the finished `partial` to `dir`. A checkpoint already there is set aside first
    /// and removed only once the new one is in place (and put back if that fails).
    fn put_in_place(&self, partial: &Path, dir: &Path) -> Result<(), CheckpointError> {
        let mut old = dir.as_os_str().to_owned();
        old.push(OLD);
        let old = PathBuf::from(old);
        let set_aside = dir.exists();
        if set_aside {
            std::fs::rename(dir, &old).map_err(CheckpointError::io(dir))?;
        }
        if let Err(e) = std::fs::rename(partial, dir) {
            if set_aside {
                let _ = std::fs::rename(&old, dir);
            }
            return Err(CheckpointError::io(dir)(e));
        }
        sync_dir(&self.root)?;
        if set_aside {
            let _ = std::fs::remove_dir_all(&old);
        }
        Ok(())
    }

    /// Removes the checkpoint at `step`: its manifest first, so that a reader meanwhile sees an
    /// unfinished checkpoint rather than missing files.
    pub fn delete(&self, step: u64) -> Result<(), CheckpointError> {
        let dir = self.root.join(name(step));
        remove_if_present(&dir.join(MANIFEST))?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CheckpointError::io(&dir)(e)),
        }
    }

    /// Removes the whole store (a finished run's backup).
    pub fn delete_all(&self) -> Result<(), CheckpointError> {
        for l in self.list()? {
            self.delete(l.step)?;
        }
        match std::fs::remove_dir(&self.root) {
            // Something else lives there too: leave it.
            Ok(()) | Err(_) => Ok(()),
        }
    }

    /// The newest checkpoint that reads back whole, skipping (and reporting through `warn`)
    /// every newer one that is unfinished or damaged.
    pub fn latest_good(
        &self,
        layout: &Layout,
        mut warn: impl FnMut(&str),
    ) -> Result<Option<LoadedCheckpoint>, CheckpointError> {
        for l in self.list()?.iter().rev() {
            match load(&l.path, layout) {
                Ok(loaded) => return Ok(Some(loaded)),
                Err(e @ (CheckpointError::Incompatible { .. } | CheckpointError::Io { .. })) => return Err(e),
                Err(e) => warn(&format!("skipping checkpoint {}: {e}; using the one before", l.path.display())),
            }
        }
        Ok(None)
    }
}

/// Writes the checkpoint's files into the fresh folder `dir`, the manifest last.
fn write_into(dir: &Path, snapshot: &Snapshot, layout: &Layout, mut manifest: Manifest) -> Result<(), CheckpointError> {
    let dir = dir.to_path_buf();
    let meta = |what: &str| BTreeMap::from([("trainrun".to_string(), what.to_string())]);
    let mut files = Vec::new();
    let mut put = |name: &str, entries: Vec<Entry<'_>>, what: &str| -> Result<(), CheckpointError> {
        let tmp = dir.join(format!("{name}.tmp"));
        let written = tensors::write(&tmp, &entries, &meta(what))?;
        std::fs::rename(&tmp, dir.join(name)).map_err(CheckpointError::io(&dir.join(name)))?;
        files.push(FileEntry { name: name.to_string(), bytes: written.bytes, sha256: written.sha256 });
        Ok(())
    };
    let mut model = tensors::entries("", &layout.tensors, &snapshot.params);
    model.extend(tensors::entries("", &layout.state_tensors, &snapshot.state));
    put(MODEL, model, "weights")?;
    let mut optimizer = Vec::new();
    for (buffer, values) in &snapshot.optimizer {
        optimizer.extend(tensors::entries(&format!("{buffer}/"), &layout.tensors, values));
    }
    put(OPTIMIZER, optimizer, "optimizer")?;
    if let Some((params, state)) = &snapshot.best {
        let mut best = tensors::entries("", &layout.tensors, params);
        best.extend(tensors::entries("", &layout.state_tensors, state));
        put(BEST, best, "best weights")?;
    }
    manifest.files = files;
    sync_dir(&dir)?;
    write_file(&dir, MANIFEST, &manifest_bytes(&manifest)?)?;
    sync_dir(&dir)
}

fn remove_if_present(path: &Path) -> Result<(), CheckpointError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CheckpointError::io(path)(e)),
    }
}

/// Reads a file the manifest lists, checking its length and checksum.
fn verified(dir: &Path, manifest: &Manifest, name: &str) -> Result<Vec<u8>, CheckpointError> {
    let path = dir.join(name);
    let Some(entry) = manifest.files.iter().find(|f| f.name == name) else {
        return Err(CheckpointError::Corrupt { path, reason: "the manifest does not list it".into() });
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::Corrupt { path, reason: "it is missing".into() });
        }
        Err(e) => return Err(CheckpointError::io(&path)(e)),
    };
    if bytes.len() as u64 != entry.bytes {
        let reason = format!("it has {} bytes, the manifest says {} (truncated?)", bytes.len(), entry.bytes);
        return Err(CheckpointError::Corrupt { path, reason });
    }
    let sha = hex(&Sha256::digest(&bytes));
    if sha != entry.sha256 {
        let reason = format!("its SHA-256 is {sha}, the manifest says {}", entry.sha256);
        return Err(CheckpointError::Corrupt { path, reason });
    }
    Ok(bytes)
}

/// Reads and verifies the checkpoint in `dir` for a model of `layout`.
pub fn load(dir: &Path, layout: &Layout) -> Result<LoadedCheckpoint, CheckpointError> {
    let missing = |reason| CheckpointError::Missing { dir: dir.to_path_buf(), reason, nearby: super::nearby(dir) };
    match std::fs::metadata(dir) {
        Err(_) => return Err(missing("no such folder")),
        Ok(m) if !m.is_dir() => return Err(missing("it is a file, not a checkpoint folder")),
        // A folder that is not named like a checkpoint and lacks a manifest was never one.
        Ok(_)
            if !dir.join(MANIFEST).exists() && dir.file_name().and_then(|n| n.to_str()).and_then(step_of).is_none() =>
        {
            return Err(missing("it holds no manifest.json, so it is not a checkpoint folder"));
        }
        Ok(_) => {}
    }
    let manifest = read_manifest(dir)?;
    let model = verified(dir, &manifest, MODEL)?;
    let path = dir.join(MODEL);
    let reader = Reader::new(&path, &model)?;
    let mut params = vec![0.0; layout.params];
    let mut state = vec![0.0; layout.state];
    reader.fill("", &layout.tensors, &mut params)?;
    reader.fill("", &layout.state_tensors, &mut state)?;
    let opt_bytes = verified(dir, &manifest, OPTIMIZER)?;
    let opt_path = dir.join(OPTIMIZER);
    let reader = Reader::new(&opt_path, &opt_bytes)?;
    let mut optimizer = Vec::new();
    for buffer in &manifest.optimizer.buffers {
        let mut values = vec![0.0; layout.params];
        reader.fill(&format!("{buffer}/"), &layout.tensors, &mut values)?;
        optimizer.push((buffer.clone(), values));
    }
    let best = if manifest.loop_state.best_weights {
        let bytes = verified(dir, &manifest, BEST)?;
        let path = dir.join(BEST);
        let reader = Reader::new(&path, &bytes)?;
        let (mut p, mut s) = (vec![0.0; layout.params], vec![0.0; layout.state]);
        reader.fill("", &layout.tensors, &mut p)?;
        reader.fill("", &layout.state_tensors, &mut s)?;
        Some((p, s))
    } else {
        None
    };
    Ok(LoadedCheckpoint { path: dir.to_path_buf(), manifest, params, state, optimizer, best })
}

#[cfg(test)]
#[path = "store_tests.rs"]
pub(crate) mod tests;
