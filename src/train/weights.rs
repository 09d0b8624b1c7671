//! Final weights as a safetensors file (tensor names are Keras weight paths, so other tools can
//! load them), and a digest of the weights for determinism checks.

use super::run_dir::RecordError;
use crate::engine::TensorInfo;
use crate::strategy::Variables;
use safetensors::SafeTensorError;
use safetensors::tensor::{Dtype, View};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::path::Path;

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Values hashed per copy to bytes.
const CHUNK: usize = 1 << 16;

/// One tensor, its bytes made as the file is written: safetensors then holds one tensor's
/// bytes at a time, where building the whole file in memory held two copies of every weight
/// (86 MB, a tenth of nanoGPT's peak memory, at the end of the run; issue 34).
struct F32Tensor<'a> {
    shape: &'a [usize],
    values: &'a [f32],
}

impl View for F32Tensor<'_> {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn shape(&self) -> &[usize] {
        self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(le_bytes(self.values))
    }

    fn data_len(&self) -> usize {
        4 * self.values.len()
    }
}

/// SHA-256 of the parameters then the state, as little-endian f32.
pub fn weights_sha256(vars: &Variables) -> String {
    let mut h = Sha256::new();
    // A chunk at a time: a copy of every weight at once was a GPT's peak memory (issue 34).
    for chunk in vars.params.chunks(CHUNK).chain(vars.state.chunks(CHUNK)) {
        h.update(le_bytes(chunk));
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The Keras weight path of the first tensor holding a NaN or an infinity, parameters first,
/// then state (batch-norm moving statistics), if any: what Keras's `TerminateOnNaN` reports.
pub fn first_non_finite<'t>(vars: &Variables, tensors: &'t [TensorInfo], state: &'t [TensorInfo]) -> Option<&'t str> {
    let bad = |t: &TensorInfo, values: &[f32]| values.get(t.range()).is_some_and(|v| v.iter().any(|x| !x.is_finite()));
    tensors
        .iter()
        .find(|t| bad(t, &vars.params))
        .or_else(|| state.iter().find(|t| bad(t, &vars.state)))
        .map(|t| t.name.as_str())
}

/// Writes `vars` to `path` (temp file, fsync, rename) as safetensors.
pub fn save_weights(
    path: &Path,
    vars: &Variables,
    tensors: &[TensorInfo],
    state: &[TensorInfo],
) -> Result<(), RecordError> {
    let err = |source: std::io::Error| RecordError { path: path.to_path_buf(), source };
    let views = tensors.iter().map(|t| (t, &vars.params)).chain(state.iter().map(|t| (t, &vars.state)));
    let views = views.map(|(t, values)| (t.name.as_str(), F32Tensor { shape: &t.shape, values: &values[t.range()] }));
    let tmp = path.with_extension("safetensors.tmp");
    let written = safetensors::serialize_to_file(views, None, &tmp)
        .map_err(|e| match e {
            SafeTensorError::IoError(e) => e,
            e => std::io::Error::other(e.to_string()),
        })
        .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|_| std::fs::rename(&tmp, path));
    // A full disk must not keep a half-written temporary file.
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, offset: usize, len: usize) -> TensorInfo {
        TensorInfo { name: name.into(), shape: vec![len], offset }
    }

    #[test]
    fn the_first_non_finite_tensor_is_named_parameters_before_state() {
        let tensors = [tensor("dense/kernel", 0, 3), tensor("dense/bias", 3, 2)];
        let state = [tensor("batch_norm/moving_mean", 0, 2)];
        let mut vars = Variables { params: vec![0.5; 5], state: vec![0.0; 2] };
        assert_eq!(first_non_finite(&vars, &tensors, &state), None);
        vars.state[1] = f32::NAN;
        assert_eq!(first_non_finite(&vars, &tensors, &state), Some("batch_norm/moving_mean"));
        vars.params[4] = f32::INFINITY;
        assert_eq!(first_non_finite(&vars, &tensors, &state), Some("dense/bias"));
        vars.params[0] = f32::NEG_INFINITY;
        assert_eq!(first_non_finite(&vars, &tensors, &state), Some("dense/kernel"));
    }
}
