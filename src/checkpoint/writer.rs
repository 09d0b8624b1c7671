//! The background writer: the step loop hands it a [`Snapshot`] (a memcpy of the buffers) and
//! goes on training while this thread writes, fsyncs and prunes. Snapshots come back for reuse,
//! so steady-state saves allocate nothing and fault in no pages.
//!
//! Backups and model checkpoints wait in two lanes, and the writer takes from them in turn, so
//! neither starves the other: a backup waits at most for the write in progress and one model
//! checkpoint. When writes are slower than saves come (a slow disk, a loaded machine), a
//! backup waiting is replaced by the newer one (only the latest state matters for resuming),
//! but only once its store has two backups written or on their way, so the newest two exist
//! as soon as the first two are written. Model checkpoints are each kept; the step loop waits
//! only when those waiting hold [`MODELS_WAITING_BYTES`] (bounded memory, not a stall per
//! save: a save costs the step loop its copy).

use super::policy::{self, Policy};
use super::{CheckpointError, Layout, Manifest, Snapshot, Store};
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One checkpoint to write, and how to prune its store after.
pub struct SaveJob {
    /// Where.
    pub store: Store,
    /// The model's tensors.
    pub layout: Arc<Layout>,
    /// The buffers (shared when two callbacks save the same step).
    pub snapshot: Arc<Snapshot>,
    /// The manifest, `files` still empty.
    pub manifest: Manifest,
    /// Retention, applied to the store once this checkpoint is written.
    pub policy: Policy,
    /// A newer job for the same store may replace this one while it waits (backups).
    pub supersedable: bool,
}

/// How saving went: the time the step loop was blocked, the time writing took.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SaveStats {
    /// Checkpoints written.
    pub saves: u64,
    /// Saves replaced by a newer one before they were written.
    pub superseded: u64,
    /// Longest time a save blocked the step loop.
    pub block_max: Duration,
    /// Total time saves blocked the step loop.
    pub block_total: Duration,
    /// Longest background write.
    pub write_max: Duration,
}

/// Bytes of model checkpoints that may wait before a save waits for the writer to take one:
/// enough for dozens of saves of a small model, while a disk that stays slower than the saves
/// cannot use up memory.
pub const MODELS_WAITING_BYTES: u64 = 1 << 30;

/// Snapshots kept for reuse: one being written and one being filled.
const POOL: usize = 2;

#[derive(Default)]
struct WriterState {
    /// Backups waiting, oldest first.
    backups: VecDeque<SaveJob>,
    /// Model checkpoints waiting, oldest first.
    models: VecDeque<SaveJob>,
    /// Bytes the waiting model checkpoints hold.
    models_bytes: u64,
    /// Whether the last job taken was a backup: the lanes take turns.
    took_backup: bool,
    /// The store being written to, and whether the job is a backup.
    writing: Option<(Store, bool)>,
    /// Committed checkpoints per store, as of the writer's last write there.
    committed: HashMap<PathBuf, usize>,
    busy: bool,
    closed: bool,
    error: Option<CheckpointError>,
    pool: Vec<Snapshot>,
    /// Snapshots made so far: two suffice (one being written, one being filled).
    made: usize,
    stats: SaveStats,
    /// Tests: how long each write sleeps first (a slow disk).
    #[cfg(test)]
    delay: Duration,
    /// Tests: every checkpoint written, in order.
    #[cfg(test)]
    written: Vec<(PathBuf, u64)>,
}

#[derive(Default)]
struct WriterShared {
    state: Mutex<WriterState>,
    changed: Condvar,
}

impl WriterState {
    /// Whether anything waits.
    fn idle(&self) -> bool {
        self.backups.is_empty() && self.models.is_empty()
    }

    /// The next job: the lanes in turn, a backup first when both have one.
    fn next(&mut self) -> Option<SaveJob> {
        let backup = !self.backups.is_empty() && (self.models.is_empty() || !self.took_backup);
        let job = if backup { self.backups.pop_front() } else { self.models.pop_front() }?;
        if !backup {
            self.models_bytes = self.models_bytes.saturating_sub(footprint(&job.snapshot));
        }
        self.took_backup = backup;
        Some(job)
    }

    /// Where a backup for `store` goes: `Some(i)` replaces the waiting backup at `i`, which
    /// is obsolete once the store has two backups written, being written or waiting.
    fn superseded(&self, store: &Store) -> Option<usize> {
        let newest = self.backups.iter().rposition(|j| &j.store == store)?;
        let waiting = self.backups.iter().filter(|j| &j.store == store).count();
        let writing = usize::from(self.writing.as_ref().is_some_and(|(s, backup)| *backup && s == store));
        let committed = self.committed.get(store.root()).copied().unwrap_or(0);
        (committed + writing + waiting >= 2).then_some(newest)
    }

    /// Puts `job` in its lane; returns the backup it supersedes.
    fn enqueue(&mut self, job: SaveJob) -> Option<SaveJob> {
        if !job.supersedable {
            self.models_bytes += footprint(&job.snapshot);
            self.models.push_back(job);
            return None;
        }
        let old = self.superseded(&job.store).and_then(|i| self.backups.remove(i));
        self.backups.push_back(job);
        old
    }
}

impl WriterShared {
    fn lock(&self) -> MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, WriterState>) -> MutexGuard<'a, WriterState> {
        self.changed.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }
}

/// A snapshot of these sizes with every page already faulted in.
fn touched(params: usize, state: usize, optimizer: &[(String, usize)]) -> Snapshot {
    let touch = |n: usize| {
        let mut v = Vec::with_capacity(n);
        v.resize(n, 0.5f32);
        v
    };
    Snapshot {
        params: touch(params),
        state: touch(state),
        optimizer: optimizer.iter().map(|(name, n)| (name.clone(), touch(*n))).collect(),
        best: None,
    }
}

/// Returns a snapshot to the pool when nobody else holds it; beyond [`POOL`] it is freed,
/// so a burst of saves waiting on a slow disk does not keep its memory.
fn recycle(state: &mut WriterState, snapshot: Arc<Snapshot>) {
    if state.pool.len() < POOL
        && let Ok(s) = Arc::try_unwrap(snapshot)
    {
        state.pool.push(s);
    }
}

/// The writer thread and its queue.
pub struct Writer {
    shared: Arc<WriterShared>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread.
    pub fn start() -> Result<Self, CheckpointError> {
        let shared = Arc::new(WriterShared::default());
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("trainrun-ckpt".into())
            .spawn(move || run(&state))
            .map_err(|e| CheckpointError::io(std::path::Path::new("(checkpoint writer thread)"))(e))?;
        Ok(Self { shared, thread: Some(thread) })
    }

    /// A writer whose every write first sleeps `delay`: a slow disk, for tests.
    #[cfg(test)]
    fn throttled(delay: Duration) -> Self {
        let w = Self::start().unwrap_or_else(|e| panic!("{e}"));
        w.shared.lock().delay = delay;
        w
    }

    /// Every checkpoint written so far, in order.
    #[cfg(test)]
    fn written(&self) -> Vec<(PathBuf, u64)> {
        self.shared.lock().written.clone()
    }

    /// A snapshot to fill: one the writer is done with, else a new one.
    pub fn take_snapshot(&mut self) -> Snapshot {
        self.shared.lock().pool.pop().unwrap_or_default()
    }

    /// Makes a snapshot ready in advance, its pages touched, so that the first save does not
    /// pay for page faults inside a step.
    pub fn prepare(&mut self, params: usize, state: usize, optimizer: &[&str]) {
        let optimizer: Vec<(String, usize)> = optimizer.iter().map(|n| (n.to_string(), params)).collect();
        let snapshot = touched(params, state, &optimizer);
        let mut s = self.shared.lock();
        s.pool.push(snapshot);
        s.made += 1;
    }

    /// Takes back the snapshot of a backup still waiting for `store` that the save about to
    /// be made supersedes, so its buffers can be reused at once.
    pub fn reclaim(&mut self, store: &Store) {
        let mut state = self.shared.lock();
        if let Some(i) = state.superseded(store)
            && let Some(old) = state.backups.remove(i)
        {
            state.stats.superseded += 1;
            recycle(&mut state, old.snapshot);
        }
    }

    /// Queues `jobs`; `blocked_since` is when the step loop stopped to save, so the time it
    /// was blocked (snapshot and queueing) is recorded.
    pub fn submit(&mut self, jobs: Vec<SaveJob>, blocked_since: Instant) -> Result<(), CheckpointError> {
        let mut state = self.shared.lock();
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        // Back-pressure, bounding memory when the disk stays slower than saves come: wait
        // only while the model lane is full.
        if jobs.iter().any(|j| !j.supersedable) {
            while state.models_bytes >= MODELS_WAITING_BYTES && state.error.is_none() && !state.closed {
                state = self.shared.wait(state);
            }
        }
        for job in jobs {
            if let Some(old) = state.enqueue(job) {
                state.stats.superseded += 1;
                recycle(&mut state, old.snapshot);
            }
        }
        let blocked = blocked_since.elapsed();
        state.stats.block_max = state.stats.block_max.max(blocked);
        state.stats.block_total += blocked;
        drop(state);
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Waits until everything queued is on disk; returns the first failure.
    pub fn flush(&mut self) -> Result<(), CheckpointError> {
        let mut state = self.shared.lock();
        while (!state.idle() || state.busy) && !state.closed {
            state = self.shared.wait(state);
        }
        match state.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits for every queued write and stops the thread.
    pub fn finish(mut self) -> Result<SaveStats, CheckpointError> {
        self.flush()?;
        self.stop();
        Ok(self.shared.lock().stats)
    }

    fn stop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    /// Even when training fails, the checkpoints already queued are written: they are good.
    fn drop(&mut self) {
        self.stop();
    }
}

/// Bytes a checkpoint of `snapshot` takes on disk, about.
fn footprint(snapshot: &Snapshot) -> u64 {
    let floats = snapshot.params.len()
        + snapshot.state.len()
        + snapshot.optimizer.iter().map(|(_, v)| v.len()).sum::<usize>()
        + snapshot.best.as_ref().map_or(0, |(p, s)| p.len() + s.len());
    4 * floats as u64
}

/// A failed write as the run should see it: a full disk that removing the unfinished save did
/// not cure (less free space than a checkpoint needs) becomes [`CheckpointError::NoSpace`],
/// which a restart cannot cure either; anything else stays as it was.
fn classify(error: CheckpointError, store: &Store, needed: u64) -> CheckpointError {
    let CheckpointError::Io { path, source } = error else { return error };
    let free = super::free_bytes(store.root());
    match free {
        Some(free) if super::is_no_space(&source) && free < needed => CheckpointError::NoSpace { path, needed, free },
        Some(_) | None => CheckpointError::Io { path, source },
    }
}

#[cfg(test)]
fn state_delay(shared: &WriterShared) -> Duration {
    shared.lock().delay
}

fn run(shared: &WriterShared) {
    // Writing yields to training: on a machine with as many compute threads as cores, the
    // checkpoint waits rather than the step.
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id only changes its scheduling weight.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
    loop {
        let mut state = shared.lock();
        let job = loop {
            if let Some(job) = state.next() {
                break job;
            }
            if state.closed {
                return;
            }
            state = shared.wait(state);
        };
        state.busy = true;
        state.writing = Some((job.store.clone(), job.supersedable));
        // The next save would find the pool empty while this one is written: make its
        // snapshot here, off the step loop, rather than fault its pages in during a step.
        let spare = state.pool.is_empty() && state.made < POOL;
        if spare {
            state.made += 1;
        }
        drop(state);
        shared.changed.notify_all();
        if spare {
            let s = &job.snapshot;
            let optimizer: Vec<(String, usize)> = s.optimizer.iter().map(|(n, v)| (n.clone(), v.len())).collect();
            let made = touched(s.params.len(), s.state.len(), &optimizer);
            shared.lock().pool.push(made);
        }

        let SaveJob { store, layout, snapshot, manifest, policy, .. } = job;
        let started = Instant::now();
        let step = manifest.step;
        #[cfg(test)]
        std::thread::sleep(state_delay(shared));
        let result = store.write(&snapshot, &layout, manifest).and_then(|_| {
            let kept: Vec<u64> = store.list()?.into_iter().filter(|l| l.committed).map(|l| l.step).collect();
            let pruned = policy::prune(&policy, &kept, step);
            for old in &pruned {
                store.delete(*old)?;
            }
            Ok(kept.len().saturating_sub(pruned.len()))
        });
        let took = started.elapsed();

        let mut state = shared.lock();
        state.busy = false;
        state.writing = None;
        match result {
            Ok(committed) => {
                state.stats.saves += 1;
                state.stats.write_max = state.stats.write_max.max(took);
                state.committed.insert(store.root().to_path_buf(), committed);
                #[cfg(test)]
                state.written.push((store.root().to_path_buf(), step));
            }
            Err(e) => {
                let e = classify(e, &store, footprint(&snapshot));
                state.error.get_or_insert(e);
            }
        }
        recycle(&mut state, snapshot);
        drop(state);
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiting_backup_is_superseded_and_everything_else_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().join("b"));
        let layout = Arc::new(Layout { tensors: vec![], state_tensors: vec![], params: 0, state: 0 });
        let mut w = Writer::start().unwrap();
        let manifest = crate::checkpoint::store::tests::manifest;
        let job = |step| SaveJob {
            store: store.clone(),
            layout: layout.clone(),
            snapshot: Arc::new(Snapshot::default()),
            manifest: manifest(step),
            policy: Policy::BACKUP,
            supersedable: true,
        };
        // Three backups in a row: whichever still waits when the next comes is replaced.
        w.submit(vec![job(1)], Instant::now()).unwrap();
        w.submit(vec![job(2)], Instant::now()).unwrap();
        w.submit(vec![job(3)], Instant::now()).unwrap();
        let stats = w.finish().unwrap();
        assert_eq!(stats.saves + stats.superseded, 3);
        let steps: Vec<u64> = store.list().unwrap().iter().map(|l| l.step).collect();
        assert_eq!(steps.last(), Some(&3));
        assert!(steps.len() <= 2);
    }

    fn job(store: &Store, step: u64, backup: bool) -> SaveJob {
        SaveJob {
            store: store.clone(),
            layout: Arc::new(Layout { tensors: vec![], state_tensors: vec![], params: 0, state: 0 }),
            snapshot: Arc::new(Snapshot::default()),
            manifest: crate::checkpoint::store::tests::manifest(step),
            policy: if backup { Policy::BACKUP } else { Policy { max_to_keep: None, best_only: None } },
            supersedable: backup,
        }
    }

    fn taken(state: &mut WriterState) -> Option<(bool, u64)> {
        state.next().map(|j| (j.supersedable, j.manifest.step))
    }

    /// The decisions alone, without a thread: whatever the timing, the lanes take turns, and
    /// a waiting backup is replaced only when its store will hold two backups anyway.
    #[test]
    fn lanes_take_turns_and_backups_are_superseded_only_past_two() {
        let (models, backups) = (Store::new("m"), Store::new("b"));
        let mut s = WriterState::default();
        for step in [10, 20] {
            assert!(s.enqueue(job(&models, step, false)).is_none());
            assert!(s.enqueue(job(&backups, step, true)).is_none(), "fewer than two backups: keep both");
        }
        assert_eq!(taken(&mut s), Some((true, 10)), "a backup first");
        assert_eq!(taken(&mut s), Some((false, 10)));
        s.writing = Some((backups.clone(), true));
        let old = s.enqueue(job(&backups, 30, true)).map(|j| j.manifest.step);
        assert_eq!(old, Some(20), "one being written and one waiting make two: 30 replaces 20");
        assert!(s.enqueue(job(&models, 30, false)).is_none());
        assert_eq!(taken(&mut s), Some((true, 30)));
        assert_eq!(taken(&mut s), Some((false, 20)));
        assert_eq!(taken(&mut s), Some((false, 30)), "no backup waits: the models go on");
        assert_eq!(taken(&mut s), None);
        s.writing = None;
        s.committed.insert(backups.root().to_path_buf(), 2);
        assert!(s.enqueue(job(&backups, 40, true)).is_none(), "nothing waits to replace");
        assert_eq!(s.enqueue(job(&backups, 50, true)).map(|j| j.manifest.step), Some(40));
        for step in [40, 50, 60] {
            assert!(s.enqueue(job(&models, step, false)).is_none());
        }
        let order: Vec<(bool, u64)> = std::iter::from_fn(|| taken(&mut s)).collect();
        assert_eq!(order, [(true, 50), (false, 40), (false, 50), (false, 60)]);
    }

    /// On a slow disk (every write takes 400 ms) saves do not wait for the writer, the first
    /// backup is written first, and the store ends with the newest two.
    #[test]
    fn a_slow_disk_neither_blocks_saves_nor_starves_backups() {
        let dir = tempfile::tempdir().unwrap();
        let (models, backups) = (Store::new(dir.path().join("m")), Store::new(dir.path().join("b")));
        let steps = |s: &Store| s.list().unwrap().iter().filter(|l| l.committed).map(|l| l.step).collect::<Vec<_>>();
        let mut w = Writer::throttled(Duration::from_millis(400));
        for round in [[10, 20, 30], [40, 50, 60]] {
            for step in round {
                w.submit(vec![job(&models, step, false), job(&backups, step, true)], Instant::now()).unwrap();
            }
            w.flush().unwrap();
            let kept = steps(&backups);
            assert_eq!((kept.len(), kept.last()), (2, Some(&round[2])), "{kept:?}");
        }
        let written = w.written();
        let stats = w.finish().unwrap();
        assert_eq!(steps(&models), [10, 20, 30, 40, 50, 60]);
        assert_eq!(written.first(), Some(&(backups.root().to_path_buf(), 10)), "the first backup first: {written:?}");
        // Saves never filled the model lane, so none waited for a 400 ms write.
        assert!(stats.block_max < Duration::from_millis(200), "{stats:?}");
    }

    #[test]
    fn checkpoints_that_must_all_be_written_are_written_one_save_after_another() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Store::new(dir.path().join("a")), Store::new(dir.path().join("b")));
        let layout = Arc::new(Layout { tensors: vec![], state_tensors: vec![], params: 0, state: 0 });
        let every = Policy { max_to_keep: None, best_only: None };
        let job = |store: &Store, step| SaveJob {
            store: store.clone(),
            layout: layout.clone(),
            snapshot: Arc::new(Snapshot::default()),
            manifest: crate::checkpoint::store::tests::manifest(step),
            policy: every,
            supersedable: false,
        };
        let jobs: Vec<Vec<SaveJob>> = (1..=4).map(|step| vec![job(&a, step), job(&b, step)]).collect();
        // Bounded, so a lost wake-up fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut w = Writer::start().unwrap();
            for j in jobs {
                w.submit(j, Instant::now()).unwrap();
            }
            let _ = tx.send(w.finish().unwrap());
        });
        let stats = rx.recv_timeout(Duration::from_secs(30)).expect("the writer hung");
        assert_eq!(stats.saves, 8);
        for store in [&a, &b] {
            assert_eq!(store.list().unwrap().iter().map(|l| l.step).collect::<Vec<_>>(), [1, 2, 3, 4]);
        }
    }
}
