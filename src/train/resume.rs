//! Resuming: the chief reads the newest good backup and sends it to every worker through the
//! collective `broadcast`, so workers need no shared storage and restart with bit-identical
//! state. A backup restores into any number of workers as long as the global batch is the
//! same: the data cursor counts examples of the global order, which every worker computes
//! alike, so it carries over exactly; with another global batch it is refused, saying how to
//! set the batch.

use super::{Session, TrainError};
use crate::checkpoint::manifest::{LoopState, SavedOptimizer};
use crate::checkpoint::{LoadedCheckpoint, Manifest};
use crate::data::Cursor;
use crate::plan::Plan;
use crate::strategy::Variables;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Where a resumed run starts.
#[derive(Debug, Clone)]
pub struct ResumePoint {
    /// Optimizer steps already done.
    pub step: u64,
    /// Epochs already finished.
    pub epochs_done: u64,
    /// The next batch's position.
    pub cursor: Cursor,
    /// The loop's state.
    pub loop_state: LoopState,
    /// Early stopping's best weights, when kept.
    pub best: Option<Variables>,
    /// The backup's folder, for messages.
    pub from: String,
}

/// What the chief sends ahead of the buffers.
#[derive(Debug, Serialize, Deserialize)]
// serde's error texts name it as before the rename.
#[serde(rename = "Header")]
struct ResumeHeader {
    from: String,
    manifest: Manifest,
}

/// What a resumed run may change besides what the training hash leaves out: how long it
/// trains, how it evaluates, logs and saves, and where the data is.
const RESUMABLE: [&str; 11] = [
    "train.epochs",
    "train.steps_per_epoch",
    "train.stop_at_step",
    "train.steps_per_execution",
    "train.metrics",
    "train.evaluate_every_steps",
    "train.evaluate_every_epoch",
    "train.validation_steps",
    "callbacks",
    "run.log_every_steps",
    "data.dir",
];

/// Whether `key` (a key path, `callbacks.0.kind`) is one a resumed run may change.
fn resumable(key: &str) -> bool {
    RESUMABLE.iter().any(|r| key.strip_prefix(r).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '['])))
}

/// The key paths whose values changed since the backup `m` was written; none when the hashes
/// agree. A backup of a version that recorded no keys names `the spec` as a whole, and is
/// resumed as before, under the new spec.
fn changed_keys(m: &Manifest, plan: &Plan) -> Vec<String> {
    let now = &plan.hashes.training_keys;
    if m.spec_hash == plan.hashes.training || m.spec_keys.is_empty() {
        return Vec::new();
    }
    let keys: std::collections::BTreeSet<&String> = m.spec_keys.keys().chain(now.keys()).collect();
    keys.into_iter().filter(|k| m.spec_keys.get(*k) != now.get(*k)).cloned().collect()
}

/// Checks that `m` can resume under `plan`; the error says what to change.
pub fn check(
    plan: &Plan,
    m: &Manifest,
    dir: &Path,
    kind: SavedOptimizer,
    optimizer_buffers: &[&str],
) -> Result<(), TrainError> {
    let t = &m.topology;
    if t.global_batch != plan.batch.global {
        let accum = if t.accumulation_steps > 1 {
            format!(" × {} accumulation steps", t.accumulation_steps)
        } else {
            String::new()
        };
        return Err(TrainError::Resume(format!(
            "the backup {} was written with a global batch of {} ({} worker{} × {} per replica{accum}), but this run's is {} ({} × {} per replica). \
             The data position counts examples of the global order, so it carries over exactly only with the same global batch: \
             set batch.global = {} (e.g. --set batch.global={}), or move {} away to start afresh",
            dir.display(),
            t.global_batch,
            t.num_workers,
            if t.num_workers == 1 { "" } else { "s" },
            t.per_replica_batch,
            plan.batch.global,
            plan.strategy.replicas_text(),
            plan.batch.per_replica,
            t.global_batch,
            t.global_batch,
            dir.parent().unwrap_or(dir).display(),
        )));
    }
    let saved: Vec<&str> = m.optimizer.buffers.iter().map(String::as_str).collect();
    if saved != optimizer_buffers || m.optimizer.kind != kind {
        return Err(TrainError::Resume(format!(
            "the backup {} holds {} optimizer state [{}], but this spec's optimizer is {} and keeps [{}]: resume with the optimizer settings that wrote it, or move the backup away to start afresh",
            dir.display(),
            m.optimizer.kind,
            saved.join(", "),
            kind,
            optimizer_buffers.join(", ")
        )));
    }
    let another_run = changed_keys(m, plan).into_iter().filter(|k| !resumable(k)).collect::<Vec<_>>();
    if !another_run.is_empty() {
        // Another seed, model, data or optimizer trains something else: resuming it would mix
        // two runs (two runs into one folder did, each resuming the other's backup).
        return Err(TrainError::Resume(format!(
            "the backup {} was written by another spec: {} changed since (its training hash is {}, this run's is \
             {}); a backup resumes only the run that wrote it, which may train longer or evaluate and log \
             otherwise\n  help: give this run a folder of its own (e.g. --set run.out_dir=runs/<another name>), or \
             delete {} to start afresh in this one",
            dir.display(),
            another_run.join(", "),
            m.spec_hash,
            plan.hashes.training,
            dir.parent().unwrap_or(dir).display(),
        )));
    }
    Ok(())
}

fn to_words(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks(4)
        .map(|c| {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            f32::from_bits(u32::from_le_bytes(w))
        })
        .collect()
}

fn from_words(words: &[f32], len: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_bits().to_le_bytes()).collect();
    bytes.truncate(len);
    bytes
}

/// Sends raw bytes from the chief to every task: a length, then the bytes packed into the
/// bit patterns of f32 words (a broadcast copies bits and does no arithmetic).
fn broadcast_bytes(session: &mut Session, bytes: Option<Vec<u8>>) -> Result<Vec<u8>, TrainError> {
    let len = bytes.as_ref().map_or(0, Vec::len) as u64;
    let mut head = [f32::from_bits(len as u32), f32::from_bits((len >> 32) as u32)];
    session.strategy.broadcast(&mut head)?;
    let len = u64::from(head[0].to_bits()) | (u64::from(head[1].to_bits()) << 32);
    let len = usize::try_from(len).map_err(|_| TrainError::Resume(format!("a resume header of {len} bytes")))?;
    let mut words = match bytes {
        Some(b) => to_words(&b),
        None => vec![0.0; len.div_ceil(4)],
    };
    words.resize(len.div_ceil(4), 0.0);
    session.strategy.broadcast(&mut words)?;
    Ok(from_words(&words, len))
}

/// Restores the newest backup: the chief passes what it `loaded` (or `None` for a fresh
/// start), every other worker `None`; all return the same resume point and hold the same
/// variables and optimizer state afterwards. `note` shows what happened.
pub fn restore(
    plan: &Plan,
    session: &mut Session,
    is_chief: bool,
    loaded: Option<LoadedCheckpoint>,
    mut note: impl FnMut(&str),
) -> Result<Option<ResumePoint>, TrainError> {
    let buffers: Vec<&'static str> = session.optimizer.state().iter().map(|(n, _)| *n).collect();
    let kind = super::checkpointer::optimizer_kind(&session.optimizer);
    let header = match &loaded {
        Some(l) => {
            check(plan, &l.manifest, &l.path, kind, &buffers)?;
            let h = ResumeHeader { from: l.path.display().to_string(), manifest: l.manifest.clone() };
            Some(serde_json::to_vec(&h).map_err(|e| TrainError::Resume(e.to_string()))?)
        }
        None if is_chief => Some(Vec::new()),
        None => None,
    };
    let bytes = broadcast_bytes(session, header)?;
    if bytes.is_empty() {
        return Ok(None);
    }
    let ResumeHeader { from, manifest } =
        serde_json::from_slice(&bytes).map_err(|e| TrainError::Resume(e.to_string()))?;
    if !is_chief {
        check(plan, &manifest, Path::new(&from), kind, &buffers)?;
    }
    let Session { vars, optimizer, .. } = session;
    let mut best = manifest.loop_state.best_weights.then(|| vars.clone());
    if let Some(l) = loaded {
        vars.params = l.params;
        vars.state = l.state;
        for ((_, dst), (_, src)) in optimizer.state_mut().into_iter().zip(l.optimizer) {
            *dst = src;
        }
        if let (Some(b), Some((p, s))) = (best.as_mut(), l.best) {
            b.params = p;
            b.state = s;
        }
    }
    session.strategy.broadcast(&mut session.vars.params)?;
    session.strategy.broadcast(&mut session.vars.state)?;
    for (_, buffer) in session.optimizer.state_mut() {
        session.strategy.broadcast(buffer)?;
    }
    if let Some(b) = best.as_mut() {
        session.strategy.broadcast(&mut b.params)?;
        session.strategy.broadcast(&mut b.state)?;
    }
    session.optimizer.set_iterations(manifest.optimizer.iterations);
    if is_chief {
        let t = &manifest.topology;
        note(&format!("resuming from {from} at step {} (epoch {})", manifest.step, manifest.epoch + 1));
        if manifest.spec_hash != plan.hashes.training {
            let changed = changed_keys(&manifest, plan);
            let which = if changed.is_empty() { "the spec".to_string() } else { changed.join(", ") };
            note(&format!(
                "{which} changed since the backup was written: training continues from it under the new spec"
            ));
        }
        if t.num_workers != plan.strategy.num_workers {
            note(&format!(
                "the backup was written by {} worker{}, this run has {}: weights, optimizer state and the data position carry over (same global batch, {})",
                t.num_workers,
                if t.num_workers == 1 { "" } else { "s" },
                plan.strategy.num_workers,
                t.global_batch
            ));
        }
    }
    Ok(Some(ResumePoint {
        step: manifest.step,
        epochs_done: manifest.epoch,
        cursor: manifest.cursor,
        loop_state: manifest.loop_state,
        best,
        from,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_survive_the_trip_through_f32_words() {
        let text = b"{\"step\": 140, \"odd\": [1, 2, 3]}";
        for n in 0..text.len() {
            assert_eq!(from_words(&to_words(&text[..n]), n), &text[..n]);
        }
    }

    #[test]
    fn a_resume_may_train_longer_not_another_model() {
        for key in
            ["train.epochs", "train.stop_at_step", "callbacks", "callbacks.0.save_freq", "callbacks[1]", "data.dir"]
        {
            assert!(resumable(key), "{key}");
        }
        for key in ["run.seed", "train.epochs_x", "optimizer.learning_rate", "model.layers", "data.dirt", "train.loss"]
        {
            assert!(!resumable(key), "{key}");
        }
    }
}
