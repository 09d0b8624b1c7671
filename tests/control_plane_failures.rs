//! Failures in a 32-task job, the binary end to end through the local launcher: a tiny MLP on
//! synthetic 8×8 images, one thread a task, so that 32 processes fit on two cores. A worker
//! killed with SIGKILL ends the job (or, with `max_restarts`, restarts it) within `timeout_s`
//! + 2 s, naming it; one stopped with SIGSTOP is named as hung.

mod common;

use common::{assert_exit, tempdir, text, wait_for_file};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const TIMEOUT_S: u64 = 5;
const WORKERS: usize = 32;
const VICTIM: usize = 5;

/// A spec for `workers` tasks that trains until stopped, backing up every 10 steps.
fn spec(dir: &Path, workers: usize, restarts: u32) -> PathBuf {
    let text = format!(
        r#"
[run]
name = "scale{workers}"
seed = 7
threads = 1
out_dir = "{out}"

[data]
dataset = "synthetic"

[data.synthetic]
train_examples = 4096
test_examples = 256
shape = [8, 8]
classes = 4

[optimizer]
kind = "sgd"
learning_rate = 0.01

[model]
[[model.layers]]
type = "flatten"

[[model.layers]]
type = "dense"
units = 16
activation = "relu"

[[model.layers]]
type = "dense"
units = 4

[strategy]
kind = "multi_worker_mirrored"

[strategy.communication]
timeout_s = {TIMEOUT_S}

[cluster]
worker = {workers}
max_restarts = {restarts}
restart_backoff_s = 0.5

[batch]
per_replica = 4

[train]
epochs = 1000
steps_per_epoch = 32
loss = "sparse_categorical_crossentropy"
from_logits = true

[[callbacks]]
kind = "backup_and_restore"
save_freq = 10
"#,
        out = dir.join("run").display()
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn launch(dir: &Path, restarts: u32) -> Child {
    common::trainrun()
        .arg(spec(dir, WORKERS, restarts))
        .arg("-q")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start trainrun: {e}"))
}

/// Waits until the job trains (its first backup), then sends `signal` to the victim.
fn strike(dir: &Path, launcher: &mut Child, signal: i32) -> Instant {
    wait_for_file(&dir.join("run/backup/ckpt-0000000010/manifest.json"), LIMIT, &mut [launcher]);
    let victim =
        common::launched_task(launcher.id(), ("worker", VICTIM), LIMIT).unwrap_or_else(|| panic!("no worker:{VICTIM}"));
    common::signal(victim, signal);
    Instant::now()
}

#[test]
fn a_killed_worker_of_32_ends_the_job_within_timeout_plus_two_seconds_named() {
    let dir = tempdir();
    let mut launcher = launch(dir.path(), 0);
    let killed = strike(dir.path(), &mut launcher, libc::SIGKILL);
    let (out, _) = common::wait_within(launcher, LIMIT);
    let took = killed.elapsed();
    assert_exit(&out, 137);
    let stderr = text(&out).1;
    assert!(took < Duration::from_secs(TIMEOUT_S + 2), "took {took:?}\n{stderr}");
    assert!(stderr.contains(&format!("error: worker:{VICTIM} failed (killed by signal 9)")), "{stderr}");
    println!("{WORKERS} tasks: worker:{VICTIM} killed, the job ended naming it after {:.2} s", took.as_secs_f64());
}

#[test]
fn a_hung_worker_of_32_is_named_as_hung_within_timeout_plus_two_seconds() {
    let dir = tempdir();
    let mut launcher = launch(dir.path(), 0);
    let hung = strike(dir.path(), &mut launcher, libc::SIGSTOP);
    let (out, _) = common::wait_within(launcher, LIMIT);
    let took = hung.elapsed();
    assert_exit(&out, 5);
    let stderr = text(&out).1;
    assert!(took < Duration::from_secs(TIMEOUT_S + 2), "took {took:?}\n{stderr}");
    assert!(stderr.contains(&format!("error: worker:{VICTIM} failed (hung: ")), "{stderr}");
    println!(
        "{WORKERS} tasks: worker:{VICTIM} stopped, the job ended naming it hung after {:.2} s",
        took.as_secs_f64()
    );
}

#[test]
fn with_restarts_a_killed_worker_of_32_is_named_and_the_job_trains_again() {
    let dir = tempdir();
    let mut launcher = launch(dir.path(), 1);
    let stderr = launcher.stderr.take().unwrap_or_else(|| panic!("no stderr"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let killed = strike(dir.path(), &mut launcher, libc::SIGKILL);
    let line = loop {
        match rx.recv_timeout(LIMIT) {
            Ok(l) if l.starts_with("[launcher]") && l.contains("restarting") => break l,
            Ok(_) => {}
            Err(e) => panic!("no restart: {e}"),
        }
    };
    let took = killed.elapsed();
    assert!(line.starts_with(&format!("[launcher] worker:{VICTIM} failed (killed by signal 9)")), "{line}");
    assert!(took < Duration::from_secs(TIMEOUT_S + 2), "took {took:?}: {line}");
    // The restarted job resumes from its backup and writes new ones.
    let backups = dir.path().join("run/backup");
    let newest = || {
        let names = std::fs::read_dir(&backups).into_iter().flatten().flatten();
        names.filter_map(|e| e.file_name().to_str()?.strip_prefix("ckpt-")?.parse::<u64>().ok()).max()
    };
    let before = newest().unwrap_or(0);
    let waiting = Instant::now();
    while newest().unwrap_or(0) <= before {
        assert!(waiting.elapsed() < LIMIT, "the restarted job wrote no new backup after step {before}");
        assert!(launcher.try_wait().unwrap().is_none(), "the launcher ended instead of training again");
        std::thread::sleep(Duration::from_millis(50));
    }
    common::signal(launcher.id(), libc::SIGTERM);
    let _ = common::wait_within(launcher, LIMIT);
    println!("{WORKERS} tasks: worker:{VICTIM} killed, the job restarted after {:.2} s", took.as_secs_f64());
}
