//! The background writer: the step loop hands it a [`Snapshot`] (a memcpy of the buffers) and
//! goes on training while this thread writes, fsyncs and prunes. Snapshots come back for reuse,
//! so steady-state saves allocate nothing and fault in no pages.

use super::{CheckpointError, Layout, Manifest, Snapshot, Store};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One checkpoint to write, and the old ones to delete after it.
pub struct Job {
    /// Where.
    pub store: Store,
    /// The model's tensors.
    pub layout: Arc<Layout>,
    /// The buffers (shared when two callbacks save the same step).
    pub snapshot: Arc<Snapshot>,
    /// The manifest, `files` still empty.
    pub manifest: Manifest,
    /// Steps to delete from `store` once this one is written.
    pub deletes: Vec<u64>,
}

enum Message {
    Write(Box<Job>),
    Flush(Sender<()>),
}

/// How saving went: the time the step loop was blocked, the time writing took.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SaveStats {
    /// Checkpoints written.
    pub saves: u64,
    /// Longest time a save blocked the step loop.
    pub block_max: Duration,
    /// Total time saves blocked the step loop.
    pub block_total: Duration,
    /// Longest background write.
    pub write_max: Duration,
}

#[derive(Default)]
struct Shared {
    error: Option<CheckpointError>,
    saves: u64,
    write_max: Duration,
    last: Option<PathBuf>,
}

/// The writer thread and its queue.
pub struct Writer {
    queue: Option<SyncSender<Message>>,
    recycled: Receiver<Snapshot>,
    pool: Vec<Snapshot>,
    shared: Arc<Mutex<Shared>>,
    thread: Option<JoinHandle<()>>,
    block_max: Duration,
    block_total: Duration,
}

impl Writer {
    /// Starts the thread. One job waits while another is written; a third save blocks until
    /// the first is on disk (back-pressure instead of unbounded memory).
    pub fn start() -> Result<Self, CheckpointError> {
        let (queue, jobs) = mpsc::sync_channel::<Message>(1);
        let (recycle, recycled) = mpsc::channel();
        let shared = Arc::new(Mutex::new(Shared::default()));
        let state = shared.clone();
        let thread = std::thread::Builder::new()
            .name("trainrun-ckpt".into())
            .spawn(move || run(&jobs, &recycle, &state))
            .map_err(|e| CheckpointError::io(std::path::Path::new("(writer thread)"))(e))?;
        Ok(Self {
            queue: Some(queue),
            recycled,
            pool: Vec::new(),
            shared,
            thread: Some(thread),
            block_max: Duration::ZERO,
            block_total: Duration::ZERO,
        })
    }

    /// A snapshot to fill: one the writer is done with, else a new one.
    pub fn take_snapshot(&mut self) -> Snapshot {
        self.pool.extend(self.recycled.try_iter());
        self.pool.pop().unwrap_or_default()
    }

    /// Makes a snapshot ready in advance, its pages touched, so that the first save does not
    /// pay for page faults inside a step.
    pub fn prepare(&mut self, params: usize, state: usize, optimizer: &[&str]) {
        let touched = |n: usize| {
            let mut v = Vec::with_capacity(n);
            v.resize(n, 0.5f32);
            v
        };
        self.pool.push(Snapshot {
            params: touched(params),
            state: touched(state),
            optimizer: optimizer.iter().map(|name| (name.to_string(), touched(params))).collect(),
            best: None,
        });
    }

    /// Queues `jobs`; `blocked_since` is when the step loop stopped to save, so the time it
    /// was blocked (snapshot and queueing) is recorded.
    pub fn submit(&mut self, jobs: Vec<Job>, blocked_since: Instant) -> Result<(), CheckpointError> {
        self.check()?;
        let queue = self.queue.as_ref().ok_or(CheckpointError::WriterGone)?;
        for job in jobs {
            queue.send(Message::Write(Box::new(job))).map_err(|_| CheckpointError::WriterGone)?;
        }
        let blocked = blocked_since.elapsed();
        self.block_max = self.block_max.max(blocked);
        self.block_total += blocked;
        Ok(())
    }

    /// The first background failure, if any.
    pub fn check(&mut self) -> Result<(), CheckpointError> {
        match self.shared.lock().unwrap_or_else(PoisonError::into_inner).error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Waits until everything queued is on disk.
    pub fn flush(&mut self) -> Result<(), CheckpointError> {
        let queue = self.queue.as_ref().ok_or(CheckpointError::WriterGone)?;
        let (tx, rx) = mpsc::channel();
        queue.send(Message::Flush(tx)).map_err(|_| CheckpointError::WriterGone)?;
        rx.recv().map_err(|_| CheckpointError::WriterGone)?;
        self.check()
    }

    /// The folder of the last checkpoint written.
    pub fn last_written(&self) -> Option<PathBuf> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner).last.clone()
    }

    /// Waits for every queued write and stops the thread.
    pub fn finish(mut self) -> Result<SaveStats, CheckpointError> {
        self.flush()?;
        self.stop();
        let s = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(SaveStats {
            saves: s.saves,
            block_max: self.block_max,
            block_total: self.block_total,
            write_max: s.write_max,
        })
    }

    fn stop(&mut self) {
        drop(self.queue.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    /// Even when training fails, a checkpoint being written is finished: it is a good one.
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(jobs: &Receiver<Message>, recycle: &Sender<Snapshot>, shared: &Mutex<Shared>) {
    // Writing yields to training: on a machine with as many compute threads as cores, the
    // checkpoint waits rather than the step.
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority on this thread's own id only changes its scheduling weight.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 10);
    }
    for message in jobs {
        let job = match message {
            Message::Write(job) => job,
            Message::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let Job { store, layout, snapshot, manifest, deletes } = *job;
        let started = Instant::now();
        let result = store.write(&snapshot, &layout, manifest).and_then(|dir| {
            for step in deletes {
                store.delete(step)?;
            }
            Ok(dir)
        });
        let took = started.elapsed();
        let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
        match result {
            Ok(dir) => {
                s.saves += 1;
                s.write_max = s.write_max.max(took);
                s.last = Some(dir);
            }
            Err(e) => {
                s.error.get_or_insert(e);
            }
        }
        drop(s);
        if let Ok(snapshot) = Arc::try_unwrap(snapshot) {
            let _ = recycle.send(snapshot);
        }
    }
}
