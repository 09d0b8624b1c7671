//! Successive halving's rule, at the end of a rung (of the whole sweep, or of one Hyperband
//! bracket): the best `keep` trials by the sweep's metric go on, the others stop; ties go to
//! the lower trial number, so the decision depends only on the values.

use super::rungs::Decision;
use serde_json::json;

/// The decision over `seen` (trial, value) keeping the best `keep`; `higher`: a higher value
/// is better.
pub(super) fn decide(seen: &[(usize, f64)], keep: usize, higher: bool) -> Decision {
    let mut ranked = seen.to_vec();
    ranked.sort_by(|a, b| {
        let order = if higher { b.1.total_cmp(&a.1) } else { a.1.total_cmp(&b.1) };
        order.then(a.0.cmp(&b.0))
    });
    let keep = keep.min(ranked.len());
    let mut promoted: Vec<usize> = ranked[..keep].iter().map(|(i, _)| *i).collect();
    promoted.sort_unstable();
    Decision {
        promoted,
        stopped: ranked[keep..].iter().map(|(i, _)| *i).collect(),
        seen: ranked.iter().map(|(i, v)| json!({ "trial": i, "value": v })).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_go_on_in_trial_order_and_ties_go_to_the_first() {
        let d = decide(&[(1, 0.5), (2, 0.9), (3, 0.9), (4, 0.1)], 2, true);
        assert_eq!((d.promoted, d.stopped), (vec![2, 3], vec![1, 4]));
        let d = decide(&[(1, 0.5), (2, 0.5), (3, 0.9)], 1, false);
        assert_eq!((d.promoted, d.stopped), (vec![1], vec![2, 3]));
        assert_eq!(d.seen[0], json!({ "trial": 1, "value": 0.5 }));
    }
}
