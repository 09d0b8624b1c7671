//! Checkpoints under pressure, the binary end to end on real MNIST: backups are not starved
//! by model checkpoints saved at the same steps (they used to wait behind every model write
//! until the last step), and a full disk (a 30 MB tmpfs) fails once, cleanly: what the failed
//! save wrote is removed at once, the last good backup stays, and the launcher does not
//! restart into the same full disk.

mod common;

use common::{assert_exit, json, tempdir, text, wait_within};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(180);

/// Committed checkpoints (with a manifest) in `dir`, by step.
fn committed(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("manifest.json").exists())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("ckpt-")?.parse().ok())
        .collect();
    steps.sort_unstable();
    steps
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// `backup_and_restore` and `model_checkpoint` both every 10 steps, with Adam (the largest
/// snapshot): while training runs, backups appear on disk well before the last step, and at
/// the end the newest two are there.
#[test]
fn backups_are_not_starved_by_model_checkpoints() {
    let dir = tempdir();
    let out_dir = format!("run.out_dir={}", dir.path().display());
    let callbacks = "callbacks=[{ kind = \"backup_and_restore\", save_freq = 10, delete_checkpoint = false }, \
                     { kind = \"model_checkpoint\", save_freq = 10 }]";
    let mut child = common::trainrun()
        .args([
            "specs/mnist_single.toml",
            "-q",
            "--set",
            "optimizer.kind=\"adam\"",
            "--set",
            callbacks,
            "--set",
            &out_dir,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start trainrun: {e}"));
    let backup = dir.path().join("backup");
    let mut seen_while_training: Vec<u64> = Vec::new();
    let mut two_at_once = false;
    let start = Instant::now();
    while matches!(child.try_wait(), Ok(None)) && start.elapsed() < LIMIT {
        // Training is over once the final weights are written; until then, look.
        if !dir.path().join("model.safetensors").exists() {
            let now = committed(&backup);
            two_at_once |= now.len() >= 2;
            seen_while_training.extend(now);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let (out, _) = wait_within(child, Duration::from_secs(10));
    assert_exit(&out, 0);
    let summary = json(&dir.path().join("summary.json"));
    let steps = summary["steps"].as_u64().unwrap_or(0);
    assert_eq!(steps, 210, "{summary}");
    assert!(
        seen_while_training.iter().any(|&s| s < steps),
        "no backup was on disk while training ran (seen: {seen_while_training:?})"
    );
    let kept = committed(&backup);
    assert_eq!((kept.len(), kept.last()), (2, Some(&210)), "two backups, the last one's the newest: {kept:?}");
    let models = committed(&dir.path().join("checkpoints"));
    assert_eq!(models, (1..=21).map(|i| i * 10).collect::<Vec<u64>>(), "every model checkpoint is written");
    seen_while_training.sort_unstable();
    seen_while_training.dedup();
    eprintln!(
        "backups seen while training: {seen_while_training:?}; two at once: {two_at_once}; save_block_ms_max {}",
        summary["save_block_ms_max"]
    );
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempdir();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The fault-tolerant job (two workers, backups every 10 steps, 3 restarts) into a 30 MB
/// folder: the third backup does not fit. The failed save's folder and temporary files go at
/// once, the two good backups stay, the job fails with exit code 7 naming the full disk, and
/// no restart is wasted on it.
#[test]
fn a_full_disk_fails_once_and_leaves_the_last_good_backup() {
    let tmpfs = match Tmpfs::mount("30m") {
        Ok(t) => t,
        Err(why) => {
            println!("skipped: cannot mount a 30 MB tmpfs ({why}); the full-disk test needs root");
            eprintln!("skipped: cannot mount a 30 MB tmpfs ({why}); the full-disk test needs root");
            return;
        }
    };
    let run = tmpfs.path().join("run");
    let out_dir = format!("run.out_dir={}", run.display());
    let child = common::trainrun()
        .args(["specs/mnist_fault_tolerant.toml", "--set", &out_dir])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start trainrun: {e}"));
    let (out, _) = wait_within(child, LIMIT);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("no space left on the device for checkpoint"), "{stderr}");
    assert!(!stderr.contains("restarting every task"), "a restart into the same full disk:\n{stderr}");
    let backup = run.join("backup");
    let left: Vec<PathBuf> = files(&run).into_iter().filter(|f| f.extension().is_some_and(|x| x == "tmp")).collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
    let folders: Vec<String> = std::fs::read_dir(&backup)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let good = committed(&backup);
    assert_eq!(folders.len(), good.len(), "an unfinished backup stayed: {folders:?}");
    assert!(!good.is_empty(), "the last good backup was removed: {folders:?}\n{stderr}");
    let free = trainrun::checkpoint::free_bytes(tmpfs.path()).unwrap_or(0);
    eprintln!("backups kept: {good:?}; {} MB free after the failure", free >> 20);
}
