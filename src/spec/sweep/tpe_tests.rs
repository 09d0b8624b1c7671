//! TPE against random search on a closed-form objective over every parameter kind.

use super::*;
use crate::engine::init::rng;
use crate::spec::sweep::expand::draw;
use serde_json::json;

fn params() -> BTreeMap<String, SweepDistribution> {
    BTreeMap::from([
        ("lr".to_string(), SweepDistribution::LogUniform { low: 1e-5, high: 1.0 }),
        ("momentum".to_string(), SweepDistribution::Uniform { low: 0.0, high: 1.0 }),
        ("layers".to_string(), SweepDistribution::IntUniform { low: 1, high: 8 }),
        (
            "activation".to_string(),
            SweepDistribution::Choice { values: vec![json!("relu"), json!("tanh"), json!("sigmoid")] },
        ),
    ])
}

/// Lowest at lr = 10^-2.5, momentum 0.8, 5 layers, relu.
fn objective(v: &BTreeMap<String, Json>) -> f64 {
    let f = |k: &str| v.get(k).and_then(Json::as_f64).unwrap_or(f64::NAN);
    (f("lr").log10() + 2.5).powi(2)
        + 4.0 * (f("momentum") - 0.8).powi(2)
        + 0.1 * (f("layers") - 5.0).powi(2)
        + if v.get("activation") == Some(&json!("relu")) { 0.0 } else { 0.5 }
}

fn random_draw(params: &BTreeMap<String, SweepDistribution>, g: &mut ChaCha8Rng) -> BTreeMap<String, Json> {
    params.iter().map(|(k, d)| (k.clone(), draw(d, g.next_u64()))).collect()
}

const SETTINGS: TpeSettings = TpeSettings { gamma: 0.25, n_candidates: 24, multivariate: false };

#[test]
fn the_good_part_is_gamma_of_the_trials_rounded_up_at_least_one_at_most_25() {
    // Optuna's default_gamma, min(ceil(0.1 n), 25), at the default 0.1.
    let optuna = |n: usize| ((0.1 * n as f64).ceil() as usize).min(25);
    for n in [1, 9, 10, 11, 20, 26, 249, 250, 251, 1000] {
        assert_eq!(n_below(0.1, n), optuna(n), "{n}");
    }
    assert_eq!((n_below(0.1, 0), n_below(0.25, 20), n_below(0.5, 3), n_below(0.9, 100)), (0, 5, 2, 25));
}

/// The best objective of `trials` trials: random, or TPE after `startup` random ones.
fn best(seed: u64, trials: usize, startup: Option<usize>) -> f64 {
    best_of(&params(), objective, SETTINGS, seed, trials, startup)
}

/// [`best`] of any parameters, objective and settings.
fn best_of(
    params: &BTreeMap<String, SweepDistribution>,
    objective: fn(&BTreeMap<String, Json>) -> f64,
    settings: TpeSettings,
    seed: u64,
    trials: usize,
    startup: Option<usize>,
) -> f64 {
    let mut g = rng(&[seed, 1]);
    let mut history: Vec<Observation> = Vec::new();
    for t in 0..trials {
        let values = match startup {
            Some(s) if t >= s => suggest(params, &history, settings, &mut rng(&[seed, 2, t as u64])),
            _ => random_draw(params, &mut g),
        };
        let loss = objective(&values);
        history.push(Observation { values, loss, stopped_at: None });
    }
    history.iter().map(|o| o.loss).fold(f64::INFINITY, f64::min)
}

#[test]
fn tpe_beats_random_search_on_most_seeds() {
    tpe_beats_random_search(SETTINGS);
}

#[test]
fn multivariate_tpe_beats_random_search_on_most_seeds() {
    tpe_beats_random_search(TpeSettings { multivariate: true, ..SETTINGS });
}

/// Two good regions that share no coordinate: a high x with a low y, or a low x with a high
/// y. Each parameter's values among the good trials spread over both, so an estimator of each
/// on its own draws the bad mixtures (both high, both low) as often as the good ones.
fn two_modes(v: &BTreeMap<String, Json>) -> f64 {
    let f = |k: &str| v.get(k).and_then(Json::as_f64).unwrap_or(f64::NAN);
    let (x, y) = (f("x"), f("y"));
    ((x - 0.8).powi(2) + (y - 0.2).powi(2)).min((x - 0.2).powi(2) + (y - 0.8).powi(2))
}

#[test]
fn multivariate_tpe_draws_values_that_worked_together() {
    let params = BTreeMap::from([
        ("x".to_string(), SweepDistribution::Uniform { low: 0.0, high: 1.0 }),
        ("y".to_string(), SweepDistribution::Uniform { low: 0.0, high: 1.0 }),
    ]);
    let joint = TpeSettings { multivariate: true, ..SETTINGS };
    let seeds = 40;
    let (mut wins, mut joint_sum, mut independent_sum) = (0, 0.0, 0.0);
    for seed in 0..seeds {
        let j = best_of(&params, two_modes, joint, seed, 30, Some(10));
        let i = best_of(&params, two_modes, SETTINGS, seed, 30, Some(10));
        wins += usize::from(j < i);
        joint_sum += j;
        independent_sum += i;
    }
    println!("joint beat independent on {wins} of {seeds} seeds; mean best {joint_sum:.5} vs {independent_sum:.5}");
    assert!(wins * 10 >= seeds as usize * 6, "joint won {wins} of {seeds}");
    assert!(joint_sum < 0.75 * independent_sum, "mean best {joint_sum} vs {independent_sum}");
}

fn tpe_beats_random_search(settings: TpeSettings) {
    let seeds = 40;
    let (mut wins, mut tpe_sum, mut random_sum) = (0, 0.0, 0.0);
    for seed in 0..seeds {
        let tpe = best_of(&params(), objective, settings, seed, 40, Some(10));
        let random = best(seed, 40, None);
        wins += usize::from(tpe < random);
        tpe_sum += tpe;
        random_sum += random;
    }
    let (tpe_mean, random_mean) = (tpe_sum / seeds as f64, random_sum / seeds as f64);
    println!("TPE beat random on {wins} of {seeds} seeds; mean best {tpe_mean:.4} vs {random_mean:.4}");
    assert!(wins * 10 >= seeds as usize * 7, "TPE won {wins} of {seeds}; mean best {tpe_mean} vs random {random_mean}");
    assert!(tpe_mean < 0.75 * random_mean, "mean best {tpe_mean} vs random {random_mean}");
}

#[test]
fn a_suggestion_depends_only_on_the_seed_and_the_results_and_stays_in_range() {
    for settings in [SETTINGS, TpeSettings { multivariate: true, ..SETTINGS }] {
        in_range(settings);
    }
}

fn in_range(settings: TpeSettings) {
    let params = params();
    let mut g = rng(&[7, 1]);
    let history: Vec<Observation> = (0..12)
        .map(|_| {
            let values = random_draw(&params, &mut g);
            Observation { loss: objective(&values), values, stopped_at: None }
        })
        .collect();
    let a = suggest(&params, &history, settings, &mut rng(&[7, 2]));
    assert_eq!(a, suggest(&params, &history, settings, &mut rng(&[7, 2])));
    for seed in 0..50 {
        let v = suggest(&params, &history, settings, &mut rng(&[seed, 3]));
        let lr = v.get("lr").and_then(Json::as_f64).unwrap_or(-1.0);
        let layers = v.get("layers").and_then(Json::as_i64).unwrap_or(-1);
        assert!((1e-5..=1.0).contains(&lr) && (1..=8).contains(&layers), "{v:?}");
        assert!(["relu", "tanh", "sigmoid"].map(|s| json!(s)).contains(&v["activation"]), "{v:?}");
    }
    // No history: the priors alone, still in range.
    let v = suggest(&params, &[], settings, &mut rng(&[1, 2]));
    assert!(v.get("momentum").and_then(Json::as_f64).is_some_and(|m| (0.0..=1.0).contains(&m)), "{v:?}");
}

#[test]
fn the_error_function_matches_known_values() {
    for (x, want) in [(0.0, 0.0), (0.5, 0.520_499_877_8), (1.0, 0.842_700_792_9), (-2.0, -0.995_322_265)] {
        assert!((erf(x) - want).abs() < 2e-7, "erf({x}) = {}", erf(x));
    }
}

#[test]
fn stopped_trials_count_after_finished_ones_the_furthest_first_as_optuna_splits_them() {
    let o = |loss: f64, stopped_at: Option<u64>| Observation { values: Default::default(), loss, stopped_at };
    let mut list = [o(0.1, Some(1)), o(0.5, None), o(0.3, Some(3)), o(0.2, Some(3)), o(0.9, None)];
    list.sort_by(better);
    let order: Vec<(f64, Option<u64>)> = list.iter().map(|o| (o.loss, o.stopped_at)).collect();
    assert_eq!(order, [(0.5, None), (0.9, None), (0.2, Some(3)), (0.3, Some(3)), (0.1, Some(1))]);
}
