//! MultiWorkerMirrored end to end: real worker processes on loopback, started by the launcher
//! or by hand with TF_CONFIG, and what happens when one dies, never comes, or does not belong.

mod common;

use common::{assert_exit, json, run, spawn_task, tempdir, text, tf_config, wait_within, weights};
use std::path::Path;
use std::time::Duration;

fn summary(dir: &Path) -> serde_json::Value {
    json(&dir.join("summary.json"))
}

fn out(dir: &Path) -> String {
    format!("run.out_dir={}", dir.display())
}

/// A job token long enough for the control plane to accept.
const TOKEN: &str = "test-token-0123456789abcdef";

/// Faster, livelier training than the tutorial's SGD 0.001, so differences would show.
const LIVELY: [&str; 4] = ["--set", "optimizer.learning_rate=0.05", "--set", "optimizer.momentum=0.9"];

#[test]
fn the_tutorial_job_trains_across_two_worker_processes() {
    let dir = tempdir();
    let o = out(dir.path());
    assert_exit(&run(&["specs/mnist_multiworker.toml", "-q", "--set", &o]), 0);
    let s = summary(dir.path());
    assert_eq!((s["num_workers"].as_u64(), s["num_replicas_in_sync"].as_u64()), (Some(2), Some(2)), "{s}");
    assert_eq!(s["transport"], "shared_memory");
    assert_eq!(s["examples"], 210 * 128);
    let losses: Vec<f64> = std::fs::read_to_string(dir.path().join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "epoch")
        .filter_map(|v| v["loss"].as_f64())
        .collect();
    assert!(losses.len() == 3 && losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
}

/// ‖two workers − one process‖ / ‖one process‖ of the weights after 50 steps on the same
/// examples in the same order, with `extra` settings.
fn two_vs_one(extra: &[&str]) -> f64 {
    let (two, one) = (tempdir(), tempdir());
    let steps = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=50"];
    let (o2, o1) = (out(two.path()), out(one.path()));
    let mut a = vec!["specs/mnist_multiworker.toml", "-q", "--set", &o2];
    a.extend(steps.iter().chain(extra));
    assert_exit(&run(&a), 0);
    let mut b = vec!["specs/mnist_single.toml", "-q", "--set", &o1, "--set", "batch.global=128"];
    b.extend(steps.iter().chain(extra));
    assert_exit(&run(&b), 0);
    common::relative_difference(
        &weights(&two.path().join("model.safetensors")),
        &weights(&one.path().join("model.safetensors")),
    )
}

#[test]
fn two_workers_of_64_match_one_process_of_128() {
    // The tutorial's settings, as the requirement states them.
    let d = two_vs_one(&[]);
    assert!(d <= 1e-5, "relative difference {d}");
    // With SGD 0.05 and momentum 0.9 the workers' different summation order (two partial sums
    // instead of one) is amplified step after step; a wrong scale or a missed example would
    // be off by 1e-2 or more.
    let d = two_vs_one(&LIVELY);
    assert!(d <= 1e-4, "relative difference {d}");
}

#[test]
fn two_workers_of_two_devices_match_one_process_and_transports_agree() {
    // Hierarchical all-reduce: each worker sums its two replicas, then the workers sum.
    let (shm, tcp, one) = (tempdir(), tempdir(), tempdir());
    let steps = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=40"];
    let devices = ["--set", r#"strategy.devices=["cpu:0","cpu:1"]"#, "--set", "batch.per_replica=32"];
    let go = |dir: &Path, extra: &[&str]| {
        let o = out(dir);
        let mut args = vec!["specs/mnist_multiworker.toml", "-q", "--set", &o];
        args.extend(steps.iter().chain(&LIVELY).chain(&devices).chain(extra));
        assert_exit(&run(&args), 0);
        summary(dir)
    };
    let s_shm = go(shm.path(), &[]);
    let s_tcp = go(tcp.path(), &["--set", "strategy.communication.transport=\"tcp\""]);
    assert_eq!(s_shm["weights_sha256"], s_tcp["weights_sha256"]);
    assert_eq!(s_shm["examples"], 40 * 128, "{s_shm}");

    let o = out(one.path());
    let mut b = vec!["specs/mnist_single.toml", "-q", "--set", &o, "--set", "batch.global=128"];
    b.extend(steps.iter().chain(&LIVELY));
    assert_exit(&run(&b), 0);
    let d = common::relative_difference(
        &weights(&shm.path().join("model.safetensors")),
        &weights(&one.path().join("model.safetensors")),
    );
    // Four partial sums instead of one, amplified by momentum (as in the test above).
    assert!(d <= 1e-4, "relative difference {d}");
}

#[test]
fn multiworker_runs_are_bit_identical_and_transports_agree() {
    let (a, b, c) = (tempdir(), tempdir(), tempdir());
    let short = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=30"];
    let go = |dir: &Path, extra: &[&str]| {
        let o = out(dir);
        let mut args = vec!["specs/mnist_multiworker.toml", "-q", "--set", &o];
        args.extend(short.iter().chain(&LIVELY).chain(extra));
        assert_exit(&run(&args), 0);
        summary(dir)
    };
    let (sa, sb) = (go(a.path(), &[]), go(b.path(), &[]));
    assert_eq!(sa["weights_sha256"], sb["weights_sha256"]);
    // Over TCP the two-worker sum is taken in the same order: the same bits.
    let sc = go(c.path(), &["--set", "strategy.communication.transport=\"tcp\""]);
    assert_eq!(sc["transport"], "tcp");
    assert_eq!(sa["weights_sha256"], sc["weights_sha256"]);
}

#[test]
fn partial_batches_at_the_end_of_the_data_are_averaged_not_hung() {
    // 99 examples in global batches of 14: each epoch ends with a batch of 1, which leaves
    // worker:1 nothing. With drop_remainder = false both workers must go on, and the result
    // must equal one process on the same batches. The two sum in different orders, so they
    // agree to rounding (about 1e-7) unless a ReLU input lands within that rounding of 0 and
    // flips, which moves the weights by 1e-5 to 1e-3 (seed 42 flips at step 11 since the
    // dense layer skips its input's zeros, seed 7 did before): the seed is one where none does.
    let data = [
        "--set",
        "data={ dataset = \"synthetic\", drop_remainder = false, synthetic = { train_examples = 99, test_examples = 20 } }",
        "--set",
        "train.epochs=2",
        "--set",
        "train.steps_per_epoch=8",
        "--set",
        "run.seed=1",
    ];
    let (two, one) = (tempdir(), tempdir());
    let (o2, o1) = (out(two.path()), out(one.path()));
    let mut a = vec!["specs/mnist_multiworker.toml", "-q", "--set", &o2, "--set", "batch.per_replica=7"];
    a.extend(data.iter().chain(&LIVELY));
    assert_exit(&run(&a), 0);
    let mut b = vec!["specs/mnist_single.toml", "-q", "--set", &o1, "--set", "batch.global=14"];
    b.extend(data.iter().chain(&LIVELY));
    assert_exit(&run(&b), 0);
    assert_eq!(summary(two.path())["examples"], summary(one.path())["examples"]);
    let d = common::relative_difference(
        &weights(&two.path().join("model.safetensors")),
        &weights(&one.path().join("model.safetensors")),
    );
    assert!(d <= 1e-5, "relative difference {d}");
}

#[test]
fn a_worker_killed_mid_training_stops_the_job_naming_it() {
    let ports = common::free_ports::<2>();
    let long = [
        "specs/mnist_multiworker.toml",
        "-q",
        "--set",
        "train.steps_per_epoch=100000",
        "--set",
        "strategy.communication.timeout_s=10",
    ];
    let dir = tempdir();
    let o = out(dir.path());
    let mut args = long.to_vec();
    args.extend(["--set", &o]);
    let chief = spawn_task(&tf_config(&ports, ("worker", 0)), TOKEN, &args);
    let mut worker = spawn_task(&tf_config(&ports, ("worker", 1)), TOKEN, &args);
    // Let training start: the chief writes its run folder before the first step.
    let t = std::time::Instant::now();
    while !dir.path().join("metrics.jsonl").exists() && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let _ = worker.kill();
    let _ = worker.wait();
    let (out, took) = wait_within(chief, Duration::from_secs(12));
    assert_exit(&out, 5);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("worker:1"), "{stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn the_launcher_reports_a_killed_worker_with_its_last_lines() {
    let launcher = common::trainrun()
        .args(["specs/mnist_multiworker.toml", "-q", "--set", "train.steps_per_epoch=100000"])
        .args(["--set", &out(tempdir().path())])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    // Find worker:1 among the launcher's children by its TF_CONFIG.
    let pid = launcher.id();
    let t = std::time::Instant::now();
    let victim = loop {
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let found = children.split_whitespace().find(|c| {
            let env = std::fs::read(format!("/proc/{c}/environ")).unwrap_or_default();
            String::from_utf8_lossy(&env).contains("\"index\":1")
        });
        if let Some(c) = found {
            break c.to_string();
        }
        assert!(t.elapsed() < Duration::from_secs(20), "worker:1 never started");
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_secs(2));
    let _ = std::process::Command::new("kill").args(["-9", &victim]).status();
    let (out, _) = wait_within(launcher, Duration::from_secs(40));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(stderr.contains("worker:1 failed (killed by signal 9)"), "{stderr}");
}

#[test]
fn a_worker_that_never_starts_fails_rendezvous_naming_it() {
    let ports = common::free_ports::<3>();
    let args = ["specs/mnist_multiworker.toml", "-q", "--set", "cluster.startup_timeout_s=2"];
    let chief = spawn_task(&tf_config(&ports, ("worker", 0)), TOKEN, &args);
    let w1 = spawn_task(&tf_config(&ports, ("worker", 1)), TOKEN, &args);
    let (out, took) = wait_within(chief, Duration::from_secs(20));
    let _ = wait_within(w1, Duration::from_secs(20));
    assert_exit(&out, 5);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("worker:2") && stderr.contains("never checked in"), "{stderr}");
    // worker:1 checked in, but it may give up at its own deadline first and be listed too.
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_task_with_the_wrong_token_is_refused() {
    let ports = common::free_ports::<2>();
    let args = ["specs/mnist_multiworker.toml", "-q", "--set", "cluster.startup_timeout_s=3"];
    let chief = spawn_task(&tf_config(&ports, ("worker", 0)), TOKEN, &args);
    let intruder = spawn_task(&tf_config(&ports, ("worker", 1)), "an-entirely-different-token", &args);
    let (bad, _) = wait_within(intruder, Duration::from_secs(20));
    let (good, _) = wait_within(chief, Duration::from_secs(20));
    assert_exit(&bad, 5);
    assert!(text(&bad).1.to_lowercase().contains("token"), "{}", text(&bad).1);
    assert_exit(&good, 5);
    assert!(text(&good).1.contains("worker:1"), "{}", text(&good).1);
}

#[test]
fn a_task_running_another_spec_is_refused_naming_both() {
    let ports = common::free_ports::<2>();
    let args = ["specs/mnist_multiworker.toml", "-q", "--set", "cluster.startup_timeout_s=10"];
    let chief = spawn_task(&tf_config(&ports, ("worker", 0)), TOKEN, &args);
    let mut other = args.to_vec();
    other.extend(["--set", "optimizer.learning_rate=0.5"]);
    let odd = spawn_task(&tf_config(&ports, ("worker", 1)), TOKEN, &other);
    let (odd_out, _) = wait_within(odd, Duration::from_secs(20));
    let (chief_out, _) = wait_within(chief, Duration::from_secs(20));
    assert_exit(&odd_out, 5);
    assert_exit(&chief_out, 5);
    let stderr = text(&odd_out).1;
    assert!(stderr.contains("worker:1") && stderr.contains("spec"), "{stderr}");
}
