//! The background writer: the step loop hands it a [`Snapshot`] (a memcpy of the buffers) and
//! goes on training while this thread writes, fsyncs and prunes. Snapshots come back for reuse,
//! so steady-state saves allocate nothing and fault in no pages.
//!
//! When writes are slower than saves come (a slow disk, a loaded machine), a backup waiting
//! in the queue is replaced by the newer one: only the latest state matters for resuming, so
//! training never waits for an obsolete backup. Model checkpoints are each kept, so a second
//! one waiting blocks the step loop until the first is taken (back-pressure, not unbounded
//! memory).

use super::policy::{self, Policy};
use super::{CheckpointError, Layout, Manifest, Snapshot, Store};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One checkpoint to write, and how to prune its store after.
pub struct Job {
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

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    busy: bool,
    closed: bool,
    error: Option<CheckpointError>,
    pool: Vec<Snapshot>,
    /// Snapshots made so far: two suffice (one being written, one being filled).
    made: usize,
    stats: SaveStats,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
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

/// Returns a snapshot to the pool when nobody else holds it.
fn recycle(state: &mut State, snapshot: Arc<Snapshot>) {
    if let Ok(s) = Arc::try_unwrap(snapshot) {
        state.pool.push(s);
    }
}

/// The writer thread and its queue.
pub struct Writer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Writer {
    /// Starts the thread.
    pub fn start() -> Result<Self, CheckpointError> {
        let shared = Arc::new(Shared::default());
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("trainrun-ckpt".into())
            .spawn(move || run(&state))
            .map_err(|e| CheckpointError::io(std::path::Path::new("(checkpoint writer thread)"))(e))?;
        Ok(Self { shared, thread: Some(thread) })
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

    /// Takes back the snapshot of a backup still waiting in the queue for `store`, which the
    /// save about to be made supersedes, so its buffers can be reused at once.
    pub fn reclaim(&mut self, store: &Store) {
        let mut state = self.shared.lock();
        if let Some(i) = state.jobs.iter().position(|j| j.supersedable && &j.store == store)
            && let Some(old) = state.jobs.remove(i)
        {
            state.stats.superseded += 1;
            recycle(&mut state, old.snapshot);
        }
    }

    /// Queues `jobs`; `blocked_since` is when the step loop stopped to save, so the time it
    /// was blocked (snapshot and queueing) is recorded.
    pub fn submit(&mut self, jobs: Vec<Job>, blocked_since: Instant) -> Result<(), CheckpointError> {
        let mut state = self.shared.lock();
        if let Some(e) = state.error.take() {
            return Err(e);
        }
        // Back-pressure for checkpoints that must all be written: the previous save's must have
        // been taken up by the writer before this save's join the queue.
        if jobs.iter().any(|j| !j.supersedable) {
            while state.jobs.iter().any(|j| !j.supersedable) && state.error.is_none() && !state.closed {
                state = self.shared.wait(state);
            }
        }
        for job in jobs {
            if job.supersedable
                && let Some(i) = state.jobs.iter().position(|j| j.supersedable && j.store == job.store)
                && let Some(old) = state.jobs.remove(i)
            {
                state.stats.superseded += 1;
                recycle(&mut state, old.snapshot);
            }
            state.jobs.push_back(job);
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
        while (!state.jobs.is_empty() || state.busy) && !state.closed {
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

fn run(shared: &Shared) {
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
            if let Some(job) = state.jobs.pop_front() {
                break job;
            }
            if state.closed {
                return;
            }
            state = shared.wait(state);
        };
        state.busy = true;
        // The next save would find the pool empty while this one is written: make its
        // snapshot here, off the step loop, rather than fault its pages in during a step.
        let spare = state.pool.is_empty() && state.made < 2;
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

        let Job { store, layout, snapshot, manifest, policy, .. } = job;
        let started = Instant::now();
        let step = manifest.step;
        let result = store.write(&snapshot, &layout, manifest).and_then(|dir| {
            let kept: Vec<u64> = store.list()?.into_iter().filter(|l| l.committed).map(|l| l.step).collect();
            for old in policy::prune(&policy, &kept, step) {
                store.delete(old)?;
            }
            Ok(dir)
        });
        let took = started.elapsed();

        let mut state = shared.lock();
        state.busy = false;
        match result {
            Ok(_) => {
                state.stats.saves += 1;
                state.stats.write_max = state.stats.write_max.max(took);
            }
            Err(e) => {
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
        let job = |step| Job {
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

    #[test]
    fn checkpoints_that_must_all_be_written_are_written_one_save_after_another() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Store::new(dir.path().join("a")), Store::new(dir.path().join("b")));
        let layout = Arc::new(Layout { tensors: vec![], state_tensors: vec![], params: 0, state: 0 });
        let every = Policy { max_to_keep: None, best_only: None };
        let job = |store: &Store, step| Job {
            store: store.clone(),
            layout: layout.clone(),
            snapshot: Arc::new(Snapshot::default()),
            manifest: crate::checkpoint::store::tests::manifest(step),
            policy: every,
            supersedable: false,
        };
        let jobs: Vec<Vec<Job>> = (1..=4).map(|step| vec![job(&a, step), job(&b, step)]).collect();
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
