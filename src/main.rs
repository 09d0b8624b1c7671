//! The `trainrun` binary: exit codes only; everything else is in the library.

fn main() -> std::process::ExitCode {
    trainrun::cli::main()
}
