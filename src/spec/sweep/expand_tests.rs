//! Unit tests of sweep expansion: order, names, sources, seeds, random draws, problems.

use super::*;
use crate::spec::{GridValues, RandomSpec};
use serde_json::json;
use std::num::NonZeroU32;

fn grid(pairs: &[(&str, Json)]) -> SweepSpec {
    let grid =
        pairs.iter().map(|(k, v)| (k.to_string(), GridValues(v.as_array().cloned().unwrap_or_default()))).collect();
    SweepSpec { grid, ..SweepSpec::default() }
}

fn trials(sweep: &SweepSpec, seed: u64) -> Vec<Trial> {
    match expand(sweep, seed) {
        Ok(t) => t,
        Err(problems) => panic!("{problems:?}"),
    }
}

fn random(samples: u32, parameters: &[(&str, SweepDistribution)]) -> Option<RandomSpec> {
    Some(RandomSpec {
        samples: NonZeroU32::new(samples).unwrap_or(NonZeroU32::MIN),
        parameters: parameters.iter().map(|(k, d)| (k.to_string(), d.clone())).collect(),
    })
}

#[test]
fn the_grid_is_a_cartesian_product_in_key_order() {
    let sweep = grid(&[("optimizer.learning_rate", json!([0.1, 0.01])), ("batch.global", json!([32, 64]))]);
    let t = trials(&sweep, 42);
    let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["trial-001-batch32-lr0.1", "trial-002-batch32-lr0.01", "trial-003-batch64-lr0.1", "trial-004-batch64-lr0.01"]
    );
    assert_eq!(t[2].describe(), "batch.global = 64, optimizer.learning_rate = 0.1");
    assert_eq!(t[2].values[0].source, "sweep.grid.\"batch.global\"[1]");
    assert_eq!(t[2].values[1].source, "sweep.grid.\"optimizer.learning_rate\"[0]");
    assert_eq!(t.iter().map(|t| t.index).collect::<Vec<_>>(), [1, 2, 3, 4]);
}

#[test]
fn seeds_are_stable_distinct_and_follow_the_sweep_seed() {
    let sweep = grid(&[("optimizer.learning_rate", json!([0.1, 0.01, 0.001]))]);
    let a = trials(&sweep, 42);
    let b = trials(&sweep, 42);
    assert_eq!(a, b, "expansion is deterministic");
    let seeds: Vec<u64> = a.iter().map(|t| t.seed).collect();
    assert!(seeds[0] != seeds[1] && seeds[1] != seeds[2] && seeds[0] != seeds[2], "{seeds:?}");
    assert!(seeds.iter().all(|s| *s <= u64::from(u32::MAX)));
    let other: Vec<u64> = trials(&sweep, 7).iter().map(|t| t.seed).collect();
    assert_ne!(seeds, other, "the sweep seed changes every trial's seed");
    // A trial's seed depends on its values, not on its position.
    let reordered = grid(&[("optimizer.learning_rate", json!([0.001, 0.1]))]);
    let r = trials(&reordered, 42);
    assert_eq!(r[0].seed, seeds[2]);
    assert_eq!(r[1].seed, seeds[0]);
    // Sweeping run.seed itself sets it.
    let by_seed = grid(&[("run.seed", json!([1, 2]))]);
    assert_eq!(trials(&by_seed, 42).iter().map(|t| t.seed).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn random_draws_are_seeded_in_range_and_rounded() {
    let sweep = SweepSpec {
        random: random(
            20,
            &[
                ("optimizer.learning_rate", SweepDistribution::LogUniform { low: 1e-4, high: 1e-1 }),
                ("optimizer.momentum", SweepDistribution::Uniform { low: 0.5, high: 0.9 }),
                ("train.epochs", SweepDistribution::IntUniform { low: 1, high: 3 }),
                ("batch.global", SweepDistribution::Choice { values: vec![json!(32), json!(64)] }),
            ],
        ),
        ..SweepSpec::default()
    };
    let t = trials(&sweep, 3);
    assert_eq!(t.len(), 20);
    assert_eq!(t, trials(&sweep, 3));
    assert_ne!(t, trials(&sweep, 4));
    let column = |key: &str| -> Vec<Json> {
        t.iter().map(|t| t.values.iter().find(|a| a.key == key).map(|a| a.value.clone()).unwrap_or_default()).collect()
    };
    for lr in column("optimizer.learning_rate") {
        let x = lr.as_f64().unwrap_or(-1.0);
        assert!((1e-4..=1e-1).contains(&x), "{x}");
        assert_eq!(format!("{x:.3e}").parse::<f64>().ok(), Some(x), "4 significant digits: {x}");
    }
    let m: Vec<f64> = column("optimizer.momentum").iter().filter_map(Json::as_f64).collect();
    assert!(m.iter().all(|x| (0.5..=0.9).contains(x)), "{m:?}");
    let epochs: Vec<i64> = column("train.epochs").iter().filter_map(Json::as_i64).collect();
    assert!(epochs.iter().all(|e| (1..=3).contains(e)) && epochs.contains(&1) && epochs.contains(&3), "{epochs:?}");
    let batches = column("batch.global");
    assert!(batches.contains(&json!(32)) && batches.contains(&json!(64)));
    assert_eq!(t[0].values[0].source, "sweep.random.parameters.\"batch.global\"");
}

#[test]
fn random_samples_cross_the_grid_and_explicit_trials_follow() {
    let mut sweep = grid(&[("batch.global", json!([32, 64]))]);
    sweep.random = random(3, &[("optimizer.learning_rate", SweepDistribution::Uniform { low: 0.01, high: 0.1 })]);
    sweep.trials = vec![[("optimizer.learning_rate".to_string(), json!(0.5))].into_iter().collect()];
    let t = trials(&sweep, 1);
    assert_eq!(t.len(), 2 * 3 + 1);
    // Each sample is crossed with every grid point: the same three rates at both batches.
    let lr = |t: &Trial| t.values.iter().find(|a| a.key == "optimizer.learning_rate").map(|a| a.value.clone());
    let batch = |t: &Trial| t.values.iter().find(|a| a.key == "batch.global").map(|a| a.value.clone());
    for pair in t[..6].chunks(2) {
        assert_eq!(lr(&pair[0]), lr(&pair[1]));
        assert_eq!((batch(&pair[0]), batch(&pair[1])), (Some(json!(32)), Some(json!(64))));
    }
    // More samples append trials: the first ones keep their numbers, names and values.
    let mut more = sweep.clone();
    more.random = random(4, &[("optimizer.learning_rate", SweepDistribution::Uniform { low: 0.01, high: 0.1 })]);
    more.trials.clear();
    assert_eq!(trials(&more, 1)[..6], t[..6]);
    assert_eq!(t[6].name, "trial-007-lr0.5");
    assert_eq!(t[6].values[0].source, "sweep.trials[0].\"optimizer.learning_rate\"");
}

#[test]
fn names_are_safe_and_disambiguated() {
    let sweep = grid(&[
        ("model.layers[1].units", json!([64])),
        ("model.layers[3].units", json!([10])),
        ("optimizer.schedule", json!([{ "kind": "cosine" }])),
        ("run.name_suffix_that_is_long_enough_to_be_cut_somewhere_here", json!(["a/b c"])),
    ]);
    let t = trials(&sweep, 1);
    let name = &t[0].name;
    assert!(name.starts_with("trial-001-model.layers_1_.units64-model.layers_3_.units10-schedule"), "{name}");
    assert!(name.len() <= MAX_NAME, "{name}");
    assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c)), "{name}");
}

#[test]
fn problems_name_their_keys() {
    let keys = |sweep: &SweepSpec| -> Vec<String> {
        match expand(sweep, 1) {
            Ok(t) => panic!("should fail: {t:?}"),
            Err(p) => p.into_iter().map(|d| d.key).collect(),
        }
    };
    assert_eq!(keys(&SweepSpec::default()), ["sweep"]);
    assert_eq!(keys(&grid(&[("run.out_dir", json!(["a"]))])), ["sweep.grid.\"run.out_dir\""]);
    let mut both = grid(&[("optimizer.learning_rate", json!([0.1]))]);
    both.random = random(
        2,
        &[
            ("optimizer.learning_rate", SweepDistribution::Uniform { low: 0.0, high: 1.0 }),
            ("optimizer.momentum", SweepDistribution::LogUniform { low: 0.0, high: 1.0 }),
        ],
    );
    assert_eq!(
        keys(&both),
        ["sweep.random.parameters.\"optimizer.learning_rate\"", "sweep.random.parameters.\"optimizer.momentum\".high"]
    );
}
