//! Panics become bug reports: trainrun's panic hook (`trainrun::crash`) prints "this is a bug
//! in trainrun", the version and a one-line reproduction instead of a raw backtrace, and exits
//! 70 — also when the panic is on another thread while the main thread waits (no hang).
//!
//! The panicking program is this test binary itself, run again with `TRAINRUN_PANIC_CHILD`
//! naming what to do (the `child` test does nothing without it): trainrun has no deliberate
//! panic to trigger, and must not grow one.

use std::process::Command;
use std::time::{Duration, Instant};

const CHILD: &str = "TRAINRUN_PANIC_CHILD";

/// In the child: installs the hook and panics on the main thread or on a worker thread.
#[test]
fn child() {
    let Some(mode) = std::env::var_os(CHILD) else { return };
    trainrun::crash::install();
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
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let start = Instant::now();
    let out = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
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
