//! Panics become bug reports: trainrun's panic hook (`trainrun::crash`) prints "this is a bug
//! in trainrun", the version and a one-line reproduction instead of a raw backtrace, and exits
//! 70 — also when the panic is on another thread while the main thread waits (no hang).
//!
//! A panic while training is recorded truthfully: `run.json` says `failed` with exit code 70
//! and the report, not `running`, and `trainrun report` says so.
//!
//! The panicking program is this test binary itself, run again with `TRAINRUN_PANIC_CHILD`
//! naming what to do (the `child` test does nothing without it): trainrun has no deliberate
//! panic to trigger, and must not grow one. To panic while training, the child trains through
//! trainrun's own entry point while a thread of its own panics once `run.json` is written.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD: &str = "TRAINRUN_PANIC_CHILD";

/// The run folder the `training` child writes.
const OUT_DIR: &str = "PANIC_REPORT_OUT_DIR";

/// In the child: trains a long run into `out` and panics on another thread once training
/// has started.
fn train_then_panic(out: &Path) {
    let record = out.join("run.json");
    let _panicker = std::thread::Builder::new()
        .name("test-panicker".into())
        .spawn(move || {
            let start = Instant::now();
            while !std::fs::read_to_string(&record).is_ok_and(|t| t.contains("\"status\": \"running\"")) {
                assert!(start.elapsed() < Duration::from_secs(60), "training did not start");
                std::thread::sleep(Duration::from_millis(5));
            }
            panic!("a worker thread fell over mid-run");
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // The environment as the binary would see it, less this test's own variables.
    let env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k != CHILD && k != OUT_DIR).collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let inv = trainrun::prepare::Invocation {
        spec: root.join("specs/mnist_single.toml"),
        sets: vec![
            "train.epochs=1".into(),
            "train.steps_per_epoch=100000".into(),
            "run.seed=7".into(),
            format!("run.out_dir={}", out.display()),
        ],
        env,
        quiet: true,
        task: None,
        launched: Instant::now(),
    };
    let _ = trainrun::run::train(&inv);
    std::thread::sleep(Duration::from_secs(60));
}

/// In the child: installs the hook and panics on the main thread or on a worker thread.
#[test]
fn child() {
    let Some(mode) = std::env::var_os(CHILD) else { return };
    trainrun::crash::install();
    if mode == "training" {
        train_then_panic(&PathBuf::from(std::env::var_os(OUT_DIR).unwrap_or_default()));
    }
    if mode == "thread" {
        let _worker = std::thread::Builder::new()
            .name("trainrun-ckpt".into())
            .spawn(|| panic!("a worker thread fell over"))
            .unwrap_or_else(|e| panic!("{e}"));
        // The main thread waits on, as the step loop would for a worker that is gone.
        std::thread::sleep(Duration::from_secs(60));
    }
    let empty: Vec<u32> = Vec::new();
    let _ = empty[usize::from(mode == "main")];
}

fn run_child(mode: &str) -> (Option<i32>, String, Duration) {
    run_child_in(mode, Path::new(""))
}

/// [`run_child`], writing the run folder `out` when it trains.
fn run_child_in(mode: &str, out: &Path) -> (Option<i32>, String, Duration) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    let out = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .env(OUT_DIR, out)
        .env("TRAINRUN_DATA_DIR", common::data_dir())
        .env("TRAINRUN_OFFLINE", "1")
        .env_remove("TF_CONFIG")
        .env_remove("TRAINRUN_TASK")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), start.elapsed())
}

#[test]
fn a_panic_is_a_bug_report_with_exit_code_70() {
    let (code, stderr, _) = run_child("main");
    assert_eq!(code, Some(70), "{stderr}");
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        stderr.contains(&format!("error: this is a bug in trainrun {version}: it panicked at tests/panic_report.rs")),
        "{stderr}"
    );
    assert!(stderr.contains("index out of bounds"), "{stderr}");
    assert!(stderr.contains("  reproduce: RUST_BACKTRACE=1 ") && stderr.contains(" --exact child "), "{stderr}");
    assert!(!stderr.contains("stack backtrace") && !stderr.contains("note: run with"), "a raw report:\n{stderr}");
}

#[test]
fn a_panic_on_another_thread_ends_the_process_with_70_not_a_hang() {
    let (code, stderr, took) = run_child("thread");
    assert_eq!(code, Some(70), "{stderr}");
    assert!(took < Duration::from_secs(30), "the process hung for {took:?}");
    assert!(stderr.contains("(thread `trainrun-ckpt`): a worker thread fell over"), "{stderr}");
}

/// A panic while training leaves `run.json` saying `failed` with exit code 70 and the report,
/// beside no summary or weights of an earlier run into the folder, and `trainrun report`
/// says how the run ended, not that it is still going.
#[test]
fn a_panic_while_training_is_recorded_in_run_json() {
    let dir = common::tempdir();
    let out = dir.path().join("run");
    let earlier = common::run(&[
        "specs/mnist_single.toml",
        "-q",
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=5",
        "--set",
        &format!("run.out_dir={}", out.display()),
    ]);
    common::assert_exit(&earlier, 0);
    let (code, stderr, took) = run_child_in("training", &out);
    assert_eq!(code, Some(70), "{stderr}");
    assert!(took < Duration::from_secs(120), "{took:?}");
    let record = common::json(&out.join("run.json"));
    assert_eq!(record["seeds"]["run"], 7, "{record}");
    assert_eq!((record["status"].as_str(), record["exit_code"].as_u64()), (Some("failed"), Some(70)), "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("this is a bug in trainrun") && error.ends_with("a worker thread fell over mid-run"),
        "{record}"
    );
    assert!(record["ended_at"].is_string(), "{record}");
    assert!(!out.join("summary.json").exists(), "the earlier run's summary passes for this one's");
    assert!(!out.join("model.safetensors").exists(), "the earlier run's weights pass for this one's");
    let report = common::run(&["report", &out.display().to_string()]);
    common::assert_exit(&report, 0);
    let page = std::fs::read_to_string(out.join("report.html")).unwrap_or_default();
    assert!(page.contains("the run ended `failed` (exit code 70): this is a bug in trainrun"), "{page}");
    assert!(!page.contains("has not finished"), "{page}");
}
