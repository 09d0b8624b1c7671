//! SIGTERM and Ctrl-C in every phase, the binary end to end: `run.json` says `preempted`
//! (exit 6) or `interrupted` (exit 130) after a backup; a task waiting at the rendezvous
//! or loading data ends within 1 s; a second Ctrl-C stops at once; the launcher passes a stop
//! on, ends its back-off at once, and leaves no task behind. A step or an evaluation slower
//! than a second does not hold a stop up: it is abandoned, and `run.json` says so. What a stop
//! leaves to resume from is said as it is: nothing before training began, nothing without
//! `backup_and_restore`.

mod common;

use common::{assert_exit, children, json, tempdir, text, wait_for_file, wait_within};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

/// A stop before training has nothing to save: the process ends this soon.
const PROMPT: Duration = Duration::from_secs(1);

// Every test here times a stop to within a second; run side by side (one of them runs 250
// threads) they would measure each other's load, so they take turns.
use common::serial;

fn backup(dir: &Path, step: u64) -> PathBuf {
    dir.join("backup").join(format!("ckpt-{step:010}")).join("manifest.json")
}

/// One process, backups every 5 steps, long enough to be stopped mid-run.
fn single(dir: &Path) -> Vec<String> {
    [
        "specs/mnist_single.toml",
        "-q",
        "--set",
        "train.epochs=3",
        "--set",
        "train.steps_per_epoch=200",
        "--set",
        "callbacks=[{ kind = \"backup_and_restore\", save_freq = 5 }]",
        "--set",
        &format!("run.out_dir={}", dir.display()),
    ]
    .map(String::from)
    .to_vec()
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn sigterm_records_preempted_and_ctrl_c_interrupted_after_a_backup() {
    let _serial = serial();
    for (signal, code, status) in [(libc::SIGTERM, 6, "preempted"), (libc::SIGINT, 130, "interrupted")] {
        let dir = tempdir();
        let args = single(dir.path());
        let mut child = common::spawn(&refs(&args));
        wait_for_file(&backup(dir.path(), 5), LIMIT, &mut [&mut child]);
        common::signal(child.id(), signal);
        let (out, _) = wait_within(child, LIMIT);
        assert_exit(&out, code);
        let record = json(&dir.path().join("run.json"));
        assert_eq!(record["status"], status, "{record}");
        assert_eq!(record["exit_code"], code, "{record}");
        let stderr = text(&out).1;
        assert!(stderr.contains("run the same command again to resume"), "{stderr}");
        assert!(!dir.path().join("model.safetensors").exists(), "a stopped run writes no final weights");
        let backups: Vec<_> = std::fs::read_dir(dir.path().join("backup")).map(|d| d.count()).into_iter().collect();
        assert!(backups.first().is_some_and(|&n| n > 0), "the backup stays");
    }
}

#[test]
fn a_second_ctrl_c_stops_at_once() {
    let _serial = serial();
    let dir = tempdir();
    let args = single(dir.path());
    let mut child = common::spawn(&refs(&args));
    wait_for_file(&backup(dir.path(), 5), LIMIT, &mut [&mut child]);
    common::signal(child.id(), libc::SIGINT);
    // Two signals sent back to back reach a process the loaded machine has not run in between
    // as one (a pending signal is not queued twice): leave the first a moment to land.
    std::thread::sleep(Duration::from_millis(50));
    common::signal(child.id(), libc::SIGINT);
    let (out, took) = wait_within(child, LIMIT);
    assert_exit(&out, 130);
    assert!(took < PROMPT, "took {took:?}");
}

#[test]
fn a_task_waiting_at_the_rendezvous_ends_within_a_second() {
    let _serial = serial();
    for (signal, code) in [(libc::SIGTERM, 6), (libc::SIGINT, 130)] {
        let ports = common::free_ports::<2>();
        // Worker 1 never starts: worker 0 waits for it (cluster.startup_timeout_s, minutes).
        let mut child = common::spawn_task(
            &common::tf_config(&ports, ("worker", 0)),
            "abcdefghijklmnop0123456789",
            &["specs/mnist_multiworker.toml", "-q"],
        );
        // Listening means it loaded the data and waits for its peer.
        let until = Instant::now() + LIMIT;
        while std::net::TcpStream::connect(("127.0.0.1", ports[0])).is_err() {
            assert!(Instant::now() < until && matches!(child.try_wait(), Ok(None)), "worker 0 never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        let asked = Instant::now();
        common::signal(child.id(), signal);
        let (out, _) = wait_within(child, LIMIT);
        let took = asked.elapsed();
        assert_exit(&out, code);
        assert!(took < PROMPT, "{signal}: took {took:?}");
        assert!(text(&out).1.contains("before training began; nothing to save"), "{}", text(&out).1);
    }
}

#[test]
fn a_task_loading_data_ends_within_a_second() {
    let _serial = serial();
    let dir = tempdir();
    let args = single(dir.path());
    let child = common::spawn(&refs(&args));
    // Within the first moments the process loads and decompresses MNIST.
    std::thread::sleep(Duration::from_millis(150));
    let asked = Instant::now();
    common::signal(child.id(), libc::SIGTERM);
    let (out, _) = wait_within(child, LIMIT);
    let took = asked.elapsed();
    assert_exit(&out, 6);
    assert!(took < PROMPT, "took {took:?}");
}

/// SIGTERM to the launcher of the two-worker job (no `backup_and_restore`), before training
/// began and during it: each says truthfully what the next run starts from, no task claims a
/// backup, and each task's lines carry its name once.
#[test]
fn sigterm_to_the_launcher_says_what_is_left_to_resume_from() {
    let _serial = serial();
    for began in [false, true] {
        let dir = tempdir();
        let out_dir = format!("run.out_dir={}", dir.path().display());
        let mut launcher = common::spawn(&["specs/mnist_multiworker.toml", "--set", &out_dir]);
        if began {
            wait_for_file(&dir.path().join("run.json"), LIMIT, &mut [&mut launcher]);
            std::thread::sleep(Duration::from_millis(300));
        } else {
            // Both tasks started: they decode MNIST (a few hundred milliseconds) before joining.
            common::wait_for_children(launcher.id(), 2, LIMIT);
        }
        common::signal(launcher.id(), libc::SIGTERM);
        let (out, _) = wait_within(launcher, LIMIT);
        assert_exit(&out, 6);
        let stderr = text(&out).1;
        let said = if began {
            "every task stopped on SIGTERM; without a backup_and_restore callback nothing was saved to resume from"
        } else {
            "every task stopped on SIGTERM before training began; nothing was saved"
        };
        assert!(stderr.contains(said), "began {began}: {stderr}");
        assert!(!stderr.contains("backup;") && !stderr.contains("saves the backup"), "began {began}: {stderr}");
        assert!(!stderr.contains("] [worker:"), "a task named twice: {stderr}");
    }
}

fn alive(pid: u32) -> bool {
    // A zombie has been reaped by nobody yet, but it runs no more.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

fn fault_tolerant(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "specs/mnist_fault_tolerant.toml",
        "-q",
        "--set",
        "train.epochs=2",
        "--set",
        "train.steps_per_epoch=200",
        "--set",
        &format!("run.out_dir={}", dir.display()),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn ctrl_c_to_the_launcher_stops_every_task_after_a_backup_and_twice_at_once() {
    let _serial = serial();
    for twice in [false, true] {
        let dir = tempdir();
        let args = fault_tolerant(dir.path(), &[]);
        let mut launcher = common::spawn(&refs(&args));
        wait_for_file(&backup(dir.path(), 10), LIMIT, &mut [&mut launcher]);
        let tasks = children(launcher.id());
        assert_eq!(tasks.len(), 2, "{tasks:?}");
        common::signal(launcher.id(), libc::SIGINT);
        if twice {
            common::signal(launcher.id(), libc::SIGINT);
        }
        let (out, took) = wait_within(launcher, LIMIT);
        assert_exit(&out, 130);
        if twice {
            assert!(took < PROMPT + Duration::from_secs(1), "took {took:?}");
        }
        let record = json(&dir.path().join("run.json"));
        assert_eq!(record["status"], "interrupted", "{record}");
        assert_eq!(record["exit_code"], 130, "{record}");
        std::thread::sleep(Duration::from_millis(200));
        let left: Vec<_> = tasks.iter().filter(|&&p| alive(p)).collect();
        assert!(left.is_empty(), "tasks left running: {left:?}");
    }
}

#[test]
fn a_stop_during_the_restart_back_off_ends_the_launcher_within_a_second() {
    let _serial = serial();
    let dir = tempdir();
    let args = fault_tolerant(dir.path(), &["--set", "cluster.restart_backoff_s=60"]);
    let mut launcher = common::spawn(&refs(&args));
    wait_for_file(&backup(dir.path(), 10), LIMIT, &mut [&mut launcher]);
    let victim = common::launched_task(launcher.id(), ("worker", 1), LIMIT).unwrap_or_else(|| panic!("no worker:1"));
    common::signal(victim, libc::SIGKILL);
    // The launcher notices, stops worker 0, and waits 60 s before restarting.
    let until = Instant::now() + LIMIT;
    while !children(launcher.id()).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    common::signal(launcher.id(), libc::SIGTERM);
    let (out, _) = wait_within(launcher, LIMIT);
    let took = asked.elapsed();
    assert_exit(&out, 6);
    assert!(took < PROMPT, "took {took:?}");
}

/// A model whose evaluation takes seconds on one thread: about 20 M weights.
const WIDE_MLP: &str = "model.layers=[{ type = \"flatten\" }, { type = \"dense\", units = 4096, activation = \"relu\" }, \
     { type = \"dense\", units = 4096, activation = \"relu\" }, { type = \"dense\", units = 10 }]";

/// One process of `steps` steps of a batch of `batch` on `threads` threads, a backup after
/// each step.
fn slow_run(dir: &Path, batch: u64, threads: u64, steps: u64) -> Vec<String> {
    [
        "specs/mnist_single.toml",
        "-q",
        "--set",
        &format!("batch.global={batch}"),
        "--set",
        &format!("run.threads={threads}"),
        "--set",
        "train.epochs=1",
        "--set",
        &format!("train.steps_per_epoch={steps}"),
        "--set",
        "callbacks=[{ kind = \"backup_and_restore\", save_freq = 1 }]",
        "--set",
        &format!("run.out_dir={}", dir.display()),
    ]
    .map(String::from)
    .to_vec()
}

/// Stops `child` `after` its `run.json` appeared (training has begun) and checks that it
/// ended within [`PROMPT`], abandoning what was under way, recorded as `status`.
fn stopped_mid_work(dir: &Path, args: &[String], after: Duration, (signal, code, status): (i32, i32, &str)) {
    let mut child = common::spawn(&refs(args));
    wait_for_file(&dir.join("run.json"), LIMIT, &mut [&mut child]);
    std::thread::sleep(after);
    let asked = Instant::now();
    common::signal(child.id(), signal);
    let (out, _) = wait_within(child, LIMIT);
    let took = asked.elapsed();
    let stderr = text(&out).1;
    assert_exit(&out, code);
    assert!(took < PROMPT, "{status}: took {took:?}; {stderr}");
    assert!(stderr.contains("so it was abandoned; run the same command again to resume"), "{stderr}");
    let record = json(&dir.join("run.json"));
    assert_eq!(record["status"], status, "{record}");
    assert_eq!(record["exit_code"], code, "{record}");
    assert!(record["error"].as_str().is_some_and(|e| e.contains("abandoned")), "{record}");
    assert!(!dir.join("model.safetensors").exists(), "a stopped run writes no final weights");
}

#[test]
fn a_stop_during_a_step_slower_than_a_second_ends_the_task_within_a_second() {
    let _serial = serial();
    for stop in [(libc::SIGTERM, 6, "preempted"), (libc::SIGINT, 130, "interrupted")] {
        let dir = tempdir();
        // The first step has begun 200 ms after `run.json`; it takes seconds.
        // Steps of 6,144 examples on one thread take seconds.
        stopped_mid_work(dir.path(), &slow_run(dir.path(), 6144, 1, 4), Duration::from_millis(200), stop);
    }
}

#[test]
fn a_stop_during_the_final_evaluation_ends_the_task_within_a_second() {
    let _serial = serial();
    let dir = tempdir();
    // The final evaluation must still run when the test sees the last backup, on any host.
    // Compute sets its length, not scheduling: two 4,096-unit layers on one thread make the
    // 10,000 test images about 400 GFLOP, seconds on any CPU, while the one training step
    // (batch 64) takes a fraction of one. (Slowing it with 400 threads, as before, raced: on a
    // quiet host the run sometimes finished before the backup was seen.)
    let mut args = slow_run(dir.path(), 64, 1, 1);
    args.extend(["--set".into(), WIDE_MLP.into()]);
    let mut child = common::spawn(&refs(&args));
    // The last step's backup is queued right before the final evaluation begins.
    wait_for_file(&backup(dir.path(), 1), LIMIT, &mut [&mut child]);
    let asked = Instant::now();
    common::signal(child.id(), libc::SIGTERM);
    let (out, _) = wait_within(child, LIMIT);
    let took = asked.elapsed();
    let stderr = text(&out).1;
    assert_exit(&out, 6);
    assert!(took < PROMPT, "took {took:?}; {stderr}");
    assert!(stderr.contains("so it was abandoned"), "{stderr}");
    let record = json(&dir.path().join("run.json"));
    assert_eq!(record["status"], "preempted", "{record}");
    assert!(!dir.path().join("model.safetensors").exists(), "a stopped run writes no final weights");
}

#[test]
fn sigterm_to_the_launcher_during_slow_steps_ends_every_task_within_a_second() {
    let _serial = serial();
    let dir = tempdir();
    let args = fault_tolerant(
        dir.path(),
        &["--set", "batch.per_replica=4096", "--set", "run.threads=1", "--set", "cluster.max_restarts=0"],
    );
    let mut launcher = common::spawn(&refs(&args));
    wait_for_file(&dir.path().join("run.json"), LIMIT, &mut [&mut launcher]);
    let tasks = children(launcher.id());
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    // Both workers are in their first step, which takes seconds.
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    common::signal(launcher.id(), libc::SIGTERM);
    let (out, _) = wait_within(launcher, LIMIT);
    let took = asked.elapsed();
    let stderr = text(&out).1;
    assert_exit(&out, 6);
    assert!(took < PROMPT, "took {took:?}; {stderr}");
    let record = json(&dir.path().join("run.json"));
    assert_eq!(record["status"], "preempted", "{record}");
    assert_eq!(record["exit_code"], 6, "{record}");
    let left: Vec<_> = tasks.iter().filter(|&&p| alive(p)).collect();
    assert!(left.is_empty(), "tasks left running: {left:?}");
}

/// Two workers training a tiny model on synthetic data: a step takes about a millisecond and
/// the chief reports every one, for many seconds unless stopped.
fn fast_steps(dir: &Path) -> PathBuf {
    let spec = format!(
        r#"
[run]
name = "fast"
seed = 5
out_dir = "{out}"
threads = 1
[data]
dataset = "synthetic"
[data.synthetic]
train_examples = 640
test_examples = 64
[strategy]
kind = "multi_worker_mirrored"
[cluster]
worker = 2
[batch]
global = 64
[optimizer]
kind = "sgd"
learning_rate = 0.05
[model]
[[model.layers]]
type = "flatten"
[[model.layers]]
type = "dense"
units = 32
activation = "relu"
[[model.layers]]
type = "dense"
units = 10
[train]
epochs = 2000
loss = "sparse_categorical_crossentropy"
from_logits = true
[[callbacks]]
kind = "backup_and_restore"
save_freq = 10
"#,
        out = dir.join("run").display()
    );
    let path = dir.join("fast.toml");
    std::fs::write(&path, spec).unwrap();
    path
}

/// The launcher used to read its tasks' output until a 20 ms pause; with a line every
/// millisecond the pause never came, the SIGTERM reached no task, and the job ran to its end
/// recorded as `completed` (3 runs in 4).
#[test]
fn sigterm_to_the_launcher_of_a_job_with_fast_steps_preempts_it() {
    let _serial = serial();
    for _ in 0..3 {
        let dir = tempdir();
        let spec = fast_steps(dir.path());
        let mut launcher = common::spawn(&[spec.to_str().unwrap(), "-q"]);
        common::wait_for_any_backup(&dir.path().join("run/backup"), LIMIT, &mut launcher);
        common::signal(launcher.id(), libc::SIGTERM);
        let (out, took) = wait_within(launcher, LIMIT);
        assert_exit(&out, 6);
        assert!(took < Duration::from_secs(5), "the stop took {took:?}");
        let record = json(&dir.path().join("run/run.json"));
        assert_eq!(record["status"], "preempted", "{record}");
        assert!(!dir.path().join("run/model.safetensors").exists(), "a stopped run writes no final weights");
    }
}
