//! How an evaluator outside the job's control plane (TF_CONFIG's evaluator, split off the
//! training cluster) learns that training is over: the chief's `run.json` in the shared run
//! folder says `completed`, `failed`, `preempted` or `interrupted`. A record that already said so when the evaluator
//! started (it came late, after training) counts too: it then evaluates the checkpoints there
//! are and exits.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Watches a run folder's `run.json`.
pub struct Watcher {
    path: PathBuf,
    started: SystemTime,
    ended_before: bool,
}

/// The record's status and when it was written, if it reads.
fn status(path: &Path) -> Option<(String, SystemTime)> {
    let text = std::fs::read_to_string(path).ok()?;
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some((value.get("status")?.as_str()?.to_owned(), modified))
}

fn terminal(status: &str) -> bool {
    // A stopped run has ended too: this launch trains no further.
    matches!(status, "completed" | "failed" | "preempted" | "interrupted")
}

impl Watcher {
    /// Starts watching `<out_dir>/run.json` now.
    pub fn new(out_dir: &Path) -> Watcher {
        let path = out_dir.join("run.json");
        let ended_before = status(&path).is_some_and(|(s, _)| terminal(&s));
        Watcher { path, started: SystemTime::now(), ended_before }
    }

    /// Whether training has ended: the record was written terminal after this watcher
    /// started, or was terminal already then.
    pub fn ended(&self) -> bool {
        match status(&self.path) {
            Some((s, at)) if terminal(&s) => self.ended_before || at >= self.started,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_terminal_ends_the_watch() {
        let dir = tempfile::tempdir().unwrap();
        let w = Watcher::new(dir.path());
        assert!(!w.ended(), "no record yet");
        std::fs::write(dir.path().join("run.json"), r#"{"status": "running"}"#).unwrap();
        assert!(!w.ended());
        std::fs::write(dir.path().join("run.json"), r#"{"status": "completed"}"#).unwrap();
        assert!(w.ended());
        assert!(Watcher::new(dir.path()).ended(), "a late evaluator sees the end at once");
    }
}
