//! The launcher's restarts of expendable tasks (workers under `parameter_server`): a worker
//! that dies is started again on its own, at once, with the job's address and token, and
//! rejoins the running job; the other tasks never stop. This is what TensorFlow users get from
//! their cluster manager (Kubernetes restarts the pod) and `ClusterCoordinator` (it waits for
//! the worker and gives it work again), so it is not counted against `cluster.max_restarts`,
//! which restarts the whole job from a backup. A worker that keeps dying soon after its start
//! is crash-looping: each further restart waits twice as long (from `restart_backoff`), and
//! one ending with a code no restart cures (a bad spec, missing data) is left out.

use super::TaskId;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A restarted task that dies within this long of its start counts as crash-looping.
const QUICK_DEATH: Duration = Duration::from_secs(10);

/// The longest wait before a crash-looping task is started again.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Restarts of expendable tasks within one start of the job.
#[derive(Debug, Default)]
pub(crate) struct Rejoins {
    /// When each task's process was last started, and its quick deaths in a row.
    started: BTreeMap<TaskId, (Instant, u32)>,
    /// Restarts waiting out their back-off.
    due: BTreeMap<TaskId, Instant>,
}

impl Rejoins {
    /// Every task of the job started now.
    pub(crate) fn new(tasks: impl IntoIterator<Item = TaskId>, now: Instant) -> Self {
        Self { started: tasks.into_iter().map(|t| (t, (now, 0))).collect(), due: BTreeMap::new() }
    }

    /// `task` died at `now`: schedules its restart and returns the wait before it.
    pub(crate) fn died(&mut self, task: TaskId, now: Instant, backoff: Duration) -> Duration {
        let (since, quick) = self.started.get(&task).copied().unwrap_or((now, 0));
        let quick = if now.duration_since(since) < QUICK_DEATH { quick + 1 } else { 0 };
        // The first death of a task that ran a while costs no wait: a worker kill should cost
        // the job as little training as possible.
        let wait = match quick {
            0 | 1 => Duration::ZERO,
            n => backoff.saturating_mul(1 << (n - 2).min(16)).min(MAX_WAIT),
        };
        self.started.insert(task, (now, quick));
        self.due.insert(task, now + wait);
        wait
    }

    /// The tasks whose restart is due at `now`; each is marked started.
    pub(crate) fn ready(&mut self, now: Instant) -> Vec<TaskId> {
        let ready: Vec<TaskId> = self.due.iter().filter(|(_, at)| **at <= now).map(|(t, _)| *t).collect();
        for t in &ready {
            self.due.remove(t);
            if let Some(s) = self.started.get_mut(t) {
                s.0 = now;
            }
        }
        ready
    }

    /// Whether a restart is waiting.
    pub(crate) fn pending(&self) -> bool {
        !self.due.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Role;

    #[test]
    fn a_worker_that_ran_a_while_restarts_at_once_and_a_crash_loop_backs_off() {
        let w = TaskId::new(Role::Worker, 1);
        let t0 = Instant::now();
        let mut r = Rejoins::new([w], t0);
        let backoff = Duration::from_secs(1);
        // Killed after a minute of training: started again at once.
        let t1 = t0 + Duration::from_secs(60);
        assert_eq!(r.died(w, t1, backoff), Duration::ZERO);
        assert!(r.pending());
        assert_eq!(r.ready(t1), vec![w]);
        assert!(!r.pending());
        // Dies 1 s after that restart: once more at once (a kill right after a restart).
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(r.died(w, t2, backoff), Duration::ZERO);
        assert_eq!(r.ready(t2), vec![w]);
        // Again and again soon after each start: 1 s, 2 s, 4 s…
        let t3 = t2 + Duration::from_secs(1);
        assert_eq!(r.died(w, t3, backoff), Duration::from_secs(1));
        assert_eq!(r.ready(t3), Vec::<TaskId>::new(), "not due yet");
        let t4 = t3 + Duration::from_secs(1);
        assert_eq!(r.ready(t4), vec![w]);
        let t5 = t4 + Duration::from_secs(2);
        assert_eq!(r.died(w, t5, backoff), Duration::from_secs(2));
        // A long run in between resets the count.
        let t6 = t5 + Duration::from_secs(2);
        assert_eq!(r.ready(t6), vec![w]);
        assert_eq!(r.died(w, t6 + Duration::from_secs(30), backoff), Duration::ZERO);
    }
}
