//! The schedulers besides successive halving (which `tests/sweep.rs` covers), end to end on
//! short real MNIST trials: Hyperband's brackets, the median stopping rule, rungs counted in
//! steps (in the middle of an epoch too, promoted trials ending bit-identical to trials never
//! paused); each sweep run twice decides the same and writes a byte-identical `results.csv`,
//! and bad input is named with its fix.

mod common;

use common::sweep::results_bytes;
use common::{assert_exit, json, run, tempdir, text};
use serde_json::Value;
use std::path::Path;

fn sweep(spec: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let o = format!("run.out_dir={}", out.display());
    let mut args = vec!["sweep", spec, "--set", &o];
    args.extend(extra);
    run(&args)
}

/// `results.csv` as its bytes and as cells, and `decisions.jsonl` as lines of JSON.
fn outcome(dir: &Path) -> (Vec<u8>, Vec<Vec<String>>, Vec<Value>) {
    let rows = common::sweep::results(dir);
    let decisions = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap_or_default();
    (results_bytes(dir), rows, decisions.lines().map(|l| serde_json::from_str(l).unwrap_or_default()).collect())
}

/// The `status` and `steps` cells of each row, by trial number.
fn status_and_steps(rows: &[Vec<String>]) -> Vec<(String, String, String)> {
    let col = |name: &str| rows[0].iter().position(|h| h == name).unwrap_or(usize::MAX);
    let (trial, status, steps) = (col("trial"), col("status"), col("steps"));
    let mut out: Vec<_> = rows[1..].iter().map(|r| (r[trial].clone(), r[status].clone(), r[steps].clone())).collect();
    out.sort();
    out
}

#[test]
fn hyperband_runs_its_brackets_and_decides_the_same_twice() {
    const SPEC: &str = "tests/fixtures/sweeps/mnist_hyperband.toml";
    let (a, b) = (tempdir(), tempdir());
    let out = sweep(SPEC, a.path(), &[]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("bracket 1, rung 1 of 2: 1 epochs, 2 trials, 2 to train"), "{stdout}");
    assert!(stdout.contains("bracket 1, rung 2 of 2: 2 epochs, 1 trials, 1 to train"), "{stdout}");
    assert!(stdout.contains("bracket 0, rung 1 of 1: 2 epochs, 1 trials, 1 to train"), "{stdout}");
    let (_, rows, decisions) = outcome(a.path());
    let cells = status_and_steps(&rows);
    let stopped: Vec<&str> = cells.iter().filter(|c| c.1 == "stopped_early").map(|c| c.2.as_str()).collect();
    assert_eq!(stopped, ["20"], "one trial of bracket 1 stops after its first epoch: {cells:?}");
    assert_eq!(cells[2], ("3".into(), "ok".into(), "40".into()), "bracket 0 trains in full: {cells:?}");
    assert_eq!(decisions.len(), 1, "{decisions:?}");
    assert_eq!((decisions[0]["bracket"].as_u64(), decisions[0]["seen"].as_array().map(Vec::len)), (Some(1), Some(2)));
    let stopped = decisions[0]["stopped"][0].as_u64().unwrap_or(0);
    let name = &rows[1..].iter().find(|r| r[1] == stopped.to_string()).map(|r| r[2].clone()).unwrap_or_default();
    let marker = json(&a.path().join(name).join("stopped_early.json"));
    assert_eq!((marker["rung"].as_u64(), marker["bracket"].as_u64()), (Some(1), Some(1)), "{marker}");

    assert_exit(&sweep(SPEC, b.path(), &["--parallel", "2"]), 0);
    assert_eq!(outcome(a.path()), outcome(b.path()));
    let check = run(&["check", SPEC]);
    assert_exit(&check, 0);
    assert!(
        text(&check).0.contains("hyperband in 2 brackets (2 trials at 1, 2; 1 trials at 2) epochs"),
        "{}",
        text(&check).0
    );
}

#[test]
fn median_stopping_in_steps_stops_trials_below_the_median_and_decides_the_same_twice() {
    const SPEC: &str = "tests/fixtures/sweeps/mnist_median.toml";
    let (a, b) = (tempdir(), tempdir());
    let out = sweep(SPEC, a.path(), &["--set", "sweep.scheduler.min_samples=2"]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("rung 1 of 3: 10 steps, 4 trials, 4 to train"), "{stdout}");
    let (_, rows, decisions) = outcome(a.path());
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    for d in &decisions {
        for seen in d["seen"].as_array().into_iter().flatten() {
            let (best, median) = (seen["best"].as_f64().unwrap_or(0.0), seen["median_of_others"].as_f64());
            let trial = &seen["trial"];
            let stopped = d["stopped"].as_array().is_some_and(|s| s.contains(trial));
            assert_eq!(stopped, median.is_some_and(|m| best < m), "{d}");
        }
    }
    let cells = status_and_steps(&rows);
    assert!(cells.iter().any(|c| c.1 == "stopped_early"), "{cells:?}");
    for (_, status, steps) in &cells {
        assert!(status == "ok" && steps == "30" || status == "stopped_early" && steps != "30", "{cells:?}");
    }
    // Rungs in steps are kept per step count.
    let first = a.path().join(&rows[1][2]);
    assert!(first.join("rung-10-steps.json").is_file() && first.join("rung-20-steps.json").is_file(), "{first:?}");

    assert_exit(&sweep(SPEC, b.path(), &["--set", "sweep.scheduler.min_samples=2", "--parallel", "2"]), 0);
    assert_eq!(outcome(a.path()), outcome(b.path()));
}

/// The SHA-256 of `model.safetensors` in `dir`.
fn weights_file_sha(dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn rungs_in_steps_pause_mid_epoch_and_promoted_trials_end_as_if_never_paused() {
    // Epochs of 47 steps, rungs at 30 and 60 steps, the whole run 94 steps under a cosine
    // schedule to its last step.
    const SPEC: &str = "tests/fixtures/sweeps/mnist_mid_epoch.toml";
    let (a, b, c) = (tempdir(), tempdir(), tempdir());
    let out = sweep(SPEC, a.path(), &["--parallel", "1"]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("rung 1 of 3: 30 steps, 4 trials, 4 to train"), "{stdout}");
    assert!(stdout.contains("rung 2 of 3: 60 steps, 2 trials, 2 to train"), "{stdout}");
    let (_, rows, decisions) = outcome(a.path());
    assert_eq!(decisions.len(), 2, "{decisions:?}");
    let mut cells: Vec<(String, String)> = status_and_steps(&rows).into_iter().map(|(_, s, n)| (n, s)).collect();
    cells.sort();
    let stopped = "stopped_early".to_string();
    let expected = [("30", &stopped), ("30", &stopped), ("60", &stopped), ("94", &"ok".to_string())];
    assert_eq!(cells, expected.map(|(n, s)| (n.to_string(), s.clone())), "{rows:?}");

    // The trials promoted past the first rung: paused in the middle of their first epoch (and
    // the finished one in its second), resident between rungs, and each equal to its spec
    // trained straight to the same step.
    let col = |name: &str| rows[0].iter().position(|h| h == name).unwrap_or(usize::MAX);
    for row in rows[1..].iter().filter(|r| r[col("steps")] != "30") {
        let dir = a.path().join(&row[col("name")]);
        let rung = json(&dir.join("rung-30-steps.json"));
        assert_eq!((rung["stopped"].as_str(), rung["steps"].as_u64()), (Some("paused"), Some(30)), "{rung}");
        let log = std::fs::read_to_string(dir.join("train.log")).unwrap_or_default();
        assert!(log.contains("paused at step 30") && log.contains("resuming from"), "{log}");
        // Promoted in place from the mid-epoch backup it had just written, held in memory.
        assert!(log.contains("its tensors are taken from memory"), "{log}");
        let straight = tempdir();
        let (spec, o) =
            (dir.join("spec.toml").display().to_string(), format!("run.out_dir={}", straight.path().display()));
        // The spec of a trial stopped at rung 2 is that rung's: it stops at step 60.
        assert_exit(&run(&[&spec, "-q", "--set", &o]), 0);
        assert_eq!(weights_file_sha(straight.path()), weights_file_sha(&dir), "{}", dir.display());
    }

    // Every trial exiting at its rung (resumed by a new process), and the sweep again with
    // two slots: the same decisions, results.csv byte for byte, and the same weights.
    assert_exit(&sweep(SPEC, b.path(), &["--parallel", "1", "--set", "sweep.resident_trials=0"]), 0);
    assert_exit(&sweep(SPEC, c.path(), &["--parallel", "2"]), 0);
    for other in [b.path(), c.path()] {
        assert_eq!(outcome(other), outcome(a.path()));
        for row in &rows[1..] {
            let name = &row[col("name")];
            assert_eq!(weights_file_sha(&other.join(name)), weights_file_sha(&a.path().join(name)), "{name}");
        }
    }
    let log = std::fs::read_to_string(b.path().join(&rows[1][col("name")]).join("train.log")).unwrap_or_default();
    assert!(!log.contains("paused at step 30"), "a trial that exits logs only its last launch: {log}");
    assert!(!log.contains("taken from memory"), "a new process reads the backup from disk: {log}");
}

#[test]
fn bad_scheduler_input_is_refused_naming_the_key_the_value_and_a_fix() {
    const SPEC: &str = "tests/fixtures/sweeps/mnist_median.toml";
    let dir = tempdir();
    // A whole run (max in steps) that is not whole epochs of the trials; rungs below may be.
    let out = sweep(SPEC, dir.path(), &["--set", "sweep.scheduler.max=35", "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("sweep.scheduler.max = 35 steps is not a whole number of epochs"), "{stderr}");
    assert!(stderr.contains("trial 1 (") && stderr.contains("trains 10 steps an epoch"), "{stderr}");
    assert!(stderr.contains("multiple of every trial's train.steps_per_epoch (e.g. 30 or 40)"), "{stderr}");
    assert_exit(&sweep(SPEC, dir.path(), &["--set", "sweep.scheduler.grace=15", "--dry-run"]), 0);
    // A trial that pauses by itself, and a step past the run's last.
    let out = sweep(SPEC, dir.path(), &["--set", "train.stop_at_step=5", "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("train.stop_at_step = 5 in trial 1") && stderr.contains("drop train.stop_at_step"),
        "{stderr}"
    );
    let out = run(&["check", "specs/mnist_single.toml", "--set", "train.stop_at_step=500"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("train.stop_at_step = 500 is past the run's last step, 210"), "{stderr}");
    assert!(stderr.contains("stop at step 210 or before, or train more epochs (train.epochs = 8)"), "{stderr}");
    // Stopping a run that keeps no backup is allowed, with a warning that it cannot go on.
    let out = run(&["check", "specs/mnist_single.toml", "--set", "train.stop_at_step=100"]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    let both = format!("{stdout}{stderr}");
    assert!(both.contains("train.stop_at_step = 100 stops the run without a backup"), "{both}");
    assert!(both.contains("kind = \"backup_and_restore\" to go on from the step it stops at"), "{both}");
    // grace above max, in the scheduler's unit.
    let out = sweep(SPEC, dir.path(), &["--set", "sweep.scheduler.grace=40", "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("grace = 40 steps is more than max = 30 steps") && stderr.contains("lower grace"),
        "{stderr}"
    );
    // A parameter of another scheduler.
    let out = sweep(SPEC, dir.path(), &["--set", "sweep.scheduler.reduction_factor=2", "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("reduction_factor"), "{stderr}");
    // An unknown unit.
    let out = sweep(SPEC, dir.path(), &["--set", "sweep.scheduler.unit=minutes", "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("minutes") && stderr.contains("steps"), "{stderr}");
}

#[test]
fn tpe_draws_each_trial_from_the_results_before_it_the_same_every_time() {
    const SPEC: &str = "tests/fixtures/sweeps/mnist_tpe.toml";
    let (a, b) = (tempdir(), tempdir());
    let out = sweep(SPEC, a.path(), &[]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert_eq!(stdout.matches("drawn by TPE").count(), 2, "{stdout}");
    let (_, rows, _) = outcome(a.path());
    assert_eq!(rows.len(), 6, "{rows:?}");
    assert!(rows[1..].iter().all(|r| r[3] == "ok"), "{rows:?}");
    let record = json(&a.path().join("sweep.json"));
    assert_eq!(record["trials"].as_array().map(Vec::len), Some(5), "{record}");

    // The same sweep again, startup trials side by side, draws and ranks the same.
    assert_exit(&sweep(SPEC, b.path(), &["--parallel", "2"]), 0);
    assert_eq!(outcome(a.path()).0, outcome(b.path()).0);
    // Run again, every drawn trial is found complete.
    let again = sweep(SPEC, a.path(), &[]);
    assert_exit(&again, 0);
    let (stdout, _) = text(&again);
    assert_eq!(stdout.matches("complete, skipped").count(), 5, "{stdout}");
    assert!(!stdout.contains(": running"), "{stdout}");
    let check = run(&["check", SPEC]);
    assert!(text(&check).0.contains("5 trials (5 trials drawn by TPE, the first 3 at random)"), "{}", text(&check).0);
}

#[test]
fn tpe_over_a_grid_or_without_random_parameters_is_refused_with_the_fix() {
    let dir = tempdir();
    let out = sweep(
        "tests/fixtures/sweeps/mnist_validation.toml",
        dir.path(),
        &["--set", "sweep.tpe.n_startup_trials=2", "--dry-run"],
    );
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("cannot search a grid: sweep.grid sets `optimizer.learning_rate`"), "{stderr}");
    assert!(stderr.contains("kind = \"choice\""), "{stderr}");
    assert!(stderr.contains("[sweep.tpe] draws the [sweep.random] parameters, and the sweep has none"), "{stderr}");
    let out = sweep("tests/fixtures/sweeps/mnist_tpe.toml", dir.path(), &["--set", "sweep.tpe.gamma=1.5", "--dry-run"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("gamma = 1.5 is not a fraction between 0 and 1"), "{}", text(&out).1);
}
