//! Final weights as a safetensors file (tensor names are Keras weight paths, so other tools can
//! load them), and a digest of the weights for determinism checks.

use super::run_dir::RecordError;
use crate::engine::TensorInfo;
use crate::strategy::Variables;
use safetensors::tensor::{Dtype, TensorView};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;

fn le_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// SHA-256 of the parameters then the state, as little-endian f32.
pub fn weights_sha256(vars: &Variables) -> String {
    let mut h = Sha256::new();
    h.update(le_bytes(&vars.params));
    h.update(le_bytes(&vars.state));
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
    let mut bufs: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (t, values) in tensors.iter().map(|t| (t, &vars.params)).chain(state.iter().map(|t| (t, &vars.state))) {
        bufs.push((t.name.clone(), t.shape.clone(), le_bytes(&values[t.range()])));
    }
    let views = bufs
        .iter()
        .map(|(name, shape, bytes)| TensorView::new(Dtype::F32, shape.clone(), bytes).map(|v| (name.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| err(std::io::Error::other(e.to_string())))?;
    let bytes = safetensors::serialize(views, None).map_err(|e| err(std::io::Error::other(e.to_string())))?;
    let tmp = path.with_extension("safetensors.tmp");
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|_| f.sync_all()))
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
