//! Stragglers: each task times its steps ([`StepClock`]), its recent percentiles ride to the
//! chief on the heartbeat (no message of their own, so the chief's load does not grow), and
//! the chief names a task whose steps stand out ([`stragglers`]) without failing the job.
//!
//! What is timed is a task's own work in a step: the wall time of its step minus the time it
//! waited in collectives. In a synchronous job every task's wall step time is the slowest
//! task's, so only the time spent working tells the slow task from the ones waiting for it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

use super::TaskId;

/// Steps a task's percentiles cover: the most recent ones, so that a task that slows down
/// mid-run is named, and one that recovers is no longer.
const WINDOW: usize = 512;

/// A task is judged only once it has timed this many steps: the first steps (warm-up, first
/// touches of memory) say little.
const MIN_STEPS: u64 = 20;

/// A task whose median step is this many times the job's median of medians is a straggler.
/// 1.5 stays clear of the noise of tasks sharing cores (within ±20 % here) and catches a task
/// at two-thirds speed; the median of medians is robust to the straggler itself whenever
/// fewer than half of the tasks straggle, which is why three tasks at least are needed.
const SLOWER: f64 = 1.5;

/// Fewer tasks have no majority that sets the job's normal pace.
const MIN_TASKS: usize = 3;

/// One task's recent step times, as its heartbeat reports them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTimes {
    /// Steps timed so far (all of them, not only the window's).
    pub steps: u64,
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub max_ms: f64,
}

/// A task whose steps stand out, as the metrics and `summary.json` name it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Straggler {
    pub task: TaskId,
    pub p50_ms: f64,
    pub p90_ms: f64,
    /// Its median step over the job's median of medians: 2.0 is twice as slow.
    pub slower: f64,
}

/// A task's own step times, recorded by the trainer and read by the heartbeat.
#[derive(Default)]
pub(crate) struct StepClock {
    inner: Mutex<(u64, VecDeque<f64>)>,
}

impl StepClock {
    pub(crate) fn record(&self, busy: Duration) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (steps, recent) = &mut *inner;
        *steps += 1;
        if recent.len() == WINDOW {
            recent.pop_front();
        }
        recent.push_back(busy.as_secs_f64() * 1e3);
    }

    /// The window's percentiles, `None` before the first step.
    pub(crate) fn read(&self) -> Option<StepTimes> {
        let (steps, mut sorted) = {
            let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            (inner.0, Vec::from_iter(inner.1.iter().copied()))
        };
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        let max = *sorted.last()?;
        Some(StepTimes { steps, p50_ms: at(0.5), p90_ms: at(0.9), max_ms: max })
    }
}

/// The tasks whose median step is more than [`SLOWER`] times the job's median of medians,
/// slowest first; none while fewer than [`MIN_TASKS`] tasks have timed [`MIN_STEPS`] steps.
pub(crate) fn stragglers(times: &BTreeMap<TaskId, StepTimes>) -> Vec<Straggler> {
    let judged: Vec<(TaskId, StepTimes)> =
        times.iter().filter(|(_, t)| t.steps >= MIN_STEPS).map(|(&task, &t)| (task, t)).collect();
    if judged.len() < MIN_TASKS {
        return Vec::new();
    }
    let mut medians: Vec<f64> = judged.iter().map(|(_, t)| t.p50_ms).collect();
    medians.sort_by(f64::total_cmp);
    let mid = medians.len() / 2;
    let median = if medians.len().is_multiple_of(2) { (medians[mid - 1] + medians[mid]) / 2.0 } else { medians[mid] };
    if median <= 0.0 {
        return Vec::new();
    }
    let mut slow: Vec<Straggler> = judged
        .into_iter()
        .filter(|(_, t)| t.p50_ms > SLOWER * median)
        .map(|(task, t)| Straggler { task, p50_ms: t.p50_ms, p90_ms: t.p90_ms, slower: t.p50_ms / median })
        .collect();
    slow.sort_by(|a, b| b.slower.total_cmp(&a.slower));
    slow
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::Role;

    fn times(p50s: &[f64]) -> BTreeMap<TaskId, StepTimes> {
        (p50s.iter().enumerate())
            .map(|(i, &p50)| {
                let t = StepTimes { steps: 100, p50_ms: p50, p90_ms: p50 * 1.2, max_ms: p50 * 3.0 };
                (TaskId::new(Role::Worker, i as u32), t)
            })
            .collect()
    }

    #[test]
    fn the_slow_task_is_named_with_how_much_slower() {
        let found = stragglers(&times(&[2.0, 2.2, 6.3, 1.9]));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].task, TaskId::new(Role::Worker, 2));
        assert!((found[0].slower - 6.3 / 2.1).abs() < 1e-9, "{found:?}");
    }

    #[test]
    fn noise_two_tasks_and_short_runs_name_nobody() {
        assert!(stragglers(&times(&[2.0, 2.4, 2.8, 1.9])).is_empty());
        assert!(stragglers(&times(&[2.0, 9.0])).is_empty());
        let mut young = times(&[2.0, 2.0, 9.0]);
        young.values_mut().for_each(|t| t.steps = MIN_STEPS - 1);
        assert!(stragglers(&young).is_empty());
    }

    #[test]
    fn the_clock_reports_its_recent_percentiles() {
        let clock = StepClock::default();
        assert_eq!(clock.read(), None);
        for ms in 1..=10 {
            clock.record(Duration::from_millis(ms));
        }
        let t = clock.read().unwrap();
        assert_eq!((t.steps, t.p90_ms, t.max_ms), (10, 9.0, 10.0));
        assert!(t.p50_ms == 5.0 || t.p50_ms == 6.0, "{t:?}");
        for _ in 0..WINDOW {
            clock.record(Duration::from_millis(1));
        }
        assert_eq!(clock.read().unwrap().max_ms, 1.0, "old steps leave the window");
    }
}
