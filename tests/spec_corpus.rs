//! The broken-spec corpus: every spec under `tests/broken/` (a file, or a folder whose
//! `spec.toml` is the named file) must fail to load, and its rendered problems are
//! snapshotted: they are the product's error texts. Overrides have their cases here.

use std::path::{Path, PathBuf};
use trainrun::spec::{Diagnostic, load, render};

/// The corpus, sorted, as paths relative to the package root so snapshots do not depend on
/// the machine.
fn corpus() -> Vec<(String, PathBuf)> {
    let mut cases = Vec::new();
    let Ok(entries) = std::fs::read_dir("tests/broken") else {
        panic!("tests/broken is missing; run the tests from the package root")
    };
    for entry in entries.flatten() {
        let path = Path::new("tests/broken").join(entry.file_name());
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            cases.push((name, path.join("spec.toml")));
        } else if let Some(stem) = name.strip_suffix(".toml") {
            cases.push((stem.to_string(), path));
        }
    }
    cases.sort();
    cases
}

fn failure(path: &str, env: &[(&str, &str)], sets: &[&str]) -> String {
    let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    match load(Path::new(path), &env, &sets) {
        Ok(loaded) => panic!("{path} loaded but should fail: {:?}", loaded.spec),
        Err(error) => error.to_string(),
    }
}

#[test]
fn the_corpus_is_large_enough() {
    assert!(corpus().len() >= 20, "{} cases", corpus().len());
}

#[test]
fn every_broken_spec_fails_with_its_snapshot() {
    for (name, path) in corpus() {
        let text = failure(&path.to_string_lossy(), &[], &[]);
        insta::assert_snapshot!(name, text);
    }
}

const GOOD: &str = "tests/fixtures/mnist_tutorial.toml";

#[test]
fn set_value_of_the_wrong_type() {
    let text = failure(GOOD, &[], &["batch.global=abc"]);
    insta::assert_snapshot!("set_wrong_type", text);
}

#[test]
fn set_without_equals_and_past_the_end() {
    let text = failure(GOOD, &[], &["optimizer.learning_rate", "model.layers[7].units=64", "=3"]);
    insta::assert_snapshot!("set_malformed", text);
}

#[test]
fn unknown_key_from_the_environment() {
    let text = failure(GOOD, &[("TRAINRUN_OPTIMIZER__LERNING_RATE", "0.1"), ("TRAINRUN_DATA_DIR", "/data")], &[]);
    insta::assert_snapshot!("env_unknown_key", text);
}

#[test]
fn unknown_variables_from_the_environment() {
    let env = [
        ("TRAINRUN_LEARNING_RATE", "0.1"),
        ("TRAINRUN_DATADIR", "/data"),
        ("TRAINRUN_OPTIMIZER_MOMENTUM", "0.9"),
        ("TRAINRUN_DATA_DIR", "/data"),
        ("TRAINRUN_OFFLINE", "1"),
    ];
    let text = failure(GOOD, &env, &[]);
    insta::assert_snapshot!("env_unknown_variables", text);
}

#[test]
fn set_values_that_are_not_finite_or_too_large() {
    let sets = [
        "strategy={ kind = \"multi_worker_mirrored\", communication = { timeout_s = nan } }",
        "optimizer.learning_rate=inf",
        "train.epochs=99999999999999999999",
        "cluster.restart_backoff_s=-inf",
    ];
    let text = failure(GOOD, &[], &sets);
    insta::assert_snapshot!("set_not_finite", text);
}

#[test]
fn set_out_of_range_inside_a_layer() {
    let text = failure(GOOD, &[], &["model.layers[3].units=0"]);
    insta::assert_snapshot!("set_layer_out_of_range", text);
}

#[test]
fn planner_diagnostics_render_at_their_keys() {
    let Ok(loaded) = load(Path::new(GOOD), &[], &["train.epochs=4".to_string()]) else { panic!("{GOOD} loads") };
    let diagnostics = [
        Diagnostic::error("batch.global", "`batch.global = 64` is not divisible by 3 replicas (3 workers × 1 device)")
            .help("use 63 or 66"),
        Diagnostic::warning("model.layers[1].filters", "32 filters on 28×28 inputs"),
        Diagnostic::error("batch.per_replica", "`batch.per_replica` defaults to 32"),
        Diagnostic::warning("train.epochs", "4 epochs may overfit"),
        Diagnostic::error("data.dir", "no data folder"),
    ];
    insta::assert_snapshot!("planner", render(&diagnostics, &loaded.origins));
}
