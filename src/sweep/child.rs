//! Running trials as child processes of this binary, at most K at once, each writing its
//! output to `train.log` in its folder. A stop asked of the sweep (SIGTERM, Ctrl-C) starts no
//! further trial and is passed on to the running ones, which stop as any run does; a child
//! dies with the sweep (Linux: parent-death signal), so a killed sweep leaves no trial
//! training on alone.
//!
//! Under a scheduler the trials may stay resident between rungs ([`Residents`],
//! [`super::resident`]): a trial that wrote its rung pauses instead of exiting, and the next job
//! of the same trial goes to it as an order rather than to a new process. Paused trials are
//! kept while their memory stays within a budget, the least promising (the worst value of the
//! sweep's metric at their rung) told to exit first; a trial that exited or died while paused is
//! started anew, resuming from its backup, as every trial did before.

use super::resident::{CONTROL_VAR, DriverOrder, PAUSED};
use super::selection::Evaluated;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
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
    /// Its arguments: the spec, then `--set` and each of `sets`.
    pub args: Vec<String>,
    /// Its `--set`s.
    pub sets: Vec<String>,
    /// Environment variables to add.
    pub env: Vec<(String, String)>,
    /// Whether it may stay resident after this job (a later rung may follow), and what it
    /// evaluates (how its summary names the sweep's metric).
    pub stays: Option<Evaluated>,
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
    run_all_resident(jobs, parallel, stop, &mut Residents::none(), on_event);
}

/// Hands out jobs one at a time as slots free up, and hears how they went.
pub trait Dispatch {
    /// The next job, or `None` when there is none now (the runner waits for a running job to
    /// end and asks again; with none running, it is done).
    fn next(&mut self) -> Option<TrialProcess>;
    /// A job started or ended.
    fn event(&mut self, event: TrialEvent);
}

/// [`run_all`], keeping trials resident in `residents` between calls.
pub fn run_all_resident(
    jobs: Vec<TrialProcess>,
    parallel: usize,
    stop: &AtomicBool,
    residents: &mut Residents,
    on_event: impl FnMut(TrialEvent),
) {
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
    run_resident(parallel, stop, &mut Queue { jobs: jobs.into(), on_event }, residents);
}

/// Runs the jobs `dispatch` hands out, at most `parallel` at a time, asking for the next one
/// whenever a slot is free, on this thread; once `stop` is set, no further job starts and the
/// running ones get SIGTERM as in [`run_all`]. A job of a trial paused in `residents` goes to
/// it, and trials that pause are kept there.
pub fn run_resident(parallel: usize, stop: &AtomicBool, dispatch: &mut dyn Dispatch, residents: &mut Residents) {
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|scope| {
        let mut running = 0;
        loop {
            while running < parallel.max(1) && !stop.load(Ordering::SeqCst) {
                let Some(job) = dispatch.next() else { break };
                dispatch.event(TrialEvent::Started(job.index));
                running += 1;
                let tx = tx.clone();
                let started = Instant::now();
                // Spawned here, on the thread that runs the sweep, so that a trial left
                // resident outlives the thread that waited for it (the parent-death signal
                // follows the thread that started a process).
                let live = match residents.take(job.index).and_then(|r| r.order(&job)) {
                    Some(live) => Ok(live),
                    None => spawn(&job, residents.enabled() && job.stays.is_some()),
                };
                scope.spawn(move || {
                    let outcome = match live {
                        Ok(live) => wait(live, job.index, stop),
                        Err(e) => JobOutcome::Exited(Err(e)),
                    };
                    let _ = tx.send((job, started.elapsed(), outcome));
                });
            }
            if running == 0 {
                break;
            }
            let Ok((job, took, outcome)) = rx.recv() else { break };
            running -= 1;
            let (code, error) = match outcome {
                JobOutcome::Paused(live) => {
                    residents.pause(&job, live);
                    (0, None)
                }
                JobOutcome::Exited(Ok(status)) => (exit_code(status), None),
                JobOutcome::Exited(Err(e)) => (1, Some(e)),
            };
            dispatch.event(TrialEvent::Ended { index: job.index, code, took, error });
            residents.trim();
        }
    });
}

/// A trial process and the driver's end of its control socket.
pub struct Live {
    child: Child,
    control: Option<BufReader<UnixStream>>,
}

/// How a job ended: its trial exited (or could not start), or paused resident.
enum JobOutcome {
    Exited(Result<ExitStatus, String>),
    Paused(Live),
}

/// A paused trial.
struct Paused {
    live: Live,
    dir: PathBuf,
    evaluates: Evaluated,
}

impl Paused {
    /// Sends the trial `job` as its order; `None` when it is gone (then it is reaped, and the
    /// job starts a new process).
    fn order(mut self, job: &TrialProcess) -> Option<Live> {
        let mut env: BTreeMap<String, String> = std::env::vars().collect();
        env.extend(job.env.iter().cloned());
        let command = std::iter::once(job.exe.display().to_string()).chain(job.args.iter().cloned()).collect();
        let order = DriverOrder::Continue { sets: job.sets.clone(), env: env.into_iter().collect(), command };
        let alive = matches!(self.live.child.try_wait(), Ok(None));
        let sent =
            alive && self.live.control.as_mut().is_some_and(|c| c.get_mut().write_all(order.line().as_bytes()).is_ok());
        if sent {
            return Some(self.live);
        }
        leave(self.live);
        None
    }
}

/// Tells a paused trial to exit and reaps it.
fn leave(mut live: Live) {
    if let Some(c) = live.control.as_mut() {
        let _ = c.get_mut().write_all(DriverOrder::Stop.line().as_bytes());
    }
    drop(live.control.take());
    // It waits on the socket alone: it exits at once, or was gone already.
    let _ = live.child.wait();
}

/// The trials paused between rungs, kept within a memory budget.
pub struct Residents {
    paused: BTreeMap<usize, Paused>,
    /// Bytes their resident memory may take together (0: no trial stays resident).
    budget: u64,
    /// How many may wait at once.
    most: usize,
    metric: String,
    higher_is_better: bool,
}

/// At most this many trials wait resident, whatever the budget (each holds its threads and a
/// socket).
const MOST_RESIDENT: usize = 64;

impl Residents {
    /// None kept: every trial exits at the end of its job.
    pub fn none() -> Self {
        Self { paused: BTreeMap::new(), budget: 0, most: 0, metric: String::new(), higher_is_better: true }
    }

    /// The paused trials of `sweep` kept resident: at most its `resident_trials` ([`MOST_RESIDENT`]
    /// when unset) while their memory stays within a quarter of what `env`'s machine gives a
    /// job; the worst by the sweep's metric at their rung are told to exit first.
    pub fn of(sweep: &super::Sweep, env: &[(String, String)]) -> Self {
        let budget = crate::machine_memory::read(env).map_or(0, |m| m.bytes / 4);
        let most = sweep.resident_trials.unwrap_or(MOST_RESIDENT).min(MOST_RESIDENT);
        let metric = sweep.metric.as_str().to_string();
        Self { paused: BTreeMap::new(), budget, most, metric, higher_is_better: sweep.higher_is_better }
    }

    fn enabled(&self) -> bool {
        self.budget > 0 && self.most > 0
    }

    /// Trial `index` paused, taken out to be given its next job.
    fn take(&mut self, index: usize) -> Option<Paused> {
        self.paused.remove(&index)
    }

    /// Keeps `live`, paused after `job`, or lets it go when no later rung may follow.
    fn pause(&mut self, job: &TrialProcess, live: Live) {
        match job.stays {
            Some(evaluates) if self.enabled() => {
                let paused = Paused { live, dir: job.dir.clone(), evaluates };
                if let Some(old) = self.paused.insert(job.index, paused) {
                    leave(old.live);
                }
            }
            _ => leave(live),
        }
    }

    /// Tells trial `index` to exit if it is paused here: it goes no further.
    pub fn release(&mut self, index: usize) {
        if let Some(p) = self.paused.remove(&index) {
            leave(p.live);
        }
    }

    /// Tells the least promising paused trials to exit until the rest fit the budget.
    fn trim(&mut self) {
        loop {
            let rss: u64 = self.paused.values().map(|p| resident_bytes(p.live.child.id())).sum();
            if self.paused.is_empty() || (rss <= self.budget && self.paused.len() <= self.most) {
                return;
            }
            let worst =
                self.paused.iter().min_by(|a, b| self.promise(a.1).total_cmp(&self.promise(b.1))).map(|(i, _)| *i);
            if let Some(i) = worst {
                self.release(i);
            }
        }
    }

    /// How promising a paused trial is: its metric at its rung, higher better; unknown last.
    fn promise(&self, p: &Paused) -> f64 {
        let summary = std::fs::read_to_string(p.dir.join("summary.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        let value = summary.as_ref().and_then(|s| super::results::value_in(s, p.evaluates, &self.metric)?.as_f64());
        match value {
            Some(v) if self.higher_is_better => v,
            Some(v) => -v,
            None => f64::NEG_INFINITY,
        }
    }
}

impl Drop for Residents {
    /// The sweep is done (or stopping): every paused trial exits.
    fn drop(&mut self) {
        for (_, p) in std::mem::take(&mut self.paused) {
            leave(p.live);
        }
    }
}

/// The resident memory of process `pid` (`/proc/<pid>/statm`), 0 when it cannot be read.
fn resident_bytes(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.saturating_mul(u64::try_from(page).unwrap_or(4096))
}

/// How often a running trial is looked at: a stop reaches it within this, and the next job
/// starts this long after a trial ends at worst. A paused trial relaunches at every rung, so
/// at 10 ms this wait was about 5 ms a launch of the sweep's wall time (benches/sweep_targets.py
/// `--part overhead`); a look costs microseconds.
const POLL: Duration = Duration::from_millis(2);

/// Starts `job`'s process, handing it a control socket when it may stay resident.
fn spawn(job: &TrialProcess, resident: bool) -> Result<Live, String> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(&job.dir).map_err(|e| format!("cannot create {}: {e}", job.dir.display()))?;
    let log = job.dir.join("train.log");
    let out = std::fs::File::create(&log).map_err(|e| format!("cannot write {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| format!("cannot write {}: {e}", log.display()))?;
    let pair = if resident { UnixStream::pair().ok() } else { None };
    let mut cmd = Command::new(&job.exe);
    cmd.args(&job.args).envs(job.env.iter().cloned()).stdin(Stdio::null()).stdout(out).stderr(err);
    let handed = pair.as_ref().map(|(_, theirs)| theirs.as_raw_fd());
    if let Some(fd) = handed {
        cmd.env(CONTROL_VAR, fd.to_string());
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl and fcntl in the child between fork and exec touch no shared state. A
        // trial whose sweep dies gets SIGTERM instead of training on alone; its end of the
        // control socket (close-on-exec here, so no other child gets it) stays open across exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if let Some(fd) = handed {
                    libc::fcntl(fd, libc::F_SETFD, 0);
                }
                Ok(())
            });
        }
    }
    let child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", job.exe.display()))?;
    // Ours closes with the trial's copy only: a trial that dies closes the socket.
    let control = pair.map(|(ours, _)| ours);
    let control = control.filter(|c| c.set_nonblocking(true).is_ok()).map(BufReader::new);
    Ok(Live { child, control })
}

/// Waits until trial `index` exits or says it paused, passing a stop on to it.
fn wait(mut live: Live, index: usize, stop: &AtomicBool) -> JobOutcome {
    let mut forwarded = false;
    let mut heard = String::new();
    loop {
        match live.child.try_wait() {
            Ok(Some(status)) => return JobOutcome::Exited(Ok(status)),
            Ok(None) => {}
            Err(e) => return JobOutcome::Exited(Err(format!("lost trial {index}: {e}"))),
        }
        if let Some(control) = live.control.as_mut() {
            match control.read_line(&mut heard) {
                Ok(_) if heard.ends_with('\n') => {
                    if heard.trim() == PAUSED {
                        return JobOutcome::Paused(live);
                    }
                    heard.clear();
                }
                // Closed (the trial is exiting, and try_wait will see it) or nothing yet.
                Ok(_) | Err(_) => {}
            }
        }
        if crate::signals::interrupted_twice() {
            let _ = live.child.kill();
        } else if !forwarded && stop.load(Ordering::SeqCst) {
            // The trial stops at its next step boundary and records it, as any run does. Ctrl-C
            // is passed on as SIGTERM too: a terminal already sent the trial its own SIGINT,
            // and a second one would stop it at once, without its backup.
            forwarded = true;
            // SAFETY: kill(2) on our own child's pid, which try_wait has not reaped.
            unsafe {
                libc::kill(live.child.id() as libc::pid_t, libc::SIGTERM);
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
