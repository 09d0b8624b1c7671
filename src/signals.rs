//! SIGTERM and Ctrl-C (SIGINT) as requests to stop at the next step boundary instead of dying
//! mid-step. The handler only sets flags (the one async-signal-safe thing to do); the step
//! loop reads them, and every task learns of any task's request through the step's
//! all-reduce. Before training begins there is nothing to save, so a watchdog thread ends the
//! process at once ([`exit_promptly_until_training`]). A second Ctrl-C stops a task at once
//! (`_exit(130)`, async-signal-safe); the launcher instead kills its tasks itself, so none is
//! left behind. A signal handler can reach nothing but process-global state, hence the
//! statics here.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::time::Duration;

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// The first stop signal received (0: none).
static FIRST: AtomicI32 = AtomicI32::new(0);
static INTERRUPTS: AtomicU32 = AtomicU32::new(0);
/// Set by the launcher: a second Ctrl-C is acted on by its loop (it kills the tasks).
static SUPERVISING: AtomicBool = AtomicBool::new(false);
/// Set once the training loop runs: from then on a stop is cooperative (a backup first).
static TRAINING: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// How often the watchdog looks at the flags: well inside the 1 s a stop may take.
const POLL: Duration = Duration::from_millis(10);

/// Which request stopped the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM: a preemption (exit code 6; `run.json` says `preempted`).
    Terminated,
    /// Ctrl-C: SIGINT (exit code 130; `run.json` says `interrupted`).
    Interrupted,
}

impl Stop {
    /// The documented exit code (README "Exit codes").
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

/// Marks the training loop started: a stop from now on saves a backup first.
pub fn training_started() {
    TRAINING.store(true, Ordering::SeqCst);
}

/// Until [`training_started`], a stop request ends the process within [`POLL`]: loading data,
/// waiting for peers at the rendezvous and building have nothing to save, and some of them
/// wait minutes (`cluster.startup_timeout_s`) without a step boundary to look at the flag.
/// `say` prints the one line explaining why.
pub fn exit_promptly_until_training(say: impl Fn(&str) + Send + Clone + 'static) {
    stop_requested();
    let watchdog_says = say.clone();
    let spawned = std::thread::Builder::new().name("stop-watchdog".into()).spawn(move || {
        let say = watchdog_says;
        while !TRAINING.load(Ordering::SeqCst) {
            if let Some(stop) = received() {
                say(&format!("stopped by {} before training began; nothing to save", stop.name()));
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
