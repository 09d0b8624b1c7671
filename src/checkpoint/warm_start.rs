//! Warm starts (`[model] init_from`): weights a run did not train itself, loaded by name before
//! training, the optimizer state starting fresh (what fine-tuning wants: "load the weights, not
//! the optimizer state"). The source is a checkpoint folder, a run folder (its final
//! `model.safetensors`) or a safetensors file; tensors match the model's by their Keras path
//! (`dense_1/kernel`). f16, bf16 and f64 tensors are converted to f32. A Hugging Face GPT-2
//! folder is read through `hf_gpt2.rs`, which renames its tensors to trainrun's first.
//!
//! `strict` refuses any model tensor the file lacks, any file tensor the model lacks and any
//! tensor whose shape differs, listing every one with both shapes at once. Not strict, what
//! matches loads and the rest keeps its fresh initialization (a new classification head), and
//! [`WarmStart`] says what was left. A backup of the run itself still wins on resume: the
//! builder loads this first and the resume overwrites it.

use super::CheckpointError;
use super::hf_gpt2::{self, Gpt2Shape};
use crate::engine::TensorInfo;
use crate::model::{InitFormat, InitFrom, ModelPlan};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// What a warm start loads and leaves, by tensor name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WarmStart {
    /// The file read.
    pub file: PathBuf,
    /// Model tensors loaded, with their shape.
    pub loaded: Vec<(String, Vec<usize>)>,
    /// Model tensors the file lacks (they keep their initialization).
    pub missing: Vec<(String, Vec<usize>)>,
    /// File tensors the model lacks (ignored).
    pub unexpected: Vec<(String, Vec<usize>)>,
    /// Tensors in both whose shapes differ: name, the model's shape, the file's.
    pub misshaped: Vec<(String, Vec<usize>, Vec<usize>)>,
}

impl WarmStart {
    /// Everything a strict load refuses, one line each; empty when all match.
    pub fn mismatches(&self) -> Vec<String> {
        let shape = |s: &[usize]| format!("{s:?}");
        let mut lines = Vec::new();
        lines.extend(
            self.missing.iter().map(|(n, s)| format!("`{n}` {} is in the model but not in the file", shape(s))),
        );
        lines.extend(
            self.unexpected.iter().map(|(n, s)| format!("`{n}` {} is in the file but not in the model", shape(s))),
        );
        lines.extend(
            self.misshaped
                .iter()
                .map(|(n, m, f)| format!("`{n}` is {} in the model but {} in the file", shape(m), shape(f))),
        );
        lines
    }

    /// Values loaded.
    pub fn values(&self) -> usize {
        self.loaded.iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }
}

/// The weights file `path` names: `model.safetensors` inside a folder, else the file itself.
pub fn weights_file(path: &Path) -> PathBuf {
    if path.is_dir() { path.join("model.safetensors") } else { path.to_path_buf() }
}

/// What `init.path` holds: its `format`, else a Hugging Face folder when it has a
/// `config.json` (a trainrun run or checkpoint folder has none).
pub fn format_of(init: &InitFrom) -> InitFormat {
    init.format.unwrap_or(if init.path.join("config.json").is_file() {
        InitFormat::HfGpt2
    } else {
        InitFormat::Trainrun
    })
}

/// The weights file `init` names and its bytes, tensors named as `model`'s are.
fn read(init: &InitFrom, model: &ModelPlan) -> Result<(PathBuf, Vec<u8>), CheckpointError> {
    match format_of(init) {
        InitFormat::Trainrun => {
            let file = weights_file(&init.path);
            let bytes = std::fs::read(&file).map_err(|source| CheckpointError::Io { path: file.clone(), source })?;
            Ok((file, bytes))
        }
        InitFormat::HfGpt2 => {
            let shape = Gpt2Shape::of(model).map_err(|why| CheckpointError::Incompatible {
                path: init.path.clone(),
                reason: format!("it is a Hugging Face GPT-2 folder (init_from.format = \"hf_gpt2\"), so the model must be a GPT-2: {why}"),
            })?;
            hf_gpt2::read(&init.path, &shape, init.strict)
        }
    }
}

/// What loading `init` into `model` (its tensors, trainable then non-trainable) would do,
/// without loading: what `trainrun check` prints.
pub fn survey(init: &InitFrom, model: &ModelPlan, tensors: &[&TensorInfo]) -> Result<WarmStart, CheckpointError> {
    let (file, bytes) = read(init, model)?;
    let st = parse(&file, &bytes)?;
    Ok(compare(&file, &st, tensors))
}

fn parse<'a>(file: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, CheckpointError> {
    SafeTensors::deserialize(bytes).map_err(|e| CheckpointError::Corrupt {
        path: file.to_path_buf(),
        reason: format!("{e} (init_from reads a safetensors file, a checkpoint folder or a run folder)"),
    })
}

fn compare(file: &Path, st: &SafeTensors<'_>, tensors: &[&TensorInfo]) -> WarmStart {
    let mut w = WarmStart { file: file.to_path_buf(), ..WarmStart::default() };
    for t in tensors {
        match st.tensor(&t.name) {
            Ok(view) if view.shape() == t.shape.as_slice() => w.loaded.push((t.name.clone(), t.shape.clone())),
            Ok(view) => w.misshaped.push((t.name.clone(), t.shape.clone(), view.shape().to_vec())),
            Err(_) => w.missing.push((t.name.clone(), t.shape.clone())),
        }
    }
    let mut names: Vec<&str> = st.names();
    names.sort_unstable();
    for name in names {
        if !tensors.iter().any(|t| t.name == name)
            && let Ok(view) = st.tensor(name)
        {
            w.unexpected.push((name.to_string(), view.shape().to_vec()));
        }
    }
    w
}

/// Loads `init` into `params` (laid out by `tensors`) and `state` (by `state_tensors`) of
/// `model`. Strict, any mismatch is an error listing them all; a tensor holding NaN or
/// infinity is always refused, naming it.
pub fn load(
    init: &InitFrom,
    model: &ModelPlan,
    (tensors, params): (&[TensorInfo], &mut [f32]),
    (state_tensors, state): (&[TensorInfo], &mut [f32]),
) -> Result<WarmStart, CheckpointError> {
    let strict = init.strict;
    let (file, bytes) = read(init, model)?;
    let st = parse(&file, &bytes)?;
    let all: Vec<&TensorInfo> = tensors.iter().chain(state_tensors).collect();
    let report = compare(&file, &st, &all);
    let mismatches = report.mismatches();
    if strict && !mismatches.is_empty() {
        return Err(CheckpointError::Incompatible {
            path: file,
            reason: format!(
                "init_from is strict, and {} tensor{} do not match:\n  {}\n(set init_from.strict = false to load what \
                 matches and keep the rest freshly initialized)",
                mismatches.len(),
                if mismatches.len() == 1 { "" } else { "s" },
                mismatches.join("\n  ")
            ),
        });
    }
    for (infos, arena) in [(tensors, params), (state_tensors, state)] {
        for t in infos.iter().filter(|t| report.loaded.iter().any(|(n, _)| *n == t.name)) {
            let view = st.tensor(&t.name).map_err(|e| corrupt(&file, &t.name, e.to_string()))?;
            let dst = arena.get_mut(t.range()).ok_or_else(|| corrupt(&file, &t.name, "outside the model".into()))?;
            convert(view.dtype(), view.data(), dst).map_err(|why| corrupt(&file, &t.name, why))?;
            if let Some((i, v)) = dst.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                return Err(CheckpointError::Incompatible {
                    path: file.clone(),
                    reason: format!(
                        "tensor `{}` holds {v} at index {i}: a warm start from non-finite weights would train NaN; \
                         start from an earlier checkpoint",
                        t.name
                    ),
                });
            }
        }
    }
    Ok(report)
}

fn corrupt(file: &Path, name: &str, why: String) -> CheckpointError {
    CheckpointError::Corrupt { path: file.to_path_buf(), reason: format!("tensor `{name}`: {why}") }
}

/// Little-endian `data` of `dtype` into `dst` as f32.
pub(super) fn convert(dtype: Dtype, data: &[u8], dst: &mut [f32]) -> Result<(), String> {
    let (width, decode): (usize, fn(&[u8]) -> f32) = match dtype {
        Dtype::F32 => (4, |b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        Dtype::F16 => (2, |b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
        Dtype::BF16 => (2, |b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        Dtype::F64 => (8, |b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32),
        other => return Err(format!("its dtype {other:?} is not a float type trainrun loads (F32, F16, BF16, F64)")),
    };
    if data.len() != dst.len() * width {
        return Err(format!("it holds {} bytes, not {} values of {width} bytes", data.len(), dst.len()));
    }
    dst.iter_mut().zip(data.chunks_exact(width)).for_each(|(d, b)| *d = decode(b));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_and_doubles_convert_to_f32() {
        let mut dst = [0.0f32; 2];
        let bf: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        convert(Dtype::BF16, &bf, &mut dst).unwrap();
        assert_eq!(dst, [1.5, -2.0]);
        let h: Vec<u8> = [0.25f32, 3.0].iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
        convert(Dtype::F16, &h, &mut dst).unwrap();
        assert_eq!(dst, [0.25, 3.0]);
        let d: Vec<u8> = [0.1f64, 7.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        convert(Dtype::F64, &d, &mut dst).unwrap();
        assert_eq!(dst, [0.1f32, 7.0]);
        assert!(convert(Dtype::I32, &[0; 8], &mut dst).unwrap_err().contains("I32"));
    }
}
