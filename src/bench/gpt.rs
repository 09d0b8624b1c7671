//! `trainrun bench`'s language-model rows: `specs/shakespeare_char.toml` against PyTorch eager
//! (`benches/gpt_torch.py`: the same GPT, batch, AdamW, schedule, clipping and data on 2
//! threads, attention through `F.scaled_dot_product_attention`), run alternately T P T P T P
//! so both see the same machine. It prints each pair's steady tokens/s and peak memory with
//! their ratios and, in the full bench, the time from launch to the validation loss PyTorch
//! reaches after its 2,000 steps (`specs/bench/gpt_tta.toml` stops there), both sides evaluating
//! every [`EVAL_EVERY`] steps. Skipped, saying
//! why, when the Python of `TRAINRUN_BENCH_PYTHON` (default `python3`) has no torch.

use super::{f, job, median};
use std::path::Path;

/// How often both sides evaluate on Macbeth in the time-to-loss row. The peer evaluates as
/// often as trainrun does, so both launch-to-loss times carry the same evaluations (it used to
/// evaluate only at the end while trainrun evaluated ten times, which charged trainrun alone).
const EVAL_EVERY: u32 = 200;

/// What one run of `benches/gpt_torch.py` measured.
pub(super) struct Torch {
    pub(super) tokens_per_s: f64,
    val_loss: Option<f64>,
    wall_s: f64,
    pub(super) peak_rss_mb: f64,
}

/// Runs `benches/gpt_torch.py` with `python` and `args`, from the repository root.
pub(super) fn torch(python: &str, args: &[&str]) -> Result<Torch, String> {
    let out = std::process::Command::new(python)
        .arg("benches/gpt_torch.py")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {python} benches/gpt_torch.py: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().unwrap_or_default();
    if !out.status.success() || !last.starts_with('{') {
        let why = if last.is_empty() { String::from_utf8_lossy(&out.stderr).trim().to_string() } else { last.into() };
        return Err(format!(
            "no PyTorch figure ({why}); set TRAINRUN_BENCH_PYTHON to a python with torch, from the repository root"
        ));
    }
    let row: serde_json::Value = serde_json::from_str(last).map_err(|e| format!("gpt_torch.py: {e}"))?;
    Ok(Torch {
        tokens_per_s: f(&row, "tokens_per_s"),
        val_loss: row["val_loss"].as_f64(),
        wall_s: f(&row, "wall_s"),
        peak_rss_mb: f(&row, "peak_rss_mb"),
    })
}

/// Prints the rows; `quick` measures throughput only, over fewer steps.
pub fn run(exe: &Path, python: &str, quick: bool) -> Result<(), String> {
    let steps = if quick { 60 } else { 300 };
    println!(
        "\n== GPT (specs/shakespeare_char.toml, 810,880 params, batch 12 × 64 tokens) against PyTorch eager \
         (benches/gpt_torch.py, 2 threads); trainrun as the spec runs it (mirrored, 2 CPU replicas × 1 thread); \
         {steps} steps each, alternating T P T P T P"
    );
    println!(
        "{:>6} {:>15} {:>13} {:>7} {:>12} {:>10} {:>7}",
        "pair", "trainrun tok/s", "torch tok/s", "ratio", "trainrun MB", "torch MB", "ratio"
    );
    let (mut speed, mut memory) = (Vec::new(), Vec::new());
    let ours_sets = [format!("train.steps_per_epoch={steps}"), "train.validation_steps=1".to_string()];
    let ours_sets: Vec<&str> = ours_sets.iter().map(String::as_str).collect();
    let steps_arg = steps.to_string();
    for pair in 1..=3 {
        let ours = job(exe, "specs/shakespeare_char.toml", &ours_sets)?;
        let theirs = match torch(python, &["--steps", &steps_arg, "--throughput-only"]) {
            Ok(t) => t,
            Err(why) => {
                println!("skipped: {why}");
                return Ok(());
            }
        };
        let (tokens, mb) = (f(&ours.summary, "steady_tokens_per_s"), f(&ours.summary, "peak_rss_mb"));
        speed.push(tokens / theirs.tokens_per_s);
        memory.push(mb / theirs.peak_rss_mb);
        println!(
            "{pair:>6} {tokens:>15.0} {:>13.0} {:>6.2}× {mb:>12.0} {:>10.0} {:>6.2}×",
            theirs.tokens_per_s,
            speed[speed.len() - 1],
            theirs.peak_rss_mb,
            memory[memory.len() - 1]
        );
    }
    println!(
        "median: tokens/s {:.2}× PyTorch's (target ≥ 1.5×), peak memory {:.2}× (target ≤ 0.5×)",
        median(speed),
        median(memory)
    );
    if quick {
        return Ok(());
    }
    println!(
        "\n== GPT time from launch to PyTorch's validation loss after 2,000 steps (Macbeth), both evaluating \
         every {EVAL_EVERY} steps"
    );
    let theirs = torch(python, &["--eval-every", &EVAL_EVERY.to_string()])?;
    let target = theirs.val_loss.ok_or("gpt_torch.py printed no validation loss")?;
    let sets = [format!("callbacks[0].target={target}"), format!("train.evaluate_every_steps={EVAL_EVERY}")];
    let ours = job(exe, "specs/bench/gpt_tta.toml", &[sets[0].as_str(), sets[1].as_str()])?;
    let s = &ours.summary;
    println!("{:<44} {:>8} {:>7} {:>9} {:>9}", "run", "wall s", "steps", "val loss", "peak MB");
    println!(
        "{:<44} {:>8.1} {:>7} {target:>9.4} {:>9.0}",
        &format!("PyTorch, 2,000 steps (evaluating every {EVAL_EVERY})"),
        theirs.wall_s,
        2000,
        theirs.peak_rss_mb
    );
    println!(
        "{:<44} {:>8.1} {:>7} {:>9.4} {:>9.0}",
        &format!("trainrun, to that loss (evaluating every {EVAL_EVERY})"),
        ours.wall_s,
        s["steps"],
        f(s, "test_loss"),
        f(s, "peak_rss_mb")
    );
    println!("time to PyTorch's loss: {:.2}× PyTorch's (target ≤ 0.6×)", ours.wall_s / theirs.wall_s);
    Ok(())
}
