//! The median stopping rule (Golovin et al., "Google Vizier", 2017; Ray Tune's
//! `MedianStoppingRule`), at the end of a rung: a trial stops when its best value so far is
//! worse than the median of the other trials' running averages (the mean of their values at
//! every rung so far), once at least `min_samples` other trials reached the rung. The trial
//! with the best value so far never stops, so at least one trial goes on.

use super::rungs::Decision;
use serde_json::json;
use std::collections::BTreeMap;

/// The decision over `seen` (trial, value at this rung) given every trial's values so far
/// (`history`, this rung's included); `higher`: a higher value is better.
pub(super) fn decide(
    seen: &[(usize, f64)],
    history: &BTreeMap<usize, Vec<f64>>,
    min_samples: u64,
    higher: bool,
) -> Decision {
    let values = |i: usize| history.get(&i).map_or(&[][..], Vec::as_slice);
    let average = |i: usize| values(i).iter().sum::<f64>() / values(i).len().max(1) as f64;
    let best = |i: usize| {
        let all = values(i).iter().copied();
        if higher { all.fold(f64::NEG_INFINITY, f64::max) } else { all.fold(f64::INFINITY, f64::min) }
    };
    let mut decision = Decision { promoted: Vec::new(), stopped: Vec::new(), seen: Vec::new() };
    for &(i, value) in seen {
        let mut others: Vec<f64> = seen.iter().filter(|(j, _)| *j != i).map(|(j, _)| average(*j)).collect();
        let median = (others.len() as u64 >= min_samples.max(1)).then(|| median(&mut others));
        let worse = median.is_some_and(|m| if higher { best(i) < m } else { best(i) > m });
        if worse {
            decision.stopped.push(i)
        } else {
            decision.promoted.push(i)
        }
        decision.seen.push(json!({ "trial": i, "value": value, "best": best(i), "median_of_others": median }));
    }
    decision
}

/// The median of a non-empty list (the mean of the middle two of an even one).
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 { values[n / 2] } else { (values[n / 2 - 1] + values[n / 2]) / 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(rows: &[(usize, &[f64])]) -> BTreeMap<usize, Vec<f64>> {
        rows.iter().map(|(i, v)| (*i, v.to_vec())).collect()
    }

    #[test]
    fn a_trial_below_the_median_of_the_others_running_averages_stops() {
        // Accuracies after two rungs: trial 4's best (0.6) is below the median of the others'
        // running averages (0.65, 0.75, 0.85 → 0.75); trial 1's best 0.7 is below it too.
        let h = history(&[(1, &[0.6, 0.7]), (2, &[0.7, 0.8]), (3, &[0.8, 0.9]), (4, &[0.6, 0.5])]);
        let seen: Vec<(usize, f64)> = h.iter().map(|(i, v)| (*i, v[1])).collect();
        let d = decide(&seen, &h, 3, true);
        assert_eq!((d.promoted, d.stopped), (vec![2, 3], vec![1, 4]));
        assert_eq!(d.seen[3]["median_of_others"], json!(0.75));
        // Losses: lower is better, the same shape mirrored.
        let h = history(&[(1, &[0.4, 0.3]), (2, &[0.3, 0.2]), (3, &[0.2, 0.1]), (4, &[0.4, 0.5])]);
        let seen: Vec<(usize, f64)> = h.iter().map(|(i, v)| (*i, v[1])).collect();
        let d = decide(&seen, &h, 3, false);
        assert_eq!((d.promoted, d.stopped), (vec![2, 3], vec![1, 4]));
    }

    #[test]
    fn nobody_stops_below_min_samples_and_the_best_never_stops() {
        let h = history(&[(1, &[0.1]), (2, &[0.9]), (3, &[0.5])]);
        let seen: Vec<(usize, f64)> = h.iter().map(|(i, v)| (*i, v[0])).collect();
        assert!(decide(&seen, &h, 3, true).stopped.is_empty());
        let d = decide(&seen, &h, 2, true);
        assert_eq!((d.promoted, d.stopped), (vec![2, 3], vec![1]));
    }
}
