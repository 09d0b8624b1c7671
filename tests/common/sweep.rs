//! What sweeps write, read back for the sweep tests.

use std::path::Path;

/// `results.csv` as rows of cells, without the timing columns (the only ones that may differ
/// between identical runs).
pub fn results(dir: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("results.csv")).unwrap_or_else(|e| panic!("results.csv: {e}"));
    let rows: Vec<Vec<String>> = text.lines().map(|l| l.split(',').map(String::from).collect()).collect();
    let timing: Vec<usize> = rows[0]
        .iter()
        .enumerate()
        .filter(|(_, h)| *h == "wall_s" || *h == "steady_examples_per_s")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(timing.len(), 2, "{:?}", rows[0]);
    rows.into_iter()
        .map(|r| r.into_iter().enumerate().filter(|(i, _)| !timing.contains(i)).map(|(_, c)| c).collect())
        .collect()
}
