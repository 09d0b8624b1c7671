//! SIGTERM as a request to stop at the next step boundary (preemption) instead of dying
//! mid-step. The handler only sets a flag, the one async-signal-safe thing to do; the step
//! loop reads it, and every task learns of any task's request through the step's all-reduce.
//! A signal handler can reach nothing but process-global state, hence the one static here.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

extern "C" fn on_term(_signal: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Installs the SIGTERM handler (once) and returns the flag it sets.
pub fn stop_requested() -> &'static AtomicBool {
    INSTALL.call_once(|| {
        // SAFETY: `on_term` only stores to an atomic, which is async-signal-safe; the
        // sigaction struct is fully initialised before the call.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_term as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
        }
    });
    &REQUESTED
}
