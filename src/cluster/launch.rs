//! The local launcher: when every task of the cluster is on this machine and no task is named,
//! `trainrun SPEC` starts one process per task (the same binary, told its task through
//! TF_CONFIG), prefixes each task's log lines with its role, shows the chief's progress as the
//! job's one display, and propagates the outcome. If any task fails, the others are stopped
//! within the timeout and, while `max_restarts` allows, every task is started again after a
//! back-off (the job resumes from its last backup); otherwise the launcher exits non-zero
//! naming the failed task and showing its last log lines. SIGTERM to the launcher is passed
//! to every task: they stop together after a backup (exit code 6), and so does the launcher.

mod failure;
mod handover;

pub use handover::{CONTROL_FD, inherited_listener};

use super::rejoin::Rejoins;
pub use super::task_output::blame_line;
use super::task_output::{Line, arriving, forward};
use super::{Address, Blame, Cluster, Role, TaskId, new_job_token};
use crate::progress::{Event, Progress, ProgressMode};
use std::collections::{BTreeMap, VecDeque};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A task's exit code when it stopped on SIGTERM after a backup (`cli::Exit::Preempted`).
const PREEMPTED: i32 = 6;

/// A task's exit code when it stopped on Ctrl-C (`cli::Exit::Interrupted`): a terminal's
/// Ctrl-C reaches every task of the foreground process group, not only the launcher.
const INTERRUPTED: i32 = 130;

/// Exit codes a restart cannot cure: a bad spec, an unsupported plan, missing data, a
/// preemption, a full disk, a bug (`cli::Exit` 2, 3, 4, 6, 7 and 70).
const NOT_RESTARTED: [u8; 6] = [2, 3, 4, 6, 7, 70];

/// The longest wait between restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The exit code of a task that found the job broken (`cli::Exit::Cluster`): a peer died or
/// stopped answering.
const CLUSTER: i32 = 5;

/// How long the other tasks get once a task has found the job broken: whoever still runs then
/// is the task that hung (it answers no SIGTERM), so the launcher returns within the job's
/// `timeout_s` + 1 s and names it.
const HANG_GRACE: Duration = Duration::from_millis(500);

/// How long the launcher waits, after a task found the job broken ([`CLUSTER`]), for the task
/// it lost to be reaped, so that the error names the cause (see [`ended_first`]).
const CAUSE_WAIT: Duration = Duration::from_millis(200);

/// Log lines kept per task for the failure report.
const TAIL: usize = 20;

/// What to launch.
pub struct Launch {
    /// The binary to run for each task.
    pub exe: PathBuf,
    /// Arguments every task gets (the spec and its `--set` overrides).
    pub args: Vec<String>,
    /// The cluster; `Local` addresses get free ports on 127.0.0.1.
    pub cluster: Cluster,
    /// How long a task that lost a peer may take to notice and exit before it is killed.
    pub grace: Duration,
    /// How the launcher shows progress.
    pub progress: ProgressMode,
    /// Epochs, for the progress display.
    pub epochs: u64,
    /// How often a failed job is started again.
    pub max_restarts: u32,
    /// The wait before the first restart; it doubles for each further one.
    pub restart_backoff: Duration,
    /// Set on SIGTERM: pass it on to every task.
    pub stop: &'static AtomicBool,
    /// Roles whose death the job survives while another task of the role runs (workers
    /// under `parameter_server`: the coordinator runs their step again elsewhere).
    pub expendable: Vec<Role>,
    /// The spec has `backup_and_restore`: a stopped job resumes from the chief's backup.
    pub backs_up: bool,
}

/// Why the job failed.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// A task could not be started.
    #[error("cannot start {task}: {source}")]
    Spawn {
        /// The task.
        task: TaskId,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No free port or no job token.
    #[error("cannot prepare the local cluster: {0}")]
    Setup(String),
    /// A task failed; the others were stopped.
    #[error("{task} failed ({status}); the other tasks were stopped. Its last lines:\n{tail}")]
    TaskFailed {
        /// The first task to fail.
        task: TaskId,
        /// How it ended.
        status: String,
        /// Its last log lines.
        tail: String,
        /// The exit code the launcher returns.
        code: u8,
    },
    /// The tasks stopped on SIGTERM, after the same step.
    #[error("every task stopped on SIGTERM{}", resumes(*.0))]
    Preempted(Saved),
    /// The tasks stopped on Ctrl-C: after the same step, or at once on a second Ctrl-C.
    #[error("interrupted: every task stopped on Ctrl-C{}", resumes(*.0))]
    Interrupted(Saved),
}

/// What a job stopped on request left to resume from, as far as the launcher knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// No task had begun training (loading data, the rendezvous): nothing to save.
    Nothing,
    /// Training ran, and the spec has no `backup_and_restore`: the next run starts over.
    NoBackups,
    /// Training ran and the chief backs up: the next run resumes from the last backup.
    Backup,
}

/// The end of a stop's message: what running the same command again does.
fn resumes(saved: Saved) -> &'static str {
    match saved {
        Saved::Nothing => " before training began; nothing was saved, and the same command starts the run",
        Saved::NoBackups => {
            "; without a backup_and_restore callback nothing was saved to resume from, and the next run starts over"
        }
        Saved::Backup => "; run the same command again to resume from the chief's last backup",
    }
}

/// The launcher's own stop: SIGTERM is a preemption, Ctrl-C an interruption. `began`: some
/// start of the job reached its first step.
fn stopped(launch: &Launch, began: bool) -> LaunchError {
    let saved = match (began, launch.backs_up) {
        (false, _) => Saved::Nothing,
        (true, false) => Saved::NoBackups,
        (true, true) => Saved::Backup,
    };
    match crate::signals::received() {
        Some(crate::signals::Stop::Interrupted) => LaunchError::Interrupted(saved),
        Some(crate::signals::Stop::Terminated) | None => LaunchError::Preempted(saved),
    }
}

/// How one start of every task ended.
enum Outcome {
    Done,
    /// Stopped on request; `began`: the chief reported a step.
    Preempted {
        began: bool,
    },
    Failed {
        task: TaskId,
        status: String,
        tail: String,
        code: u8,
        at: Instant,
    },
}

/// A free port on 127.0.0.1 and the listener that holds it: while the caller keeps it, the
/// next call cannot be given the same port (released ports are handed out again, and two
/// tasks were once given one port).
fn free_port() -> Result<(TcpListener, u16), LaunchError> {
    // The launcher keeps the listener and hands it down to the task ([`CONTROL_FD`]), so no
    // other process can take the port between the choice and the task's start (or a
    // restarted task's).
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr().map(|a| (l, a.port())))
        .map_err(|e| LaunchError::Setup(format!("no free port on 127.0.0.1: {e}")))
}

/// TF_CONFIG's JSON for `task` of `addresses`.
fn tf_config(addresses: &BTreeMap<TaskId, String>, task: TaskId) -> String {
    let mut cluster: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (t, a) in addresses {
        cluster.entry(t.role.as_str()).or_default().push(a);
    }
    serde_json::json!({ "cluster": cluster, "task": { "type": task.role.as_str(), "index": task.index } }).to_string()
}

fn describe(status: ExitStatus) -> (String, u8) {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => (format!("exit code {c}"), u8::try_from(c).unwrap_or(1)),
        (None, Some(s)) => (format!("killed by signal {s}"), u8::try_from(128 + s).unwrap_or(1)),
        (None, None) => ("ended abnormally".into(), 1),
    }
}

/// Stops every task: SIGTERM, then SIGKILL to those still running after `grace`. Returns the
/// tasks that had to be killed.
fn terminate(children: &mut BTreeMap<TaskId, Child>, grace: Duration) -> Vec<TaskId> {
    for child in children.values() {
        // SAFETY: kill(2) on our own child's pid; a stale pid at worst gets ESRCH.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && children.values_mut().any(|c| matches!(c.try_wait(), Ok(None))) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut killed = Vec::new();
    for (task, child) in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
            killed.push(*task);
        }
        let _ = child.wait();
    }
    killed
}

/// The wait before restart number `n` (1-based).
fn backoff(base: Duration, n: u32) -> Duration {
    base.saturating_mul(1u32 << (n.saturating_sub(1)).min(16)).min(MAX_BACKOFF)
}

/// Starts every task and supervises them to the end, restarting them all after a failure
/// while `max_restarts` allows.
pub fn run(launch: Launch) -> Result<(), LaunchError> {
    let mut restarts = 0;
    let mut failed: Option<(Instant, TaskId)> = None;
    loop {
        match incarnation(&launch, failed.take())? {
            Outcome::Done => return Ok(()),
            // An earlier start that failed and was restarted had trained.
            Outcome::Preempted { began } => return Err(stopped(&launch, began || restarts > 0)),
            Outcome::Failed { task, status, tail, code, at } => {
                let stopping = launch.stop.load(Ordering::SeqCst);
                if crate::signals::interrupted_twice() {
                    return Err(stopped(&launch, true));
                }
                if restarts >= launch.max_restarts || NOT_RESTARTED.contains(&code) || stopping {
                    return Err(LaunchError::TaskFailed { task, status, tail, code });
                }
                restarts += 1;
                let wait = backoff(launch.restart_backoff, restarts);
                eprintln!(
                    "[launcher] {task} failed ({status}); restarting every task ({restarts} of {}) in {:.1} s, resuming from the last backup",
                    launch.max_restarts,
                    wait.as_secs_f64()
                );
                let until = Instant::now() + wait;
                while Instant::now() < until {
                    // Asked to stop while waiting: the last backup is where the next launch
                    // resumes, as after any preemption.
                    if launch.stop.load(Ordering::SeqCst) {
                        return Err(stopped(&launch, true));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                failed = Some((at, task));
            }
        }
    }
}

/// What every process of one start of the job is given: the addresses and the job token,
/// and each local task its control-plane listener.
struct Started {
    addresses: BTreeMap<TaskId, String>,
    token: super::JobToken,
    listeners: BTreeMap<TaskId, TcpListener>,
}

/// Starts every task with its TF_CONFIG and a fresh job token, forwarding their output to
/// `tx`; on a failed start, stops those already started.
fn spawn_all(launch: &Launch, tx: &mpsc::Sender<Line>) -> Result<(Started, BTreeMap<TaskId, Child>), LaunchError> {
    let token = new_job_token().map_err(|e| LaunchError::Setup(e.to_string()))?;
    let (mut addresses, mut listeners) = (BTreeMap::new(), BTreeMap::new());
    for (task, address) in &launch.cluster.tasks {
        let a = match address {
            Address::Local => {
                let (listener, port) = free_port()?;
                listeners.insert(*task, listener);
                format!("127.0.0.1:{port}")
            }
            Address::At(a) => a.clone(),
        };
        addresses.insert(*task, a);
    }
    let started = Started { addresses, token, listeners };
    let mut children = BTreeMap::new();
    for task in started.addresses.keys().copied() {
        match spawn(launch, &started, task, tx) {
            Ok(child) => children.insert(task, child),
            Err(e) => {
                terminate(&mut children, launch.grace);
                return Err(e);
            }
        };
    }
    Ok((started, children))
}

/// Starts the process of `task` (again, for a restarted worker: same address, same token).
fn spawn(launch: &Launch, started: &Started, task: TaskId, tx: &mpsc::Sender<Line>) -> Result<Child, LaunchError> {
    let is_chief = Some(task) == launch.cluster.chief();
    let mut cmd = Command::new(&launch.exe);
    cmd.args(&launch.args)
        .env("TF_CONFIG", tf_config(&started.addresses, task))
        .env("TRAINRUN_JOB_TOKEN", started.token.as_str())
        .env("TRAINRUN_PROGRESS", if is_chief { "events" } else { "quiet" })
        .env_remove("TRAINRUN_TASK")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let control = started.listeners.get(&task).map(std::os::fd::AsRawFd::as_raw_fd);
    if let Some(fd) = control {
        cmd.env(CONTROL_FD, fd.to_string());
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl and fcntl in the child between fork and exec touch no shared state. A
        // task whose launcher dies gets SIGTERM instead of training on alone; its own
        // control-plane listener (and no other) stays open across exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                if let Some(fd) = control {
                    libc::fcntl(fd, libc::F_SETFD, 0);
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn { task, source })?;
    if let Some(out) = child.stdout.take() {
        forward(task, out, is_chief, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        forward(task, err, false, tx.clone());
    }
    Ok(child)
}

/// One start of every task, supervised to the end.
fn incarnation(launch: &Launch, after_failure: Option<(Instant, TaskId)>) -> Result<Outcome, LaunchError> {
    let (tx, rx) = mpsc::channel();
    let (started, mut children) = spawn_all(launch, &tx)?;
    let mut rejoins = Rejoins::new(children.keys().copied(), Instant::now());

    let mut progress = Progress::new(launch.progress, launch.epochs, "");
    let mut tails: BTreeMap<TaskId, VecDeque<String>> = BTreeMap::new();
    let mut blames: BTreeMap<TaskId, Blame> = BTreeMap::new();
    let mut failure: Option<(TaskId, ExitStatus)> = None;
    let mut waiting = after_failure;
    let mut forwarded: Option<Instant> = None;
    let mut preempted = false;
    let mut began = false;
    // Tasks still running when the stop's grace period ran out, and so killed.
    let mut unanswered: Vec<TaskId> = Vec::new();
    loop {
        for line in arriving(&rx) {
            match line {
                Line::Event(e) => {
                    began |= training(&e);
                    if let (Event::Step { .. }, Some((at, task))) = (&e, waiting) {
                        waiting = None;
                        eprintln!("[launcher] training again {:.2} s after {task} failed", at.elapsed().as_secs_f64());
                    }
                    progress.show(e)
                }
                Line::Log(task, text) => {
                    if launch.progress != ProgressMode::Quiet || failure.is_some() {
                        eprintln!("[{task}] {text}");
                    }
                    keep(&mut tails, task, text);
                }
                Line::Blame(task, blame) => {
                    blames.insert(task, blame);
                }
            }
        }
        if forwarded.is_none() && launch.stop.load(Ordering::SeqCst) {
            // Preemption of the whole job: every task stops after the same step.
            forwarded = Some(Instant::now());
            signal(&children, libc::SIGTERM);
        }
        let mut running = Vec::new();
        let mut failed = Vec::new();
        let mut chief_runs = false;
        for (task, child) in children.iter_mut() {
            match child.try_wait() {
                Ok(None) => {
                    running.push(*task);
                    chief_runs |= Some(*task) == launch.cluster.chief();
                }
                Ok(Some(status)) if matches!(status.code(), Some(PREEMPTED | INTERRUPTED)) => preempted = true,
                // A task the stop reached before it had set up its own handlers (just
                // started, still decoding its data) dies of the signal itself: it had nothing
                // to save, so it stopped as asked and did not fail.
                Ok(Some(status)) if stopped_by(launch, status) => preempted = true,
                Ok(Some(status)) if !status.success() => failed.push((*task, status)),
                _ => {}
            }
        }
        let rejoin = chief_runs && forwarded.is_none();
        let lost = if chief_runs { survivable(launch, &children, &failed, rejoin) } else { Vec::new() };
        let_go(launch, &mut children, &lost, rejoin.then_some(&mut rejoins));
        failed.retain(|f| !lost.contains(f));
        for task in rejoins.ready(Instant::now()).into_iter().filter(|_| rejoin) {
            match spawn(launch, &started, task, &tx) {
                Ok(child) => {
                    children.insert(task, child);
                }
                Err(e) => eprintln!("[launcher] {e}; the job goes on without it"),
            }
        }
        // Stopping tasks get the grace period to reach a step boundary and save; a second
        // Ctrl-C takes none.
        let now = crate::signals::interrupted_twice();
        if (now || forwarded.is_some_and(|f| f.elapsed() > launch.grace)) && !running.is_empty() {
            if !now && unanswered.is_empty() {
                unanswered.clone_from(&running);
            }
            signal(&children, libc::SIGKILL);
        }
        // When several end in one poll, a task killed by a signal is the cause; the others
        // are exiting because they lost it.
        use std::os::unix::process::ExitStatusExt;
        failed.sort_by_key(|(_, s)| s.signal().is_none());
        if failure.is_none() {
            failure = failed.into_iter().next();
        }
        if failure.is_some() || (running.is_empty() && !(rejoin && rejoins.pending())) {
            break;
        }
    }
    drop(tx);
    if let Some((task, status)) = failure {
        let heard = failure::Heard { tails: &mut tails, blames: &mut blames, unanswered: &unanswered };
        return Ok(failure::failed(launch, &mut children, &rx, heard, task, status));
    }
    // Every task exited; drain remaining output in order.
    while let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
        match line {
            Line::Event(e) => {
                began |= training(&e);
                progress.show(e)
            }
            Line::Log(task, text) if launch.progress != ProgressMode::Quiet => eprintln!("[{task}] {text}"),
            Line::Log(..) | Line::Blame(..) => {}
        }
    }
    Ok(if preempted { Outcome::Preempted { began } } else { Outcome::Done })
}

/// Goes on without the `lost` tasks, saying so; with `rejoins`, one that a restart may cure
/// is started again after its back-off to rejoin the job.
fn let_go(
    launch: &Launch,
    children: &mut BTreeMap<TaskId, Child>,
    lost: &[(TaskId, ExitStatus)],
    mut rejoins: Option<&mut Rejoins>,
) {
    for (task, status) in lost {
        children.remove(task);
        let (how, _) = describe(*status);
        match rejoins.as_deref_mut().filter(|_| restartable(*status)) {
            Some(rejoins) => {
                let wait = rejoins.died(*task, Instant::now(), launch.restart_backoff);
                eprintln!(
                    "[launcher] {task} ended ({how}); restarting it in {:.1} s to rejoin the job",
                    wait.as_secs_f64()
                );
            }
            None => eprintln!("[launcher] {task} ended ({how}); the job goes on without it"),
        }
    }
}

/// The failed tasks the job survives, while the chief runs: those of an expendable role that
/// will be restarted (`rejoin`: no stop was asked) or while another task of that role still
/// runs.
fn survivable(
    launch: &Launch,
    children: &BTreeMap<TaskId, Child>,
    failed: &[(TaskId, ExitStatus)],
    rejoin: bool,
) -> Vec<(TaskId, ExitStatus)> {
    let alive = |role: Role| children.keys().filter(|t| t.role == role && !failed.iter().any(|(f, _)| f == *t)).count();
    let survives = |(t, s): &(TaskId, ExitStatus)| (rejoin && restartable(*s)) || alive(t.role) > 0;
    failed.iter().filter(|f| launch.expendable.contains(&f.0.role) && survives(f)).copied().collect()
}

/// Whether a task that ended so may be started again: killed, or exiting with a code a
/// restart may cure.
fn restartable(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let incurable = status.code().and_then(|c| u8::try_from(c).ok()).is_some_and(|c| NOT_RESTARTED.contains(&c));
    status.signal().is_some() || !incurable
}

/// Keeps `text` among `task`'s last [`TAIL`] lines, shown if the job fails in it.
fn keep(tails: &mut BTreeMap<TaskId, VecDeque<String>>, task: TaskId, text: String) {
    let tail = tails.entry(task).or_default();
    tail.push_back(text);
    if tail.len() > TAIL {
        tail.pop_front();
    }
}

/// Whether a task that ended with `status` was killed by the stop the launcher itself was
/// asked for: SIGTERM forwarded by the launcher, or SIGTERM / SIGINT sent to the whole process
/// group (a terminal's Ctrl-C, a scheduler's preemption). Once a task has its handlers, these
/// signals end it with [`PREEMPTED`] or [`INTERRUPTED`] instead.
fn stopped_by(launch: &Launch, status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    launch.stop.load(Ordering::SeqCst) && matches!(status.signal(), Some(libc::SIGTERM | libc::SIGINT))
}

/// Whether the chief's `event` shows training under way: from its first epoch on, a stop is
/// taken at a step boundary, after a backup when the spec backs up.
fn training(event: &Event) -> bool {
    matches!(event, Event::StartEpoch { .. } | Event::Step { .. } | Event::EndEpoch { .. })
}

fn signal(children: &BTreeMap<TaskId, Child>, sig: libc::c_int) {
    for child in children.values() {
        // SAFETY: kill(2) on our own child's pid; a stale pid at worst gets ESRCH.
        unsafe {
            libc::kill(child.id() as libc::pid_t, sig);
        }
    }
}
