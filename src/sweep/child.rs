//! Running trials as child processes of this binary, at most K at once, each writing its
//! output to `train.log` in its folder. A stop asked of the sweep (SIGTERM, Ctrl-C) starts no
//! further trial and is passed on to the running ones, which stop as any run does; a child
//! dies with the sweep (Linux: parent-death signal), so a killed sweep leaves no trial
//! training on alone.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// One trial to run.
#[derive(Debug, Clone)]
pub struct TrialProcess {
    /// 1-based trial number.
    pub index: usize,
    /// Its folder (created here, for the log).
    pub dir: PathBuf,
    /// The binary.
    pub exe: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables to add.
    pub env: Vec<(String, String)>,
}

/// What happened to a job.
#[derive(Debug)]
pub enum TrialEvent {
    /// It started.
    Started(usize),
    /// It ended: exit code (128 + signal when killed) and how long it ran.
    Ended { index: usize, code: u8, took: Duration, error: Option<String> },
}

/// Runs `jobs` in order, `parallel` at a time, calling `on_event` on this thread as each
/// starts and ends; once `stop` is set, no further job starts and the running ones get
/// SIGTERM (and SIGKILL on a second Ctrl-C).
pub fn run_all(jobs: Vec<TrialProcess>, parallel: usize, stop: &AtomicBool, on_event: impl FnMut(TrialEvent)) {
    /// The jobs in order.
    struct Queue<F> {
        jobs: VecDeque<TrialProcess>,
        on_event: F,
    }
    impl<F: FnMut(TrialEvent)> Dispatch for Queue<F> {
        fn next(&mut self) -> Option<TrialProcess> {
            self.jobs.pop_front()
        }
        fn event(&mut self, event: TrialEvent) {
            (self.on_event)(event)
        }
    }
    run_dispatched(parallel, stop, &mut Queue { jobs: jobs.into(), on_event });
}

/// Hands out jobs one at a time as slots free up, and hears how they went.
pub trait Dispatch {
    /// The next job, or `None` when there is none now (the runner waits for a running job to
    /// end and asks again; with none running, it is done).
    fn next(&mut self) -> Option<TrialProcess>;
    /// A job started or ended.
    fn event(&mut self, event: TrialEvent);
}

/// Runs the jobs `dispatch` hands out, at most `parallel` at a time, asking for the next one
/// whenever a slot is free, on this thread; once `stop` is set, no further job starts and
/// the running ones get SIGTERM as in [`run_all`].
pub fn run_dispatched(parallel: usize, stop: &AtomicBool, dispatch: &mut dyn Dispatch) {
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        let mut running = 0;
        loop {
            while running < parallel.max(1) && !stop.load(Ordering::SeqCst) {
                let Some(job) = dispatch.next() else { break };
                dispatch.event(TrialEvent::Started(job.index));
                running += 1;
                let tx = tx.clone();
                // This thread waits for its child, so it outlives it (the parent-death signal).
                scope.spawn(move || {
                    let started = Instant::now();
                    let (code, error) = match run_one(&job, stop) {
                        Ok(status) => (exit_code(status), None),
                        Err(e) => (1, Some(e)),
                    };
                    let _ = tx.send(TrialEvent::Ended { index: job.index, code, took: started.elapsed(), error });
                });
            }
            if running == 0 {
                break;
            }
            match rx.recv() {
                Ok(event) => {
                    running -= 1;
                    dispatch.event(event);
                }
                Err(_) => break,
            }
        }
    });
}

/// How often a running trial is looked at: a stop reaches it within this, and the next job
/// starts this long after a trial ends at worst. A paused trial relaunches at every rung, so
/// at 10 ms this wait was about 5 ms a launch of the sweep's wall time (benches/sweep_targets.py
/// `--part overhead`); a look costs microseconds.
const POLL: Duration = Duration::from_millis(2);

fn run_one(job: &TrialProcess, stop: &AtomicBool) -> Result<ExitStatus, String> {
    std::fs::create_dir_all(&job.dir).map_err(|e| format!("cannot create {}: {e}", job.dir.display()))?;
    let log = job.dir.join("train.log");
    let out = std::fs::File::create(&log).map_err(|e| format!("cannot write {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| format!("cannot write {}: {e}", log.display()))?;
    let mut cmd = Command::new(&job.exe);
    cmd.args(&job.args).envs(job.env.iter().cloned()).stdin(Stdio::null()).stdout(out).stderr(err);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl in the child between fork and exec touches no shared state. A trial
        // whose sweep dies gets SIGTERM instead of training on alone.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", job.exe.display()))?;
    let mut forwarded = false;
    loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("lost trial {}: {e}", job.index))? {
            return Ok(status);
        }
        if crate::signals::interrupted_twice() {
            let _ = child.kill();
        } else if !forwarded && stop.load(Ordering::SeqCst) {
            // The trial stops at its next step boundary and records it, as any run does. Ctrl-C
            // is passed on as SIGTERM too: a terminal already sent the trial its own SIGINT,
            // and a second one would stop it at once, without its backup.
            forwarded = true;
            // SAFETY: kill(2) on our own child's pid, which try_wait has not reaped.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
        std::thread::sleep(POLL);
    }
}

/// The exit code of a process, 128 + the signal when it was killed (as shells report it).
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(s)) => u8::try_from(128 + s).unwrap_or(1),
        (None, None) => 1,
    }
}
