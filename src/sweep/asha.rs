//! Asynchronous successive halving's rule (Li et al., "A System for Massively Parallel
//! Hyperparameter Tuning", MLSys 2020, Algorithm 2), purely, for a sweep of a known number of
//! trials. Whenever a slot is free it asks for a job: the next trial starts at the first rung
//! while any has not started; once all have, from the first rung up to the one below the
//! last, a trial that is in the best ⌊n/η⌋ of the n results its rung has so far and was not
//! promoted from it yet goes on to the next rung (the best such trial, ties to the lower trial
//! number); when there is none, the slot waits for a result. A trial never promoted from its
//! rung is stopped there once the sweep ends. Each decision comes with the values it saw, so a
//! sweep can make the same decisions again whatever the timing ([`Ladder::apply`]).
//!
//! Why this order and not the paper's (promotions first, from the highest rung down): the
//! paper draws from an endless stream of configurations, where a slot that always started a
//! new one would never promote. A sweep's trials are finite and each starts anyway, so a slot
//! that promotes while a trial is still to start gains no use of the machine; it only decides
//! earlier, against fewer rivals, and the early trials of a rung go on against two or three
//! results (measured, docs/sweeps.md: 15 promotions to the second rung and 9 to the third of
//! a 27-trial grid, where halving with every result in makes 9 and 3, and 35–46 % of the
//! grid's steps). Starting first and promoting from the lowest rung up decides each rung with
//! as many of its results as the slots allow: with one slot it is synchronous successive
//! halving; with more, the slots still never wait for a rung to fill.
//!
//! Under TPE ([`Ladder::promoting_first`]) the paper's order comes back: the trials are not
//! fixed up front but drawn one by one from the results so far, a stream like the paper's.
//! Starting every trial first would leave TPE nothing but first-rung values to draw from (it
//! would search for what trains fastest in a rung's few steps, not for what ends best), so a
//! free slot promotes first, from the highest rung down, and starts a trial when none can go
//! on, as Optuna's TPE learns from each trial trained or pruned before it draws the next.

use serde_json::{Value as Json, json};
use std::collections::BTreeSet;

/// What a free slot does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AshaJob {
    /// The trial, 1-based.
    pub trial: usize,
    /// The rung (0-based) it trains to.
    pub rung: usize,
}

/// The state of an asynchronous sweep: every rung's results so far and who went on.
#[derive(Debug, Clone)]
pub(super) struct Ladder {
    /// The rungs, in the scheduler's unit; the last is what a trial trains in full.
    rungs: Vec<u64>,
    /// The reduction factor η.
    eta: usize,
    /// Whether a higher value is better.
    higher: bool,
    /// Trials the sweep has.
    trials: usize,
    /// Trials started so far (they start in order).
    started: usize,
    /// Each rung's results, in the order they arrived.
    results: Vec<Vec<(usize, f64)>>,
    /// Each rung's trials promoted from it.
    promoted: Vec<BTreeSet<usize>>,
    /// Promote before starting, from the highest rung down (the paper's order).
    promote_first: bool,
}

impl Ladder {
    /// A sweep of `trials` trials over `rungs` keeping the best 1/`eta` of each.
    pub(super) fn new(rungs: Vec<u64>, eta: u64, higher: bool, trials: usize) -> Ladder {
        let n = rungs.len();
        Ladder {
            rungs,
            eta: usize::try_from(eta).unwrap_or(usize::MAX).max(1),
            higher,
            trials,
            started: 0,
            results: vec![Vec::new(); n],
            promoted: vec![BTreeSet::new(); n],
            promote_first: false,
        }
    }

    /// The ladder that promotes before it starts a trial, from the highest rung down: for
    /// trials drawn one by one from the results so far (TPE).
    pub(super) fn promoting_first(self) -> Ladder {
        Ladder { promote_first: true, ..self }
    }

    /// The rungs, in the scheduler's unit.
    pub(super) fn rungs(&self) -> &[u64] {
        &self.rungs
    }

    /// Records trial `trial`'s `value` at rung `rung`.
    pub(super) fn report(&mut self, trial: usize, rung: usize, value: f64) {
        if let Some(list) = self.results.get_mut(rung)
            && !list.iter().any(|(t, _)| *t == trial)
        {
            list.push((trial, value));
        }
    }

    /// Trial `trial`'s value at rung `rung`, once reported.
    pub(super) fn value(&self, trial: usize, rung: usize) -> Option<f64> {
        self.results.get(rung)?.iter().find(|(t, _)| *t == trial).map(|(_, v)| *v)
    }

    /// `rung`'s results best first, ties to the lower trial number.
    fn ranked(&self, rung: usize) -> Vec<(usize, f64)> {
        let mut ranked = self.results[rung].clone();
        ranked.sort_by(|a, b| {
            let order = if self.higher { b.1.total_cmp(&a.1) } else { a.1.total_cmp(&b.1) };
            order.then(a.0.cmp(&b.0))
        });
        ranked
    }

    /// The next job and its record (the values it saw), or `None` when no trial can go on and
    /// every trial has started: the slot waits for a result, or the sweep is over.
    pub(super) fn decide(&mut self) -> Option<(AshaJob, Json)> {
        if self.promote_first {
            return self.promotion((0..self.rungs.len().saturating_sub(1)).rev()).or_else(|| self.start());
        }
        self.start().or_else(|| self.promotion(0..self.rungs.len().saturating_sub(1)))
    }

    /// The next trial's start, while any has not started.
    fn start(&mut self) -> Option<(AshaJob, Json)> {
        if self.started < self.trials {
            self.started += 1;
            let trial = self.started;
            let record = json!({ "decision": "start", "trial": trial, "rung": 1, "to": self.rungs[0] });
            return Some((AshaJob { trial, rung: 0 }, record));
        }
        None
    }

    /// The first promotion that `rungs`, in that order, allow.
    fn promotion(&mut self, rungs: impl Iterator<Item = usize>) -> Option<(AshaJob, Json)> {
        for rung in rungs {
            let ranked = self.ranked(rung);
            let top = ranked.len() / self.eta;
            let best = ranked[..top].iter().find(|(t, _)| !self.promoted[rung].contains(t));
            if let Some(&(trial, _)) = best {
                self.promoted[rung].insert(trial);
                let seen: Vec<Json> = ranked.iter().map(|(t, v)| json!({ "trial": t, "value": v })).collect();
                let record = json!({
                    "decision": "promote",
                    "trial": trial,
                    "rung": rung + 2,
                    "from": self.rungs[rung],
                    "to": self.rungs[rung + 1],
                    "top": top,
                    "seen": seen,
                });
                return Some((AshaJob { trial, rung: rung + 1 }, record));
            }
        }
        None
    }

    /// Makes the recorded decision `record` (a line `decide` wrote), or says why it cannot be
    /// made here: the sweep it came from differs from this one.
    pub(super) fn apply(&mut self, record: &Json) -> Result<AshaJob, String> {
        let trial = record.get("trial").and_then(Json::as_u64).and_then(|t| usize::try_from(t).ok());
        let to = record.get("rung").and_then(Json::as_u64).and_then(|r| usize::try_from(r).ok());
        let (Some(trial), Some(rung @ 1..)) = (trial, to) else {
            return Err(format!("`{record}` is not a decision of an asha sweep"));
        };
        let rung = rung - 1;
        if rung >= self.rungs.len() {
            return Err(format!(
                "it trains trial {trial} to rung {}, and this sweep has {}",
                rung + 1,
                self.rungs.len()
            ));
        }
        match record.get("decision").and_then(Json::as_str) {
            Some("start") if rung == 0 && trial == self.started + 1 && trial <= self.trials => {
                self.started = trial;
                Ok(AshaJob { trial, rung })
            }
            Some("start") => Err(format!(
                "it starts trial {trial}, and this sweep's next trial is {} of {}",
                self.started + 1,
                self.trials
            )),
            Some("promote") if rung > 0 && self.value(trial, rung - 1).is_some() => {
                if !self.promoted[rung - 1].insert(trial) {
                    return Err(format!("it promotes trial {trial} from rung {} a second time", rung));
                }
                Ok(AshaJob { trial, rung })
            }
            Some("promote") => Err(format!("it promotes trial {trial} from rung {rung}, which it has no result at")),
            Some(_) | None => Err(format!("`{record}` is not a decision of an asha sweep")),
        }
    }

    /// Trials stopped once the sweep is over: each with the rung (0-based) it was not promoted
    /// from, by trial number.
    pub(super) fn stopped(&self) -> Vec<(usize, usize)> {
        let last = self.rungs.len().saturating_sub(1);
        let mut out: Vec<(usize, usize)> = Vec::new();
        for rung in 0..last {
            for (trial, _) in &self.results[rung] {
                if !self.promoted[rung].contains(trial) {
                    out.push((*trial, rung));
                }
            }
        }
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(ladder: &mut Ladder) -> Vec<(usize, usize)> {
        std::iter::from_fn(|| ladder.decide()).map(|(j, _)| (j.trial, j.rung)).collect()
    }

    #[test]
    fn promoting_first_goes_on_from_the_highest_rung_before_starting_a_trial() {
        let mut l = Ladder::new(vec![1, 3, 9], 3, true, 9).promoting_first();
        assert_eq!(jobs(&mut l), (1..=9).map(|t| (t, 0)).collect::<Vec<_>>(), "nothing to promote yet");
        let mut l = Ladder::new(vec![1, 3, 9], 3, true, 9).promoting_first();
        for t in 1..=3 {
            assert_eq!(l.decide().map(|(j, _)| (j.trial, j.rung)), Some((t, 0)));
            l.report(t, 0, t as f64 / 10.0);
        }
        // Trial 3 is the best third of three results: it goes on before trial 4 starts.
        assert_eq!(l.decide().map(|(j, _)| (j.trial, j.rung)), Some((3, 1)));
        assert_eq!(l.decide().map(|(j, _)| (j.trial, j.rung)), Some((4, 0)));
        for t in 4..=9 {
            l.report(t, 0, 0.05);
        }
        l.report(3, 1, 0.9);
        l.started = 9;
        // Trial 2 is in the best third of nine at the first rung now; trial 3 is the only
        // result of the second, so nothing goes on from there: trial 2 does.
        assert_eq!(l.decide().map(|(j, _)| (j.trial, j.rung)), Some((2, 1)));
        l.report(2, 1, 0.8);
        l.report(1, 1, 0.7);
        l.promoted[0].insert(1);
        // Three results at the second rung: the highest rung goes first.
        assert_eq!(l.decide().map(|(j, _)| (j.trial, j.rung)), Some((3, 2)));
    }

    #[test]
    fn a_trial_goes_on_once_in_the_best_third_of_its_rung_so_far() {
        let mut l = Ladder::new(vec![1, 3, 9], 3, true, 3);
        // Three slots start trials 1–3; none can go on with fewer than 3 results at a rung.
        assert_eq!(jobs(&mut l), [(1, 0), (2, 0), (3, 0)]);
        l.report(2, 0, 0.5);
        l.report(1, 0, 0.9);
        assert!(l.decide().is_none(), "2 results: nobody in the top third, the slot waits");
        l.report(3, 0, 0.7);
        let (job, record) = l.decide().unwrap_or_else(|| panic!("a promotion"));
        assert_eq!((job.trial, job.rung), (1, 1));
        assert_eq!(record["seen"][0], json!({ "trial": 1, "value": 0.9 }));
        assert_eq!((record["top"].as_u64(), record["to"].as_u64()), (Some(1), Some(3)));
        // Trial 1 went on already; nobody else is in the top third.
        assert!(l.decide().is_none());
    }

    #[test]
    fn every_trial_starts_before_one_goes_on_and_lower_rungs_go_first() {
        let mut l = Ladder::new(vec![1, 3, 9], 3, true, 9);
        // Results in as each start is made: trial 4 is the best, then 7, then 2.
        let value = |t: usize, rung: usize| [0.0, 0.5, 0.8, 0.1, 0.9, 0.2, 0.3, 0.85, 0.4, 0.6][t] + rung as f64 * 0.01;
        let (mut started, mut first_promotion) = (0, None);
        // One slot: each job's result is in before the next job is decided.
        let mut order = Vec::new();
        while let Some((job, _)) = l.decide() {
            if job.rung == 0 {
                started += 1;
            } else if first_promotion.is_none() {
                first_promotion = Some(started);
            }
            order.push((job.trial, job.rung));
            l.report(job.trial, job.rung, value(job.trial, job.rung));
        }
        assert_eq!(first_promotion, Some(9), "a promotion waits for every trial to start: {order:?}");
        // The best third of all 9 goes on, best first, before the best of those goes on again:
        // synchronous successive halving, with one slot.
        assert_eq!(order[9..], [(4, 1), (7, 1), (2, 1), (4, 2)]);
        assert_eq!(l.stopped(), [(1, 0), (2, 1), (3, 0), (5, 0), (6, 0), (7, 1), (8, 0), (9, 0)]);
    }

    #[test]
    fn a_higher_rung_goes_on_once_no_lower_one_can() {
        let mut l = Ladder::new(vec![1, 2, 4], 2, true, 4);
        assert_eq!(jobs(&mut l), [(1, 0), (2, 0), (3, 0), (4, 0)]);
        l.report(1, 0, 0.9);
        l.report(2, 0, 0.8);
        assert_eq!(jobs(&mut l), [(1, 1)], "the best half of 2 results");
        l.report(1, 1, 0.95);
        l.report(3, 0, 0.1);
        // Rung 1's best half is trial 1, gone on already; rung 2 has one result: the slot waits.
        assert_eq!(jobs(&mut l), []);
        l.report(4, 0, 0.85);
        assert_eq!(jobs(&mut l), [(4, 1)]);
        l.report(4, 1, 0.5);
        assert_eq!(jobs(&mut l), [(1, 2)]);
    }

    #[test]
    fn the_best_half_goes_on_best_first_and_the_unpromoted_stop_at_the_end() {
        let mut l = Ladder::new(vec![1, 2], 2, false, 4);
        assert_eq!(jobs(&mut l), [(1, 0), (2, 0), (3, 0), (4, 0)]);
        for (t, v) in [(1, 0.3), (2, 0.1), (3, 0.2), (4, 0.4)] {
            l.report(t, 0, v);
        }
        // Losses: the best half (2, 3) goes on, best first.
        assert_eq!(jobs(&mut l), [(2, 1), (3, 1)]);
        l.report(2, 1, 0.05);
        assert_eq!(l.stopped(), [(1, 0), (4, 0)]);
    }

    #[test]
    fn a_record_replays_into_the_same_state_and_a_foreign_one_is_refused() {
        let mut live = Ladder::new(vec![1, 2], 2, true, 3);
        let mut replay = live.clone();
        let mut records = Vec::new();
        while let Some((job, record)) = live.decide() {
            records.push(record);
            live.report(job.trial, job.rung, (job.trial * 10) as f64);
        }
        for r in &records {
            let job = replay.apply(r).unwrap_or_else(|e| panic!("{e}"));
            replay.report(job.trial, job.rung, (job.trial * 10) as f64);
        }
        assert_eq!(replay.stopped(), live.stopped());
        assert!(replay.decide().is_none());
        let mut other = Ladder::new(vec![1, 2], 2, true, 3);
        let e = other.apply(&json!({ "decision": "start", "trial": 2, "rung": 1 }));
        assert_eq!(e, Err("it starts trial 2, and this sweep's next trial is 1 of 3".to_string()));
        let e = other.apply(&json!({ "decision": "promote", "trial": 1, "rung": 2 }));
        assert_eq!(e, Err("it promotes trial 1 from rung 1, which it has no result at".to_string()));
    }
}
