//! Processes started inside a cluster's hosts (`ip netns exec`, which execs the program, so
//! the child is the program itself), each logging to files of its own in the cluster's
//! folder, waited for with a deadline and a stop flag. Dropping them kills and reaps whatever
//! still runs, so no process outlives the harness that started it.

use super::hosts::NamespaceHosts;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum ProcsError {
    #[error("cannot start {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write into the cluster's folder: {0}")]
    Io(#[from] std::io::Error),
    #[error("{name} failed ({status}); the others were stopped. Its last lines:\n{tail}")]
    Failed { name: String, status: String, tail: String },
    #[error("still running after the {}-second deadline: {}; every process was killed", .after.as_secs(), .names.join(", "))]
    Deadline { after: Duration, names: Vec<String> },
    #[error("stopped on request (SIGINT or SIGTERM); every process was killed")]
    Stopped,
}

/// One process in a host.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

/// What to run in a host.
pub struct Start<'a> {
    /// For messages and the log files' names, e.g. `worker:3`.
    pub name: String,
    pub host: usize,
    pub program: &'a Path,
    pub args: Vec<String>,
    /// Added to a cleared environment that keeps only `PATH`, `HOME` and `LANG`.
    pub env: Vec<(String, String)>,
}

/// The processes of one measurement.
#[derive(Default)]
pub struct Procs {
    procs: Vec<Proc>,
}

impl Procs {
    /// Starts `s` in its host; stdout and stderr go to `<name>.log` in the cluster's folder.
    pub fn start(&mut self, cluster: &NamespaceHosts, s: Start<'_>) -> Result<(), ProcsError> {
        let log = cluster.work().join(format!("{}.log", s.name.replace(':', "-")));
        let out = std::fs::File::create(&log)?;
        let err = out.try_clone()?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", cluster.host(s.host)]).arg(s.program).args(&s.args);
        cmd.env_clear();
        for key in ["PATH", "HOME", "LANG"] {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        cmd.envs(s.env.iter().map(|(k, v)| (k, v)))
            .current_dir(cluster.work())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().map_err(|source| ProcsError::Spawn { name: s.name.clone(), source })?;
        self.procs.push(Proc { name: s.name, child, log });
        Ok(())
    }

    /// Waits until every process has exited successfully; the first failure, the deadline or
    /// `stop` ends the wait, killing the rest.
    pub fn wait(&mut self, limit: Duration, stop: &AtomicBool) -> Result<(), ProcsError> {
        let deadline = Instant::now() + limit;
        let mut done = vec![false; self.procs.len()];
        while done.iter().any(|d| !d) {
            if let Some(e) = self.poll(&mut done) {
                self.kill();
                return Err(e);
            }
            if stop.load(Ordering::SeqCst) {
                self.kill();
                return Err(ProcsError::Stopped);
            }
            if Instant::now() > deadline {
                let names = self.procs.iter().zip(&done).filter(|(_, d)| !**d).map(|(p, _)| p.name.clone()).collect();
                self.kill();
                return Err(ProcsError::Deadline { after: limit, names });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Marks the processes that exited successfully in `done`; the first that failed.
    fn poll(&mut self, done: &mut [bool]) -> Option<ProcsError> {
        for (p, d) in self.procs.iter_mut().zip(done.iter_mut()).filter(|(_, d)| !**d) {
            match p.child.try_wait() {
                Ok(Some(status)) if status.success() => *d = true,
                Ok(Some(status)) => {
                    return Some(ProcsError::Failed {
                        name: p.name.clone(),
                        status: status.to_string(),
                        tail: tail(&p.log),
                    });
                }
                Ok(None) => {}
                Err(source) => return Some(ProcsError::Spawn { name: p.name.clone(), source }),
            }
        }
        None
    }

    /// Kills and reaps every process.
    fn kill(&mut self) {
        for p in &mut self.procs {
            if matches!(p.child.try_wait(), Ok(None)) {
                let _ = p.child.kill();
            }
            let _ = p.child.wait();
        }
    }

    /// Process `i`'s log.
    pub fn log(&self, i: usize) -> Option<String> {
        self.procs.get(i).and_then(|p| std::fs::read_to_string(&p.log).ok())
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last lines of a log.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(12)..].join("\n")
}
