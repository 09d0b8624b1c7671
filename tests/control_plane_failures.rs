//! Failures and stragglers, the binary end to end through the local launcher. In a 32-task
//! job (a tiny MLP on synthetic 8×8 images, one thread a task, so that 32 processes fit on two
//! cores) a worker killed with SIGKILL ends the job (or, with `max_restarts`, restarts it)
//! within `timeout_s` + 2 s, naming it; one stopped with SIGSTOP is named as hung. In a 4-worker
//! job one worker slowed for real is named a straggler, and only it, while the job completes.
//!
//! The slowing is SIGSTOP/SIGCONT duty cycling from the test (stopped 9 ms of every 10), not a
//! CPU quota: here only cgroup v1's `cpu` controller is writable, and a throttled worker
//! spends its quota spinning and yielding in the shared-memory all-reduce while it waits, so
//! its stalls land in the waits every rank shares rather than in its own work, and nothing
//! tells it apart (measured: every worker's median step within 5 % under a 1-in-4 quota). A
//! stopped process spends nothing while stopped, so, like a slower CPU, its work takes longer.

mod common;

// One test at a time: each times an ending to within two seconds or compares step times, and
// three 32-task jobs beside them on 2 cores blur both.
use common::serial;
use common::{assert_exit, json, tempdir, text, wait_for_file};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const TIMEOUT_S: u64 = 5;
const WORKERS: usize = FAULTS.workers;
const VICTIM: usize = 5;
const SLOW: usize = 2;

/// The shape of a test job: a one-hidden-layer MLP on synthetic square images.
struct Job {
    workers: usize,
    side: usize,
    units: usize,
    per_replica: usize,
    /// Epochs of `steps` steps.
    epochs: u64,
    steps: u64,
    /// Restarts, and a backup every 10 steps; `None`: neither.
    restarts: Option<u32>,
}

/// Trains until stopped, backing up every 10 steps: small, so that 32 tasks fit on two cores.
const FAULTS: Job = Job { workers: 32, side: 8, units: 16, per_replica: 4, epochs: 1000, steps: 32, restarts: Some(0) };

/// Steps of a few milliseconds, long enough for a slowed worker's stops to fall in its work.
const STRAGGLING: Job =
    Job { workers: 4, side: 28, units: 1024, per_replica: 64, epochs: 2, steps: 150, restarts: None };

/// Writes `job`'s spec in `dir`; the run folder is `dir/run`.
fn spec(dir: &Path, job: &Job) -> PathBuf {
    let Job { workers, side, units, per_replica, epochs, steps, restarts } = *job;
    let faults = restarts.map_or(String::new(), |r| {
        format!(
            "[[callbacks]]\nkind = \"backup_and_restore\"\nsave_freq = 10\n\n\
             [cluster]\nworker = {workers}\nmax_restarts = {r}\nrestart_backoff_s = 0.5\n"
        )
    });
    let cluster = if restarts.is_some() { String::new() } else { format!("[cluster]\nworker = {workers}\n") };
    let text = format!(
        r#"
[run]
name = "job{workers}"
seed = 7
threads = 1
out_dir = "{out}"

[data]
dataset = "synthetic"

[data.synthetic]
train_examples = 8192
test_examples = 256
shape = [{side}, {side}]
classes = 4

[optimizer]
kind = "sgd"
learning_rate = 0.01

[model]
[[model.layers]]
type = "flatten"

[[model.layers]]
type = "dense"
units = {units}
activation = "relu"

[[model.layers]]
type = "dense"
units = 4

[strategy]
kind = "multi_worker_mirrored"

[strategy.communication]
timeout_s = {TIMEOUT_S}

[batch]
per_replica = {per_replica}

[train]
epochs = {epochs}
steps_per_epoch = {steps}
loss = "sparse_categorical_crossentropy"
from_logits = true

{cluster}
{faults}
"#,
        out = dir.join("run").display()
    );
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn launch(dir: &Path, restarts: u32) -> Child {
    common::trainrun()
        .arg(spec(dir, &Job { restarts: Some(restarts), ..FAULTS }))
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

/// Each task's log but the victim's (its `[worker:i]` lines) names the victim and its end.
fn every_other_task_names(stderr: &str, cause: &str) {
    for i in (0..WORKERS).filter(|&i| i != VICTIM) {
        let told = format!("[worker:{i}] stopped by the launcher: {cause}");
        assert!(stderr.lines().any(|l| l.starts_with(&told)), "worker:{i} was not told `{cause}`:\n{stderr}");
    }
}

#[test]
fn a_killed_worker_of_32_ends_the_job_within_timeout_plus_two_seconds_named() {
    let _serial = serial();
    let dir = tempdir();
    let mut launcher = launch(dir.path(), 0);
    let killed = strike(dir.path(), &mut launcher, libc::SIGKILL);
    let (out, _) = common::wait_within(launcher, LIMIT);
    let took = killed.elapsed();
    assert_exit(&out, 137);
    let stderr = text(&out).1;
    assert!(took < Duration::from_secs(TIMEOUT_S + 2), "took {took:?}\n{stderr}");
    assert!(stderr.contains(&format!("error: worker:{VICTIM} failed (killed by signal 9)")), "{stderr}");
    every_other_task_names(&stderr, &format!("worker:{VICTIM} failed (killed by signal 9)"));
    println!("{WORKERS} tasks: worker:{VICTIM} killed, the job ended naming it after {:.2} s", took.as_secs_f64());
}

#[test]
fn a_hung_worker_of_32_is_named_as_hung_within_timeout_plus_two_seconds() {
    let _serial = serial();
    let dir = tempdir();
    let mut launcher = launch(dir.path(), 0);
    let hung = strike(dir.path(), &mut launcher, libc::SIGSTOP);
    let (out, _) = common::wait_within(launcher, LIMIT);
    let took = hung.elapsed();
    assert_exit(&out, 5);
    let stderr = text(&out).1;
    assert!(took < Duration::from_secs(TIMEOUT_S + 2), "took {took:?}\n{stderr}");
    assert!(stderr.contains(&format!("error: worker:{VICTIM} failed (hung: ")), "{stderr}");
    every_other_task_names(&stderr, &format!("worker:{VICTIM} failed (hung: "));
    println!(
        "{WORKERS} tasks: worker:{VICTIM} stopped, the job ended naming it hung after {:.2} s",
        took.as_secs_f64()
    );
}

#[test]
fn with_restarts_a_killed_worker_of_32_is_named_and_the_job_trains_again() {
    let _serial = serial();
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

#[test]
fn a_slowed_worker_is_named_a_straggler_and_the_job_completes() {
    let _serial = serial();
    let dir = tempdir();
    let launcher = common::trainrun()
        .arg(spec(dir.path(), &STRAGGLING))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start trainrun: {e}"));
    let victim =
        common::launched_task(launcher.id(), ("worker", SLOW), LIMIT).unwrap_or_else(|| panic!("no worker:{SLOW}"));
    let done = Arc::new(AtomicBool::new(false));
    let slowing = {
        let done = done.clone();
        std::thread::spawn(move || {
            realtime();
            while !done.load(Ordering::Relaxed) {
                // Stopped 9 ms in 10: four tasks share 2 cores, so the victim's fair share is
                // already half a core, and the scheduler favours it after each stop; 3 ms in 4
                // left it 1.5-1.9x slower here and under 1.5x in CI, at the threshold.
                common::signal(victim, libc::SIGSTOP);
                std::thread::sleep(Duration::from_millis(9));
                common::signal(victim, libc::SIGCONT);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let (out, _) = common::wait_within(launcher, LIMIT);
    done.store(true, Ordering::Relaxed);
    slowing.join().unwrap();
    common::signal(victim, libc::SIGCONT);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);

    let summary = json(&dir.path().join("run/summary.json"));
    let stragglers = summary["stragglers"].as_array().unwrap_or_else(|| panic!("no stragglers: {summary}\n{stderr}"));
    assert_eq!(stragglers.len(), 1, "{stragglers:?}");
    let s = &stragglers[0];
    assert_eq!(s["task"], format!("worker:{SLOW}"), "{s}");
    let (p50, p90, slower) =
        (s["p50_ms"].as_f64().unwrap(), s["p90_ms"].as_f64().unwrap(), s["slower"].as_f64().unwrap());
    assert!(slower > 1.5 && p90 >= p50 && p50 > 0.0, "{s}");

    let metrics = std::fs::read_to_string(dir.path().join("run/metrics.jsonl")).unwrap();
    let named = metrics.lines().filter(|l| l.contains("\"event\":\"epoch\"") && l.contains("\"stragglers\""));
    assert!(named.count() >= 1, "no epoch line names the straggler:\n{metrics}");
    let said = format!("straggler: worker:{SLOW} steps in");
    assert!(stdout.contains(&said) || stderr.contains(&said), "{stdout}\n{stderr}");
    println!(
        "4 tasks, worker:{SLOW} stopped 9 ms in 10: named with p50 {p50:.2} ms, p90 {p90:.2} ms, {slower:.2}x the median"
    );
}

/// Makes the calling thread real-time (SCHED_FIFO), so that it stops and resumes the victim on
/// time while five processes share 2 cores: at normal priority its wake-ups came late under
/// load and the victim ran on unstopped for whole steps (1.5x the median instead of 4x). Root
/// may; elsewhere the test goes on at normal priority and says so.
fn realtime() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: `param` is a valid sched_param for the duration of the call; pid 0 is this thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        eprintln!(
            "cannot make the slowing thread real-time ({}): its timing may drift under load",
            std::io::Error::last_os_error()
        );
    }
}
