//! Checkpoints: the format ([`manifest`], [`tensors`]), the atomic [`store`], the retention
//! [`policy`] (which decides, purely) and the background [`writer`] (which acts), so that a save
//! costs the step loop one memcpy of the buffers. A run keeps the backup of its last step in
//! memory for the same process to train on from ([`held`]).
//!
//! A checkpoint is a folder `ckpt-<step>` holding `model.safetensors` (weights named by Keras
//! weight path, loadable by any safetensors reader), `optimizer.safetensors` (each state buffer
//! per weight, `momentum/dense_1/kernel`), `best.safetensors` when early stopping keeps best
//! weights, and `manifest.json` (step, epoch, data cursor, RNG state, spec hash, topology,
//! loop and callback state, and every file's SHA-256), written last as the commit marker.

pub mod held;
pub mod hf_gpt2;
pub mod manifest;
pub mod policy;
pub mod store;
pub mod tensors;
pub mod warm_start;
pub mod writer;

pub use held::HeldBackup;
pub use manifest::{Kind, Manifest};
pub use policy::{Admit, Policy};
pub use store::{Listed, LoadedCheckpoint, Store};
pub use writer::{SaveStats, Writer};

use crate::engine::TensorInfo;
use std::path::{Path, PathBuf};

/// Where each named tensor lives in the flat arenas, and their lengths.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Trainable tensors.
    pub tensors: Vec<TensorInfo>,
    /// Non-trainable tensors.
    pub state_tensors: Vec<TensorInfo>,
    /// Trainable values.
    pub params: usize,
    /// Non-trainable values.
    pub state: usize,
}

/// A copy of the training state's buffers, taken at a step boundary and written in the
/// background while training goes on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Trainable values.
    pub params: Vec<f32>,
    /// Non-trainable values.
    pub state: Vec<f32>,
    /// Optimizer buffers by name (`momentum`; `m`, `v`).
    pub optimizer: Vec<(String, Vec<f32>)>,
    /// Early stopping's best weights (params, state), when it keeps them.
    pub best: Option<(Vec<f32>, Vec<f32>)>,
}

/// Copies `src` into `dst`, reusing `dst`'s allocation.
pub fn copy_into(dst: &mut Vec<f32>, src: &[f32]) {
    dst.clear();
    dst.extend_from_slice(src);
}

/// A checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed (full disk, permissions, …).
    #[error("checkpoint file {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The folder has no manifest: the save never finished.
    #[error("{dir} has no manifest.json: its save did not finish")]
    Unfinished {
        /// The checkpoint folder.
        dir: PathBuf,
    },
    /// A file does not match its manifest, or the manifest is damaged.
    #[error("{path} is damaged: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint is whole but belongs to another model or optimizer.
    #[error("{path} does not fit this spec's model: {reason}")]
    Incompatible {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// The manifest could not be encoded.
    #[error("cannot encode a checkpoint manifest: {0}")]
    Encode(String),
    /// No checkpoint folder at the path given.
    #[error("{} is not a checkpoint: {reason}{nearby}", dir.display())]
    Missing {
        /// The path given.
        dir: PathBuf,
        /// What is there instead.
        reason: &'static str,
        /// The checkpoints beside it, as [`nearby`] words them.
        nearby: String,
    },
    /// The disk is full, and removing the unfinished save left less room than a checkpoint
    /// needs: a restart would fail the same way.
    #[error(
        "no space left on the device for checkpoint {}: it needs about {} MB, {} MB are free after removing the unfinished save; free space or save elsewhere (run.out_dir, backup_dir, dir), then run again",
        path.display(),
        needed.div_ceil(1 << 20),
        free >> 20
    )]
    NoSpace {
        /// The file or folder being written.
        path: PathBuf,
        /// Bytes a checkpoint takes, about.
        needed: u64,
        /// Bytes free on its file system after the failed save was removed.
        free: u64,
    },
}

/// Whether an I/O error says the file system is full (or the user's quota is).
pub fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Bytes an unprivileged process may still write on the file system holding `path` (or its
/// nearest existing ancestor).
pub fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let c = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and statvfs writes only into `stat`, which we own.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut stat) };
    (rc == 0).then(|| stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The checkpoints beside a path that is not one, to say which exist: `; checkpoints in
/// runs/x/checkpoints: ckpt-0000000130, ckpt-0000000140`.
pub(crate) fn nearby(dir: &Path) -> String {
    // A folder of checkpoints (`runs/x/checkpoints`) lists its own; anything else, its
    // neighbours'.
    let inside = Store::new(dir).list().unwrap_or_default();
    let parent = if inside.is_empty() { dir.parent().filter(|p| !p.as_os_str().is_empty()) } else { Some(dir) };
    let Some(parent) = parent else {
        return String::new();
    };
    let listed = Store::new(parent).list().unwrap_or_default();
    let names: Vec<String> = listed
        .iter()
        .filter(|l| l.committed)
        .filter_map(|l| l.path.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    match names.as_slice() {
        [] => String::new(),
        names => format!("; checkpoints in {}: {}", parent.display(), names.join(", ")),
    }
}

impl CheckpointError {
    /// Wraps an I/O error about `path`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
        move |source| CheckpointError::Io { path: path.to_path_buf(), source }
    }
}
