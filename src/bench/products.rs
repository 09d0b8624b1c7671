//! `trainrun bench --only products`: GFLOP/s of each matrix-product path (`engine::bf16`) at
//! the GPT's product shapes, the checked-in Shakespeare size and nanoGPT's (6 layers,
//! `n_embd` 384, block 256, batch 12), forward and backward, on 2 threads. Prints the CPU
//! model and the path `mixed_bfloat16` takes here beside the figures; paths alternate shape
//! by shape so both see the same machine.

use super::median;
use crate::engine::bf16::{Bf16Support, ProductPath, gemm, paths_here};
use crate::engine::strided::{MatMut, MatRef};

/// One product of the GPT: `name`, `m × k · k × n`, and whether the left operand is read
/// transposed (the weight gradients, `xᵀ · dy`).
struct ProductShape {
    name: &'static str,
    m: usize,
    k: usize,
    n: usize,
    a_transposed: bool,
}

/// The products of a GPT step at `rows` positions (batch × block), width `d`, `vocab`
/// tokens, one head's `t × hd` attention.
fn shapes(rows: usize, d: usize, t: usize, hd: usize) -> Vec<ProductShape> {
    let s = |name, m, k, n, a_transposed| ProductShape { name, m, k, n, a_transposed };
    vec![
        s("qkv forward", rows, d, 3 * d, false),
        s("attention out", rows, d, d, false),
        s("mlp fc", rows, d, 4 * d, false),
        s("mlp proj", rows, 4 * d, d, false),
        s("lm head (65)", rows, d, 65, false),
        s("mlp fc dW", d, rows, 4 * d, true),
        s("scores q·kᵀ", t, hd, t, false),
        s("probs·v", t, t, hd, false),
    ]
}

/// The CPU's model name, from `/proc/cpuinfo`.
pub(super) fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// AMX's bf16 peak on `cores` cores at the clock `/proc/cpuinfo` reports, where this
/// process runs AMX.
fn amx_peak_gflops(cores: usize) -> Option<f64> {
    if !paths_here().contains(&ProductPath::Amx) {
        return None;
    }
    let mhz: f64 = std::fs::read_to_string("/proc/cpuinfo")
        .ok()?
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    Some(1024.0 * cores as f64 * mhz / 1e3)
}

/// Prints the table; `reps` timed products per figure.
pub fn run(reps: usize) -> Result<(), String> {
    let cpu = Bf16Support::detect();
    let mixed = cpu.mixed_path().map_or("runs in fp32", ProductPath::name);
    let paths = paths_here();
    println!(
        "\n== matrix products, GFLOP/s on 2 threads (median of {reps}); CPU: {} (bf16: {}; mixed_bfloat16 takes {mixed})",
        cpu_model(),
        cpu.name()
    );
    if let Some(peak) = amx_peak_gflops(2) {
        println!(
            "   AMX peak on 2 cores at the clock /proc/cpuinfo reports: {peak:.0} GFLOP/s (1,024 bf16 FLOP a cycle a core)"
        );
    }
    print!("{:>10} {:>16} {:>16}", "GPT", "product", "m×k·k×n");
    paths.iter().for_each(|p| print!(" {:>22}", p.name()));
    println!();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().map_err(|e| e.to_string())?;
    for (size, rows, d, t, hd) in [("shakespeare", 12 * 64, 128, 64, 32), ("nanogpt", 12 * 256, 384, 256, 64)] {
        for s in shapes(rows, d, t, hd) {
            let a: Vec<f32> = (0..s.m * s.k).map(|i| ((i * 37) % 101) as f32 / 101.0 - 0.5).collect();
            let b: Vec<f32> = (0..s.k * s.n).map(|i| ((i * 53) % 89) as f32 / 89.0 - 0.5).collect();
            let mut c = vec![0.0f32; s.m * s.n];
            let a_m = if s.a_transposed { MatRef::rows(&a, s.k, s.m).t() } else { MatRef::rows(&a, s.m, s.k) };
            let b_m = MatRef::rows(&b, s.k, s.n);
            let flop = 2.0 * (s.m * s.k * s.n) as f64;
            print!("{size:>10} {:>16} {:>16}", s.name, format!("{}×{}·{}×{}", s.m, s.k, s.k, s.n));
            // Paths take turns, rep by rep, so a busy moment of the machine hits each alike.
            let mut ms = vec![Vec::with_capacity(reps); paths.len()];
            for rep in 0..=reps {
                for (times, &path) in ms.iter_mut().zip(&paths) {
                    let start = std::time::Instant::now();
                    pool.install(|| gemm(path, MatMut::rows(&mut c, s.m, s.n), a_m, b_m, false, 1.0, 2));
                    // The first turn warms the caches and the packing buffers.
                    if rep > 0 {
                        times.push(start.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            ms.into_iter().for_each(|times| print!(" {:>22.1}", flop / (median(times) * 1e6)));
            println!();
        }
    }
    Ok(())
}
