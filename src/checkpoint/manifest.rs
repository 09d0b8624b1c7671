//! `manifest.json`: everything about a checkpoint besides its tensors (step, epoch, data
//! cursor, RNG state, spec hash, topology, the loop's and callbacks' state) and the SHA-256 of
//! every file. It is written last: a folder without one is an unfinished checkpoint.

use crate::data::Cursor;
use crate::metrics::Sums;
use serde::{Deserialize, Serialize};

/// The manifest's format; a reader refuses others.
pub const FORMAT: u32 = 2;

/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";

/// Which callback wrote a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// `backup_and_restore`: the run resumes from it.
    Backup,
    /// `model_checkpoint`: kept for people and the evaluator.
    Model,
}

/// The randomness of the run: every step's seed derives from `(seed, step)`, so this is all
/// there is to restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// The run seed.
    pub seed: u64,
    /// The next step's index.
    pub step: u64,
}

/// The job's shape when the checkpoint was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
// serde's error texts name it as before the rename.
#[serde(rename = "Topology")]
pub struct SavedTopology {
    /// Worker processes that held replicas.
    pub num_workers: usize,
    /// Replicas whose gradients were summed each step.
    pub num_replicas_in_sync: usize,
    /// Examples per replica per micro-batch.
    pub per_replica_batch: usize,
    /// Examples per optimizer step, across replicas and accumulation.
    pub global_batch: usize,
    /// Micro-batches per optimizer step.
    pub accumulation_steps: usize,
}

/// [`Sums`] as a JSON object of its slots by name (`{"loss_sum": 1.5, "correct": 3.0, …}`),
/// each a [`float`], exactly as the loop accumulated them. Backups written before the sums
/// became slots have the same names, with integer counts, and the oldest lack
/// `abs_error_sum` and `squared_error_sum`: both read, a missing slot as 0. A name no slot has
/// is refused rather than dropped (a newer trainrun's metric this one cannot carry on).
pub mod sums {
    use crate::metrics::{SLOTS, Sums};
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::collections::BTreeMap;

    #[derive(Serialize, Deserialize)]
    struct Float(#[serde(with = "super::float")] f64);

    pub fn serialize<S: Serializer>(sums: &Sums, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(Sums::LEN))?;
        for (slot, value) in sums.slots() {
            map.serialize_entry(slot.name, &Float(value))?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Sums, D::Error> {
        let mut values = [0.0; Sums::LEN];
        for (name, Float(value)) in BTreeMap::<String, Float>::deserialize(d)? {
            let Some(slot) = SLOTS.iter().find(|s| s.name == name) else {
                let known: Vec<&str> = SLOTS.iter().map(|s| s.name).collect();
                return Err(serde::de::Error::custom(format!(
                    "unknown sum `{name}` (this trainrun sums {})",
                    known.join(", ")
                )));
            };
            values[slot.index] = value;
        }
        Ok(Sums::from_values(values))
    }
}

/// The last evaluation on the test split.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalState {
    /// The step it was taken at.
    pub step: u64,
    /// Its sums.
    #[serde(with = "sums")]
    pub sums: Sums,
}

/// Every callback's memory, by callback name (`early_stopping`, `model_checkpoint_1`, …):
/// each callback writes and reads its own value.
pub type CallbacksState = std::collections::BTreeMap<String, serde_json::Value>;

/// Where the loop stood: enough to continue as if never stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopState {
    /// Training examples processed so far (all replicas).
    pub examples: u64,
    /// Sums of the epoch in progress (empty at an epoch boundary).
    #[serde(with = "sums")]
    pub epoch_sums: Sums,
    /// Sums of the last finished epoch (the summary's `train_loss`).
    #[serde(with = "sums")]
    pub last_epoch_sums: Sums,
    /// The last evaluation, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_eval: Option<EvalState>,
    /// Callbacks.
    pub callbacks: CallbacksState,
    /// Whether `best.safetensors` holds early stopping's best weights.
    pub best_weights: bool,
    /// Under `parameter_server`: the steps each worker has completed, by worker index, so that
    /// each resumes its own shuffle where it was. Empty under the other strategies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub worker_steps: Vec<u64>,
}

/// Which optimizer wrote the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
// serde's error texts name it as before the rename.
#[serde(rename = "OptimizerKind", rename_all = "snake_case")]
pub enum SavedOptimizer {
    /// SGD (with or without momentum).
    Sgd,
    /// Adam or AdamW.
    Adam,
}

impl std::fmt::Display for SavedOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SavedOptimizer::Sgd => "sgd",
            SavedOptimizer::Adam => "adam",
        })
    }
}

/// The optimizer's kind and counters; its buffers are in `optimizer.safetensors`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OptimizerState {
    /// Which optimizer.
    pub kind: SavedOptimizer,
    /// Updates applied.
    pub iterations: u64,
    /// Names of the state buffers (`momentum`; `m`, `v`).
    pub buffers: Vec<String>,
}

/// Metrics at the time of the save, for people and for `save_best_only`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Training loss of the epoch so far.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_opt")]
    pub loss: Option<f64>,
    /// Training accuracy of the epoch so far.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_opt")]
    pub accuracy: Option<f64>,
    /// Test-split loss, when evaluated at this step.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_opt")]
    pub val_loss: Option<f64>,
    /// Test-split accuracy, when evaluated at this step.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "float_opt")]
    pub val_accuracy: Option<f64>,
}

/// One file of the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the checkpoint folder.
    pub name: String,
    /// Its length.
    pub bytes: u64,
    /// SHA-256 of its content, hex.
    pub sha256: String,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The trainrun that wrote it.
    pub trainrun_version: String,
    /// Which callback wrote it.
    pub kind: Kind,
    /// Optimizer steps done.
    pub step: u64,
    /// Epochs finished.
    pub epoch: u64,
    /// The input pipeline's position: the next global batch, in examples of the global order.
    pub cursor: Cursor,
    /// The randomness.
    pub rng: RngState,
    /// SHA-256 of the resolved spec without its topology (cluster, strategy, batch) and
    /// output settings.
    pub spec_hash: String,
    /// One short hash per key path of what `spec_hash` covers ([`crate::plan::SpecHashes`]'s
    /// `training_keys`): which keys changed since. Empty in backups of older versions.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub spec_keys: std::collections::BTreeMap<String, String>,
    /// The job's shape.
    pub topology: SavedTopology,
    /// Optimizer kind and counters.
    pub optimizer: OptimizerState,
    /// The loop's state.
    #[serde(rename = "loop")]
    pub loop_state: LoopState,
    /// Metrics at the save.
    pub metrics: Metrics,
    /// Seconds since the Unix epoch.
    pub unix_time: f64,
    /// Every other file, with its checksum.
    pub files: Vec<FileEntry>,
}

/// f64 that may be infinite or NaN: JSON numbers when finite, else the strings `"inf"`,
/// `"-inf"`, `"NaN"` (JSON has no such numbers, and a best value starts at infinity).
pub mod float {
    use serde::{Deserialize, Deserializer, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        match *v {
            v if v.is_finite() => s.serialize_f64(v),
            v if v.is_nan() => s.serialize_str("NaN"),
            v if v > 0.0 => s.serialize_str("inf"),
            _ => s.serialize_str("-inf"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Number(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                other => Err(serde::de::Error::custom(format!("`{other}` is not a number"))),
            },
        }
    }
}

/// [`float`] for optional values.
pub mod float_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => super::float::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        #[derive(Deserialize)]
        struct Wrap(#[serde(with = "super::float")] f64);
        Ok(Option::<Wrap>::deserialize(d)?.map(|w| w.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{accuracy, loss, mae, rmse};

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Remembered {
        #[serde(with = "float")]
        best: f64,
        #[serde(with = "float_opt")]
        kept: Option<f64>,
        wait: u32,
    }

    #[test]
    fn infinities_and_exact_values_round_trip() {
        let mut state = CallbacksState::new();
        for (name, m) in [
            ("early_stopping", Remembered { best: f64::INFINITY, kept: None, wait: 2 }),
            ("reduce_lr_on_plateau", Remembered { best: f64::NEG_INFINITY, kept: Some(1e-300), wait: 0 }),
            ("model_checkpoint", Remembered { best: 0.123_456_789_012_345_67, kept: Some(f64::INFINITY), wait: 1 }),
        ] {
            state.insert(name.to_string(), serde_json::to_value(&m).unwrap());
        }
        let text = serde_json::to_string(&state).unwrap();
        let back: CallbacksState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, state);
        let m: Remembered = serde_json::from_value(back["model_checkpoint"].clone()).unwrap();
        assert_eq!(m, Remembered { best: 0.123_456_789_012_345_67, kept: Some(f64::INFINITY), wait: 1 });
        let mut sums = Sums::of_examples(2);
        sums.accumulate(loss::SUM, f64::NAN);
        let eval = EvalState { step: 3, sums };
        let back: EvalState = serde_json::from_str(&serde_json::to_string(&eval).unwrap()).unwrap();
        assert!(back.sums.loss_sum().is_nan());
        assert_eq!(back.sums.examples(), 2);
    }

    /// A backup written before the sums became slots: named fields, integer counts.
    #[test]
    fn sums_of_older_backups_read() {
        let old = r#"{"step": 20, "sums": {"loss_sum": 1.5, "correct": 3, "examples": 4, "abs_error_sum": 0.5,
            "squared_error_sum": 0.25}}"#;
        let back: EvalState = serde_json::from_str(old).unwrap();
        let expected = [(loss::SUM, 1.5), (accuracy::CORRECT, 3.0), (loss::EXAMPLES, 4.0), (mae::ABS_ERROR, 0.5)];
        for (slot, value) in expected.into_iter().chain([(rmse::SQUARED_ERROR, 0.25)]) {
            assert_eq!(back.sums.get(slot), value, "{}", slot.name);
        }
        // Older still: no regression errors.
        let oldest = r#"{"step": 20, "sums": {"loss_sum": "NaN", "correct": 3, "examples": 4}}"#;
        let back: EvalState = serde_json::from_str(oldest).unwrap();
        assert!(back.sums.loss_sum().is_nan());
        assert_eq!((back.sums.get(mae::ABS_ERROR), back.sums.get(rmse::SQUARED_ERROR)), (0.0, 0.0));
        // What this trainrun writes reads back the same.
        let again: EvalState = serde_json::from_str(&serde_json::to_string(&back).unwrap()).unwrap();
        assert_eq!(again.sums.values().map(f64::to_bits), back.sums.values().map(f64::to_bits));
        let unknown = r#"{"step": 20, "sums": {"loss_sum": 1.0, "hinge_sum": 2.0}}"#;
        let err = serde_json::from_str::<EvalState>(unknown).unwrap_err().to_string();
        assert!(err.contains("unknown sum `hinge_sum`"), "{err}");
    }
}
