//! One run per run folder. Before a run reads a backup or writes into `run.out_dir` it
//! checks that the folder is one a run may write into (missing, empty, or a trainrun run
//! folder: never `/` or a project's folder, whose files a run would overwrite), then takes an
//! advisory lock on `run.lock` inside it (`flock`: the kernel releases it when the holder
//! ends, however it ends, so no stale lock outlives a killed run) and writes who holds it, for
//! the message a second run gets. The process that owns the folder holds it: a single
//! process, the local launcher (its tasks share the folder under it), or, in a job started
//! task by task, the chief.

use crate::exit::RunError;
use crate::prepare::Prepared;
use crate::provenance::{hostname, rfc3339};
use crate::train::run_dir::LOCK_FILE;
use std::fs::{File, TryLockError};
use std::io::{Seek, Write};
use std::path::Path;

/// What a run writes into its folder (and `trainrun report` and `trainrun sweep` beside it):
/// a folder holding only these (a run killed before `run.json`, a sweep trial's `train.log`)
/// is a run folder too.
const RUN_FILES: [&str; 18] = [
    "run.json",
    LOCK_FILE,
    "spec.toml",
    "metrics.jsonl",
    "metrics.jsonl.tmp",
    "run.json.tmp",
    "summary.json",
    "summary.json.tmp",
    "model.safetensors",
    "vocab.json",
    "classes.json",
    "tensorboard",
    "backup",
    "checkpoints",
    "eval.jsonl",
    "train.log",
    "training.csv",
    "report.html",
];

/// Tries after the first, 10 ms apart, before a held lock means another run.
const PROBE_RETRIES: u32 = 5;

/// The run folder's lock, held until this value is dropped or the process ends.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

/// Checks that `p`'s run folder may be written, creates it and locks it.
pub fn acquire(p: &Prepared) -> Result<RunLock, RunError> {
    let dir = &p.plan.out_dir;
    if let Some(found) = foreign_files(dir) {
        return Err(refused(p, &format!("it is not a trainrun run folder: it holds {found}, and no run.json"), None));
    }
    std::fs::create_dir_all(dir).map_err(|e| refused(p, &crate::spec::io_reason(&e), Some("create")))?;
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| refused(p, &crate::spec::io_reason(&e), Some("lock")))?;
    // A probe (`trainrun sweep --collect` asking whether a trial's process is gone, see
    // `run_dir::in_use`) holds the lock for an instant: a few short retries never take it for a run.
    let mut retries = PROBE_RETRIES;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) if retries > 0 => {
                retries -= 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(TryLockError::WouldBlock) => {
                let holder = std::fs::read_to_string(&path).unwrap_or_default();
                return Err(in_use(p, holder.trim()));
            }
            Err(TryLockError::Error(e)) => return Err(refused(p, &crate::spec::io_reason(&e), Some("lock"))),
        }
    }
    // Who holds it, for the next run's message; a lock that cannot say so still locks.
    let holder = format!(
        "pid {} on {}, started {}: {}\n",
        std::process::id(),
        hostname().unwrap_or_else(|| "an unnamed host".into()),
        rfc3339(std::time::SystemTime::now()),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    let _ = file.set_len(0).and_then(|_| file.rewind()).and_then(|_| file.write_all(holder.as_bytes()));
    Ok(RunLock { _file: file })
}

/// What in `dir` says it is not a run folder: `None` when it is missing, empty, holds
/// `run.json` or holds only what runs write; else up to three names of what it holds.
fn foreign_files(dir: &Path) -> Option<String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // Missing: the run creates it. Not a folder, or unreadable: creating or writing it
        // fails with its own reason.
        Err(_) => return None,
    };
    let names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    if names.iter().any(|n| n == "run.json") {
        return None;
    }
    let mut foreign: Vec<&String> =
        names.iter().filter(|n| !RUN_FILES.contains(&n.as_str()) && !is_report_file(n)).collect();
    if foreign.is_empty() {
        return None;
    }
    foreign.sort();
    let more = foreign.len().saturating_sub(3);
    let shown: Vec<String> = foreign.iter().take(3).map(|n| format!("`{n}`")).collect();
    Some(if more > 0 { format!("{} and {more} more", shown.join(", ")) } else { shown.join(", ") })
}

/// `trainrun report`'s plots.
fn is_report_file(name: &str) -> bool {
    ["loss.svg", "loss.png", "accuracy.svg", "accuracy.png"].contains(&name)
}

/// Where `run.out_dir` came from, for messages.
fn origin(p: &Prepared) -> String {
    match &p.loaded.spec.run.out_dir {
        Some(_) => p.loaded.origins.origin("run.out_dir").unwrap_or("the spec").to_string(),
        None => "the default, runs/<run.name>".to_string(),
    }
}

/// Another folder to suggest.
fn other_folder(p: &Prepared) -> String {
    format!("runs/{}-2", p.loaded.spec.run.name.as_deref().unwrap_or("run"))
}

/// The folder cannot be used (exit 2, which the launcher does not restart: a restart would
/// find the same folder). `action` is what failed on it, when something did.
pub(super) fn refused(p: &Prepared, reason: &str, action: Option<&str>) -> RunError {
    let dir = p.plan.out_dir.display();
    let what = action.map_or_else(|| "use".to_string(), str::to_string);
    RunError::Spec(format!(
        "error: cannot {what} the run folder `run.out_dir` = \"{dir}\" (from {}): {reason}\n  \
         help: point run.out_dir at a folder this process can create and write, new or empty or an earlier \
         run's, e.g. `--set run.out_dir={}`; a run writes run.json, spec.toml, weights and tensorboard/ there",
        origin(p),
        other_folder(p)
    ))
}

/// Another run holds the folder.
fn in_use(p: &Prepared, holder: &str) -> RunError {
    let holder = if holder.is_empty() { "a run that has not said who it is yet".to_string() } else { holder.into() };
    RunError::Spec(format!(
        "error: the run folder `run.out_dir` = \"{}\" (from {}) is in use by another trainrun run: {holder}\n  \
         help: wait for that run to end or stop it, or give this run a folder of its own, e.g. `--set run.out_dir={}`",
        p.plan.out_dir.display(),
        origin(p),
        other_folder(p)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_folders_are_missing_empty_or_hold_what_runs_write() {
        let Ok(dir) = tempfile::tempdir() else { panic!("no temporary folder") };
        let d = dir.path();
        assert_eq!(foreign_files(&d.join("missing")), None);
        assert_eq!(foreign_files(d), None, "empty");
        let _ = std::fs::write(d.join("train.log"), "");
        let _ = std::fs::create_dir(d.join("backup"));
        assert_eq!(foreign_files(d), None, "a sweep trial's log and a backup");
        for n in ["Cargo.toml", "src", "a", "b"] {
            let _ = std::fs::write(d.join(n), "");
        }
        assert_eq!(foreign_files(d).as_deref(), Some("`Cargo.toml`, `a`, `b` and 1 more"));
        let _ = std::fs::write(d.join("run.json"), "{}");
        assert_eq!(foreign_files(d), None, "run.json makes it a run folder");
    }
}
