//! The `trainrun` binary: exit codes only; everything else is in the library.

fn main() -> std::process::ExitCode {
    // A panic on any thread is reported as a bug and ends the process with exit code 70; a
    // print to a closed pipe (`trainrun check spec.toml | head`) ends it quietly by SIGPIPE.
    // SIGPIPE itself stays ignored (Rust's default), so a socket whose peer closed it is an
    // error to report (`crash` says why).
    trainrun::crash::install();
    // `trainrun bench` measures all-reduce between copies of this binary, told their part
    // through the environment.
    if let Some(code) = trainrun::collective::bench::peer_main_from_env() {
        return code;
    }
    trainrun::cli::main()
}
