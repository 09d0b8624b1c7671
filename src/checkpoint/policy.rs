//! Which checkpoints to write and which to delete: pure decisions over the monitored value and
//! the best so far ([`admit`]), and over the steps already kept ([`prune`]). The saver and
//! the background writer act on them.

use crate::vocab::Direction;
use std::num::NonZeroUsize;

/// How a store keeps checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Newest checkpoints kept (`None`: all).
    pub max_to_keep: Option<NonZeroUsize>,
    /// Write only when the monitored value improves on the best, in this direction
    /// (`save_best_only`).
    pub best_only: Option<Direction>,
}

impl Policy {
    /// `backup_and_restore`: the newest two, so a damaged newest one still leaves one to
    /// resume from.
    pub const BACKUP: Policy = Policy { max_to_keep: NonZeroUsize::new(2), best_only: None };
}

/// Whether to write a checkpoint now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Admit {
    /// Write it.
    Write,
    /// Write nothing: the monitored value did not improve on the best.
    NotImproved {
        /// The value now.
        value: f64,
        /// The best so far.
        best: f64,
    },
    /// Write nothing: the monitored value is not known at this save (no evaluation here).
    NoValue,
}

fn improves(direction: Direction, value: f64, best: Option<f64>) -> bool {
    // Keras's ModelCheckpoint: strictly better, no min_delta; NaN never improves.
    match (direction, best) {
        (_, _) if value.is_nan() => false,
        (_, None) => true,
        (Direction::Max, Some(b)) => value > b,
        (Direction::Min, Some(b)) => value < b,
    }
}

/// Decides whether to save given the monitored `value` now and the `best` so far; returns
/// the decision and the best value afterwards.
pub fn admit(policy: &Policy, value: Option<f64>, best: Option<f64>) -> (Admit, Option<f64>) {
    let Some(mode) = policy.best_only else { return (Admit::Write, best) };
    match value {
        None => (Admit::NoValue, best),
        Some(v) if !improves(mode, v, best) => (Admit::NotImproved { value: v, best: best.unwrap_or(v) }, best),
        Some(v) => (Admit::Write, Some(v)),
    }
}

/// The checkpoints to delete once the one at `step` is written, given the steps `kept`
/// (committed, any order): the oldest beyond `max_to_keep`, and any past `step`, which are
/// left from a run that crashed after them and resumed from an older backup.
pub fn prune(policy: &Policy, kept: &[u64], step: u64) -> Vec<u64> {
    let Some(max) = policy.max_to_keep else { return Vec::new() };
    let mut steps: Vec<u64> = kept.iter().copied().filter(|&s| s != step).collect();
    steps.sort_unstable();
    let (older, mut newer): (Vec<u64>, Vec<u64>) = steps.into_iter().partition(|&s| s < step);
    let extra = (older.len() + 1).saturating_sub(max.get());
    newer.extend(older.into_iter().take(extra));
    newer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(n: usize) -> Policy {
        Policy { max_to_keep: NonZeroUsize::new(n), best_only: None }
    }

    #[test]
    fn keeps_the_newest_n() {
        assert_eq!(prune(&keep(2), &[10, 20, 30], 40), [10, 20]);
        assert_eq!(prune(&keep(3), &[10], 20), Vec::<u64>::new());
        let all = Policy { max_to_keep: None, best_only: None };
        assert_eq!(prune(&all, &[1, 2, 3], 4), Vec::<u64>::new());
    }

    #[test]
    fn a_rewritten_step_is_not_counted_twice_and_stale_newer_ones_go() {
        assert_eq!(prune(&keep(2), &[10, 20, 30], 20), [30]);
    }

    #[test]
    fn best_only_writes_improvements_in_the_right_direction() {
        let min = Policy { max_to_keep: None, best_only: Some(Direction::Min) };
        assert_eq!(admit(&min, Some(0.5), None), (Admit::Write, Some(0.5)));
        assert_eq!(admit(&min, Some(0.6), Some(0.5)), (Admit::NotImproved { value: 0.6, best: 0.5 }, Some(0.5)));
        assert!(matches!(admit(&min, Some(0.5), Some(0.5)).0, Admit::NotImproved { .. }), "equal is no improvement");
        let max = Policy { max_to_keep: NonZeroUsize::new(1), best_only: Some(Direction::Max) };
        assert_eq!(admit(&max, Some(0.9), Some(0.8)), (Admit::Write, Some(0.9)));
        assert_eq!(admit(&max, None, Some(0.8)), (Admit::NoValue, Some(0.8)));
        assert!(matches!(admit(&max, Some(f64::NAN), None).0, Admit::NotImproved { .. }));
        let every = Policy { max_to_keep: None, best_only: None };
        assert_eq!(admit(&every, None, None), (Admit::Write, None));
    }
}
