//! Run folders, the binary end to end: one run at a time in a folder (a second is refused
//! naming the folder and who holds it; the lock dies with its holder), a backup another spec
//! wrote is refused rather than resumed, an empty `run.out_dir` and a folder that is not a run
//! folder are refused before anything is written, and a new run removes the summary and
//! weights an earlier run left, so they never pass for its own.

mod common;

use common::{assert_exit, json, run, tempdir, text};
use std::time::Duration;

/// A short MNIST run into `dir`, with `extra` overrides.
fn short_run(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let out_dir = format!("run.out_dir={}", dir.display());
    let mut args = vec!["specs/mnist_single.toml", "-q", "--set", "train.epochs=1", "--set", "train.steps_per_epoch=5"];
    args.extend(["--set", &out_dir]);
    args.extend(extra);
    run(&args)
}

/// A run into `dir` that trains far longer than any test waits, started in the background.
fn long_run(dir: &std::path::Path, extra: &[&str]) -> std::process::Child {
    let out_dir = format!("run.out_dir={}", dir.display());
    let mut args = vec!["specs/mnist_single.toml", "-q", "--set", "train.epochs=1", "--set"];
    args.extend(["train.steps_per_epoch=100000", "--set", &out_dir]);
    args.extend(extra);
    common::spawn(&args)
}

#[test]
fn a_second_run_into_a_folder_in_use_is_refused_naming_the_holder() {
    let dir = tempdir();
    let d = dir.path().join("run");
    // Long enough to still be training when the second run starts.
    let mut first = long_run(&d, &[]);
    let pid = first.id();
    common::wait_for_file(&d.join("run.json"), Duration::from_secs(60), &mut [&mut first]);
    let second = short_run(&d, &["--set", "run.seed=7"]);
    assert_exit(&second, 2);
    let stderr = text(&second).1;
    assert!(
        stderr.contains(&format!("the run folder `run.out_dir` = \"{}\"", d.display()))
            && stderr.contains("is in use by another trainrun run")
            && stderr.contains(&format!("pid {pid} on ")),
        "{stderr}"
    );
    assert!(stderr.contains("help: wait for that run to end or stop it, or give this run a folder"), "{stderr}");
    assert_eq!(json(&d.join("run.json"))["seeds"]["run"], 42, "the first run's record stays its own");
    // The kernel releases the lock of a run that dies, however it dies: no stale lock.
    common::signal(pid, libc::SIGKILL);
    let _ = first.wait();
    assert_exit(&short_run(&d, &[]), 0);
}

#[test]
fn a_backup_another_spec_wrote_is_refused_not_resumed() {
    let dir = tempdir();
    let d = dir.path();
    // A run that diverges keeps its last good backup.
    let backup = ["--set", "callbacks=[{ kind = \"backup_and_restore\", save_freq = 1 }]"];
    assert_exit(&common::run_diverging(d, &backup), 1);
    let backups: Vec<_> = std::fs::read_dir(d.join("backup")).unwrap().map(|e| e.unwrap().path()).collect();
    let written_by =
        json(&backups[0].join("manifest.json"))["manifest"]["spec_hash"].as_str().unwrap_or_default().to_string();
    assert!(!written_by.is_empty(), "{backups:?}");
    // Another seed trains another model: its run must not continue the backup.
    let out = common::run_diverging(d, &[&backup[..], &["--set", "run.seed=7"]].concat());
    assert_exit(&out, 2);
    let stderr = text(&out).1;
    assert!(
        stderr.contains("was written by another spec: run.seed changed since (its training hash is ")
            && stderr.contains(&written_by),
        "{stderr}"
    );
    assert!(stderr.contains("help: give this run a folder of its own") && stderr.contains("or delete "), "{stderr}");
    assert!(!stderr.contains("resuming from"), "{stderr}");
    assert_eq!(json(&d.join("run.json"))["seeds"]["run"], 42, "nothing of the refused run was written");
}

#[test]
fn an_empty_out_dir_is_a_spec_error_in_check_and_run() {
    for command in [vec!["check", "specs/mnist_single.toml"], vec!["specs/mnist_single.toml", "-q"]] {
        let mut args = command.clone();
        args.extend(["--set", "run.out_dir=\"\""]);
        let out = run(&args);
        assert_exit(&out, 2);
        let stderr = text(&out).1;
        assert!(stderr.contains("`run.out_dir` = \"\" is empty"), "{args:?}: {stderr}");
        assert!(stderr.contains("--set run.out_dir=\"\"") && stderr.contains("or leave the key out"), "{stderr}");
    }
}

#[test]
fn a_folder_that_is_not_a_run_folder_is_refused_and_left_as_it_was() {
    let dir = tempdir();
    let d = dir.path();
    std::fs::write(d.join("Cargo.toml"), "[package]\n").unwrap();
    let events = d.join("tensorboard").join("train");
    std::fs::create_dir_all(&events).unwrap();
    std::fs::write(events.join("events.out.tfevents.1.someone"), "theirs").unwrap();
    let out = short_run(d, &[]);
    assert_exit(&out, 2);
    let stderr = text(&out).1;
    assert!(
        stderr.contains(&format!("cannot use the run folder `run.out_dir` = \"{}\"", d.display()))
            && stderr.contains("it is not a trainrun run folder: it holds `Cargo.toml`, and no run.json"),
        "{stderr}"
    );
    assert!(
        stderr.contains("help: point run.out_dir at a folder this process can create and write, new or empty"),
        "{stderr}"
    );
    assert!(events.join("events.out.tfevents.1.someone").exists(), "another program's files are not deleted");
    assert!(!d.join("run.json").exists() && !d.join("metrics.jsonl").exists(), "nothing written");
    // An earlier run's folder is one.
    let ran = d.join("ran");
    assert_exit(&short_run(&ran, &[]), 0);
    assert_exit(&short_run(&ran, &[]), 0);
}

#[test]
fn a_new_run_does_not_present_an_earlier_runs_summary_and_weights_as_its_own() {
    let dir = tempdir();
    let d = dir.path();
    assert_exit(&short_run(d, &[]), 0);
    assert!(d.join("summary.json").exists() && d.join("model.safetensors").exists());
    // The second run stops before its end: nothing of the first may pass for its results.
    let mut second = long_run(d, &["--set", "run.seed=7"]);
    let start = std::time::Instant::now();
    while json(&d.join("run.json"))["seeds"]["run"] != 7 {
        assert!(second.try_wait().ok().flatten().is_none(), "the second run ended before it started training");
        assert!(start.elapsed() < Duration::from_secs(60), "the second run did not start within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    common::signal(second.id(), libc::SIGKILL);
    let _ = second.wait();
    assert!(!d.join("summary.json").exists(), "the first run's summary passes for the second's");
    assert!(!d.join("model.safetensors").exists(), "the first run's weights pass for the second's");
}
