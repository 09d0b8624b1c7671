//! Sweeps end to end, as a user runs them: `trainrun sweep` over learning rate × batch size on
//! real MNIST, twice with the same results; an interrupted sweep finishing only the missing
//! trials; SIGTERM and Ctrl-C stopping a sweep cleanly; `--dry-run`; errors located in the sweep; failing and multi-worker trials;
//! `trainrun report` on what it wrote.

mod common;

use common::sweep::{gpu_then_cpu, results, results_bytes};
use common::{assert_exit, json, run, tempdir, text};
use std::path::Path;
use std::time::{Duration, Instant};

const SPEC: &str = "specs/mnist_sweep.toml";
/// A sweep that selects on the test split, for the warning that earns.
const TEST_METRIC: &str = "tests/fixtures/sweeps/mnist_test_metric.toml";

/// Shorter trials than the checked-in spec's, with the same shape.
const SHORT: [&str; 6] =
    ["--set", "train.steps_per_epoch=20", "--set", "train.evaluate_every_steps=10", "--set", "run.log_every_steps=5"];

/// `trainrun sweep` of the short trials into `out`, as arguments.
fn sweep_args(out: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["sweep", SPEC, "--set"].map(String::from).to_vec();
    args.push(format!("run.out_dir={}", out.display()));
    args.extend(SHORT.map(String::from));
    args
}

fn sweep(out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = sweep_args(out);
    args.extend(extra.iter().map(|s| s.to_string()));
    run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The sweep of `sweep_args(out)` started in the background, its output piped or dropped.
fn start_sweep(out: &Path, piped: bool) -> std::process::Child {
    let stdio = || if piped { std::process::Stdio::piped() } else { std::process::Stdio::null() };
    common::trainrun().args(sweep_args(out)).stdout(stdio()).stderr(stdio()).spawn().unwrap_or_else(|e| panic!("{e}"))
}

const TRIALS: [&str; 4] =
    ["trial-001-batch32-lr0.01", "trial-002-batch32-lr0.05", "trial-003-batch64-lr0.01", "trial-004-batch64-lr0.05"];

#[test]
fn a_sweep_runs_ranks_and_records_every_trial_the_same_twice_and_reports() {
    let (a, b) = (tempdir(), tempdir());
    let out = sweep(a.path(), &[]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("4 trials"), "{stdout}");
    assert!(stdout.contains("ranked by val_accuracy (higher is better)"), "{stdout}");
    for t in TRIALS {
        assert!(stdout.contains(t), "{t} not in\n{stdout}");
    }

    // The results: one row per trial, ranked, with values, seed and final metrics.
    let rows = results(a.path());
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(
        rows[0][..8],
        ["rank", "trial", "name", "status", "exit_code", "batch.global", "optimizer.learning_rate", "seed"]
    );
    let acc = rows[0].iter().position(|h| h == "val_accuracy").unwrap_or(usize::MAX);
    let accs: Vec<f64> = rows[1..].iter().map(|r| r[acc].parse().unwrap_or(f64::NAN)).collect();
    assert!(accs.windows(2).all(|w| w[0] >= w[1]) && accs.iter().all(|a| *a > 0.5), "{accs:?}");
    assert!(rows[1..].iter().all(|r| r[3] == "ok" && r[4] == "0"), "{rows:?}");
    assert_eq!(rows[1..].iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), ["1", "2", "3", "4"]);

    // Every trial is an ordinary run folder that records how to reproduce it.
    for (i, t) in TRIALS.iter().enumerate() {
        let dir = a.path().join(t);
        let summary = json(&dir.join("summary.json"));
        assert_eq!(summary["spec_sha256"].as_str().map(str::len), Some(64), "{summary}");
        let record = json(&dir.join("run.json"));
        assert_eq!(record["status"], "completed", "{record}");
        assert_eq!(record["exit_code"], 0);
        assert_eq!(record["sweep"]["trial"], i + 1);
        assert_eq!(record["sweep"]["name"], *t);
        assert_eq!(record["seeds"]["sweep"], 42);
        assert_eq!(record["seeds"]["run"], summary["seed"]);
        assert_eq!(record["spec"]["sha256"], summary["spec_sha256"]);
        assert_eq!(record["spec"]["path"], SPEC);
        assert!(record["git"].get("commit").is_some() && record["git"].get("dirty").is_some(), "{record}");
        assert_eq!(record["cluster"]["strategy"], "default");
        assert!(record["host"]["cores"].as_u64().unwrap_or(0) >= 1);
        assert!(record["started_at"].as_str().is_some_and(|s| s.ends_with('Z')));
        let spec = std::fs::read_to_string(dir.join("spec.toml")).unwrap_or_default();
        assert!(!spec.contains("[sweep"), "a trial's resolved spec is an ordinary run:\n{spec}");
        assert!(dir.join("train.log").is_file() && dir.join("model.safetensors").is_file());
    }
    // A trial's resolved spec runs again on its own, to the same weights.
    let again = tempdir();
    let spec = a.path().join(TRIALS[1]).join("spec.toml").display().to_string();
    let o = format!("run.out_dir={}", again.path().display());
    assert_exit(&run(&[&spec, "-q", "--set", &o]), 0);
    let (first, second) =
        (json(&a.path().join(TRIALS[1]).join("summary.json")), json(&again.path().join("summary.json")));
    assert_eq!(first["weights_sha256"], second["weights_sha256"]);
    assert_eq!(first["spec_sha256"], second["spec_sha256"]);

    let record = json(&a.path().join("sweep.json"));
    assert_eq!(record["trials"].as_array().map(Vec::len), Some(4));
    assert!(record["ended_at"].is_string(), "{record}");

    // The same sweep elsewhere, two trials at a time: the same results, bit for bit.
    assert_exit(&sweep(b.path(), &["--parallel", "2"]), 0);
    assert_eq!(results(a.path()), results(b.path()));

    // Running it again finds every trial complete.
    let again = sweep(a.path(), &[]);
    assert_exit(&again, 0);
    let (stdout, _) = text(&again);
    assert!(stdout.contains("0 to run (4 complete)"), "{stdout}");
    assert!(!stdout.contains("running"), "{stdout}");
    assert_eq!(results(a.path()), results(b.path()));

    // The report: curves of every trial, the ranked table.
    let out = run(&["report", &a.path().display().to_string()]);
    assert_exit(&out, 0);
    for file in ["loss.svg", "loss.png", "accuracy.svg", "accuracy.png", "report.html"] {
        let bytes = std::fs::read(a.path().join(file)).unwrap_or_default();
        assert!(bytes.len() > 2000, "{file}: {} bytes", bytes.len());
        if file.ends_with(".png") {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{file}");
        }
    }
    let svg = std::fs::read_to_string(a.path().join("loss.svg")).unwrap_or_default();
    assert!(TRIALS.iter().all(|t| svg.contains(t)) && svg.contains("step"), "every trial in the legend");
    let html = std::fs::read_to_string(a.path().join("report.html")).unwrap_or_default();
    assert!(html.contains("<table>") && html.contains("loss.svg") && TRIALS.iter().all(|t| html.contains(t)));
    let trial = a.path().join(TRIALS[0]);
    assert_exit(&run(&["report", &trial.display().to_string()]), 0);
    assert!(std::fs::metadata(trial.join("accuracy.png")).map(|m| m.len()).unwrap_or(0) > 2000);
}

#[test]
fn an_interrupted_sweep_runs_only_the_missing_trials() {
    let dir = tempdir();
    let mut child = start_sweep(dir.path(), false);
    let first = dir.path().join(TRIALS[0]).join("summary.json");
    let start = Instant::now();
    while !first.exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "the first trial never completed");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    let kept = std::fs::read(&first).unwrap_or_default();

    // The trial that was running dies with the sweep.
    std::thread::sleep(Duration::from_millis(500));
    let second = dir.path().join(TRIALS[1]);
    if let Ok(text) = std::fs::read_to_string(second.join("run.json")) {
        let record: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        let pid = record["host"]["pid"].as_u64().unwrap_or(0);
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "trial 2 (pid {pid}) outlived its sweep");
    }
    assert!(!second.join("summary.json").exists(), "trial 2 should have been interrupted");

    let out = sweep(dir.path(), &[]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("3 to run (1 complete)"), "{stdout}");
    assert!(stdout.contains(&format!("[1/4] {}: complete, skipped", TRIALS[0])), "{stdout}");
    for t in &TRIALS[1..] {
        assert!(stdout.contains(&format!("{t}: running")), "{t} should run:\n{stdout}");
    }
    assert_eq!(std::fs::read(&first).unwrap_or_default(), kept, "the complete trial was left alone");
    let rows = results(dir.path());
    assert!(rows.len() == 5 && rows[1..].iter().all(|r| r[3] == "ok"), "{rows:?}");
}

/// SIGTERM (then Ctrl-C) to a sweep while its second trial trains: the trial stops as a run
/// does and stays pending, not failed; the sweep records the stop, says how far it got and
/// exits 6 (130); the same command then runs the rest.
#[test]
fn a_stopped_sweep_records_the_stop_and_the_same_command_runs_the_rest() {
    for (signal, code, name) in [(libc::SIGTERM, 6, "SIGTERM"), (libc::SIGINT, 130, "Ctrl-C (SIGINT)")] {
        let dir = tempdir();
        let mut child = start_sweep(dir.path(), true);
        // The second trial's run.json appears when it begins training.
        common::wait_for_file(&dir.path().join(TRIALS[1]).join("run.json"), Duration::from_secs(60), &mut [&mut child]);
        common::signal(child.id(), signal);
        let (out, took) = common::wait_within(child, Duration::from_secs(60));
        assert_exit(&out, code);
        assert!(took < Duration::from_secs(2), "{name}: took {took:?}");
        let (stdout, stderr) = text(&out);
        assert!(stdout.contains(&format!("[2/4] {}: stopped by {name}", TRIALS[1])), "{stdout}");
        assert!(
            stderr.contains(&format!("sweep stopped by {name}: 1 of 4 trials complete; run the same command again")),
            "{stderr}"
        );
        let record = json(&dir.path().join("sweep.json"));
        assert_eq!(record["stopped_by"], name, "{record}");
        // The sweep passes a stop on as SIGTERM (a terminal sends its own Ctrl-C to the trial).
        let stopped = json(&dir.path().join(TRIALS[1]).join("run.json"));
        assert_eq!(stopped["status"], "preempted", "{stopped}");
        let rows = results(dir.path());
        let status: Vec<&str> = rows[1..].iter().map(|r| r[3].as_str()).collect();
        assert_eq!(status, ["ok", "pending", "pending", "pending"], "{rows:?}");

        let out = sweep(dir.path(), &[]);
        assert_exit(&out, 0);
        assert!(text(&out).0.contains("3 to run (1 complete)"), "{}", text(&out).0);
        assert!(json(&dir.path().join("sweep.json"))["stopped_by"].is_null());
    }
}

#[test]
fn dry_run_lists_the_trials_and_runs_nothing() {
    let dir = tempdir();
    let out_dir = dir.path().join("sweep");
    let out = sweep(&out_dir, &["--dry-run"]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("4 trials") && stdout.contains("sweep seed 42"), "{stdout}");
    assert!(stdout.contains("batch.global = 64, optimizer.learning_rate = 0.05"), "{stdout}");
    for t in TRIALS {
        assert!(stdout.lines().any(|l| l.contains(t) && l.contains("to run")), "{t}:\n{stdout}");
    }
    assert!(!out_dir.exists(), "a dry run writes nothing");

    // `check` plans the base spec and counts the trials; an empty sweep is a spec error.
    let out = run(&["check", SPEC]);
    assert_exit(&out, 0);
    assert!(text(&out).0.lines().any(|l| l.trim_start().starts_with("sweep") && l.contains("4 trials")));
    let out = run(&["check", "specs/mnist_single.toml", "--set", "sweep.metric=test_loss"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("the sweep has no trials"), "{}", text(&out).1);
}

#[test]
fn problems_in_a_sweep_exit_2_all_at_once_located_in_the_sweep() {
    let out = run(&["sweep", "tests/fixtures/sweeps/bad_key.toml", "--dry-run"]);
    assert_exit(&out, 2);
    insta::assert_snapshot!("sweep_bad_key", text(&out).1);
}

#[test]
fn plain_trainrun_on_a_sweep_spec_points_at_trainrun_sweep() {
    let out = run(&[SPEC, "-q"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("has a [sweep] section") && stderr.contains("trainrun sweep specs/mnist_sweep.toml"));
    assert!(stderr.contains("specs/mnist_sweep.toml:"), "located at [sweep]: {stderr}");
    let out = run(&["sweep", "specs/mnist_single.toml", "--dry-run"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("has no [sweep] section"));
    let out = run(&["sweep", SPEC, "--parallel", "999"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("--parallel 999 is more than"));
}

#[test]
fn a_failing_trial_is_reported_and_the_others_still_run() {
    #[cfg(feature = "cuda")]
    if trainrun::engine::cuda::probe::Library::Driver.present() {
        println!("skipped: a CUDA build with the NVIDIA driver present would run the GPU trial");
        return;
    }
    let dir = tempdir();
    // A GPU device plans, but a CPU build cannot run it: its trial exits 3 at run time.
    let out = run(&gpu_then_cpu(dir.path(), &[]).iter().map(String::as_str).collect::<Vec<_>>());
    assert_exit(&out, 3);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("trial-001-devicegpu_0: FAILED (exit 3)"), "{stdout}");
    // A CUDA build fails the GPU trial with the probe's message instead (tests/cuda.rs).
    let want = if cfg!(feature = "cuda") { "GPU: " } else { "needs a GPU build" };
    assert!(stdout.contains(want), "the failed trial's log tail: {stdout}");
    assert!(stdout.lines().any(|l| l.contains("trial-001-devicegpu_0") && l.ends_with("failed (exit 3)")), "{stdout}");
    assert!(stderr.contains("1 of 2 trials failed"), "{stderr}");
    let rows = results(dir.path());
    assert_eq!(rows[1][..5], ["1", "2", "trial-002-devicecpu_0", "ok", "0"]);
    assert_eq!(rows[2][..5], ["", "1", "trial-001-devicegpu_0", "failed", "3"]);
}

#[test]
fn multi_worker_trials_are_ordinary_runs() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    let out = run(&[
        "sweep",
        "specs/mnist_multiworker.toml",
        "--set",
        &o,
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=10",
        "--set",
        "sweep.grid.\"optimizer.learning_rate\"=[0.01, 0.05]",
        "--set",
        "sweep.metric=test_loss",
    ]);
    assert_exit(&out, 0);
    for t in ["trial-001-lr0.01", "trial-002-lr0.05"] {
        let summary = json(&dir.path().join(t).join("summary.json"));
        assert_eq!(summary["num_workers"], 2, "{summary}");
        let record = json(&dir.path().join(t).join("run.json"));
        assert_eq!(record["cluster"]["num_workers"], 2, "{record}");
        assert_eq!(record["cluster"]["task"], "worker:0", "the chief records the run: {record}");
    }
}

/// A sweep selects on a validation split by default: trials that evaluate only the test split
/// are refused before anything runs, naming the metric, what the trials produce and the fix;
/// selecting on a test metric is a warning.
#[test]
fn a_sweep_selects_on_validation_and_is_told_when_it_cannot() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    let grid = "sweep.grid.\"optimizer.learning_rate\"=[0.01, 0.05]";
    let out = run(&["sweep", "specs/mnist_single.toml", "--set", &o, "--set", grid, "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains(
            "sweep.metric = \"val_loss\", but the trials do not produce val_loss; they produce test_accuracy, \
             test_loss, train_accuracy, train_loss"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("validation_split") && stderr.contains("sweep.metric = \"test_loss\""), "{stderr}");
    let out = run(&["check", "specs/mnist_single.toml", "--set", grid]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("do not produce val_loss"), "{}", text(&out).1);

    // Selecting on the test split runs, with a warning at check and at the sweep.
    let out = run(&["check", TEST_METRIC]);
    assert_exit(&out, 0);
    let warning = "warning: the sweep selects on test_accuracy, a metric of the test split";
    assert!(text(&out).1.contains(warning), "{}", text(&out).1);
    let o = format!("run.out_dir={}", dir.path().join("test").display());
    let out = run(&["sweep", TEST_METRIC, "--set", &o, "--dry-run"]);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains(warning), "{}", text(&out).1);
    // The checked-in sweep selects on its validation split, without the warning.
    let out = run(&["check", SPEC]);
    assert_exit(&out, 0);
    assert!(!text(&out).1.contains("selects on"), "{}", text(&out).1);
}

#[test]
fn a_validation_sweep_ranks_by_the_held_out_split_and_keeps_test_columns_empty() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    let out = run(&["sweep", "tests/fixtures/sweeps/mnist_validation.toml", "--set", &o]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("ranked by val_accuracy (higher is better)"), "{stdout}");
    assert!(!stderr.contains("selects on"), "{stderr}");
    let rows = results(dir.path());
    let col = |name: &str| rows[0].iter().position(|h| h == name).unwrap_or(usize::MAX);
    let (val, val_loss, test) = (col("val_accuracy"), col("val_loss"), col("test_accuracy"));
    let accs: Vec<f64> = rows[1..].iter().map(|r| r[val].parse().unwrap_or(f64::NAN)).collect();
    assert!(accs.len() == 2 && accs[0] >= accs[1] && accs[1] > 0.3, "{rows:?}");
    assert!(rows[1..].iter().all(|r| r[test].is_empty() && !r[val_loss].is_empty()), "{rows:?}");
    // The trial's own summary calls its evaluated split `test`, as every run does.
    let best = dir.path().join(&rows[1][2]).join("summary.json");
    assert_eq!(json(&best)["test_accuracy"].as_f64(), Some(accs[0]));
    assert_eq!(json(&dir.path().join("sweep.json"))["trials"][0]["evaluates"], "validation");
}

const HALVING: &str = "tests/fixtures/sweeps/mnist_halving.toml";

fn halving(out: &Path, extra: &[&str]) -> std::process::Output {
    let o = format!("run.out_dir={}", out.display());
    let mut args = vec!["sweep", HALVING, "--set", &o];
    args.extend(extra);
    run(&args)
}

/// Successive halving: 3 trials train 1 epoch, the best goes on to 2 from its backup and ends
/// bit-identical to its spec trained straight; the others keep their folders, marked stopped
/// early at rung 1; the decisions are logged; the same synchronous sweep again (two trials at
/// a time) decides the same and writes a byte-identical `results.csv`, its timings apart in
/// `timings.csv`; a rerun trains nothing and rewrites the same bytes.
#[test]
fn successive_halving_promotes_the_best_which_resumes_exactly_and_stops_the_rest() {
    let (a, b) = (tempdir(), tempdir());
    let out = halving(a.path(), &[]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("rung 1 of 2: 1 epochs, 3 trials, 3 to train"), "{stdout}");
    assert!(stdout.contains("rung 2 of 2: 2 epochs, 1 trials, 1 to train"), "{stdout}");
    let rows = results(a.path());
    let status: Vec<&str> = rows[1..].iter().map(|r| r[3].as_str()).collect();
    assert_eq!(status, ["ok", "stopped_early", "stopped_early"], "{rows:?}");
    let steps = rows[0].iter().position(|h| h == "steps").unwrap_or(usize::MAX);
    assert_eq!(rows[1..].iter().map(|r| r[steps].as_str()).collect::<Vec<_>>(), ["40", "20", "20"], "{rows:?}");
    let best = a.path().join(&rows[1][2]);
    let summary = json(&best.join("summary.json"));
    assert_eq!(summary["resumed_from_step"], 20, "{summary}");
    for r in &rows[2..] {
        let marker = json(&a.path().join(&r[2]).join("stopped_early.json"));
        assert_eq!((marker["rung"].as_u64(), marker["epochs"].as_u64()), (Some(1), Some(1)), "{marker}");
        assert!(a.path().join(&r[2]).join("model.safetensors").is_file(), "a stopped trial keeps its folder");
    }
    let decisions = std::fs::read_to_string(a.path().join("decisions.jsonl")).unwrap_or_default();
    assert_eq!(decisions.lines().count(), 1, "{decisions}");
    let line: serde_json::Value = serde_json::from_str(decisions.trim()).unwrap_or_default();
    assert_eq!(line["seen"].as_array().map(Vec::len), Some(3), "{line}");
    assert_eq!(line["promoted"][0], rows[1][1].parse::<u64>().unwrap_or(0), "{line}");

    // The promoted trial, paused and resumed, equals its spec trained without a pause.
    let straight = tempdir();
    let spec = best.join("spec.toml").display().to_string();
    let o = format!("run.out_dir={}", straight.path().display());
    assert_exit(&run(&[&spec, "-q", "--set", &o]), 0);
    assert_eq!(json(&straight.path().join("summary.json"))["weights_sha256"], summary["weights_sha256"]);

    // The same sweep again decides the same and writes the same bytes; only timings.csv,
    // beside it, differs from run to run.
    assert_exit(&halving(b.path(), &["--parallel", "2"]), 0);
    let bytes = results_bytes(a.path());
    assert!(bytes == results_bytes(b.path()), "results.csv differs:\n{:?}\n{:?}", results(a.path()), results(b.path()));
    assert_eq!(std::fs::read_to_string(b.path().join("decisions.jsonl")).unwrap_or_default(), decisions);
    let timings = std::fs::read_to_string(a.path().join("timings.csv")).unwrap_or_default();
    let timings: Vec<Vec<&str>> = timings.lines().map(|l| l.split(',').collect()).collect();
    assert_eq!(timings[0], ["trial", "name", "status", "wall_s", "steady_examples_per_s"], "{timings:?}");
    let mut named: Vec<(&str, &str)> = rows[1..].iter().map(|r| (r[1].as_str(), r[2].as_str())).collect();
    named.sort();
    assert_eq!(timings[1..].iter().map(|t| (t[0], t[1])).collect::<Vec<_>>(), named, "every trial, by number");
    assert!(timings[1..].iter().all(|t| t[3].parse::<f64>().is_ok_and(|w| w > 0.0)), "{timings:?}");

    // Run again, it trains nothing.
    let again = halving(a.path(), &[]);
    assert_exit(&again, 0);
    let (stdout, _) = text(&again);
    assert!(stdout.contains("3 trials, 0 to train") && stdout.contains("1 trials, 0 to train"), "{stdout}");
    assert!(results_bytes(a.path()) == bytes, "a rerun rewrites the same bytes: {:?}", results(a.path()));
}

/// A sweep driver killed (SIGKILL) during the first rung resumes there: a trial that finished
/// the rung is not trained again.
#[test]
fn a_killed_halving_sweep_resumes_where_it_was() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    let mut child = common::trainrun()
        .args(["sweep", HALVING, "--set", &o])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let first = dir.path().join("trial-001-lr0.003").join("summary.json");
    common::wait_for_file(&first, Duration::from_secs(60), &mut [&mut child]);
    let _ = child.kill();
    let _ = child.wait();
    let out = halving(dir.path(), &[]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("rung 1 of 2: 1 epochs, 3 trials, 2 to train"), "{stdout}");
    assert!(!stdout.contains("trial-001-lr0.003: running"), "trial 1 finished its rung:\n{stdout}");
    let rows = results(dir.path());
    assert_eq!(rows[1..].iter().filter(|r| r[3] == "ok").count(), 1, "{rows:?}");
}

#[test]
fn bad_scheduler_input_is_named_with_its_fix() {
    let dir = tempdir();
    let out = halving(dir.path(), &["--set", "sweep.scheduler.grace=5", "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("grace = 5 epochs is more than max = 2 epochs"), "{stderr}");
    assert!(stderr.contains("lower grace to at most 2"), "{stderr}");
    let out = halving(dir.path(), &["--set", "sweep.scheduler.grase=1", "--dry-run"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("grase") && stderr.contains("grace"), "{stderr}");
    let out = halving(dir.path(), &["--set", "callbacks=[]"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("keeps no backup"), "{}", text(&out).1);
}

/// The trials of a sweep inflate MNIST's gzip files once into the sweep's `.data-cache` and
/// read them from there after; a run reads the same bits either way, a cache that cannot be
/// written is a warning with the same results, and a corrupt entry is not trusted.
#[test]
fn trials_share_the_inflated_data_and_get_the_same_results_without_it() {
    const VALIDATION: &str = "tests/fixtures/sweeps/mnist_validation.toml";
    let (cached, blocked, repaired) = (tempdir(), tempdir(), tempdir());
    let sweep_into = |out: &Path, cache: Option<&Path>| {
        let o = format!("run.out_dir={}", out.display());
        let mut cmd = common::trainrun();
        cmd.args(["sweep", VALIDATION, "-q", "--set", &o]).env_remove("TRAINRUN_DATA_CACHE");
        if let Some(c) = cache {
            cmd.env("TRAINRUN_DATA_CACHE", c);
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("{e}"));
        assert_exit(&out, 0);
    };
    sweep_into(cached.path(), None);
    let cache = cached.path().join(".data-cache");
    let entries = |dir: &Path| -> Vec<std::path::PathBuf> {
        let mut e: Vec<_> =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{e}")).map(|e| e.unwrap().path()).collect();
        e.sort();
        e
    };
    let written = entries(&cache);
    // The training images and labels, and no temporary left behind.
    assert_eq!(written.len(), 2, "{written:?}");
    assert!(written.iter().all(|p| p.extension().is_some_and(|e| e == "idx")), "{written:?}");

    // A file where the cache folder should be: every trial warns and inflates, same results.
    let file = blocked.path().join("not-a-folder");
    std::fs::write(&file, b"").unwrap_or_else(|e| panic!("{e}"));
    sweep_into(&blocked.path().join("sweep"), Some(&file));
    assert_eq!(results_bytes(&blocked.path().join("sweep")), results_bytes(cached.path()));
    let logs: String = std::fs::read_dir(blocked.path().join("sweep"))
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("train.log")).ok())
        .collect();
    assert!(logs.contains("warning: cannot use the data cache"), "{logs}");

    // A truncated entry is inflated again and rewritten whole; the results do not move.
    let images = written.iter().max_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).unwrap();
    let whole = std::fs::read(images).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(images, &whole[..whole.len() / 2]).unwrap_or_else(|e| panic!("{e}"));
    sweep_into(repaired.path(), Some(&cache));
    assert_eq!(results_bytes(repaired.path()), results_bytes(cached.path()));
    assert_eq!(std::fs::read(images).unwrap_or_else(|e| panic!("{e}")), whole);
    assert!(!repaired.path().join(".data-cache").exists(), "the cache the user named is used");
}
