//! Panics become bug reports. A panic anywhere (any thread: the step loop, the checkpoint
//! writer, a tokio task) prints "this is a bug in trainrun", the version, where it happened and
//! a one-line way to reproduce it, then ends the process with exit code 70 (BSD's
//! `EX_SOFTWARE`): never a raw backtrace, never a process left hanging by a dead thread.
//! `RUST_BACKTRACE=1` adds Rust's own report with the backtrace.
//!
//! Output that goes away (`trainrun check spec.toml | head`) is not a bug: Rust ignores
//! SIGPIPE, so a print to a closed pipe fails, and the hook then ends the process by SIGPIPE
//! quietly, as a Unix tool does. Sockets keep SIGPIPE ignored, so a peer that closes a
//! connection is an error to report, not a silent death.

use std::io::Write;
use std::panic::PanicHookInfo;
use std::sync::Mutex;

/// The exit code of a panic.
pub const BUG: i32 = crate::exit::Exit::Bug as i32;

/// What to record before the process ends on a panic (the run folder's `run.json`), given the
/// report's text.
type PanicRecorder = Box<dyn Fn(&str) + Send>;

static RECORDERS: Mutex<Vec<PanicRecorder>> = Mutex::new(Vec::new());

/// Has `record` called with the bug report when a panic ends the process, so that what the
/// process left behind says how it ended.
pub fn on_panic(record: impl Fn(&str) + Send + 'static) {
    if let Ok(mut recorders) = RECORDERS.lock() {
        recorders.push(Box::new(record));
    }
}

/// Calls the recorders; a panic while one was being added (the lock held, or poisoned) skips
/// them rather than hang the process that must end.
fn record(report: &str) {
    if let Ok(recorders) = RECORDERS.try_lock() {
        recorders.iter().for_each(|r| r(report));
    }
}

/// Installs the hook; call first thing in `main`.
pub fn install() {
    let rust_report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = payload(info);
        if is_closed_output(&message) {
            closed_output();
        }
        if std::env::var_os("RUST_BACKTRACE").is_some_and(|v| v != "0") {
            rust_report(info);
        }
        let args: Vec<String> = std::env::args().collect();
        let thread = std::thread::current();
        let report = report(&message, info, thread.name(), &args);
        let _ = writeln!(std::io::stderr(), "{report}");
        record(report.lines().next().unwrap_or(&message).trim_start_matches("error: "));
        std::process::exit(BUG);
    }));
}

/// The panic's message.
fn payload(info: &PanicHookInfo<'_>) -> String {
    let p = info.payload();
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_string())
}

/// Whether the panic is `print!` failing on a pipe whose reader went away.
fn is_closed_output(message: &str) -> bool {
    (message.starts_with("failed printing to stdout") || message.starts_with("failed printing to stderr"))
        && message.contains("Broken pipe")
}

/// Dies of SIGPIPE, as the process would have with the default disposition.
fn closed_output() -> ! {
    // SAFETY: resetting a signal's disposition and raising it in this process; nothing else
    // runs in between that could observe the change.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::raise(libc::SIGPIPE);
    }
    std::process::exit(128 + libc::SIGPIPE)
}

/// The words of the report.
fn report(message: &str, info: &PanicHookInfo<'_>, thread: Option<&str>, args: &[String]) -> String {
    let place = info.location().map_or_else(String::new, |l| format!(" at {}:{}", l.file(), l.line()));
    let thread = thread.map_or_else(String::new, |t| format!(" (thread `{t}`)"));
    let command: Vec<String> = args.iter().map(|a| shell_word(a)).collect();
    format!(
        "error: this is a bug in trainrun {}: it panicked{place}{thread}: {message}\n  \
         reproduce: RUST_BACKTRACE=1 {}\n  \
         please report it with that command line, the spec and this message",
        env!("CARGO_PKG_VERSION"),
        command.join(" ")
    )
}

/// `a` quoted for a POSIX shell when it needs to be.
fn shell_word(a: &str) -> String {
    let plain = !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@+%".contains(&b));
    if plain { a.to_string() } else { format!("'{}'", a.replace('\'', r"'\''")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_for_the_shell_and_for_closed_pipes() {
        assert_eq!(shell_word("specs/a.toml"), "specs/a.toml");
        assert_eq!(shell_word("strategy={ kind = \"x\" }"), "'strategy={ kind = \"x\" }'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        assert!(is_closed_output("failed printing to stdout: Broken pipe (os error 32)"));
        assert!(!is_closed_output("index out of bounds"));
    }
}
