//! `implementation = "auto"` per pack size with the cost model measured at start-up: four
//! local workers over TCP train with the algorithm each pack size's estimate picks; the first
//! run measures the network and keeps the figures in the chief's cache, a second run takes
//! them from there and ends with the same weights bit for bit. A spec that gives the model
//! is not measured. `trainrun check` prints the choice per pack size.

mod common;

use common::{assert_exit, json, run, tempdir, text, trainrun};
use std::path::Path;

/// Four local workers over TCP, packs of 16 KiB.
const FOUR_OVER_TCP: [&str; 6] = [
    "--set",
    "cluster.worker=4",
    "--set",
    "strategy.communication.transport=\"tcp\"",
    "--set",
    "strategy.communication.bytes_per_pack=16384",
];

/// [`FOUR_OVER_TCP`] train 12 steps into `out`, with `extra`.
fn train(out: &Path, cache: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let o = format!("run.out_dir={}", out.display());
    let mut args = vec!["specs/mnist_multiworker.toml", "--set", &o];
    args.extend(FOUR_OVER_TCP);
    args.extend([
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=12",
        "--set",
        "optimizer.learning_rate=0.05",
    ]);
    args.extend(extra);
    let output = trainrun().env("XDG_CACHE_HOME", cache).args(&args).output().expect("trainrun runs");
    let (stdout, stderr) = text(&output);
    assert_exit(&output, 0);
    (json(&out.join("summary.json")), format!("{stdout}{stderr}"))
}

#[test]
fn auto_measures_once_keeps_the_figures_and_repeats_the_bits() {
    let (cache, a, b) = (tempdir(), tempdir(), tempdir());
    let (first, log) = train(a.path(), cache.path(), &[]);
    assert!(log.contains("all-reduce cost model measured at start-up ("), "{log}");
    assert!(log.contains("by pack size: 16.0 KiB → "), "{log}");
    // Packs of 16 KiB: the probe's large size is its least, 64 KiB.
    let kept = cache.path().join("trainrun/cost-model/tcp-4-ranks-1-hosts-4-a-host-65536-bytes.json");
    let figures = json(&kept);
    assert!(figures["sum_s_per_byte"].as_f64().is_some_and(|x| x.is_finite() && x > 0.0), "{figures}");
    // Each algorithm's own link, α and β: one network figure cannot price them all.
    for key in ["ring", "halving_doubling", "inside_hosts", "among_leaders"] {
        let pair = figures[key].as_array().map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect::<Vec<_>>());
        assert!(pair.is_some_and(|p| p.len() == 2 && p.iter().all(|x| x.is_finite() && *x >= 0.0)), "{key}: {figures}");
    }
    let (second, log) = train(b.path(), cache.path(), &[]);
    assert!(log.contains("all-reduce cost model measured by an earlier run, from"), "{log}");
    assert_eq!(first["transport"], "tcp", "{first}");
    assert_eq!(first["weights_sha256"], second["weights_sha256"], "the same figures choose the same algorithms");
}

#[test]
fn a_model_in_the_spec_is_not_measured() {
    let (cache, out) = (tempdir(), tempdir());
    let model = "strategy.communication.cost_model.network={ latency_us = 500, gigabytes_per_s = 1 }";
    let (_, log) = train(out.path(), cache.path(), &["--set", model]);
    assert!(log.contains("all-reduce cost model from the spec: network α 500.0 µs, 1.00 GB/s"), "{log}");
    // 500 µs a message: the fewest messages win at every size.
    assert!(log.contains("16.0 KiB → halving_doubling"), "{log}");
    assert!(!cache.path().join("trainrun/cost-model").exists(), "nothing measured, nothing kept");
}

#[test]
fn check_prints_the_choice_per_pack_size() {
    let mut args = vec!["check", "specs/mnist_multiworker.toml"];
    args.extend(FOUR_OVER_TCP);
    let out = run(&args);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    let row = stdout.lines().find(|l| l.trim_start().starts_with("by pack size")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.contains(" × 16 KiB → "), "{row}");
    assert!(row.contains("by the model measured at start-up"), "{row}");
}
