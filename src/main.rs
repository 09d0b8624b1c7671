//! The `trainrun` binary: exit codes only; everything else is in the library.

fn main() -> std::process::ExitCode {
    // Like other Unix tools, die quietly when the reader of our output goes away
    // (`trainrun check spec.toml | head`) instead of panicking on a failed print.
    #[cfg(unix)]
    // SAFETY: called first thing, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // `trainrun bench` measures all-reduce between copies of this binary, told their part
    // through the environment.
    if let Some(code) = trainrun::collective::bench::peer_main_from_env() {
        return code;
    }
    trainrun::cli::main()
}
