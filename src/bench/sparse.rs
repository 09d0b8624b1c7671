//! `trainrun bench --only sparse`: where the dense layer's walk over a ReLU's nonzeros stops
//! paying against gemm on this CPU, beside the thresholds its CPU family's row uses
//! ([`crate::engine::tuning`]); a new family's row is read off this table.

use crate::engine::sparse::timing::{crossover, forward_time, ratios};
use crate::engine::tuning::Tuning;

/// Densities measured, in increasing order.
const DENSITIES: [f64; 8] = [0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40];

/// Forward blocks tried (kernel rows a block).
const BLOCKS: [usize; 5] = [128, 256, 512, 1024, 2048];

/// Prints the table; `reps` timed runs per figure (the fastest counts).
pub fn run(reps: usize) -> Result<(), String> {
    let row = Tuning::here();
    println!(
        "\n== sparse walk over gemm, 1 thread, the tutorial's dense layer (64 × 21,632 · 21,632 × 128), zeros spread evenly; fastest of {reps}"
    );
    println!("   row in use: {}", row.describe());
    println!("| nonzero | forward | kernel gradient | dx | backward (both) |");
    println!("|---|---|---|---|---|");
    let rows: Vec<_> = DENSITIES.iter().map(|&d| ratios(d, reps)).collect();
    for r in &rows {
        println!(
            "| {:.0} % | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.density * 100.0,
            r.forward,
            r.kernel_gradient,
            r.dx,
            r.backward
        );
    }
    let at = |pick: fn(&crate::engine::sparse::timing::Ratios) -> f64| {
        let points: Vec<(f64, f64)> = rows.iter().map(|r| (r.density, pick(r))).collect();
        crossover(&points).map_or_else(|| "above 40 %".into(), |d| format!("{:.0} %", d * 100.0))
    };
    println!(
        "   the walk stops paying: forward at {} (row: ≤ {:.0} %), backward at {} (row: ≤ {:.0} %)",
        at(|r| r.forward),
        row.sparse_forward.fraction() * 100.0,
        at(|r| r.backward),
        row.sparse_backward.fraction() * 100.0
    );
    let times: Vec<String> =
        BLOCKS.iter().map(|&b| format!("{b} rows {:.2} ms", forward_time(0.10, b, reps).as_secs_f64() * 1e3)).collect();
    println!("   forward walk at 10 % by block (row: {} rows): {}", row.forward_block, times.join(", "));
    Ok(())
}
