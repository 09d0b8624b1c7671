//! Trials that stay resident between rungs, end to end on short real MNIST trials under ASHA:
//! a trial paused at a rung waits in its process and trains on there when promoted, and the
//! sweep ends with the same `results.csv` (byte for byte), the same decisions and the same
//! weights as when every trial exits at its rung and a new process resumes it from its backup
//! (`sweep.resident_trials = 0`). A sweep driver killed while trials wait leaves none behind
//! (they exit when their control socket closes), and the same command resumes the sweep from
//! the backups to the same results.

mod common;

use common::sweep::results_bytes;
use common::{assert_exit, children, run, signal, spawn, tempdir};
use std::path::Path;
use std::time::{Duration, Instant};

const SPEC: &str = "tests/fixtures/sweeps/mnist_asha.toml";

fn sweep(out: &Path, extra: &[&str]) -> std::process::Output {
    let o = format!("run.out_dir={}", out.display());
    let mut args = vec!["sweep", SPEC, "-q", "--parallel", "1", "--set", &o];
    args.extend(extra);
    run(&args)
}

/// Each trial folder's name and `weights_sha256`, and its `train.log`.
fn trials(dir: &Path) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_dir() && p.join("run.json").is_file()).collect())
        .unwrap_or_else(|_| Vec::new())
        .into_iter()
        .map(|p: std::path::PathBuf| {
            let summary = common::json(&p.join("summary.json"));
            let log = std::fs::read_to_string(p.join("train.log")).unwrap_or_default();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            (name, summary["weights_sha256"].as_str().unwrap_or("").to_string(), log)
        })
        .collect();
    out.sort();
    out
}

fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // A zombie (state Z, after the pid's name in parentheses) has exited.
    stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
}

#[test]
fn resident_trials_train_on_to_the_same_results_as_trials_that_exit_and_a_killed_driver_leaves_none() {
    let (resident, exiting, killed) = (tempdir(), tempdir(), tempdir());
    assert_exit(&sweep(resident.path(), &[]), 0);
    assert_exit(&sweep(exiting.path(), &["--set", "sweep.resident_trials=0"]), 0);

    assert_eq!(results_bytes(resident.path()), results_bytes(exiting.path()));
    let decisions = |d: &Path| std::fs::read_to_string(d.join("decisions.jsonl")).unwrap_or_default();
    assert_eq!(decisions(resident.path()), decisions(exiting.path()));
    let (a, b) = (trials(resident.path()), trials(exiting.path()));
    let weights = |t: &[(String, String, String)]| t.iter().map(|(n, w, _)| (n.clone(), w.clone())).collect::<Vec<_>>();
    assert_eq!(weights(&a), weights(&b));
    assert_eq!(a.len(), 6, "{a:?}");
    // The promoted trials trained on in the process that trained their first rung (its log
    // holds every rung); a trial that exits logs only its last launch.
    let promoted = |t: &[(String, String, String)]| {
        t.iter().filter(|(_, _, log)| log.contains("Epoch 1/1") && log.contains("resuming from")).count()
    };
    assert!(promoted(&a) >= 2, "{a:?}");
    assert_eq!(promoted(&b), 0, "{b:?}");
    // Each promotion in place took the backup's tensors from memory (the backup it had just
    // written), not read back from disk; the equal weights above are that path's.
    let from_memory = "its tensors are taken from memory";
    let in_place = |log: &str| log.matches("resuming from").count();
    for (name, _, log) in &a {
        assert_eq!(log.matches(from_memory).count(), in_place(log), "{name}: {log}");
    }
    assert!(b.iter().all(|(_, _, log)| !log.contains(from_memory)), "{b:?}");

    // Killed once a trial waits resident (two children: the paused one and the one training).
    let o = format!("run.out_dir={}", killed.path().display());
    let mut driver = spawn(&["sweep", SPEC, "-q", "--parallel", "1", "--set", &o]);
    let until = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while Instant::now() < until && driver.try_wait().ok().flatten().is_none() {
        seen = children(driver.id());
        if seen.len() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(seen.len() >= 2, "no trial waited resident before the sweep ended: {seen:?}");
    signal(driver.id(), libc::SIGKILL);
    let _ = driver.wait();
    let until = Instant::now() + Duration::from_secs(20);
    while seen.iter().any(|p| alive(*p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(seen.iter().all(|p| !alive(*p)), "trials outlived their killed driver: {seen:?}");
    // The same command resumes from the backups, to the same results.
    assert_exit(&sweep(killed.path(), &[]), 0);
    assert_eq!(results_bytes(killed.path()), results_bytes(resident.path()));
    assert_eq!(weights(&trials(killed.path())), weights(&a));
}
