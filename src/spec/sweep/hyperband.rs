//! Hyperband's brackets (Li et al., "Hyperband: A Novel Bandit-Based Approach to
//! Hyperparameter Optimization", JMLR 2018), purely. With `R = max / grace` and
//! `s_max = ⌊log_η R⌋`, bracket `s` (from `s_max` down to 0) is successive halving over
//! `n_s = ⌈(s_max + 1) η^s / (s + 1)⌉` trials starting at `max / η^s`: the first bracket tries
//! many trials briefly, the last trains a few to `max` straight away, which hedges against a
//! metric that ranks trials early differently from late. Trials fill the brackets in order,
//! `s_max` first, and start over at `s_max` when a round of brackets is full, as Ray Tune's
//! `HyperBandScheduler` does.

use super::scheduler::RungGroup;

/// The brackets of `trials` trials, each a group with its rungs (every rung at least `grace`,
/// the last `max`); brackets left without trials are left out.
pub fn brackets(grace: u64, eta: u64, max: u64, trials: usize) -> Vec<RungGroup> {
    let mut s_max: u32 = 0;
    while eta.checked_pow(s_max + 1).and_then(|p| p.checked_mul(grace)).is_some_and(|r| r <= max) {
        s_max += 1;
    }
    let sizes: Vec<(u32, usize)> = (0..=s_max)
        .rev()
        .map(|s| {
            let trials = u64::from(s_max + 1).saturating_mul(eta.saturating_pow(s)).div_ceil(u64::from(s + 1));
            (s, usize::try_from(trials).unwrap_or(usize::MAX))
        })
        .collect();
    let mut groups = Vec::new();
    let mut next = 1;
    'rounds: loop {
        for &(s, size) in &sizes {
            if next > trials {
                break 'rounds;
            }
            let last = (next + size - 1).min(trials);
            groups.push(RungGroup {
                bracket: Some(s),
                trials: (next..=last).collect(),
                rungs: rungs(grace, eta, max, s),
            });
            next = last + 1;
        }
    }
    groups
}

/// Bracket `s`'s rungs: `max / η^s`, `max / η^(s-1)`, …, `max`, each at least `grace`.
fn rungs(grace: u64, eta: u64, max: u64, s: u32) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::new();
    for i in (0..=s).rev() {
        let r = (max / eta.saturating_pow(i)).max(grace);
        if out.last() != Some(&r) {
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(groups: &[RungGroup]) -> Vec<(Option<u32>, usize, Vec<u64>)> {
        groups.iter().map(|g| (g.bracket, g.trials.len(), g.rungs.clone())).collect()
    }

    #[test]
    fn brackets_follow_the_paper() {
        // The paper's table for R = 81, η = 3: n = 81, 34, 15, 8, 5 starting at 1, 3, 9, 27, 81.
        let b = brackets(1, 3, 81, 143);
        assert_eq!(b.iter().map(|g| g.trials.len()).collect::<Vec<_>>(), [81, 34, 15, 8, 5]);
        assert_eq!(b.iter().map(|g| g.rungs[0]).collect::<Vec<_>>(), [1, 3, 9, 27, 81]);
        assert_eq!(b[0].rungs, [1, 3, 9, 27, 81]);
        assert_eq!(b[4].trials, (139..=143).collect::<Vec<_>>());
    }

    #[test]
    fn few_trials_fill_the_first_brackets_and_many_start_a_new_round() {
        assert_eq!(shape(&brackets(1, 2, 2, 3)), [(Some(1), 2, vec![1, 2]), (Some(0), 1, vec![2])]);
        assert_eq!(shape(&brackets(1, 3, 9, 2)), [(Some(2), 2, vec![1, 3, 9])]);
        let round = brackets(1, 2, 2, 5);
        assert_eq!(shape(&round), [(Some(1), 2, vec![1, 2]), (Some(0), 2, vec![2]), (Some(1), 1, vec![1, 2])]);
        // A max that is no power of η: rungs still end at max, none below grace.
        assert_eq!(shape(&brackets(2, 3, 10, 9))[0], (Some(1), 3, vec![3, 10]));
        assert_eq!(shape(&brackets(1, 3, 10, 1))[0], (Some(2), 1, vec![1, 3, 10]));
    }
}
