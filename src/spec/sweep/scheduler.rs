//! `[sweep.scheduler]`: stopping bad trials early. Synchronous successive halving, the
//! synchronous form of ASHA (Li et al., "A System for Massively Parallel Hyperparameter
//! Tuning", 2020): every trial trains `grace` epochs (the first rung); the best
//! 1/`reduction_factor` of them go on to `grace × reduction_factor` epochs, and so on, the last
//! rung being `max` epochs. A trial pauses at a rung by its own backup and a promoted one
//! resumes from it, so it ends bit-identical to a trial never paused. Decisions depend only
//! on the trials' results, so the same sweep makes the same decisions every time.

use crate::spec::Diagnostic;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU64;

/// `[sweep.scheduler]`: how trials are stopped early, chosen by `kind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum SchedulerSpec {
    /// Synchronous successive halving: all trials of a rung finish before the best go on.
    SuccessiveHalving {
        /// Epochs every trial trains before the first decision. Example: `grace = 1`.
        grace: NonZeroU64,
        /// Each rung keeps the best 1/`reduction_factor` of its trials (at least one) and
        /// trains them `reduction_factor` times as many epochs. Default: `3`.
        /// Example: `reduction_factor = 2`.
        #[serde(default = "three")]
        #[schemars(range(min = 2))]
        reduction_factor: u64,
        /// Epochs of the last rung. Default: `train.epochs`. Example: `max = 9`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<NonZeroU64>,
    },
}

fn three() -> u64 {
    3
}

impl SchedulerSpec {
    /// The rungs, in epochs, for trials of `epochs` (`train.epochs`), or the problem.
    pub fn rungs(&self, epochs: u64) -> Result<Vec<u64>, Diagnostic> {
        let SchedulerSpec::SuccessiveHalving { grace, reduction_factor, max } = self;
        let (grace, max) = (grace.get(), max.map_or(epochs, NonZeroU64::get));
        if *reduction_factor < 2 {
            return Err(Diagnostic::error(
                "sweep.scheduler.reduction_factor",
                format!("reduction_factor = {reduction_factor} never stops a trial"),
            )
            .help("use 2 or more; 3 is the default (each rung keeps the best third)"));
        }
        if grace > max {
            return Err(Diagnostic::error(
                "sweep.scheduler.grace",
                format!("grace = {grace} epochs is more than max = {max} epochs, the most a trial trains"),
            )
            .help(format!("lower grace to at most {max}, or raise max (default: train.epochs)")));
        }
        Ok(rungs(grace, *reduction_factor, max))
    }

    /// Trials a rung of `n` keeps.
    pub fn keep(&self, n: usize) -> usize {
        let SchedulerSpec::SuccessiveHalving { reduction_factor, .. } = self;
        (n / usize::try_from(*reduction_factor).unwrap_or(usize::MAX)).max(1).min(n)
    }
}

/// `grace`, `grace × η`, `grace × η²`, … below `max`, then `max`.
fn rungs(grace: u64, eta: u64, max: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut r = grace;
    while r < max {
        out.push(r);
        r = r.saturating_mul(eta);
    }
    out.push(max);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn halving(grace: u64, eta: u64, max: Option<u64>) -> SchedulerSpec {
        SchedulerSpec::SuccessiveHalving {
            grace: NonZeroU64::new(grace).unwrap_or(NonZeroU64::MIN),
            reduction_factor: eta,
            max: max.and_then(NonZeroU64::new),
        }
    }

    #[test]
    fn rungs_grow_by_the_reduction_factor_up_to_max() {
        assert_eq!(halving(1, 3, None).rungs(9).ok(), Some(vec![1, 3, 9]));
        assert_eq!(halving(1, 3, Some(5)).rungs(9).ok(), Some(vec![1, 3, 5]));
        assert_eq!(halving(2, 2, None).rungs(2).ok(), Some(vec![2]));
        assert_eq!(halving(1, 3, None).keep(27), 9);
        assert_eq!(halving(1, 3, None).keep(2), 1);
    }

    #[test]
    fn grace_above_max_and_a_factor_below_2_are_named_with_their_fix() {
        let e = halving(4, 3, None).rungs(3).err().map(|d| (d.key, d.message, d.help));
        assert_eq!(
            e,
            Some((
                "sweep.scheduler.grace".into(),
                "grace = 4 epochs is more than max = 3 epochs, the most a trial trains".into(),
                Some("lower grace to at most 3, or raise max (default: train.epochs)".into())
            ))
        );
        assert!(halving(1, 1, None).rungs(3).is_err_and(|d| d.key == "sweep.scheduler.reduction_factor"));
    }
}
