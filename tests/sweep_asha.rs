//! Asynchronous successive halving (`kind = "asha"`) end to end on short real MNIST trials:
//! slots never wait for a rung to fill, every decision is recorded with the values it saw,
//! `--replay` makes exactly those decisions again (same `results.csv`), a promoted trial ends
//! bit-identical to one trained without pause, and a replay that cannot follow its record, or
//! one of a synchronous sweep, is refused with the fix. TPE under ASHA draws its trials from
//! finished and stopped trials, promoting before it starts one, the same every time with one
//! slot and on replay.

mod common;

use common::sweep::results;
use common::{assert_exit, json, run, tempdir, text};
use serde_json::Value;
use std::path::Path;

const SPEC: &str = "tests/fixtures/sweeps/mnist_asha.toml";

fn sweep(spec: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let o = format!("run.out_dir={}", out.display());
    let mut args = vec!["sweep", spec, "--set", &o];
    args.extend(extra);
    run(&args)
}

fn decisions(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join("decisions.jsonl")).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[test]
fn asha_promotes_as_results_come_and_a_replay_makes_the_same_decisions() {
    let (a, b) = (tempdir(), tempdir());
    let out = sweep(SPEC, a.path(), &["--parallel", "2"]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("starts at rung 1 (1 epochs)"), "{stdout}");
    assert!(stdout.contains("promoted to rung 2 (2 epochs)"), "{stdout}");
    let recorded = decisions(a.path());
    let starts = recorded.iter().filter(|d| d["decision"] == "start").count();
    assert_eq!(starts, 6, "every trial starts once: {recorded:?}");
    // A promotion is in the best ⌊n/2⌋ of the n results its rung had when it was made.
    for d in recorded.iter().filter(|d| d["decision"] == "promote") {
        let seen = d["seen"].as_array().cloned().unwrap_or_default();
        let top = d["top"].as_u64().unwrap_or(0) as usize;
        assert_eq!(top, seen.len() / 2, "{d}");
        assert!(seen[..top].iter().any(|s| s["trial"] == d["trial"]), "{d}");
        assert!(d["metric"] == "val_accuracy" && d["unit"] == "epochs", "{d}");
    }
    let rows = results(a.path());
    let col = |name: &str| rows[0].iter().position(|h| h == name).unwrap_or(usize::MAX);
    let (status, steps) = (col("status"), col("steps"));
    assert!(rows[1..].iter().any(|r| r[status] == "ok" && r[steps] == "80"), "{rows:?}");
    assert!(rows[1..].iter().all(|r| r[status] == "ok" || r[status] == "stopped_early"), "{rows:?}");
    assert!(rows[1..].iter().any(|r| r[status] == "stopped_early"), "{rows:?}");

    // The best trial was paused at two rungs; it equals its spec trained without a pause.
    let best = a.path().join(&rows[1][col("name")]);
    let summary = json(&best.join("summary.json"));
    let straight = tempdir();
    let spec = best.join("spec.toml").display().to_string();
    let o = format!("run.out_dir={}", straight.path().display());
    assert_exit(&run(&[&spec, "-q", "--set", &o]), 0);
    assert_eq!(json(&straight.path().join("summary.json"))["weights_sha256"], summary["weights_sha256"]);

    // Replayed one slot at a time into another folder: the same decisions, the same results.
    let record = a.path().join("decisions.jsonl").display().to_string();
    let replay = sweep(SPEC, b.path(), &["--replay", &record]);
    assert_exit(&replay, 0);
    assert_eq!(decisions(b.path()), recorded);
    assert_eq!(results(b.path()), rows);

    // Run again in its own folder, it follows its own record and trains nothing.
    let again = sweep(SPEC, a.path(), &[]);
    assert_exit(&again, 0);
    assert!(!text(&again).0.contains(": running"), "{}", text(&again).0);
    assert_eq!(decisions(a.path()), recorded);
    assert_eq!(results(a.path()), rows);
}

#[test]
fn a_record_of_another_sweep_or_a_synchronous_sweep_is_not_replayed() {
    let dir = tempdir();
    let foreign = dir.path().join("foreign.jsonl");
    let line = r#"{"decision":"promote","trial":3,"rung":2,"from":1,"to":2,"top":1,"seen":[]}"#;
    std::fs::write(&foreign, format!("{line}\n")).unwrap_or_else(|e| panic!("{e}"));
    let out = sweep(SPEC, &dir.path().join("sweep"), &["--replay", &foreign.display().to_string()]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("cannot follow the decisions recorded in"), "{stderr}");
    assert!(stderr.contains("it promotes trial 3 from rung 1, which it has no result at"), "{stderr}");
    let out = sweep("tests/fixtures/sweeps/mnist_halving.toml", dir.path(), &["--replay", "x.jsonl"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("is synchronous and decides the same every time"), "{}", text(&out).1);
    let check = run(&["check", SPEC]);
    assert_exit(&check, 0);
    assert!(text(&check).0.contains("asynchronous successive halving (ASHA) at 1, 2, 4 epochs"), "{}", text(&check).0);
}

#[test]
fn tpe_under_asha_draws_the_same_trials_with_one_slot_and_on_replay() {
    const TPE: &str = "tests/fixtures/sweeps/mnist_tpe_asha.toml";
    let (a, b, c, d) = (tempdir(), tempdir(), tempdir(), tempdir());
    let out = sweep(TPE, a.path(), &[]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert_eq!(stdout.matches("drawn by TPE").count(), 3, "{stdout}");
    let recorded = decisions(a.path());
    let drawn: Vec<&Value> = recorded.iter().filter(|d| d["values"].is_object()).collect();
    assert_eq!(drawn.len(), 3, "{recorded:?}");
    assert!(drawn.iter().all(|d| d["values"]["optimizer.learning_rate"].is_number()), "{drawn:?}");
    // Under TPE a slot promotes before it starts a trial, so the drawn trials learn from values
    // above the first rung.
    let first_promotion = recorded.iter().position(|d| d["decision"] == "promote");
    let last_start = recorded.iter().rposition(|d| d["decision"] == "start");
    assert!(first_promotion.is_some_and(|p| Some(p) < last_start), "{recorded:?}");
    let rows = results(a.path());
    assert_eq!(rows.len(), 7, "{rows:?}");
    let status = rows[0].iter().position(|h| h == "status").unwrap_or(usize::MAX);
    assert!(rows[1..].iter().any(|r| r[status] == "stopped_early"), "{rows:?}");
    assert!(rows[1..].iter().all(|r| r[status] == "ok" || r[status] == "stopped_early"), "{rows:?}");
    assert_eq!(json(&a.path().join("sweep.json"))["trials"].as_array().map(Vec::len), Some(6));

    // One slot: the same sweep again draws, decides and ranks the same.
    assert_exit(&sweep(TPE, b.path(), &[]), 0);
    assert_eq!((decisions(b.path()), results(b.path())), (recorded, rows));
    // Two slots: timing decides; the replay of that record draws and decides the same.
    assert_exit(&sweep(TPE, c.path(), &["--parallel", "2"]), 0);
    let record = c.path().join("decisions.jsonl").display().to_string();
    assert_exit(&sweep(TPE, d.path(), &["--replay", &record]), 0);
    assert_eq!((decisions(d.path()), results(d.path())), (decisions(c.path()), results(c.path())));

    // A synchronous scheduler needs its trials up front: refused, with the fix.
    let out = sweep(TPE, d.path(), &["--set", "sweep.scheduler.kind=successive_halving", "--dry-run"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("use kind = \"asha\""), "{}", text(&out).1);
}
