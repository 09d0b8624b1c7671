//! `trainrun bench --only precision`: the GPT under `mixed_bfloat16` against its own float32 and
//! against PyTorch's fp32 eager and bf16 autocast (`benches/gpt_torch.py [--bf16]`, 2 threads),
//! at the checked-in Shakespeare size (`specs/shakespeare_char.toml`) and at nanoGPT's
//! (`specs/shakespeare_gpt_nano.toml`: 6 layers, `n_embd` 384, block 256), batch 12 both. The
//! four runs (PyTorch's two, then trainrun's) take turns round by round, so a busy moment of
//! the machine hits each alike, and each round prints its own ratios: the targets are ratios
//! within one sitting. Skipped, saying why, when the Python of `TRAINRUN_BENCH_PYTHON` has no
//! torch.

use super::gpt::torch;
use super::{f, job, median};
use std::path::Path;

/// One GPT size: its spec, the peer's matching arguments, and the steps a run times.
struct Size {
    name: &'static str,
    spec: &'static str,
    torch_args: &'static [&'static str],
    steps: usize,
}

const SIZES: [Size; 2] = [
    Size { name: "shakespeare", spec: "specs/shakespeare_char.toml", torch_args: &[], steps: 300 },
    Size {
        name: "nanogpt",
        spec: "specs/shakespeare_gpt_nano.toml",
        torch_args: &["--n-layer", "6", "--n-head", "6", "--n-embd", "384", "--block", "256"],
        steps: 30,
    },
];

/// Prints the table; `quick` runs one round of a third of the steps.
pub fn run(exe: &Path, python: &str, quick: bool) -> Result<(), String> {
    let rounds = if quick { 1 } else { 3 };
    println!(
        "\n== GPT under mixed_bfloat16 against its float32 and PyTorch's fp32 eager and bf16 autocast \
         (2 threads, batch 12, steady tokens/s); PyTorch fp32, PyTorch bf16, trainrun fp32, trainrun mixed in turn, \
         {rounds} round(s)"
    );
    println!(
        "{:>12} {:>6} {:>10} {:>10} {:>10} {:>10} {:>12} {:>15} {:>22}",
        "GPT",
        "round",
        "fp32",
        "mixed",
        "torch fp32",
        "torch bf16",
        "mixed÷fp32",
        "mixed÷torch's",
        "peak MB (mixed, torch)"
    );
    for size in &SIZES {
        let steps = if quick { size.steps.div_ceil(3) } else { size.steps };
        let sets = [format!("train.steps_per_epoch={steps}"), "train.validation_steps=1".to_string()];
        let steps_arg = steps.to_string();
        let mut peer_args = vec!["--steps", steps_arg.as_str(), "--throughput-only"];
        peer_args.extend_from_slice(size.torch_args);
        let (mut own, mut peer, mut memory) = (Vec::new(), Vec::new(), Vec::new());
        for round in 1..=rounds {
            // The peer first: without torch there is nothing to compare with.
            let fp32 = match torch(python, &peer_args) {
                Ok(t) => t,
                Err(why) => {
                    println!("skipped: {why}");
                    return Ok(());
                }
            };
            let bf16 = torch(python, &[peer_args.as_slice(), &["--bf16"]].concat())?;
            let mut ours = Vec::new();
            for precision in ["float32", "mixed_bfloat16"] {
                let precision = format!("train.precision=\"{precision}\"");
                ours.push(job(exe, size.spec, &[sets[0].as_str(), sets[1].as_str(), precision.as_str()])?.summary);
            }
            let (float32, mixed) = (f(&ours[0], "steady_tokens_per_s"), f(&ours[1], "steady_tokens_per_s"));
            let faster = fp32.tokens_per_s.max(bf16.tokens_per_s);
            let peak = f(&ours[1], "peak_rss_mb");
            let (torch_low, torch_high) =
                (fp32.peak_rss_mb.min(bf16.peak_rss_mb), fp32.peak_rss_mb.max(bf16.peak_rss_mb));
            let (over_own, over_peer) = (mixed / float32, mixed / faster);
            own.push(over_own);
            peer.push(over_peer);
            memory.push(peak / torch_low);
            println!(
                "{:>12} {round:>6} {float32:>10.0} {mixed:>10.0} {:>10.0} {:>10.0} {over_own:>11.2}× {over_peer:>14.2}× {:>22}",
                size.name,
                fp32.tokens_per_s,
                bf16.tokens_per_s,
                format!("{peak:.0}, {torch_low:.0}–{torch_high:.0}")
            );
        }
        // The targets: ≥ 1.5× PyTorch's faster run at both sizes; at nanoGPT's size
        // also ≥ 2× its own float32 and ≤ 0.6× PyTorch's peak memory.
        let nano = size.name == "nanogpt";
        println!(
            "{}: mixed_bfloat16 median {:.2}× PyTorch's faster run (target ≥ 1.5×), {:.2}× its own float32{}, \
             peak memory {:.2}× PyTorch's smaller{}",
            size.name,
            median(peer),
            median(own),
            if nano { " (target ≥ 2×)" } else { "" },
            median(memory),
            if nano { " (target ≤ 0.6×)" } else { "" }
        );
    }
    Ok(())
}
