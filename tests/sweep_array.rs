//! A sweep spread over a cluster, as its job array runs it: `trainrun sweep SPEC --trial I` for
//! every index (two at once, into one folder), then `--collect` ranks them into the same
//! `results.csv` as `trainrun sweep SPEC`; an index outside the sweep and a scheduled sweep are
//! refused; a failed index is told from an unfinished one; the sbatch job array's own script
//! trains two indexes here (no Slurm needed); the Indexed Job runs the same command; and a
//! multi-worker trial whose worker is killed fails without hanging the sweep, while the trial
//! beside it (its own cluster, its own ports) completes.

mod common;

use common::sweep::{gpu_then_cpu, results};
use common::{assert_exit, run, tempdir, text};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const SPEC: &str = "specs/mnist_sweep.toml";
const HALVING: &str = "tests/fixtures/sweeps/mnist_halving.toml";

/// Shorter trials than the checked-in spec's, with the same shape.
const SHORT: [&str; 6] =
    ["--set", "train.steps_per_epoch=20", "--set", "train.evaluate_every_steps=10", "--set", "run.log_every_steps=5"];

/// `trainrun <command> SPEC` of the short trials into `out`, then `extra`.
fn args(command: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [command, SPEC, "--set"].map(String::from).to_vec();
    args.push(format!("run.out_dir={}", out.display()));
    args.extend(SHORT.map(String::from));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn sweep(out: &Path, extra: &[&str]) -> std::process::Output {
    let args = args("sweep", out, extra);
    run(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The status column of each row of `results.csv`, by trial number.
fn statuses(dir: &Path) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = results(dir)[1..].iter().map(|r| (r[1].clone(), r[3].clone())).collect();
    rows.sort();
    rows
}

#[test]
fn every_index_then_collect_ranks_as_the_driver_does() {
    let (driven, spread) = (tempdir(), tempdir());
    assert_exit(&sweep(driven.path(), &[]), 0);

    // Nothing has run: every trial is listed, not finished.
    let out = sweep(spread.path(), &["--collect"]);
    assert_exit(&out, 0);
    assert!(
        text(&out).0.contains("0 of 4 trials complete, 0 failed, 0 stopped early, 4 not finished"),
        "{:?}",
        text(&out)
    );
    assert!(statuses(spread.path()).iter().all(|(_, s)| s == "pending"), "{:?}", statuses(spread.path()));

    // Two indexes at a time into the same folder, as a job array with `%2` runs them.
    let folder = spread.path();
    for pair in [["0", "1"], ["2", "3"]] {
        let outs: Vec<std::process::Output> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                pair.map(|i| scope.spawn(move || sweep(folder, &["--trial", i]))).into_iter().collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for out in &outs {
            assert_exit(out, 0);
        }
        // An index writes only its trial's folder: the ranking is the collector's.
        assert!(statuses(spread.path()).iter().all(|(_, s)| s == "pending"));
    }
    let out = sweep(spread.path(), &["--collect"]);
    assert_exit(&out, 0);
    assert!(text(&out).0.contains("4 of 4 trials complete"), "{:?}", text(&out));
    // The same trials, folders, seeds, metrics and weights' hashes, in the same order.
    assert_eq!(results(spread.path()), results(driven.path()));
    assert!(spread.path().join("sweep.json").exists());

    // A complete index is skipped, so a requeued array task costs nothing.
    let out = sweep(spread.path(), &["--trial", "2"]);
    assert_exit(&out, 0);
    assert!(text(&out).0.contains("[3/4] trial-003-batch64-lr0.01: complete, skipped"), "{:?}", text(&out));
}

#[test]
fn indexes_outside_the_sweep_and_scheduled_sweeps_are_refused() {
    let dir = tempdir();
    let out = sweep(dir.path(), &["--trial", "4"]);
    assert_exit(&out, 2);
    let err = text(&out).1;
    assert!(err.contains("--trial 4 is outside the sweep of specs/mnist_sweep.toml"), "{err}");
    assert!(err.contains("job-array indexes 0 to 3 (index I runs trial I + 1)"), "{err}");
    assert!(!dir.path().join("trial-001-batch32-lr0.01").exists(), "nothing runs on a refusal");

    let out = run(&["sweep", HALVING, "--trial", "0", "--set", &format!("run.out_dir={}", dir.path().display())]);
    assert_exit(&out, 2);
    let err = text(&out).1;
    assert!(err.contains("[sweep.scheduler] decides rung by rung") && err.contains("needs the sweep driver"), "{err}");

    let out = sweep(dir.path(), &["--trial", "0", "--collect"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("cannot be used with"), "{:?}", text(&out));
}

/// A failed index leaves its exit code in its folder, so the collector says failed, not pending.
#[test]
fn the_collector_tells_a_failed_index_from_an_unfinished_one() {
    #[cfg(feature = "cuda")]
    if trainrun::engine::cuda::probe::Library::Driver.present() {
        println!("skipped: a CUDA build with the NVIDIA driver present would run the GPU trial");
        return;
    }
    let dir = tempdir();
    let gpu = |extra: &[&str]| run(&gpu_then_cpu(dir.path(), extra).iter().map(String::as_str).collect::<Vec<_>>());
    // A GPU device plans, but a CPU build cannot run it: its trial exits 3 at run time.
    let out = gpu(&["--trial", "0"]);
    assert_exit(&out, 3);
    assert!(text(&out).1.contains("[1/2] trial-001-devicegpu_0 FAILED (exit 3)"), "{:?}", text(&out));
    let out = gpu(&["--collect"]);
    assert_exit(&out, 0);
    assert!(
        text(&out).0.contains("0 of 2 trials complete, 1 failed, 0 stopped early, 1 not finished"),
        "{:?}",
        text(&out)
    );
    let rows = results(dir.path());
    assert_eq!(rows[1][1..5], ["1", "trial-001-devicegpu_0", "failed", "3"], "{rows:?}");
    assert_eq!(rows[2][1..4], ["2", "trial-002-devicecpu_0", "pending"], "{rows:?}");
}

/// The sbatch script of a sweep is a job array whose every index runs its trial; run here
/// under bash for two indexes at once, with `trainrun` on the PATH as in the image.
#[test]
fn the_slurm_job_array_script_trains_its_indexes_here() {
    let dir = tempdir();
    let sweep_dir = dir.path().join("sweep");
    let manifest = args("manifest", &sweep_dir, &["--for", "slurm", "--parallel", "2"]);
    let out = run(&manifest.iter().map(String::as_str).collect::<Vec<_>>());
    assert_exit(&out, 0);
    let script = text(&out).0;
    for line in [
        "#SBATCH --array=0-3%2\n",
        "#SBATCH --nodes=1\n#SBATCH --ntasks=1\n",
        "#SBATCH --output=mnist-sweep-%A_%a.out\n",
    ] {
        assert!(script.contains(line), "{line:?} in\n{script}");
    }
    assert!(
        script.ends_with("trainrun sweep \"mnist-sweep.spec.toml\" --trial \"$SLURM_ARRAY_TASK_ID\"\n"),
        "{script}"
    );
    let job = dir.path().join("job.sbatch");
    std::fs::write(&job, &script).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&job).output().unwrap();
    assert!(syntax.status.success(), "{}", String::from_utf8_lossy(&syntax.stderr));

    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_trainrun"), bin.join("trainrun")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let index = |i: &str| {
        Command::new("bash")
            .arg(&job)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("SLURM_ARRAY_TASK_ID", i)
            .env("TRAINRUN_DATA_DIR", common::data_dir())
            .env("TRAINRUN_OFFLINE", "1")
            .spawn()
            .unwrap()
    };
    let (a, b) = (index("0"), index("3"));
    for child in [a, b] {
        let (out, _) = common::wait_within(child, Duration::from_secs(300));
        assert!(out.status.success(), "{:?}", text(&out));
    }
    let spec = dir.path().join("mnist-sweep.spec.toml");
    let out = common::trainrun().args(["sweep", &spec.display().to_string(), "--collect"]).output().unwrap();
    assert_exit(&out, 0);
    let want: Vec<(String, String)> = [("1", "ok"), ("2", "pending"), ("3", "pending"), ("4", "ok")]
        .map(|(t, s)| (t.to_string(), s.to_string()))
        .to_vec();
    assert_eq!(statuses(&sweep_dir), want);
}

#[test]
fn the_kubernetes_indexed_job_runs_one_trial_per_index() {
    let dir = tempdir();
    let manifest = args("manifest", dir.path(), &["--parallel", "3"]);
    let out = run(&manifest.iter().map(String::as_str).collect::<Vec<_>>());
    assert_exit(&out, 0);
    let yaml = text(&out).0;
    for want in [
        "completionMode: Indexed",
        "completions: 4",
        "parallelism: 3",
        "- sweep\n        - /etc/trainrun/spec/spec.toml\n        - --trial\n        - $(JOB_COMPLETION_INDEX)",
        "batch.kubernetes.io/job-completion-index",
    ] {
        assert!(yaml.contains(want), "{want:?} in\n{yaml}");
    }
    assert!(!yaml.contains("kind: Service"), "trials need no Service:\n{yaml}");

    // What a job array cannot do is refused, naming the fix.
    for (extra, why) in [
        (&["--for", "tfjob"][..], "use `--for kubernetes` (an Indexed Job) or `--for slurm`"),
        (&["--set", "sweep.scheduler={ kind = \"successive_halving\", grace = 1 }"][..], "needs one sweep driver"),
    ] {
        let out = run(&args("manifest", dir.path(), extra).iter().map(String::as_str).collect::<Vec<_>>());
        assert_exit(&out, 2);
        assert!(text(&out).1.contains(why), "{why}: {:?}", text(&out));
    }
    let out = run(&["manifest", "specs/mnist_single.toml", "--parallel", "2"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("--parallel 2 sets how many trials of a sweep run at once"), "{:?}", text(&out));
}

/// Every process `pid` started, from any of its threads.
fn started_by(pid: u32) -> Vec<u32> {
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect()).unwrap_or(Vec::new());
    threads
        .iter()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

#[test]
fn a_multi_worker_trial_whose_worker_dies_fails_without_hanging_the_sweep() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    let sweep = common::trainrun()
        .args([
            "sweep",
            "specs/mnist_multiworker.toml",
            "--parallel",
            "2",
            "--set",
            &o,
            "--set",
            "train.epochs=1",
            "--set",
            "train.steps_per_epoch=150",
            "--set",
            "sweep.grid.\"optimizer.learning_rate\"=[0.01, 0.05]",
            "--set",
            "sweep.metric=test_loss",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The first trial's launcher: the trial whose TRAINRUN_SWEEP_TRIAL is 1.
    let mut launcher = None;
    let start = std::time::Instant::now();
    while launcher.is_none() && start.elapsed() < Duration::from_secs(60) {
        launcher = started_by(sweep.id()).into_iter().find(|c| {
            let env = std::fs::read(format!("/proc/{c}/environ")).unwrap_or_default();
            String::from_utf8_lossy(&env).contains("TRAINRUN_SWEEP_TRIAL=1:")
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    let launcher = launcher.expect("the first trial never started");
    let worker = common::launched_task(launcher, ("worker", 1), Duration::from_secs(60)).expect("no worker:1");
    common::signal(worker, libc::SIGKILL);
    let (out, took) = common::wait_within(sweep, Duration::from_secs(300));
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("1 of 2 trials failed; the first, trial 1"), "{stdout}{stderr}");
    assert!(stdout.contains("[2/2] trial-002-lr0.05: done"), "the trial beside it completes: {stdout}");
    println!("the sweep with a killed worker ended in {took:?}");
    let rows = results(dir.path());
    assert_eq!(rows[1][1..5], ["2", "trial-002-lr0.05", "ok", "0"], "{rows:?}");
    assert_eq!(rows[2][1..4], ["1", "trial-001-lr0.01", "failed"], "{rows:?}");
}
