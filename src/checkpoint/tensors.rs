//! safetensors files written straight from the flat `f32` buffers (no intermediate copy of
//! the whole file, which `safetensors::serialize` would make), hashed while written, and read
//! back with the `safetensors` crate, so what we write is what other tools load.

use super::CheckpointError;
use crate::engine::TensorInfo;
use safetensors::SafeTensors;
use safetensors::tensor::Dtype;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// One tensor to write: its name, shape and values.
pub struct Entry<'a> {
    pub name: String,
    pub shape: &'a [usize],
    pub values: &'a [f32],
}

/// What a written file is: its length and SHA-256.
pub struct Written {
    pub bytes: u64,
    pub sha256: String,
}

/// Hex of a digest.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

struct Hashing<W: Write> {
    out: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Hashing<W> {
    fn put(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.hash.update(data);
        self.bytes += data.len() as u64;
        self.out.write_all(data)
    }
}

/// Writes `entries` as safetensors to `path` (which the caller makes atomic: a temp name, then
/// rename) and fsyncs it.
pub fn write(
    path: &Path,
    entries: &[Entry<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<Written, CheckpointError> {
    let io = |e: std::io::Error| CheckpointError::Io { path: path.to_path_buf(), source: e };
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for e in entries {
        let len = e.values.len() * 4;
        header.insert(
            e.name.clone(),
            serde_json::json!({ "dtype": "F32", "shape": e.shape, "data_offsets": [offset, offset + len] }),
        );
        offset += len;
    }
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), serde_json::json!(metadata));
    }
    let mut text = serde_json::to_vec(&header).map_err(|e| io(std::io::Error::other(e)))?;
    // Data starts 8-byte aligned, as the format recommends, so readers can map it in place.
    while !(8 + text.len()).is_multiple_of(8) {
        text.push(b' ');
    }
    let file = File::create(path).map_err(io)?;
    let mut out = Hashing { out: BufWriter::with_capacity(1 << 20, file), hash: Sha256::new(), bytes: 0 };
    out.put(&(text.len() as u64).to_le_bytes()).map_err(io)?;
    out.put(&text).map_err(io)?;
    for e in entries {
        if cfg!(target_endian = "little") {
            out.put(bytemuck::cast_slice(e.values)).map_err(io)?;
        } else {
            for chunk in e.values.chunks(1 << 14) {
                let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
                out.put(&bytes).map_err(io)?;
            }
        }
    }
    let Hashing { out, hash, bytes } = out;
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(Written { bytes, sha256: hex(&hash.finalize()) })
}

/// The entries of an arena's tensors, named `prefix` + the tensor's Keras path.
pub fn entries<'a>(prefix: &str, infos: &'a [TensorInfo], arena: &'a [f32]) -> Vec<Entry<'a>> {
    infos
        .iter()
        .filter(|t| t.range().end <= arena.len())
        .map(|t| Entry { name: format!("{prefix}{}", t.name), shape: &t.shape, values: &arena[t.range()] })
        .collect()
}

/// A parsed safetensors file.
pub struct Reader<'a> {
    path: &'a Path,
    tensors: SafeTensors<'a>,
}

impl<'a> Reader<'a> {
    /// Parses `bytes`, the content of `path`.
    pub fn new(path: &'a Path, bytes: &'a [u8]) -> Result<Self, CheckpointError> {
        let tensors = SafeTensors::deserialize(bytes)
            .map_err(|e| CheckpointError::Corrupt { path: path.to_path_buf(), reason: e.to_string() })?;
        Ok(Self { path, tensors })
    }

    /// Fills `arena` from the tensors `infos`, each named `prefix` + its path, checking that
    /// every one is there with its shape, and that together they cover the arena.
    pub fn fill(&self, prefix: &str, infos: &[TensorInfo], arena: &mut [f32]) -> Result<(), CheckpointError> {
        let covered: usize = infos.iter().map(TensorInfo::len).sum();
        if covered != arena.len() {
            return Err(
                self.mismatch(format!("the model's tensors hold {covered} values but its arena {}", arena.len()))
            );
        }
        for t in infos {
            let name = format!("{prefix}{}", t.name);
            let view = self.tensors.tensor(&name).map_err(|_| {
                self.mismatch(format!("it has no tensor `{name}`; it holds {}", self.names().join(", ")))
            })?;
            if view.dtype() != Dtype::F32 || view.shape() != t.shape.as_slice() {
                return Err(self.mismatch(format!(
                    "`{name}` is {:?} {:?} but the model's is F32 {:?}",
                    view.dtype(),
                    view.shape(),
                    t.shape
                )));
            }
            let Some(dst) = arena.get_mut(t.range()) else {
                return Err(self.mismatch(format!("`{name}` lies outside the model's arena")));
            };
            for (d, b) in dst.iter_mut().zip(view.data().chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Ok(())
    }

    fn names(&self) -> Vec<String> {
        let mut names = self.tensors.names().into_iter().map(str::to_string).collect::<Vec<_>>();
        names.sort();
        names
    }

    fn mismatch(&self, reason: String) -> CheckpointError {
        CheckpointError::Incompatible { path: self.path.to_path_buf(), reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_we_write_the_safetensors_crate_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let a = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [-0.5f32];
        let entries = [
            Entry { name: "dense/kernel".into(), shape: &[2, 3], values: &a },
            Entry { name: "dense/bias".into(), shape: &[1], values: &b },
        ];
        let meta = BTreeMap::from([("format".to_string(), "trainrun".to_string())]);
        let w = write(&path, &entries, &meta).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(w.bytes, bytes.len() as u64);
        assert_eq!(w.sha256, hex(&Sha256::digest(&bytes)));
        let st = SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.tensor("dense/kernel").unwrap().shape(), &[2, 3]);
        let infos = vec![
            TensorInfo { name: "dense/kernel".into(), shape: vec![2, 3], offset: 1 },
            TensorInfo { name: "dense/bias".into(), shape: vec![1], offset: 0 },
        ];
        let mut arena = vec![0.0f32; 7];
        Reader::new(&path, &bytes).unwrap().fill("", &infos, &mut arena).unwrap();
        assert_eq!(arena, [-0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let wrong = vec![TensorInfo { name: "dense/kernel".into(), shape: vec![3, 2], offset: 0 }];
        let e = Reader::new(&path, &bytes).unwrap().fill("", &wrong, &mut arena[..6]).unwrap_err().to_string();
        assert!(e.contains("[2, 3]") && e.contains("[3, 2]"), "{e}");
    }
}
