//! Shared helpers for the end-to-end tests: the built binary, pointed at the real MNIST files
//! and forbidden to download.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The MNIST folder: `TRAINRUN_DATA_DIR` when set (CI sets it), else the shared copy next to
/// the checkout.
pub fn data_dir() -> PathBuf {
    std::env::var_os("TRAINRUN_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/mnist"))
}

/// `trainrun` run from the package root, offline, on the real data.
pub fn trainrun() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainrun"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("TRAINRUN_DATA_DIR", data_dir())
        .env("TRAINRUN_OFFLINE", "1")
        .env_remove("TF_CONFIG")
        .env_remove("TRAINRUN_TASK");
    cmd
}

/// Runs `trainrun` with `args`.
pub fn run(args: &[&str]) -> Output {
    match trainrun().args(args).output() {
        Ok(out) => out,
        Err(e) => panic!("cannot run trainrun: {e}"),
    }
}

/// stdout and stderr as text.
pub fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Fails with the command's output unless it exited with `code`.
pub fn assert_exit(out: &Output, code: i32) {
    let (stdout, stderr) = text(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status.code()
    );
    assert!(!stderr.contains("panicked"), "a panic:\n{stderr}");
}

/// A fresh temporary folder.
pub fn tempdir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("no temp dir: {e}"),
    }
}

/// Reads and parses a JSON file.
pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
