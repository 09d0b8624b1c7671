//! The store: round trips, and every kind of damage detected with the previous checkpoint used.

use super::*;
use crate::checkpoint::manifest::{
    CallbacksState, LoopState, Metrics, OptimizerState, RngState, SavedOptimizer, SavedTopology,
};
use crate::checkpoint::{Kind, Layout, Snapshot};
use crate::data::Cursor;
use crate::engine::TensorInfo;
use crate::metrics::{Sums, accuracy, loss};

pub(crate) fn layout() -> Layout {
    Layout {
        tensors: vec![
            TensorInfo { name: "dense/kernel".into(), shape: vec![2, 2], offset: 1 },
            TensorInfo { name: "dense/bias".into(), shape: vec![1], offset: 0 },
        ],
        state_tensors: vec![TensorInfo { name: "bn/moving_mean".into(), shape: vec![2], offset: 0 }],
        params: 5,
        state: 2,
    }
}

fn snapshot(x: f32) -> Snapshot {
    Snapshot {
        params: (0..5).map(|i| x + i as f32).collect(),
        state: vec![x, -x],
        optimizer: vec![("momentum".into(), vec![x * 0.5; 5])],
        best: None,
    }
}

pub(crate) fn manifest(step: u64) -> Manifest {
    let mut epoch_sums = Sums::of_examples(4);
    epoch_sums.accumulate(loss::SUM, 1.25);
    epoch_sums.accumulate(accuracy::CORRECT, 3.0);
    Manifest {
        format: crate::checkpoint::manifest::FORMAT,
        trainrun_version: "test".into(),
        kind: Kind::Backup,
        step,
        epoch: step / 10,
        cursor: Cursor { epoch: 0, offset: step as usize * 64 },
        rng: RngState { seed: 42, step },
        spec_hash: "abc".into(),
        spec_keys: Default::default(),
        topology: SavedTopology {
            num_workers: 2,
            num_replicas_in_sync: 2,
            per_replica_batch: 32,
            global_batch: 64,
            accumulation_steps: 1,
        },
        optimizer: OptimizerState { kind: SavedOptimizer::Sgd, iterations: step, buffers: vec!["momentum".into()] },
        loop_state: LoopState {
            examples: step * 64,
            epoch_sums,
            last_epoch_sums: Sums::default(),
            last_eval: None,
            callbacks: CallbacksState::new(),
            best_weights: false,
            worker_steps: Vec::new(),
        },
        metrics: Metrics::default(),
        unix_time: 0.0,
        files: vec![],
    }
}

fn store_with(steps: &[u64]) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::new(dir.path().join("ckpt"));
    for &s in steps {
        store.write(&snapshot(s as f32), &layout(), manifest(s)).unwrap();
    }
    (dir, store)
}

fn latest(store: &Store) -> (Option<u64>, Vec<String>) {
    let mut warnings = Vec::new();
    let got = store.latest_good(&layout(), |w| warnings.push(w.to_string())).unwrap();
    (got.map(|l| l.manifest.step), warnings)
}

#[test]
fn a_checkpoint_reads_back_exactly() {
    let (_d, store) = store_with(&[10]);
    let loaded = load(&store.root().join(name(10)), &layout()).unwrap();
    let s = snapshot(10.0);
    assert_eq!((loaded.params, loaded.state), (s.params, s.state));
    assert_eq!(loaded.optimizer, s.optimizer);
    assert_eq!(loaded.manifest.files.len(), 2);
    assert_eq!(loaded.manifest.loop_state.epoch_sums.loss_sum(), 1.25);
    let listed: Vec<u64> = store.list().unwrap().iter().map(|l| l.step).collect();
    assert_eq!(listed, [10]);
}

#[test]
fn no_checkpoint_is_none() {
    let (_d, store) = store_with(&[]);
    assert_eq!(latest(&store), (None, vec![]));
}

#[test]
fn a_truncated_file_is_skipped_for_the_previous_checkpoint() {
    let (_d, store) = store_with(&[10, 20]);
    let f = store.root().join(name(20)).join("model.safetensors");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(len - 3).unwrap();
    let (step, warnings) = latest(&store);
    assert_eq!(step, Some(10));
    assert!(warnings[0].contains("truncated"), "{warnings:?}");
}

#[test]
fn a_flipped_byte_is_skipped_for_the_previous_checkpoint() {
    let (_d, store) = store_with(&[10, 20]);
    let f = store.root().join(name(20)).join("optimizer.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&f, bytes).unwrap();
    let (step, warnings) = latest(&store);
    assert_eq!(step, Some(10));
    assert!(warnings[0].contains("SHA-256"), "{warnings:?}");
}

#[test]
fn a_missing_manifest_is_an_unfinished_save() {
    let (_d, store) = store_with(&[10, 20]);
    std::fs::remove_file(store.root().join(name(20)).join("manifest.json")).unwrap();
    let (step, warnings) = latest(&store);
    assert_eq!(step, Some(10));
    assert!(warnings[0].contains("did not finish"), "{warnings:?}");
}

#[test]
fn a_damaged_manifest_is_caught_by_its_own_checksum() {
    let (_d, store) = store_with(&[10, 20]);
    let f = store.root().join(name(20)).join("manifest.json");
    let text = std::fs::read_to_string(&f).unwrap().replace("\"step\": 20", "\"step\": 90");
    std::fs::write(&f, text).unwrap();
    let (step, warnings) = latest(&store);
    assert_eq!(step, Some(10));
    assert!(warnings[0].contains("checksum"), "{warnings:?}");
}

#[test]
fn another_model_is_an_error_not_a_silent_fallback() {
    let (_d, store) = store_with(&[10]);
    let mut other = layout();
    other.tensors[0].shape = vec![1, 4];
    let e = store.latest_good(&other, |_| {}).unwrap_err().to_string();
    assert!(e.contains("dense/kernel") && e.contains("[1, 4]"), "{e}");
}

#[test]
fn rewriting_and_deleting_leave_a_consistent_store() {
    let (_d, store) = store_with(&[10, 20]);
    store.write(&snapshot(99.0), &layout(), manifest(20)).unwrap();
    let loaded = load(&store.root().join(name(20)), &layout()).unwrap();
    assert_eq!(loaded.params[0], 99.0);
    store.delete(10).unwrap();
    assert_eq!(store.list().unwrap().iter().map(|l| l.step).collect::<Vec<_>>(), [20]);
    store.delete_all().unwrap();
    assert!(!store.root().exists());
}

/// A write that fails (here: its folder name is taken by a file) leaves no partial folder and
/// does not touch the committed checkpoint at the same step; leftovers of a crash go at the
/// next write.
#[test]
fn a_failed_write_keeps_every_committed_checkpoint_and_leaves_nothing() {
    let (_d, store) = store_with(&[10, 20]);
    let partial = store.root().join(format!("{}.partial", name(20)));
    std::fs::write(&partial, b"in the way").unwrap();
    assert!(store.write(&snapshot(99.0), &layout(), manifest(20)).is_err());
    assert_eq!(load(&store.root().join(name(20)), &layout()).unwrap().params[0], snapshot(20.0).params[0]);
    std::fs::remove_file(&partial).unwrap();
    std::fs::create_dir(store.root().join(format!("{}.partial", name(30)))).unwrap();
    store.write(&snapshot(40.0), &layout(), manifest(40)).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(store.root())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [name(10), name(20), name(40)]);
}
