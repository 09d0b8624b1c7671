//! What a worker's `kill -9` costs under `parameter_server`: `mnist_parameter_server.toml` run
//! twice in a row, once as it is and once with worker 1 killed halfway through its training
//! (the launcher restarts it and it rejoins). Reported: how long the worker was absent, the
//! closures run again, whether every scheduled step was applied, the training time
//! (`wall_s − first_step_s`) of both runs, and the cost the kill is bounded by: the steps run
//! again plus the killed worker's share of the job's work while it was away. The difference of
//! the two training times is printed too, but at ±30 % run to run it measures the noise more
//! than the kill.

use super::{JobMeasure, f, job, job_with};
use std::path::Path;
use std::time::{Duration, Instant};

const SPEC: &str = "specs/mnist_parameter_server.toml";

/// Prints the kill row for runs of `steps` steps.
pub fn run(exe: &Path, steps: u64) -> Result<(), String> {
    // One step per closure: a closure run again is one step of work done twice.
    let sets =
        [format!("train.steps_per_epoch={steps}"), "train.epochs=1".into(), "train.steps_per_execution=1".into()];
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let plain = job(exe, SPEC, &sets)?;
    let training = |j: &JobMeasure| f(&j.summary, "wall_s") - f(&j.summary, "first_step_s");
    // Halfway through the training of the run without a kill, from the launch.
    let at = Duration::from_secs_f64(f(&plain.summary, "first_step_s") + training(&plain) / 2.0);
    let killed = job_with(exe, SPEC, &sets, |launcher| kill_worker(launcher, at))?;
    let ps = &killed.summary["parameter_server"];
    let workers = ps["steps_applied_per_worker"].as_array().map_or(1, Vec::len).max(1) as f64;
    let absent_ms = ps["absent_ms_per_worker"][1].as_f64().unwrap_or(0.0);
    let rescheduled = ps["closures_rescheduled"].as_f64().unwrap_or(0.0);
    let per_step = training(&plain) / steps.max(1) as f64;
    // While one worker of n is away the job runs at (n − 1)/n of its pace: it loses 1/n of
    // the absence; each closure run again is one step of the job's work done twice.
    let cost = absent_ms / 1000.0 / workers + rescheduled * per_step;
    let applied = ps["steps_applied"] == ps["steps_scheduled"];
    println!(
        "worker kill ({steps} steps, kill -9 of worker:1 halfway): back after {absent_ms:.0} ms, {rescheduled:.0} closure(s) run again, scheduled == applied: {applied}; training {:.2} s vs {:.2} s without ({:+.2} s); cost ≤ {cost:.2} s of training (target ≤ 1 s)",
        training(&killed),
        training(&plain),
        training(&killed) - training(&plain),
    );
    Ok(())
}

/// Waits until `at` after the launch of `launcher`, then kills its task worker:1 with SIGKILL.
fn kill_worker(launcher: u32, at: Duration) -> Result<(), String> {
    let started = Instant::now();
    let worker = loop {
        if let Some(pid) = task_pid(launcher, "worker", 1) {
            break pid;
        }
        if started.elapsed() > at + Duration::from_secs(30) {
            return Err("the launcher started no worker:1 within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(at.saturating_sub(started.elapsed()));
    // SAFETY: kill(2) on a pid the launcher this bench started reports as its child.
    match unsafe { libc::kill(worker as libc::pid_t, libc::SIGKILL) } {
        0 => Ok(()),
        _ => Err(format!("kill -KILL {worker}: {}", std::io::Error::last_os_error())),
    }
}

/// The pid of the child of `launcher` whose TF_CONFIG names task `role`:`index`.
fn task_pid(launcher: u32, role: &str, index: u32) -> Option<u32> {
    let needle = format!("\"task\":{{\"index\":{index},\"type\":\"{role}\"}}");
    let children = std::fs::read_to_string(format!("/proc/{launcher}/task/{launcher}/children")).ok()?;
    children.split_whitespace().find_map(|c| {
        let env = std::fs::read(format!("/proc/{c}/environ")).ok()?;
        String::from_utf8_lossy(&env).contains(&needle).then(|| c.parse().ok()).flatten()
    })
}
