//! Which checkpoints to write and which to delete: a pure decision over the steps already
//! kept, the new checkpoint's monitored value and the best so far. The writer acts on it.

use crate::spec::Mode;
use std::num::NonZeroUsize;

/// How a store keeps checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Newest checkpoints kept (`None`: all).
    pub max_to_keep: Option<NonZeroUsize>,
    /// Write only when the monitored value improves on the best, in this direction
    /// (`save_best_only`); `Auto` was resolved by the plan.
    pub best_only: Option<Mode>,
}

impl Policy {
    /// `backup_and_restore`: the newest two, so a damaged newest one still leaves one to
    /// resume from.
    pub const BACKUP: Policy = Policy { max_to_keep: NonZeroUsize::new(2), best_only: None };
}

/// One thing to do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action {
    /// Write the checkpoint at this step.
    Write(u64),
    /// Delete the checkpoint at this step.
    Delete(u64),
    /// Write nothing: the monitored value did not improve on the best.
    SkipNotImproved {
        /// The value now.
        value: f64,
        /// The best so far.
        best: f64,
    },
    /// Write nothing: the monitored value is not known at this save (no evaluation here).
    SkipNoValue,
}

/// The actions for one save and the best value afterwards.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// In order: write first, then delete, so the newest is never missing.
    pub actions: Vec<Action>,
    /// The best monitored value after this save.
    pub best: Option<f64>,
}

fn improves(mode: Mode, value: f64, best: Option<f64>) -> bool {
    // Keras's ModelCheckpoint: strictly better, no min_delta; NaN never improves.
    match (mode, best) {
        (_, _) if value.is_nan() => false,
        (_, None) => true,
        (Mode::Max, Some(b)) => value > b,
        (Mode::Min | Mode::Auto, Some(b)) => value < b,
    }
}

/// Decides a save at `step` given the steps `kept` (committed, any order), the monitored
/// `value` at this step, and the `best` so far.
pub fn decide(policy: &Policy, kept: &[u64], step: u64, value: Option<f64>, best: Option<f64>) -> Decision {
    let mut best_after = best;
    if let Some(mode) = policy.best_only {
        match value {
            None => return Decision { actions: vec![Action::SkipNoValue], best },
            Some(v) if !improves(mode, v, best) => {
                return Decision { actions: vec![Action::SkipNotImproved { value: v, best: best.unwrap_or(v) }], best };
            }
            Some(v) => best_after = Some(v),
        }
    }
    let mut actions = vec![Action::Write(step)];
    if let Some(max) = policy.max_to_keep {
        // Checkpoints past `step` are left from a run that crashed after them and resumed
        // from an older backup: they are stale, and go first.
        let mut steps: Vec<u64> = kept.iter().copied().filter(|&s| s != step).collect();
        steps.sort_unstable();
        let (older, newer): (Vec<u64>, Vec<u64>) = steps.into_iter().partition(|&s| s < step);
        actions.extend(newer.into_iter().map(Action::Delete));
        let extra = (older.len() + 1).saturating_sub(max.get());
        actions.extend(older.into_iter().take(extra).map(Action::Delete));
    }
    Decision { actions, best: best_after }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep(n: usize) -> Policy {
        Policy { max_to_keep: NonZeroUsize::new(n), best_only: None }
    }

    #[test]
    fn keeps_the_newest_n() {
        let d = decide(&keep(2), &[10, 20, 30], 40, None, None);
        assert_eq!(d.actions, [Action::Write(40), Action::Delete(10), Action::Delete(20)]);
        let d = decide(&keep(3), &[10], 20, None, None);
        assert_eq!(d.actions, [Action::Write(20)]);
        let all = Policy { max_to_keep: None, best_only: None };
        assert_eq!(decide(&all, &[1, 2, 3], 4, None, None).actions, [Action::Write(4)]);
    }

    #[test]
    fn a_rewritten_step_is_not_counted_twice_and_stale_newer_ones_go() {
        let d = decide(&keep(2), &[10, 20, 30], 20, None, None);
        assert_eq!(d.actions, [Action::Write(20), Action::Delete(30)]);
    }

    #[test]
    fn best_only_writes_improvements_in_the_right_direction() {
        let min = Policy { max_to_keep: None, best_only: Some(Mode::Min) };
        let d = decide(&min, &[], 10, Some(0.5), None);
        assert_eq!((d.actions, d.best), (vec![Action::Write(10)], Some(0.5)));
        let d = decide(&min, &[10], 20, Some(0.6), Some(0.5));
        assert_eq!((d.actions, d.best), (vec![Action::SkipNotImproved { value: 0.6, best: 0.5 }], Some(0.5)));
        let d = decide(&min, &[10], 20, Some(0.5), Some(0.5));
        assert!(matches!(d.actions[0], Action::SkipNotImproved { .. }), "equal is no improvement");
        let max = Policy { max_to_keep: NonZeroUsize::new(1), best_only: Some(Mode::Max) };
        let d = decide(&max, &[10], 20, Some(0.9), Some(0.8));
        assert_eq!((d.actions, d.best), (vec![Action::Write(20), Action::Delete(10)], Some(0.9)));
        assert_eq!(decide(&max, &[], 5, None, Some(0.8)).actions, [Action::SkipNoValue]);
        assert!(matches!(decide(&max, &[], 5, Some(f64::NAN), None).actions[0], Action::SkipNotImproved { .. }));
    }
}
