//! ParameterServerStrategy end to end: a chief (the coordinator), workers and ps tasks as
//! processes on loopback, started by the launcher, training real MNIST asynchronously.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use std::path::Path;

fn out(dir: &Path) -> String {
    format!("run.out_dir={}", dir.display())
}

/// Adam converges in a few hundred asynchronous steps where the tutorial's SGD 0.001 crawls.
const ADAM: [&str; 2] = ["--set", "optimizer={ kind = \"adam\", learning_rate = 0.001 }"];

#[test]
fn two_workers_and_a_ps_train_mnist_to_97_percent() {
    let dir = tempdir();
    let o = out(dir.path());
    let mut args = vec!["specs/mnist_parameter_server.toml", "-q", "--set", &o];
    args.extend(ADAM);
    args.extend(["--set", "train.epochs=2", "--set", "train.steps_per_epoch=250"]);
    let res = run(&args);
    assert_exit(&res, 0);
    let s = json(&dir.path().join("summary.json"));
    let accuracy = s["test_accuracy"].as_f64().unwrap_or(0.0);
    assert!(accuracy >= 0.97, "test accuracy {accuracy}\n{s}\n{}", text(&res).1);
    assert_eq!((s["num_workers"].as_u64(), s["steps"].as_u64()), (Some(2), Some(500)), "{s}");
    let ps = &s["parameter_server"];
    assert_eq!(ps["steps_scheduled"], 500, "{ps}");
    assert_eq!(ps["steps_applied"], 500, "{ps}");
    let per_worker: Vec<u64> =
        ps["steps_applied_per_worker"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    // Both workers took work; together they did every step once.
    assert!(per_worker.len() == 2 && per_worker.iter().all(|&n| n > 0), "{ps}");
    assert_eq!(per_worker.iter().sum::<u64>(), 500);
    let staleness: u64 = ps["staleness_histogram"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(staleness, 500, "one staleness per step: {ps}");
    // Every epoch line carries the coordinator's counters so far.
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let applied: Vec<u64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "epoch")
        .filter_map(|v| v["parameter_server"]["steps_applied"].as_u64())
        .collect();
    assert_eq!(applied, vec![250, 500], "{metrics}");
}

/// One worker and one ps against the default strategy at the same batch: the same weights,
/// bit for bit, with optimizer state (momentum, Adam's moments) living on the ps.
#[test]
fn one_worker_and_one_ps_equal_the_default_strategy_bit_for_bit() {
    let steps = ["--set", "train.epochs=2", "--set", "train.steps_per_epoch=15"];
    for optimizer in [
        "optimizer={ kind = \"sgd\", learning_rate = 0.05, momentum = 0.9 }",
        "optimizer={ kind = \"adam\", learning_rate = 0.001, clip_norm = 1.0 }",
    ] {
        let (ps, one) = (tempdir(), tempdir());
        let (o_ps, o_one) = (out(ps.path()), out(one.path()));
        let mut a = vec!["specs/mnist_parameter_server.toml", "-q", "--set", &o_ps, "--set", optimizer];
        a.extend(["--set", "cluster={ chief = 1, worker = 1, ps = 1 }"]);
        a.extend(steps);
        assert_exit(&run(&a), 0);
        let mut b = vec!["specs/mnist_single.toml", "-q", "--set", &o_one, "--set", optimizer];
        b.extend(["--set", "batch.global=64"]);
        b.extend(steps);
        assert_exit(&run(&b), 0);
        let (s_ps, s_one) = (json(&ps.path().join("summary.json")), json(&one.path().join("summary.json")));
        assert_eq!(s_ps["steps"], 30);
        assert_eq!(s_ps["weights_sha256"], s_one["weights_sha256"], "{optimizer}\n{s_ps}\n{s_one}");
    }
}
