//! The chief's `ClusterCoordinator`: closures of `steps_per_execution` steps go through a
//! bounded queue to one thread per worker. Execution is at least once: a closure whose worker
//! is lost goes back to the front of the queue and the worker rejoins when it can. The first
//! error a closure raises is returned once, by the next `schedule` or `join`, and every queued
//! closure is then cancelled, as TensorFlow's coordinator does. With `max_staleness = s` a
//! worker more than `s` steps ahead of the slowest live worker waits (stale-synchronous).
//!
//! The coordinator knows workers only through [`Worker`], so the scheduling rules are tested
//! here with fake workers and the transport stays a separate file.

use std::collections::VecDeque;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often a join looks at the stop request while no closure ends.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Steps `first_step..first_step + steps` as one unit of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closure {
    /// Its place in scheduling order.
    pub id: u64,
    /// The first global step it runs.
    pub first_step: u64,
    /// Steps it runs (`steps_per_execution`, fewer at an epoch's end).
    pub steps: u64,
}

/// Why a closure did not complete on a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClosureFailure {
    /// The worker is gone (killed, preempted, unreachable): the closure runs again elsewhere.
    WorkerLost(String),
    /// The closure itself failed (a ps is gone, a non-finite loss): the job fails.
    Failed(String),
}

/// One remote worker as the coordinator drives it.
pub trait Worker: Send + 'static {
    /// Runs `closure` to completion: pulls variables, computes and pushes each step.
    fn run(&mut self, closure: &Closure) -> Result<(), ClosureFailure>;
    /// Waits for the lost worker to come back (the launcher restarts it); `false` when it
    /// will not, and the coordinator stops using it. Gives up as soon as `give_up` says so
    /// (the job is ending).
    fn rejoin(&mut self, give_up: &dyn Fn() -> bool) -> bool;
}

/// The job failed; returned once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorError {
    /// A closure failed on a worker.
    #[error("closure {closure} (steps from {first_step}) failed on worker {worker}: {message}")]
    Closure { closure: u64, first_step: u64, worker: usize, message: String },
    /// Every worker is gone for good with work left.
    #[error("every worker is gone and {0} closures are left")]
    NoWorkers(usize),
}

/// What the coordinator did, for `summary.json` and `metrics.jsonl`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Closures scheduled.
    pub scheduled: u64,
    /// Steps completed by each worker.
    pub steps_per_worker: Vec<u64>,
    /// Closures run again after their worker was lost.
    pub rescheduled: u64,
    /// Times each worker came back after it was lost.
    pub rejoins_per_worker: Vec<u64>,
    /// Steps completed by each worker since it last came back.
    pub steps_since_rejoin: Vec<u64>,
    /// Milliseconds each worker was lost before it came back, in all.
    pub absent_ms_per_worker: Vec<u64>,
    /// Queued closures dropped after the first error, or at a stop.
    pub cancelled: u64,
}

impl Stats {
    /// Steps completed by all workers.
    pub fn steps_applied(&self) -> u64 {
        self.steps_per_worker.iter().sum()
    }
}

struct QueueState {
    queue: VecDeque<Closure>,
    in_flight: usize,
    /// Workers taking work now (not lost, not rejoining).
    live: Vec<bool>,
    /// Workers that will not come back.
    gone: usize,
    error: Option<CoordinatorError>,
    stats: Stats,
    closing: bool,
    /// Failures of closures scheduled before this id belong to an error already recorded:
    /// only the first error of a batch is returned.
    quiet_before: u64,
}

impl QueueState {
    /// Whether worker `w` must wait for slower live workers before taking more work.
    fn too_far_ahead(&self, w: usize, max_staleness: Option<u64>) -> bool {
        let Some(s) = max_staleness else { return false };
        let slowest =
            (0..self.live.len()).filter(|&i| self.live[i] && i != w).map(|i| self.stats.steps_per_worker[i]).min();
        slowest.is_some_and(|slowest| self.stats.steps_per_worker[w] > slowest + s)
    }

    /// Drops the queue (after the first error, or at a stop); returns the steps dropped.
    fn cancel_queued(&mut self) -> u64 {
        self.stats.cancelled += self.queue.len() as u64;
        self.queue.drain(..).map(|c| c.steps).sum()
    }
}

struct QueueShared {
    state: Mutex<QueueState>,
    changed: Condvar,
    capacity: usize,
    max_staleness: Option<u64>,
}

impl QueueShared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A worker thread that panicked leaves consistent counters: every update is one
        // statement under the lock.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, QueueState>) -> MutexGuard<'a, QueueState> {
        self.changed.wait(guard).unwrap_or_else(PoisonError::into_inner)
    }

    fn wait_timeout<'a>(&self, guard: MutexGuard<'a, QueueState>, timeout: Duration) -> MutexGuard<'a, QueueState> {
        self.changed.wait_timeout(guard, timeout).map_or_else(|e| e.into_inner().0, |(g, _)| g)
    }
}

/// The chief's coordinator over a fixed set of workers.
pub struct Coordinator {
    shared: Arc<QueueShared>,
    threads: Vec<JoinHandle<()>>,
}

impl Coordinator {
    /// Starts one thread per worker; `queue_size` closures may wait before `schedule` blocks.
    pub fn new<W: Worker>(workers: Vec<W>, queue_size: NonZeroUsize, max_staleness: Option<u64>) -> Self {
        let n = workers.len();
        let shared = Arc::new(QueueShared {
            state: Mutex::new(QueueState {
                queue: VecDeque::new(),
                in_flight: 0,
                live: vec![true; n],
                gone: 0,
                error: None,
                stats: Stats {
                    steps_per_worker: vec![0; n],
                    rejoins_per_worker: vec![0; n],
                    steps_since_rejoin: vec![0; n],
                    absent_ms_per_worker: vec![0; n],
                    ..Stats::default()
                },
                closing: false,
                quiet_before: 0,
            }),
            changed: Condvar::new(),
            capacity: queue_size.get(),
            max_staleness,
        });
        let threads = workers
            .into_iter()
            .enumerate()
            .map(|(w, worker)| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || drive(&shared, w, worker))
            })
            .collect();
        Self { shared, threads }
    }

    /// Queues `steps` steps from `first_step`, blocking while the queue is full. Returns the
    /// first error instead, once, if a closure has failed.
    pub fn schedule(&self, first_step: u64, steps: u64) -> Result<u64, CoordinatorError> {
        let mut s = self.shared.lock();
        loop {
            if let Some(e) = s.error.take() {
                return Err(e);
            }
            if s.queue.len() < self.shared.capacity {
                break;
            }
            s = self.shared.wait(s);
        }
        let id = s.stats.scheduled;
        s.stats.scheduled += 1;
        s.queue.push_back(Closure { id, first_step, steps });
        self.shared.changed.notify_all();
        Ok(id)
    }

    /// Drops the closures not started yet, for a stop: [`Coordinator::join`] then waits only
    /// for those in flight. Returns the steps dropped, which were never run.
    pub fn cancel(&self) -> u64 {
        let steps = self.shared.lock().cancel_queued();
        self.shared.changed.notify_all();
        steps
    }

    /// Waits until every scheduled closure has completed or been cancelled; returns the first
    /// error, once.
    pub fn join(&self) -> Result<(), CoordinatorError> {
        self.join_unless(&AtomicBool::new(false)).map(|_| ())
    }

    /// [`Coordinator::join`], but once `stop` is set the closures not started yet are dropped
    /// and only those in flight are waited for: a stop request takes effect within a closure,
    /// however many are queued. Returns the steps dropped.
    pub fn join_unless(&self, stop: &AtomicBool) -> Result<u64, CoordinatorError> {
        let mut dropped = 0;
        let mut s = self.shared.lock();
        loop {
            if dropped == 0 && stop.load(Ordering::Relaxed) {
                dropped = s.cancel_queued();
            }
            if let Some(e) = s.error.take() {
                return Err(e);
            }
            if s.queue.is_empty() && s.in_flight == 0 {
                return Ok(dropped);
            }
            if s.gone == s.live.len() {
                let left = s.queue.len();
                s.cancel_queued();
                return Err(CoordinatorError::NoWorkers(left));
            }
            // Woken by every closure that ends; the timeout only bounds how late a stop
            // request is seen when none does.
            s = self.shared.wait_timeout(s, STOP_POLL);
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.shared.lock().stats.clone()
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        {
            let mut s = self.shared.lock();
            s.closing = true;
            s.cancel_queued();
        }
        self.shared.changed.notify_all();
        for t in self.threads.drain(..) {
            // A worker thread that panicked has nothing left to report.
            let _ = t.join();
        }
    }
}

/// One worker's thread: take a closure, run it, record what happened.
fn drive<W: Worker>(shared: &QueueShared, w: usize, mut worker: W) {
    loop {
        let closure = {
            let mut s = shared.lock();
            loop {
                if s.closing {
                    return;
                }
                if !s.queue.is_empty() && !s.too_far_ahead(w, shared.max_staleness) {
                    break;
                }
                s = shared.wait(s);
            }
            let Some(c) = s.queue.pop_front() else { continue };
            s.in_flight += 1;
            shared.changed.notify_all();
            c
        };
        let result = worker.run(&closure);
        let lost = {
            let mut s = shared.lock();
            s.in_flight -= 1;
            let lost = match result {
                Ok(()) => {
                    s.stats.steps_per_worker[w] += closure.steps;
                    s.stats.steps_since_rejoin[w] += closure.steps;
                    false
                }
                Err(ClosureFailure::WorkerLost(_)) => {
                    // At least once: the closure runs next, on whichever worker is free.
                    s.stats.rescheduled += 1;
                    if !s.closing {
                        s.queue.push_front(closure);
                    }
                    s.live[w] = false;
                    true
                }
                Err(ClosureFailure::Failed(message)) => {
                    if closure.id >= s.quiet_before {
                        s.quiet_before = s.stats.scheduled;
                        s.error = Some(CoordinatorError::Closure {
                            closure: closure.id,
                            first_step: closure.first_step,
                            worker: w,
                            message,
                        });
                        s.cancel_queued();
                    }
                    false
                }
            };
            shared.changed.notify_all();
            lost
        };
        if lost {
            let since = std::time::Instant::now();
            let back = worker.rejoin(&|| shared.lock().closing);
            let mut s = shared.lock();
            s.stats.absent_ms_per_worker[w] += since.elapsed().as_millis() as u64;
            s.live[w] = back;
            s.gone += usize::from(!back);
            if back {
                s.stats.rejoins_per_worker[w] += 1;
                s.stats.steps_since_rejoin[w] = 0;
            }
            shared.changed.notify_all();
            if !back {
                return;
            }
        }
    }
}

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;
