//! What sweeps write, read back for the sweep tests.

use std::path::Path;

/// `results.csv` as rows of cells: all of it, since it holds nothing that differs between
/// identical runs (the timings are in `timings.csv`).
pub fn results(dir: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("results.csv")).unwrap_or_else(|e| panic!("results.csv: {e}"));
    let rows: Vec<Vec<String>> = text.lines().map(|l| l.split(',').map(String::from).collect()).collect();
    assert!(
        !rows[0].iter().any(|h| h == "wall_s" || h.starts_with("steady_")),
        "timings in results.csv: {:?}",
        rows[0]
    );
    rows
}

/// The bytes of `results.csv` in `dir`.
pub fn results_bytes(dir: &Path) -> Vec<u8> {
    std::fs::read(dir.join("results.csv")).unwrap_or_else(|e| panic!("{}: {e}", dir.join("results.csv").display()))
}

/// `trainrun sweep` arguments of two short trials of `specs/mnist_single.toml` into `out`, then
/// `extra`: a GPU device plans, but a CPU build cannot run it, so trial 1 exits 3 at run time;
/// trial 2 runs on the CPU.
pub fn gpu_then_cpu(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["sweep", "specs/mnist_single.toml", "--set"].map(String::from).to_vec();
    args.push(format!("run.out_dir={}", out.display()));
    for set in [
        "train.epochs=1",
        "train.steps_per_epoch=10",
        "strategy.kind=one_device",
        "sweep.grid.\"strategy.device\"=[\"gpu:0\", \"cpu:0\"]",
        "sweep.metric=test_accuracy",
    ] {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}
