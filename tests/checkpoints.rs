//! Checkpoints, backup-and-restore, restarts and the evaluator, end to end on real MNIST: the
//! binary as a user runs it, interrupted the ways real jobs are (SIGTERM, SIGKILL, damaged
//! files), always ending with the weights of an uninterrupted run.

mod common;

use common::{assert_exit, json, run, tempdir, text, wait_for_file, wait_within};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

fn out(dir: &Path) -> String {
    format!("run.out_dir={}", dir.display())
}

fn summary(dir: &Path) -> serde_json::Value {
    json(&dir.join("summary.json"))
}

fn ckpt(root: &Path, step: u64) -> PathBuf {
    root.join(format!("ckpt-{step:010}"))
}

/// Runs `trainrun` with `args` to the end within [`LIMIT`].
fn finish(args: &[&str]) -> std::process::Output {
    let child = common::spawn(args);
    wait_within(child, LIMIT).0
}

fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

/// A jittery delay in `0..ms` milliseconds, so kills land at different steps run to run.
fn jitter(ms: u64) -> Duration {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    Duration::from_millis(u64::from(nanos) % ms.max(1))
}

// ---------------------------------------------------------------------------------------------
// One process.

/// The single-process job of these tests: 2 epochs × 80 steps, momentum (so optimizer state
/// matters), backups every 7 steps (so they fall mid-epoch).
const SINGLE: [&str; 10] = [
    "specs/mnist_single.toml",
    "-q",
    "--set",
    "train.epochs=2",
    "--set",
    "train.steps_per_epoch=80",
    "--set",
    "optimizer.momentum=0.9",
    "--set",
    "callbacks=[{ kind = \"backup_and_restore\", save_freq = 7 }, { kind = \"csv_logger\" }]",
];

fn single_reference() -> &'static serde_json::Value {
    static REF: OnceLock<serde_json::Value> = OnceLock::new();
    REF.get_or_init(|| {
        let dir = tempdir().keep();
        let o = out(&dir);
        assert_exit(&finish(&with(&SINGLE, &["--set", &o])), 0);
        assert!(!dir.join("backup").exists(), "a finished run removes its backup");
        let mut s = summary(&dir);
        s["csv"] = std::fs::read_to_string(dir.join("training.csv")).unwrap_or_default().into();
        s
    })
}

#[test]
fn a_sigterm_stops_after_a_backup_and_the_next_launch_ends_bit_identical() {
    let dir = tempdir();
    let o = out(dir.path());
    let args = with(&SINGLE, &["--set", &o]);
    let mut child = common::spawn(&args);
    wait_for_file(&ckpt(&dir.path().join("backup"), 7).join("manifest.json"), LIMIT, &mut [&mut child]);
    std::thread::sleep(jitter(150));
    common::signal(child.id(), libc::SIGTERM);
    let (stopped, _) = wait_within(child, LIMIT);
    assert_exit(&stopped, 6);
    let stderr = text(&stopped).1;
    assert!(
        stderr.contains("preempted: stopped after step") && stderr.contains("run the same command again"),
        "{stderr}"
    );
    assert!(!dir.path().join("summary.json").exists(), "a preempted run has no summary");

    let resumed = finish(&args);
    assert_exit(&resumed, 0);
    let s = summary(dir.path());
    let reference = single_reference();
    assert!(s["resumed_from_step"].as_u64().is_some_and(|n| n > 0 && n < 160), "{s}");
    for key in ["weights_sha256", "test_loss", "test_accuracy", "train_loss", "steps", "examples"] {
        assert_eq!(s[key], reference[key], "{key}");
    }
    let csv = std::fs::read_to_string(dir.path().join("training.csv")).unwrap_or_default();
    assert_eq!(csv, reference["csv"].as_str().unwrap_or_default(), "the CSV log reads as one run's");
}

/// Damages the newest of two backups in each way a crash or a disk can; the run must notice,
/// say so, resume from the older one and still end identical.
#[test]
fn damaged_backups_are_skipped_for_the_previous_one() {
    let base = tempdir();
    let o = out(base.path());
    // One epoch of 80, keeping its last two backups; then resume for the second epoch from
    // the newer one, damaged, so from the older.
    let first = with(&SINGLE, &["--set", &o, "--set", "train.epochs=1"]);
    let keep = "callbacks=[{ kind = \"backup_and_restore\", save_freq = 7, delete_checkpoint = false }, { kind = \"csv_logger\" }]";
    let mut first = first;
    first.extend(["--set", keep]);
    assert_exit(&finish(&first), 0);
    let backup = base.path().join("backup");
    // Which two: a backup still waiting when the next is due is replaced by it.
    let kept = steps_of(&backup);
    let [older, newer] = kept[..] else { panic!("backups kept: {kept:?}") };
    type Damage = fn(&Path);
    let cases: [(&str, Damage, &str); 3] = [
        ("truncated", |d| truncate(&d.join("model.safetensors")), "truncated"),
        ("flipped", |d| flip(&d.join("optimizer.safetensors")), "SHA-256"),
        ("no manifest", |d| std::fs::remove_file(d.join("manifest.json")).unwrap_or(()), "did not finish"),
    ];
    for (what, damage, says) in cases {
        let dir = tempdir();
        copy_dir(base.path(), dir.path());
        damage(&ckpt(&dir.path().join("backup"), newer));
        let o = out(dir.path());
        let resumed = finish(&with(&SINGLE, &["--set", &o, "--set", keep]));
        assert_exit(&resumed, 0);
        let stderr = text(&resumed).1;
        assert!(stderr.contains("skipping checkpoint") && stderr.contains(says), "{what}: {stderr}");
        let s = summary(dir.path());
        assert_eq!(s["resumed_from_step"], older, "{what}");
        assert_eq!(s["weights_sha256"], single_reference()["weights_sha256"], "{what}");
    }
}

fn truncate(path: &Path) {
    let len = std::fs::metadata(path).map_or(0, |m| m.len());
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap_or_else(|e| panic!("{e}"));
    f.set_len(len / 2).unwrap_or_else(|e| panic!("{e}"));
}

fn flip(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{e}"));
    let i = bytes.len() / 2;
    bytes[i] ^= 0x01;
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("{e}"));
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("{e}")).flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir_all(&target).unwrap_or_else(|e| panic!("{e}"));
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Retention and `trainrun eval`.

fn steps_of(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("manifest.json").exists())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("ckpt-")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    steps.sort_unstable();
    steps
}

#[test]
fn model_checkpoints_keep_max_to_keep_and_save_best_only_follows_the_mode() {
    let dir = tempdir();
    let o = out(dir.path());
    let short = ["specs/mnist_single.toml", "-q", "--set", "train.epochs=3", "--set", "train.steps_per_epoch=10"];
    let keep = "callbacks=[{ kind = \"model_checkpoint\", save_freq = 5, max_to_keep = 2 }]";
    assert_exit(&finish(&with(&short, &["--set", &o, "--set", keep])), 0);
    assert_eq!(steps_of(&dir.path().join("checkpoints")), [25, 30]);

    // val_loss falls every epoch: each epoch's checkpoint improves. val_accuracy rises, so with
    // mode = "min" only the first counts as best.
    let best = tempdir();
    let o = out(best.path());
    let cbs = "callbacks=[{ kind = \"model_checkpoint\", dir = \"CK/a\", save_best_only = true, monitor = \"val_loss\" }, \
               { kind = \"model_checkpoint\", dir = \"CK/b\", save_best_only = true, monitor = \"val_accuracy\", mode = \"min\" }]";
    let cbs = cbs.replace("CK", &best.path().display().to_string());
    let out = finish(&with(
        &short,
        &[
            "--set",
            &o,
            "--set",
            "optimizer.learning_rate=0.05",
            "--set",
            "train.evaluate_every_epoch=true",
            "--set",
            &cbs,
        ],
    ));
    assert_exit(&out, 0);
    assert_eq!(steps_of(&best.path().join("a")), [10, 20, 30]);
    assert_eq!(steps_of(&best.path().join("b")), [10]);

    // `trainrun eval` on the last checkpoint gives the run's final test metrics.
    let s = summary(best.path());
    let ck = ckpt(&best.path().join("a"), 30);
    let c = ck.display().to_string();
    let e = run(&["eval", "specs/mnist_single.toml", "--checkpoint", &c]);
    assert_exit(&e, 0);
    let line = text(&e).0.lines().last().map(str::to_string).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|err| panic!("{err}: {line}"));
    assert_eq!(v["test_accuracy"], s["test_accuracy"]);
    let (a, b) = (v["test_loss"].as_f64().unwrap_or(0.0), s["test_loss"].as_f64().unwrap_or(1.0));
    assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    // And refuses a damaged one, naming it.
    flip(&ck.join("model.safetensors"));
    let e = run(&["eval", "specs/mnist_single.toml", "--checkpoint", &c]);
    assert_exit(&e, 1);
    assert!(text(&e).1.contains("is damaged"), "{}", text(&e).1);
}

// ---------------------------------------------------------------------------------------------
// Two workers.

/// The checked-in fault-tolerant job, shortened, with momentum so optimizer state matters.
const FT: [&str; 8] = [
    "specs/mnist_fault_tolerant.toml",
    "--set",
    "train.epochs=2",
    "--set",
    "train.steps_per_epoch=50",
    "--set",
    "optimizer.momentum=0.9",
    "-q",
];

fn two_worker_reference() -> &'static serde_json::Value {
    static REF: OnceLock<serde_json::Value> = OnceLock::new();
    REF.get_or_init(|| {
        let dir = tempdir().keep();
        let o = out(&dir);
        assert_exit(&finish(&with(&FT, &["--set", &o])), 0);
        summary(&dir)
    })
}

fn same_result(s: &serde_json::Value, reference: &serde_json::Value) {
    for key in ["weights_sha256", "test_loss", "test_accuracy", "train_loss", "steps", "examples"] {
        assert_eq!(s[key], reference[key], "{key}: {s}");
    }
}

#[test]
fn a_worker_killed_at_a_random_step_is_restarted_and_the_job_ends_bit_identical() {
    let dir = tempdir();
    let o = out(dir.path());
    // Not quiet: the launcher reports how long the restart took.
    let args = ["specs/mnist_fault_tolerant.toml", "--set", "train.epochs=2", "--set", "train.steps_per_epoch=50"];
    let args = with(&args, &["--set", "optimizer.momentum=0.9", "--set", &o]);
    let mut launcher = common::spawn(&args);
    let victim = common::launched_task(launcher.id(), ("worker", 1), LIMIT).unwrap_or_else(|| panic!("no worker:1"));
    wait_for_file(&ckpt(&dir.path().join("backup"), 10).join("manifest.json"), LIMIT, &mut [&mut launcher]);
    std::thread::sleep(jitter(400));
    common::signal(victim, libc::SIGKILL);
    let (done, _) = wait_within(launcher, LIMIT);
    assert_exit(&done, 0);
    let stderr = text(&done).1;
    assert!(stderr.contains("worker:1 failed (killed by signal 9); restarting every task (1 of 3)"), "{stderr}");
    let again: f64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix("[launcher] training again ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no restart time in {stderr}"));
    // A bound against a restart that waits out a timeout, not a speed figure: the restart
    // takes well under a second on a quiet machine, and a loaded one stretched it past 3 s.
    assert!(again <= 10.0, "training ran again {again} s after the death");
    let s = summary(dir.path());
    assert!(s["resumed_from_step"].as_u64().is_some(), "{s}");
    same_result(&s, two_worker_reference());
}

#[test]
fn a_sigterm_to_a_worker_or_the_launcher_preempts_every_task_and_the_job_resumes_identical() {
    // Twice the shared job's length: a fast machine must not finish the job between the test
    // seeing a new backup and its SIGTERM arriving (CI once saw the second launch exit 0).
    let long = with(&FT, &["--set", "train.epochs=4"]);
    let reference = tempdir();
    let o = out(reference.path());
    assert_exit(&finish(&with(&long, &["--set", &o])), 0);
    let reference = summary(reference.path());
    let dir = tempdir();
    let o = out(dir.path());
    let args = with(&long, &["--set", &o]);
    let backup = dir.path().join("backup");

    // A worker asked to stop: all stop after the same step, the chief saves there.
    let mut launcher = common::spawn(&args);
    let victim = common::launched_task(launcher.id(), ("worker", 1), LIMIT).unwrap_or_else(|| panic!("no worker:1"));
    wait_for_file(&ckpt(&backup, 10).join("manifest.json"), LIMIT, &mut [&mut launcher]);
    std::thread::sleep(jitter(300));
    common::signal(victim, libc::SIGTERM);
    let (first, _) = wait_within(launcher, LIMIT);
    assert_exit(&first, 6);
    let first_stop = *steps_of(&backup).last().unwrap_or(&0);
    assert!(first_stop >= 10, "{:?}", steps_of(&backup));

    // The launcher asked to stop passes it on; the second launch resumed and stops again.
    let mut launcher = common::spawn(&args);
    std::thread::sleep(Duration::from_millis(300));
    wait_for_file(&dir.path().join("metrics.jsonl"), LIMIT, &mut [&mut launcher]);
    let until = Instant::now() + LIMIT;
    while steps_of(&backup).last().is_some_and(|&s| s <= first_stop) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    common::signal(launcher.id(), libc::SIGTERM);
    let (second, _) = wait_within(launcher, LIMIT);
    assert_exit(&second, 6);
    assert!(text(&second).1.contains("run the same command again to resume"), "{}", text(&second).1);

    let last = finish(&args);
    assert_exit(&last, 0);
    let s = summary(dir.path());
    assert!(s["resumed_from_step"].as_u64().is_some_and(|n| n > first_stop), "{s}");
    same_result(&s, &reference);
    assert!(!backup.exists(), "the backup is removed after success");
}

#[test]
fn a_two_worker_backup_restores_into_one_and_into_four_workers() {
    // Two workers train one epoch and keep their backup (at step 20, the epoch's end).
    let base = tempdir();
    let o = out(base.path());
    let keep = "callbacks=[{ kind = \"backup_and_restore\", save_freq = 10, delete_checkpoint = false }]";
    let common_args = ["--set", "train.steps_per_epoch=20", "--set", "optimizer.learning_rate=0.05", "-q"];
    let two = ["specs/mnist_multiworker.toml", "--set", keep];
    let mut a = with(&two, &common_args);
    a.extend(["--set", &o, "--set", "train.epochs=1"]);
    assert_exit(&finish(&a), 0);
    // The uninterrupted two-worker run of two epochs.
    let whole = tempdir();
    let o = out(whole.path());
    let mut a = with(&two, &common_args);
    a.extend(["--set", &o, "--set", "train.epochs=2"]);
    assert_exit(&finish(&a), 0);
    let reference = common::weights(&whole.path().join("model.safetensors"));

    // The second epoch on one process (global batch 128) and on four workers (4 × 32).
    let variants: [(&str, &[&str]); 2] = [
        ("one", &["specs/mnist_single.toml", "--set", "batch.global=128"]),
        ("four", &["specs/mnist_multiworker.toml", "--set", "cluster.worker=4", "--set", "batch.per_replica=32"]),
    ];
    for (name, spec) in variants {
        let dir = tempdir();
        copy_dir(base.path(), dir.path());
        let o = out(dir.path());
        let mut a = with(spec, &common_args);
        a.extend(["--set", &o, "--set", "train.epochs=2", "--set", keep]);
        let done = finish(&a);
        assert_exit(&done, 0);
        let s = summary(dir.path());
        assert_eq!(s["resumed_from_step"], 20, "{name}");
        assert_eq!(s["examples"], 40 * 128, "{name}");
        let d = common::relative_difference(&common::weights(&dir.path().join("model.safetensors")), &reference);
        // Other worker counts sum the same gradients in another order: equal up to rounding,
        // amplified by SGD 0.05 over 20 steps (a wrong data position is off by 1e-2 or more).
        assert!(d <= 1e-4, "{name}: relative difference {d}");
    }

    // Another global batch cannot continue the data position: refused, saying what to set.
    let dir = tempdir();
    copy_dir(base.path(), dir.path());
    let o = out(dir.path());
    let refused = finish(&["specs/mnist_single.toml", "-q", "--set", &o, "--set", keep, "--set", "batch.global=64"]);
    assert_exit(&refused, 2);
    let stderr = text(&refused).1;
    assert!(stderr.contains("global batch of 128") && stderr.contains("batch.global = 128"), "{stderr}");
}

/// The evaluator follows every `model_checkpoint` callback, each checkpoint once.
#[test]
fn the_evaluator_evaluates_every_checkpoint_exactly_once() {
    let dir = tempdir();
    let o = out(dir.path());
    let epochs = dir.path().join("epochs");
    let callbacks = format!(
        "callbacks=[{{ kind = \"model_checkpoint\", save_freq = 10 }}, \
         {{ kind = \"model_checkpoint\", save_freq = \"epoch\", dir = \"{}\" }}]",
        epochs.display()
    );
    let args = [
        "specs/mnist_multiworker.toml",
        "-q",
        "--set",
        "cluster.evaluator=1",
        "--set",
        "train.epochs=2",
        "--set",
        "train.steps_per_epoch=20",
        "--set",
        &callbacks,
        "--set",
        &o,
    ];
    assert_exit(&finish(&args), 0);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("eval.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let steps_of = |callback: &str| -> Vec<u64> {
        let mut steps: Vec<u64> =
            lines.iter().filter(|l| l["callback"] == callback).filter_map(|l| l["step"].as_u64()).collect();
        steps.sort();
        steps
    };
    assert_eq!(steps_of("model_checkpoint"), [10, 20, 30, 40], "{lines:?}");
    assert_eq!(steps_of("model_checkpoint_1"), [20, 40], "{lines:?}");
    assert_eq!(lines.len(), 6, "{lines:?}");
    let s = summary(dir.path());
    let last = lines.iter().find(|l| l["callback"] == "model_checkpoint" && l["step"] == 40).cloned();
    assert_eq!(last.map(|l| l["test_accuracy"].clone()), Some(s["test_accuracy"].clone()));
    assert!(lines.iter().all(|l| l["examples"] == 10_000));
}

/// Across hosts without shared storage: each task is started by hand (as each host's
/// supervisor would) in its own folder, over TCP. Only the chief's folder holds the backup;
/// after a worker dies and both are started again, the chief sends the restored state to the
/// worker, and the job ends as an uninterrupted one.
#[test]
fn restarted_tasks_on_separate_hosts_resume_from_the_chiefs_backup() {
    let (chief_dir, worker_dir) = (tempdir(), tempdir());
    let ports = common::free_ports::<2>();
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/mnist_fault_tolerant.toml");
    let spec = spec.display().to_string();
    let args = [
        spec.as_str(),
        "-q",
        "--set",
        "train.epochs=2",
        "--set",
        "train.steps_per_epoch=50",
        "--set",
        "optimizer.momentum=0.9",
        "--set",
        "strategy.communication.transport=\"tcp\"",
        "--set",
        "strategy.communication.timeout_s=10",
        // Relative: each task's own folder.
        "--set",
        "run.out_dir=\"out\"",
    ];
    let task = |dir: &Path, index: usize| -> Child {
        common::trainrun()
            .current_dir(dir)
            .args(args)
            .env("TF_CONFIG", common::tf_config(&ports, ("worker", index)))
            .env("TRAINRUN_JOB_TOKEN", "test-token-0123456789abcdef")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start trainrun: {e}"))
    };
    let backup = chief_dir.path().join("out/backup");
    let (mut chief, mut worker) = (task(chief_dir.path(), 0), task(worker_dir.path(), 1));
    wait_for_file(&ckpt(&backup, 10).join("manifest.json"), LIMIT, &mut [&mut chief, &mut worker]);
    std::thread::sleep(jitter(300));
    let _ = worker.kill();
    let _ = worker.wait();
    let (failed, _) = wait_within(chief, LIMIT);
    assert_exit(&failed, 5);

    let (chief, worker) = (task(chief_dir.path(), 0), task(worker_dir.path(), 1));
    let (w, _) = wait_within(worker, LIMIT);
    let (c, _) = wait_within(chief, LIMIT);
    assert_exit(&c, 0);
    assert_exit(&w, 0);
    let s = summary(&chief_dir.path().join("out"));
    assert!(s["resumed_from_step"].as_u64().is_some(), "{s}");
    assert_eq!(s["transport"], "tcp");
    same_result(&s, two_worker_reference());
    assert!(!worker_dir.path().join("out").exists(), "the worker writes nothing, backups included");
}

/// Early stopping's memory (best value, wait count, best weights) travels in the backup: a run
/// continued from a backup stops at the same epoch and restores the same best weights.
#[test]
fn early_stopping_decides_the_same_after_a_resume() {
    // val_accuracy rises every epoch, so with mode = "min" epoch 1 stays the best; patience 2
    // stops at epoch 3 and puts epoch 1's weights back.
    let cbs = "callbacks=[{ kind = \"backup_and_restore\", delete_checkpoint = false }, \
               { kind = \"early_stopping\", monitor = \"val_accuracy\", mode = \"min\", patience = 2, restore_best_weights = true }]";
    let base = [
        "specs/mnist_single.toml",
        "-q",
        "--set",
        "train.steps_per_epoch=10",
        "--set",
        "train.evaluate_every_epoch=true",
        "--set",
        "optimizer.learning_rate=0.05",
        "--set",
        cbs,
    ];
    let (whole, split) = (tempdir(), tempdir());
    let o = out(whole.path());
    assert_exit(&finish(&with(&base, &["--set", &o, "--set", "train.epochs=4"])), 0);
    let o = out(split.path());
    assert_exit(&finish(&with(&base, &["--set", &o, "--set", "train.epochs=2"])), 0);
    assert!(ckpt(&split.path().join("backup"), 20).join("best.safetensors").exists());
    assert_exit(&finish(&with(&base, &["--set", &o, "--set", "train.epochs=4"])), 0);
    let (a, b) = (summary(whole.path()), summary(split.path()));
    assert_eq!(a["stopped"], "early_stopping");
    assert_eq!(b["resumed_from_step"], 20);
    for key in ["stopped", "steps", "weights_sha256", "test_loss"] {
        assert_eq!(a[key], b[key], "{key}");
    }
}
