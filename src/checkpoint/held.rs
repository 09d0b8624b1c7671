//! The backup a run wrote at its last step (where it ended, or paused at `train.stop_at_step`),
//! kept in memory as it went to disk, so that the same process training on (a sweep's resident trial,
//! [`crate::sweep::resident`]) restores from it without reading back and checksumming the
//! files it has just written (about 40 ms for the tutorial model's 22 MB, at every promotion).
//! It stands in for its folder only while that folder is the store's newest, committed, with the
//! manifest of that step; the manifest itself is read from the folder, so the loop state, data
//! cursor and seed are what a process started anew reads. Otherwise the folder is read as such
//! a process reads it.

use super::{Layout, LoadedCheckpoint, Snapshot, Store, store};
use std::path::PathBuf;
use std::sync::Arc;

/// A backup's tensors as this process wrote them, and where.
#[derive(Debug)]
pub struct HeldBackup {
    dir: PathBuf,
    step: u64,
    snapshot: Arc<Snapshot>,
}

impl HeldBackup {
    /// The backup at `step` in `store`, written from `snapshot`.
    pub fn new(store: &Store, step: u64, snapshot: Arc<Snapshot>) -> Self {
        Self { dir: store.root().join(store::name(step)), step, snapshot }
    }

    /// The checkpoint `store` would load as its newest good one, for a model laid out as
    /// `layout`, taken from memory; `None` when `store`'s newest folder is not this backup (a
    /// newer one, an unfinished one, another store) or no longer holds its manifest: then the
    /// caller reads the store.
    pub fn load_if_newest(self, store: &Store, layout: &Layout) -> Option<LoadedCheckpoint> {
        let newest = store.list().ok()?.pop()?;
        if newest.path != self.dir || !newest.committed {
            return None;
        }
        let manifest = store::read_manifest(&newest.path).ok()?;
        // The writer finished, so this is the last reference and nothing is copied.
        let Snapshot { params, state, optimizer, best } =
            Arc::try_unwrap(self.snapshot).unwrap_or_else(|s| (*s).clone());
        let names = optimizer.iter().map(|(n, _)| n.as_str());
        let same_shape = manifest.step == self.step
            && params.len() == layout.params
            && state.len() == layout.state
            && names.eq(manifest.optimizer.buffers.iter().map(String::as_str))
            && optimizer.iter().all(|(_, v)| v.len() == layout.params)
            && best.is_some() == manifest.loop_state.best_weights;
        same_shape.then_some(LoadedCheckpoint { path: newest.path, manifest, params, state, optimizer, best })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::store::tests::{layout, manifest};

    /// Values whose bits a lossy round trip would change: signed zero, a subnormal, the
    /// extremes.
    fn snapshot(best: bool) -> Snapshot {
        let odd = [-0.0, f32::from_bits(1), f32::MAX, f32::MIN_POSITIVE, 0.1];
        Snapshot {
            params: odd.to_vec(),
            state: vec![1.0e-40, -3.5],
            optimizer: vec![("momentum".into(), odd.iter().map(|v| -v).collect())],
            best: best.then(|| (vec![0.5; 5], vec![-0.0, 2.0])),
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn a_held_backup_is_what_the_store_reads_back_from_its_folder() {
        for best in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::new(dir.path().join("backup"));
            let mut m = manifest(40);
            m.loop_state.best_weights = best;
            store.write(&snapshot(false), &layout(), manifest(20)).unwrap();
            store.write(&snapshot(best), &layout(), m).unwrap();
            let held = HeldBackup::new(&store, 40, Arc::new(snapshot(best))).load_if_newest(&store, &layout()).unwrap();
            let read = store::load(&store.root().join(store::name(40)), &layout()).unwrap();
            assert_eq!(held.path, read.path);
            assert_eq!(held.manifest, read.manifest, "the manifest is the folder's: cursor, loop state, seed");
            assert_eq!(bits(&held.params), bits(&read.params));
            assert_eq!(bits(&held.state), bits(&read.state));
            assert_eq!(held.optimizer.len(), read.optimizer.len());
            for ((hn, hv), (rn, rv)) in held.optimizer.iter().zip(&read.optimizer) {
                assert_eq!((hn, bits(hv)), (rn, bits(rv)));
            }
            let pair = |b: &Option<(Vec<f32>, Vec<f32>)>| b.as_ref().map(|(p, s)| (bits(p), bits(s)));
            assert_eq!(pair(&held.best), pair(&read.best));
            assert_eq!(held.best.is_some(), best);
        }
    }

    #[test]
    fn a_held_backup_that_is_no_longer_the_newest_or_whole_is_read_from_the_store_instead() {
        let held = |store: &Store| HeldBackup::new(store, 20, Arc::new(snapshot(false)));
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("backup"));
        // Nothing written.
        assert!(held(&store).load_if_newest(&store, &layout()).is_none());
        store.write(&snapshot(false), &layout(), manifest(20)).unwrap();
        assert!(held(&store).load_if_newest(&store, &layout()).is_some());
        // Another store, another model.
        let other = Store::new(dir.path().join("other"));
        store.write(&snapshot(false), &layout(), manifest(20)).unwrap();
        assert!(held(&other).load_if_newest(&store, &layout()).is_none());
        let bigger = Layout { params: 6, ..layout() };
        assert!(held(&store).load_if_newest(&store, &bigger).is_none());
        // A newer backup, then the held one's manifest gone (an unfinished folder).
        store.write(&snapshot(false), &layout(), manifest(30)).unwrap();
        assert!(held(&store).load_if_newest(&store, &layout()).is_none());
        store.delete(30).unwrap();
        assert!(held(&store).load_if_newest(&store, &layout()).is_some());
        std::fs::remove_file(store.root().join(store::name(20)).join("manifest.json")).unwrap();
        assert!(held(&store).load_if_newest(&store, &layout()).is_none());
    }
}
