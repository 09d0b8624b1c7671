//! SIGTERM and Ctrl-C (SIGINT) as requests to stop at the next step boundary instead of dying
//! mid-step. The handler only sets flags (the one async-signal-safe thing to do); the step
//! loop reads them, and every task learns of any task's request through the step's
//! all-reduce. Before training begins there is nothing to save, so a watchdog thread ends the
//! process at once ([`start_watchdog`]). Once training runs, the same watchdog
//! gives the step loop [`STEP_WAIT`] to reach a step boundary; a step or an evaluation that
//! takes longer (`run.threads` far beyond the cores, a huge batch) is abandoned: the process
//! records the stop ([`on_forced_stop`]) and ends, and the last backup is where a rerun
//! resumes. A second Ctrl-C stops a task at once
//! (`_exit(130)`, async-signal-safe); the launcher instead kills its tasks itself, so none is
//! left behind. A signal handler can reach nothing but process-global state, hence the
//! statics here.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// The first stop signal received (0: none).
static FIRST: AtomicI32 = AtomicI32::new(0);
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);
/// Set by the launcher: a second Ctrl-C is acted on by its loop (it kills the tasks).
static SUPERVISING: AtomicBool = AtomicBool::new(false);
/// Set once the training loop runs: from then on a stop is cooperative (a backup first).
static TRAINING: AtomicBool = AtomicBool::new(false);
/// Set once the step loop has reached a step boundary and is stopping there.
static STOPPING: AtomicBool = AtomicBool::new(false);
/// Set while a resident trial waits between rungs ([`training_paused`]).
static PAUSED: AtomicBool = AtomicBool::new(false);
/// Set with [`TRAINING`] when the spec has `backup_and_restore`: there is a backup to resume from.
static BACKS_UP: AtomicBool = AtomicBool::new(false);
/// What records a stop the watchdog forces (the chief's `run.json`), given the stop and why.
type Recorder = Box<dyn Fn(Stop, &str) + Send + Sync>;
static FORCED: OnceLock<Recorder> = OnceLock::new();
static INSTALL: Once = Once::new();

/// How often the watchdog looks at the flags: well inside the 1 s a stop may take.
const POLL: Duration = Duration::from_millis(10);

/// How long a stop waits for the step loop to reach a step boundary: what is left of the
/// promised 1 s is for recording the stop and exiting.
pub const STEP_WAIT: Duration = Duration::from_millis(500);

/// Which request stopped the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: a preemption (exit code 6; `run.json` says `preempted`).
    Terminated,
    /// Ctrl-C: SIGINT (exit code 130; `run.json` says `interrupted`).
    Interrupted,
}

impl Stop {
    /// The documented exit code (docs/reliability.md, "Exit codes").
    pub fn exit_code(self) -> u8 {
        match self {
            Stop::Terminated => 6,
            Stop::Interrupted => 130,
        }
    }

    /// The signal, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Stop::Terminated => "SIGTERM",
            Stop::Interrupted => "Ctrl-C (SIGINT)",
        }
    }
}

extern "C" fn on_signal(signal: libc::c_int) {
    let _ = FIRST.compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst);
    REQUESTED.store(true, Ordering::SeqCst);
    if signal == libc::SIGINT && INTERRUPTS.fetch_add(1, Ordering::SeqCst) >= 1 && !SUPERVISING.load(Ordering::SeqCst) {
        // SAFETY: _exit(2) is async-signal-safe; the user asked twice to stop now.
        unsafe { libc::_exit(130) }
    }
}

/// Installs the SIGTERM and SIGINT handlers (once) and returns the flag they set.
pub fn stop_requested() -> &'static AtomicBool {
    INSTALL.call_once(|| {
        for signal in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: `on_signal` only touches atomics and calls `_exit`, both
            // async-signal-safe; the sigaction struct is fully initialised before the call.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
    &REQUESTED
}

/// The request that stopped this process, if any.
pub fn received() -> Option<Stop> {
    match FIRST.load(Ordering::SeqCst) {
        libc::SIGTERM => Some(Stop::Terminated),
        libc::SIGINT => Some(Stop::Interrupted),
        _ => None,
    }
}

/// Whether Ctrl-C came twice: stop now, without waiting for a backup.
pub fn interrupted_twice() -> bool {
    INTERRUPTS.load(Ordering::SeqCst) >= 2
}

/// The launcher's mode: a second Ctrl-C is left to its loop, which kills the tasks.
pub fn supervise() -> &'static AtomicBool {
    SUPERVISING.store(true, Ordering::SeqCst);
    stop_requested()
}

/// Marks the training loop started: a stop from now on saves a backup first, when the spec
/// has `backup_and_restore` (`backs_up`).
pub fn training_started(backs_up: bool) {
    PAUSED.store(false, Ordering::SeqCst);
    BACKS_UP.store(backs_up, Ordering::SeqCst);
    TRAINING.store(true, Ordering::SeqCst);
}

/// Marks training paused between a sweep's rungs (a resident trial waiting for its next
/// order, [`crate::sweep::resident`]): its backup and records are written, so a stop ends the
/// process at once, as before training begins.
pub fn training_paused() {
    TRAINING.store(false, Ordering::SeqCst);
    STOPPING.store(false, Ordering::SeqCst);
    PAUSED.store(true, Ordering::SeqCst);
}

/// Marks training under way in a parameter-server job, whose stop lets the work in flight
/// finish: the chief stops scheduling, waits for the closures its workers run (and an
/// evaluation under way), saves, and then tells every worker and ps to leave. Abandoning the
/// chief mid-way would leave them to find it gone, so the watchdog abandons nothing.
pub fn cooperative_stop() {
    TRAINING.store(true, Ordering::SeqCst);
    STOPPING.store(true, Ordering::SeqCst);
}

/// The step loop reached a step boundary and stops there (a backup, then the exit): the
/// watchdog leaves it to finish.
pub fn stopping_at_step_boundary() {
    STOPPING.store(true, Ordering::SeqCst);
}

/// What to do, besides saying why, when the watchdog ends a run whose step did not reach its
/// boundary within [`STEP_WAIT`]: `record(stop, why)` marks the run stopped. Set once.
pub fn on_forced_stop(record: impl Fn(Stop, &str) + Send + Sync + 'static) {
    let _ = FORCED.set(Box::new(record));
}

/// What the watchdog does now: `None` to keep watching.
fn verdict(noticed: &mut Option<Instant>) -> Option<(Stop, String)> {
    let stop = received()?;
    if PAUSED.load(Ordering::SeqCst) {
        return Some((stop, format!("stopped by {} while paused at a rung; its backup is written", stop.name())));
    }
    if !TRAINING.load(Ordering::SeqCst) {
        return Some((stop, format!("stopped by {} before training began; nothing to save", stop.name())));
    }
    if STOPPING.load(Ordering::SeqCst) {
        return None;
    }
    let since = *noticed.get_or_insert_with(Instant::now);
    (since.elapsed() >= STEP_WAIT).then(|| {
        let next = if BACKS_UP.load(Ordering::SeqCst) {
            "run the same command again to resume from the last backup"
        } else {
            "without a backup_and_restore callback the next run starts over"
        };
        let why = format!(
            "stopped by {}: the step or evaluation under way takes longer than {} ms, so it was abandoned; {next}",
            stop.name(),
            STEP_WAIT.as_millis()
        );
        (stop, why)
    })
}

/// Until [`training_started`], a stop request ends the process within [`POLL`]: loading data,
/// waiting for peers at the rendezvous and building have nothing to save, and some of them
/// wait minutes (`cluster.startup_timeout_s`) without a step boundary to look at the flag.
/// Afterwards, a stop whose step loop has not reached a step boundary within [`STEP_WAIT`]
/// ends the process too, recorded by [`on_forced_stop`]'s function. `say` prints the one line
/// explaining why.
pub fn start_watchdog(say: impl Fn(&str) + Send + Clone + 'static) {
    stop_requested();
    let watchdog_says = say.clone();
    let spawned = std::thread::Builder::new().name("stop-watchdog".into()).spawn(move || {
        let say = watchdog_says;
        let mut noticed = None;
        loop {
            if let Some((stop, why)) = verdict(&mut noticed) {
                say(&why);
                if let Some(record) = FORCED.get().filter(|_| TRAINING.load(Ordering::SeqCst)) {
                    record(stop, &why);
                }
                std::process::exit(i32::from(stop.exit_code()));
            }
            std::thread::sleep(POLL);
        }
    });
    // Without the thread a stop still ends the run at the first step boundary.
    if let Err(e) = spawned {
        say(&format!("warning: cannot start the stop watchdog ({e}); a stop waits for training to begin"));
    }
}
