//! `trainrun bench --only scale`: real `trainrun` jobs of N = 2 … 64 worker tasks on up to 8
//! hosts made on this machine ([`hosts`]: network namespaces, links shaped with `htb` and
//! `netem` where the kernel has it, else by the harness's own link emulator, [`link`]), per N and link profile: the rendezvous
//! time and step time (median, p90) from the tasks' own records ([`train`]), the all-reduce
//! time of every algorithm and of `auto` at 1 KB, 1 MB and 16 MB, with whether `auto` came
//! within 10 % of the fastest in each cell and in how many ([`allreduce`]), and, given a Python with
//! torch, PyTorch DDP over gloo on the same job and gloo's all-reduce alongside ([`gloo`]).
//! `--only scale` runs N ≤ 8, `--only scale-full` up to 64. Everything printed is measured;
//! the settings are printed with the results. Needs root: without it the bench says why.

pub mod allreduce;
pub mod gloo;
pub mod hosts;
pub mod link;
pub mod procs;
pub mod rtt;
pub mod train;

use hosts::{HostsError, NamespaceHosts, Profile};
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use train::{TaskLayout, TrainSettings, percentile};

/// Steps each job trains; the first is left out of the step times. Enough that p99 is not
/// simply the slowest step.
const STEPS: u64 = 100;
/// Examples per replica and step.
const BATCH: usize = 16;
/// The worlds where the torch reference runs (the target's).
const TORCH_WORLDS: [usize; 3] = [8, 16, 32];

/// How long one job of `tasks` tasks may take before everything is killed.
pub fn deadline(tasks: usize) -> Duration {
    Duration::from_secs(60 + 3 * tasks as u64)
}

/// The implementations a job trains with: `auto` and every algorithm that runs between hosts
/// whose name the spec accepts as `strategy.communication.implementation`.
pub fn implementations() -> Vec<String> {
    use crate::spec::CollectiveImplementation;
    let accepted =
        |name: &str| serde_json::from_value::<CollectiveImplementation>(serde_json::Value::from(name)).is_ok();
    let names = allreduce::algorithms().into_iter().map(|a| a.name().to_string());
    ["auto".to_string()].into_iter().chain(names.filter(|n| accepted(n))).collect()
}

/// The table: N ≤ 8, or up to 64 with `full`; torch's figures with `python` when it has torch.
pub fn run(exe: &Path, python: &str, full: bool) -> Result<(), String> {
    let stop = crate::signals::stop_requested();
    // A second Ctrl-C must not end the process before the cluster is removed.
    crate::signals::supervise();
    let worlds: &[usize] = if full { &[2, 4, 8, 16, 32, 64] } else { &[2, 4, 8] };
    let torch = gloo::TorchReference::find(python);
    let mut summary = Vec::new();
    println!(
        "\n== scale: N worker tasks as hosts × tasks (network namespaces with their own addresses; each cluster's \
         link, netem or the userspace emulator, printed with it), MLP 784-32-10 on synthetic images, \
         batch {BATCH} per task, 1 thread a task, {STEPS} steps"
    );
    for profile in Profile::ALL {
        let mut verdicts = Vec::new();
        for &n in worlds {
            if stop.load(Ordering::SeqCst) {
                return Err(stopped(stop, String::new()));
            }
            let p = TaskLayout::for_tasks(n);
            let cluster = match NamespaceHosts::new(p.hosts, profile, stop) {
                Ok(c) => c,
                Err(e @ HostsError::NoNamespaces(_)) => {
                    println!("skipped: {e}");
                    return Ok(());
                }
                Err(e) => return Err(e.to_string()),
            };
            println!("\n-- N = {n} ({} × {}), cluster {}: {}", p.hosts, p.per_host(), cluster.tag, cluster.settings());
            let torch = torch.as_ref().ok().filter(|_| profile == Profile::FAST && TORCH_WORLDS.contains(&n));
            let text = measure(exe, &cluster, p, torch, stop, &mut verdicts).map_err(|e| stopped(stop, e))?;
            print!("{text}");
        }
        summary.push(verdict_line(profile, &verdicts));
    }
    println!();
    for line in summary {
        println!("{line}");
    }
    if let Err(why) = torch {
        println!("\ntorch reference skipped: {why}");
    }
    Ok(())
}

/// How `auto` did on one link profile: the cells within 10 % of the fastest candidate timed
/// beside it, of the misses how many its pick explains and how many noise; and the cells
/// within 10 % of the fastest row of any group and transport.
pub fn verdict_line(profile: Profile, verdicts: &[allreduce::AutoVerdict]) -> String {
    let count = |k: allreduce::Verdict| verdicts.iter().filter(|v| v.verdict() == k).count();
    format!(
        "{}, {} µs: auto within 10 % of the fastest all-reduce timed beside it in {} of {} cells (N, size) \
         (target: ≥ 90 %); missed by noise (its pick's row within 10 %): {}; by the pick: {}; \
         within 10 % of the fastest row of any group and transport: {}",
        profile.name,
        profile.delay_us,
        count(allreduce::Verdict::Within),
        verdicts.len(),
        count(allreduce::Verdict::MissedBySpread),
        count(allreduce::Verdict::MissedByPick),
        verdicts.iter().filter(|v| v.anywhere_ratio() <= 1.10).count()
    )
}

/// `e`, or that the bench was stopped, which explains it.
fn stopped(stop: &AtomicBool, e: String) -> String {
    match stop.load(Ordering::SeqCst) {
        true => "stopped on request (SIGINT or SIGTERM); the cluster was removed".into(),
        false => e,
    }
}

/// One cluster's rows; how `auto`'s all-reduce did in each of its cells goes to `verdicts`.
fn measure(
    exe: &Path,
    cluster: &NamespaceHosts,
    p: TaskLayout,
    torch: Option<&gloo::TorchReference>,
    stop: &AtomicBool,
    verdicts: &mut Vec<allreduce::AutoVerdict>,
) -> Result<String, String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<18} {:>22} {:>14} {:>12} {:>10} {:>10}",
        "implementation", "transport", "rendezvous s", "step ms p50", "p90", "p99"
    );
    let mut ours = Vec::new();
    for implementation in implementations() {
        let settings =
            TrainSettings { steps: STEPS, per_replica_batch: BATCH, implementation, deadline: deadline(p.tasks) };
        let r = train::train(exe, cluster, p, &settings, stop).map_err(|e| e.to_string())?;
        let _ = writeln!(
            out,
            "{:<18} {:>22} {:>14.3} {:>12.3} {:>10.3} {:>10.3}",
            settings.implementation,
            r.transport,
            r.rendezvous_s,
            r.step_median_ms(),
            r.step_p90_ms(),
            r.step_p99_ms()
        );
        ours.push(r.step_median_ms());
    }
    let rounds = allreduce::measure(exe, cluster, p).map_err(|e| e.to_string())?;
    let rows = allreduce::combine_rounds(&rounds);
    let _ = writeln!(
        out,
        "{:<40} {:>10} {:>12} {:>19} {:>10}  (median of {} interleaved rounds; each round's median)",
        "all-reduce",
        "size",
        "median ms",
        "rounds ms",
        "min ms",
        rounds.len()
    );
    for r in &rows {
        let (least, most, picks) = allreduce::spread(&rounds, r);
        let picks: Vec<&str> = picks.iter().map(|a| a.map_or("-", |a| a.name())).collect();
        let _ = writeln!(
            out,
            "{:<40} {:>10} {:>12.3} {:>9.3}–{:<9.3} {:>10.3}{}",
            r.label(),
            size(r.bytes),
            r.median.as_secs_f64() * 1e3,
            least.as_secs_f64() * 1e3,
            most.as_secs_f64() * 1e3,
            r.min.as_secs_f64() * 1e3,
            if r.picked.is_some() { format!("  picks {}", picks.join(", ")) } else { String::new() }
        );
    }
    for v in allreduce::verdicts(&rows) {
        let _ = writeln!(out, "{}", v.line());
        verdicts.push(v);
    }
    for b in allreduce::bandwidth_bounds(&rows, p) {
        let _ = writeln!(out, "{}", b.line());
    }
    let Some(torch) = torch else {
        return Ok(out);
    };
    let theirs = torch.step_ms(cluster, p, BATCH, STEPS, deadline(p.tasks), stop).map_err(|e| e.to_string())?;
    // What a user gets: `auto`, the first row.
    let (a, b) = (ours.first().copied().unwrap_or(f64::NAN), percentile(&theirs, 0.5));
    let _ = writeln!(
        out,
        "torch DDP (gloo) step ms p50 {b:.3} p90 {:.3}; trainrun (auto) ÷ torch: {:.2}× (target ≤ 0.7×)",
        percentile(&theirs, 0.9),
        a / b
    );
    for (bytes, secs) in torch.all_reduce(cluster, p, deadline(p.tasks), stop).map_err(|e| e.to_string())? {
        let best =
            rows.iter().filter(|r| r.bytes == bytes).map(|r| r.median.as_secs_f64()).fold(f64::INFINITY, f64::min);
        let _ = writeln!(
            out,
            "gloo all-reduce {:>10}: {:.3} ms; trainrun's best ÷ gloo's: {:.2}×",
            size(bytes),
            secs * 1e3,
            best / secs
        );
    }
    Ok(out)
}

/// 1 KB, 1 MB, 16 MB.
fn size(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MB", b >> 20),
        b => format!("{} KB", b >> 10),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_train_with_auto_and_every_algorithm_the_spec_names() {
        let names = implementations();
        assert_eq!(names.first().map(String::as_str), Some("auto"));
        assert!(names.iter().any(|n| n == "ring"), "{names:?}");
        // `direct` needs shared memory between every worker: it cannot run between hosts.
        assert!(!names.iter().any(|n| n == "direct"), "{names:?}");
        assert_eq!((size(1024), size(1 << 20), size(16 << 20)), ("1 KB".into(), "1 MB".into(), "16 MB".into()));
    }
}
