//! A sweep spread over a cluster: each index of a Slurm job array or a Kubernetes Indexed Job
//! runs `trainrun sweep SPEC --trial I`, the trial of that index alone (index I is trial I + 1,
//! the same folder, seed and bits as the driver's), into the shared sweep folder, and
//! `trainrun sweep SPEC --collect` ranks whatever has finished into the same `results.csv` the
//! driver writes.
//!
//! Indexes run at once on other machines, so an index writes only its own trial's folder (its
//! files are written whole and renamed into place); `sweep.json`, `results.csv` and
//! `timings.csv` are the collector's. A trial that ends without its summary leaves
//! [`EXIT_FILE`] with its exit code, so the collector tells a failed trial from one still
//! running or not started.
//!
//! A scheduler decides between trials rung by rung, from all their results: it needs the
//! driver, so `--trial` refuses a sweep with one (`--collect` reads its folders all the same).

use super::Sweep;
use super::child::{self, TrialEvent};
use super::driver::{self, job, validate_each};
use super::results::{self, Status};
use crate::exit::RunError;
use crate::prepare::Invocation;
use crate::provenance::rfc3339;
use crate::signals::Stop;
use serde_json::{Value as Json, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The file in a trial's folder that records the exit code of a `--trial` run that ended
/// without its summary (a failed trial, not a pending one).
pub const EXIT_FILE: &str = "exit.json";

/// `--trial index`: runs that trial alone (unless complete) and exits with its code.
pub(super) fn trial(inv: &Invocation, sweep: &Sweep, index: usize) -> Result<(), RunError> {
    let n = sweep.trials.len();
    let spec = inv.spec.display();
    let Some(trial) = sweep.trials.get(index) else {
        return Err(RunError::Usage(format!(
            "--trial {index} is outside the sweep of {spec}: its {n} trials are the job-array indexes 0 to {} \
             (index I runs trial I + 1); `trainrun sweep {spec} --dry-run` lists them",
            n.saturating_sub(1)
        )));
    };
    if sweep.scheduler.is_some() {
        return Err(RunError::Usage(format!(
            "--trial runs one trial to its end, but {spec}'s [sweep.scheduler] decides rung by rung which trials go \
             on, from all their results, so it needs the sweep driver: run `trainrun sweep {spec} --parallel K` as \
             one job, or remove [sweep.scheduler] to spread the trials over a job array"
        )));
    }
    refuse_tpe(sweep, "--trial")?;
    let checked = validate_each(inv, sweep, &|_| Vec::new(), true)?;
    let valid = &checked[index];
    let dir = sweep.trial_dir(trial);
    let name = format!("[{}/{n}] {}", trial.index, trial.name);
    if results::completed(&dir, &valid.sha256).is_some() {
        if !inv.quiet {
            println!("{name}: complete, skipped");
        }
        return Ok(());
    }
    std::fs::create_dir_all(&dir).map_err(|e| RunError::Failure(format!("cannot create {}: {e}", dir.display())))?;
    // An earlier try's failure no longer stands while this one runs.
    match std::fs::remove_file(dir.join(EXIT_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(RunError::Failure(format!("cannot remove {}: {e}", dir.join(EXIT_FILE).display())));
        }
        _ => {}
    }
    let exe =
        std::env::current_exe().map_err(|e| RunError::Failure(format!("cannot find the trainrun binary: {e}")))?;
    let stop = crate::signals::supervise();
    let mut ended: Option<(u8, Duration, Option<String>)> = None;
    let process = job(inv, sweep, trial, valid, &exe, 1, &[]);
    child::run_all(vec![process], 1, stop, |event| match event {
        TrialEvent::Started(_) if !inv.quiet => {
            println!("{name}: running (log: {})", dir.join("train.log").display());
        }
        TrialEvent::Started(_) => {}
        TrialEvent::Ended { code, took, error, .. } => ended = Some((code, took, error)),
    });
    let complete = results::completed(&dir, &valid.sha256);
    let stop_codes = [Stop::Terminated, Stop::Interrupted].map(Stop::exit_code);
    // Stopped as asked (a preemption, the job's time limit), not failed: it stays pending, and
    // its backup resumes it when the index runs again.
    if let Some(stop) = crate::signals::received()
        && complete.is_none()
        && ended.as_ref().is_none_or(|(code, _, _)| stop_codes.contains(code))
    {
        let why = format!("{name} stopped by {}; the same index resumes it from its backup", stop.name());
        return Err(match stop {
            Stop::Terminated => RunError::Preempted(why),
            Stop::Interrupted => RunError::Interrupted(why),
        });
    }
    match (ended, complete) {
        (Some((0, took, _)), Some(summary)) => {
            if !inv.quiet {
                let value = results::value_in(&summary, valid.evaluates, sweep.metric.as_str()).and_then(Json::as_f64);
                let shown = value.map_or("-".into(), |v| format!("{v:.4}"));
                println!("{name}: done in {:.1} s, {} {shown}", took.as_secs_f64(), sweep.metric.as_str());
            }
            Ok(())
        }
        (ended, _) => {
            let (code, took, error) = ended.unwrap_or((1, Duration::ZERO, Some("it did not start".into())));
            let code = if code == 0 { 1 } else { code };
            crate::train::run_dir::write_json(&dir.join(EXIT_FILE), &json!({ "exit_code": code, "error": error }))
                .map_err(|e| RunError::Failure(e.to_string()))?;
            Err(RunError::TrialFailed {
                code,
                message: format!(
                    "{name} FAILED (exit {code}) after {:.1} s{}",
                    took.as_secs_f64(),
                    driver::tail(&dir, error.as_deref())
                ),
            })
        }
    }
}

/// The exit code a `--trial` run left in trial folder `dir`, if it failed.
fn failed(dir: &Path) -> Option<u8> {
    let record: Json = serde_json::from_str(&std::fs::read_to_string(dir.join(EXIT_FILE)).ok()?).ok()?;
    record.get("exit_code")?.as_u64().and_then(|c| u8::try_from(c).ok())
}

/// `--collect`: ranks the trials as their folders stand, into `sweep.json` and `results.csv`.
pub(super) fn collect(inv: &Invocation, sweep: &Sweep) -> Result<(), RunError> {
    refuse_tpe(sweep, "--collect")?;
    let checked = validate_each(inv, sweep, &|_| Vec::new(), true)?;
    let mut record = driver::sweep_record(inv, sweep, &checked, 1);
    record.ended_at = Some(rfc3339(SystemTime::now()));
    let failures: BTreeMap<usize, u8> =
        sweep.trials.iter().filter_map(|t| failed(&sweep.trial_dir(t)).map(|code| (t.index, code))).collect();
    std::fs::create_dir_all(&sweep.dir)
        .map_err(|e| RunError::Failure(format!("cannot create {}: {e}", sweep.dir.display())))?;
    driver::write(&sweep.dir.join("sweep.json"), &record)?;
    super::tracked::end_killed_trials(inv, sweep, &checked, "`trainrun sweep --collect`");
    let rows = driver::ranked(sweep, &record, &failures);
    driver::write_results(&sweep.dir, &rows)?;
    if !inv.quiet {
        let count = |f: fn(&Status) -> bool| rows.iter().filter(|r| f(&r.status)).count();
        let order = if sweep.higher_is_better { "higher is better" } else { "lower is better" };
        println!(
            "sweep {}: {} of {} trials complete, {} failed, {} stopped early, {} not finished (pending or running)",
            sweep.name,
            count(|s| *s == Status::Ok),
            rows.len(),
            count(|s| matches!(s, Status::Failed(_))),
            count(|s| matches!(s, Status::StoppedEarly { .. })),
            count(|s| *s == Status::Pending),
        );
        println!("\nranked by {} ({order}):", sweep.metric.as_str());
        print!("{}", results::table(&rows, sweep.metric.as_str()));
        println!("wrote {} and timings.csv", sweep.dir.join("results.csv").display());
    }
    Ok(())
}

/// TPE draws each trial after its start-up ones from the results before it, so its trials are
/// not a fixed list that job-array indexes could name: only the sweep driver can run them.
fn refuse_tpe(sweep: &Sweep, flag: &str) -> Result<(), RunError> {
    match sweep.tpe {
        None => Ok(()),
        Some(_) => Err(RunError::Usage(format!(
            "{flag} works on a fixed list of trials, but [sweep.tpe] draws each trial after the start-up ones from \
             the results before it, so it needs the sweep driver: run `trainrun sweep SPEC` as one job, or remove \
             [sweep.tpe] to spread the [sweep.random] trials over a job array"
        ))),
    }
}
