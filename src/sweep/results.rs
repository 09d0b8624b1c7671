//! A sweep's results: `sweep.json` (what the sweep is: its trials, seeds and provenance), one
//! row per trial read from the trial folders, ranked by the sweep's metric, as a text table
//! and as `results.csv`; the trials' timings, the only results that differ between identical
//! sweeps, in `timings.csv` beside it, so `results.csv` depends on the spec and seeds alone.

use super::selection::Evaluated;
use crate::provenance::{Git, Host};
use crate::spec::sweep::{RungUnit, SWEEP_METRICS};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// `sweep.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SweepRecord {
    /// trainrun version.
    pub trainrun_version: String,
    /// The sweep's name (the base spec's `run.name`).
    pub name: String,
    /// The spec file as given.
    pub spec: String,
    /// `--set` overrides, in order.
    pub sets: Vec<String>,
    /// The metric trials are ranked by.
    pub metric: String,
    /// Whether a higher metric is better.
    pub higher_is_better: bool,
    /// The sweep seed.
    pub seed: u64,
    /// Trials run at once.
    pub parallel: usize,
    /// When this invocation started and ended (RFC 3339, UTC).
    pub started_at: String,
    /// `null` while it runs.
    pub ended_at: Option<String>,
    /// What stopped this invocation before every trial ran (`SIGTERM`, `Ctrl-C (SIGINT)`);
    /// `null` when it ran to the end.
    #[serde(default)]
    pub stopped_by: Option<String>,
    /// The command line.
    pub command: Vec<String>,
    /// The git state of the spec's folder.
    #[serde(skip_deserializing)]
    pub git: Option<Git>,
    /// The machine.
    #[serde(skip_deserializing)]
    pub host: Option<Host>,
    /// Every trial.
    pub trials: Vec<TrialRecord>,
}

/// One trial in `sweep.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrialRecord {
    /// 1-based trial number.
    pub index: usize,
    /// Folder name, under the sweep folder.
    pub name: String,
    /// The run seed.
    pub seed: u64,
    /// The values the trial sets, in key order.
    pub values: Vec<(String, Json)>,
    /// Hash of its resolved spec (`summary.json`'s `spec_sha256` once complete).
    pub spec_sha256: String,
    /// The split it evaluates, which says whether its `summary.json`'s `test_*` are the
    /// sweep's `val_*` (absent from sweeps written before: the test split).
    #[serde(default)]
    pub evaluates: Evaluated,
}

/// How a trial stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Completed, with a `summary.json` of its spec.
    Ok,
    /// Ended with this exit code.
    Failed(u8),
    /// Stopped by the scheduler after rung `rung` (1-based), at `at` epochs or steps (`unit`).
    StoppedEarly { rung: u64, at: u64, unit: RungUnit },
    /// Not run yet (or interrupted).
    Pending,
}

impl Status {
    fn word(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Failed(_) => "failed",
            Status::StoppedEarly { .. } => "stopped_early",
            Status::Pending => "pending",
        }
    }
}

/// One trial's results.
#[derive(Debug, Clone)]
pub struct Row {
    /// The trial.
    pub trial: TrialRecord,
    /// How it stands.
    pub status: Status,
    /// Its `summary.json`, when complete.
    pub summary: Option<Json>,
}

impl Row {
    /// A result (`val_accuracy`, `wall_s`): a value of its summary, the metrics of the split
    /// it evaluates under their sweep names.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.value(key).and_then(Json::as_f64)
    }

    fn value(&self, key: &str) -> Option<&Json> {
        let summary = self.summary.as_ref()?;
        value_in(summary, self.trial.evaluates, key)
    }
}

/// The result `key` of a trial that evaluates `evaluates`, in its `summary`.
pub fn value_in<'s>(summary: &'s Json, evaluates: Evaluated, key: &str) -> Option<&'s Json> {
    let metric = SWEEP_METRICS.into_iter().find(|m| m.as_str() == key);
    let key = match metric {
        Some(m) => evaluates.summary_key(m)?,
        None => key,
    };
    summary.get(key).filter(|v| !v.is_null())
}

/// The completed summary in `dir` for a spec of hash `sha256`, if there is one.
pub fn completed(dir: &Path, sha256: &str) -> Option<Json> {
    summary_of(&dir.join("summary.json"), sha256)
}

/// The summary in file `path` if it is of a spec of hash `sha256`.
pub fn summary_of(path: &Path, sha256: &str) -> Option<Json> {
    let text = std::fs::read_to_string(path).ok()?;
    let summary: Json = serde_json::from_str(&text).ok()?;
    (summary.get("spec_sha256").and_then(Json::as_str) == Some(sha256)).then_some(summary)
}

/// The file in a trial's folder that marks it stopped early: `{ rung, epochs or steps, summary }`.
pub const STOPPED_EARLY: &str = "stopped_early.json";

/// A trial stopped early: its status and its summary at the rung where it stopped.
fn stopped_early(dir: &Path) -> Option<(Status, Json)> {
    let marker: Json = serde_json::from_str(&std::fs::read_to_string(dir.join(STOPPED_EARLY)).ok()?).ok()?;
    let (unit, at) = match marker.get("steps").and_then(Json::as_u64) {
        Some(steps) => (RungUnit::Steps, steps),
        None => (RungUnit::Epochs, marker.get("epochs")?.as_u64()?),
    };
    let status = Status::StoppedEarly { rung: marker.get("rung")?.as_u64()?, at, unit };
    Some((status, marker.get("summary")?.clone()))
}

/// The exit code a trial's `run.json` records for a failed run.
fn failed_code(dir: &Path) -> Option<u8> {
    let record: Json = serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).ok()?).ok()?;
    (record.get("status")? == "failed").then(|| record.get("exit_code").and_then(Json::as_u64).unwrap_or(1) as u8)
}

/// Every trial's row, read from its folder under `sweep_dir`; `failures` are exit codes seen
/// by this invocation (a trial can fail before its folder records anything).
pub fn rows(sweep_dir: &Path, record: &SweepRecord, failures: &BTreeMap<usize, u8>) -> Vec<Row> {
    record
        .trials
        .iter()
        .map(|t| {
            let dir = sweep_dir.join(&t.name);
            let summary = completed(&dir, &t.spec_sha256);
            let status = match (&summary, failures.get(&t.index)) {
                (Some(_), _) => Status::Ok,
                (None, Some(code)) => Status::Failed(*code),
                (None, None) => {
                    if let Some((status, at_rung)) = stopped_early(&dir) {
                        return Row { trial: t.clone(), status, summary: Some(at_rung) };
                    }
                    failed_code(&dir).map_or(Status::Pending, Status::Failed)
                }
            };
            Row { trial: t.clone(), status, summary }
        })
        .collect()
}

/// `rows` best first: completed trials by the metric (ties by trial number), then trials
/// stopped early (the later their rung the better, then by the metric), completed trials
/// without the metric, failed ones, pending ones.
pub fn rank(mut rows: Vec<Row>, metric: &str, higher_is_better: bool) -> Vec<Row> {
    let class = |r: &Row| match (r.status, r.get(metric)) {
        (Status::Ok, Some(_)) => (0, 0),
        (Status::StoppedEarly { at, .. }, _) => (1, u64::MAX - at),
        (Status::Ok, None) => (2, 0),
        (Status::Failed(_), _) => (3, 0),
        (Status::Pending, _) => (4, 0),
    };
    rows.sort_by(|a, b| {
        let by_metric = match (a.get(metric), b.get(metric)) {
            (Some(x), Some(y)) if higher_is_better => y.total_cmp(&x),
            (Some(x), Some(y)) => x.total_cmp(&y),
            _ => std::cmp::Ordering::Equal,
        };
        class(a).cmp(&class(b)).then(by_metric).then(a.trial.index.cmp(&b.trial.index))
    });
    rows
}

/// Result columns of `results.csv`, after the trial's values and seed: what the spec and the
/// seeds decide, so the same sweep twice writes the same bytes.
const RESULTS: [&str; 9] = [
    "test_accuracy",
    "test_loss",
    "train_accuracy",
    "train_loss",
    "val_accuracy",
    "val_loss",
    "steps",
    "examples",
    "weights_sha256",
];

/// Result columns of `timings.csv`: how long trials took, which differs run to run.
const TIMINGS: [&str; 2] = ["wall_s", "steady_examples_per_s"];

/// The value keys of all rows, in order.
fn keys(rows: &[Row]) -> Vec<String> {
    let set: BTreeSet<&String> = rows.iter().flat_map(|r| r.trial.values.iter().map(|(k, _)| k)).collect();
    set.into_iter().cloned().collect()
}

fn value_of<'r>(row: &'r Row, key: &str) -> Option<&'r Json> {
    row.trial.values.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// `results.csv` of ranked `rows`: rank, trial, folder, status, exit code, each swept key,
/// seed, then the results; numbers at full precision.
pub fn csv(rows: &[Row]) -> String {
    let keys = keys(rows);
    let mut header: Vec<String> = ["rank", "trial", "name", "status", "exit_code"].map(String::from).to_vec();
    header.extend(keys.iter().cloned());
    header.push("seed".into());
    header.extend(RESULTS.map(String::from));
    let mut out = line(&header);
    let mut rank = 0;
    for row in rows {
        let mut cells = Vec::with_capacity(header.len());
        cells.push(if row.status == Status::Ok {
            rank += 1;
            rank.to_string()
        } else {
            String::new()
        });
        cells.push(row.trial.index.to_string());
        cells.push(row.trial.name.clone());
        cells.push(row.status.word().to_string());
        cells.push(match row.status {
            Status::Failed(code) => code.to_string(),
            Status::Ok => "0".to_string(),
            Status::Pending | Status::StoppedEarly { .. } => String::new(),
        });
        for key in &keys {
            cells.push(value_of(row, key).map(crate::spec::sweep::value_text).unwrap_or_default());
        }
        cells.push(row.trial.seed.to_string());
        for key in RESULTS {
            cells.push(row.value(key).map(crate::spec::sweep::value_text).unwrap_or_default());
        }
        out.push_str(&line(&cells));
    }
    out
}

/// `timings.csv` of `rows`: one line per trial in trial order (trial, folder, status), then
/// its timings (empty for a trial without a summary); numbers at full precision.
pub fn timings_csv(rows: &[Row]) -> String {
    let mut header: Vec<String> = ["trial", "name", "status"].map(String::from).to_vec();
    header.extend(TIMINGS.map(String::from));
    let mut out = line(&header);
    let mut by_trial: Vec<&Row> = rows.iter().collect();
    by_trial.sort_by_key(|r| r.trial.index);
    for row in by_trial {
        let mut cells = vec![row.trial.index.to_string(), row.trial.name.clone(), row.status.word().to_string()];
        for key in TIMINGS {
            cells.push(row.value(key).map(crate::spec::sweep::value_text).unwrap_or_default());
        }
        out.push_str(&line(&cells));
    }
    out
}

/// One CSV line, quoting cells that need it (RFC 4180).
fn line(cells: &[String]) -> String {
    let quoted: Vec<String> = cells
        .iter()
        .map(|c| if c.contains([',', '"', '\n', '\r']) { format!("\"{}\"", c.replace('"', "\"\"")) } else { c.clone() })
        .collect();
    quoted.join(",") + "\n"
}

/// The results as a text table, best first, as `trainrun sweep` prints it.
pub fn table(rows: &[Row], metric: &str) -> String {
    let keys = keys(rows);
    let mut columns: Vec<&str> = vec![metric];
    columns.extend(["test_accuracy", "test_loss", "train_loss"].iter().filter(|c| **c != metric));
    let mut header: Vec<String> = vec!["rank".into(), "trial".into()];
    header.extend(keys.iter().cloned());
    header.extend(columns.iter().map(|c| c.to_string()));
    header.extend(["wall_s".to_string(), "status".to_string()]);
    let mut lines = vec![header];
    let mut rank = 0;
    for row in rows {
        let mut cells = vec![
            if row.status == Status::Ok {
                rank += 1;
                rank.to_string()
            } else {
                "-".into()
            },
            row.trial.name.clone(),
        ];
        for key in &keys {
            cells.push(value_of(row, key).map_or("-".into(), crate::spec::sweep::value_text));
        }
        for c in &columns {
            cells.push(row.get(c).map_or("-".into(), |v| format!("{v:.4}")));
        }
        cells.push(row.get("wall_s").map_or("-".into(), |v| format!("{v:.1}")));
        cells.push(match row.status {
            Status::Failed(code) => format!("failed (exit {code})"),
            Status::StoppedEarly { rung, at, unit } => format!("stopped_early (rung {rung}, {at} {})", unit.as_str()),
            other => other.word().to_string(),
        });
        lines.push(cells);
    }
    let widths: Vec<usize> =
        (0..lines[0].len()).map(|i| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for l in &lines {
        let cells: Vec<String> = l.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(index: usize, status: Status, acc: Option<f64>) -> Row {
        Row {
            trial: TrialRecord {
                index,
                name: format!("trial-{index:03}-lr0.{index}"),
                seed: 100 + index as u64,
                values: vec![("optimizer.learning_rate".into(), json!(index as f64 / 10.0))],
                spec_sha256: "h".into(),
                evaluates: Evaluated::Test,
            },
            status,
            summary: acc
                .map(|a| json!({ "test_accuracy": a, "test_loss": 1.0 - a, "wall_s": 2.5, "weights_sha256": "ab,c" })),
        }
    }

    #[test]
    fn ranks_by_the_metric_then_failures_then_pending() {
        let rows = vec![
            row(1, Status::Ok, Some(0.5)),
            row(2, Status::Failed(5), None),
            row(3, Status::Ok, Some(0.9)),
            row(4, Status::Pending, None),
            row(5, Status::Ok, Some(0.9)),
        ];
        let order = |rows: &[Row]| rows.iter().map(|r| r.trial.index).collect::<Vec<_>>();
        let best = rank(rows.clone(), "test_accuracy", true);
        assert_eq!(order(&best), [3, 5, 1, 2, 4]);
        let lowest = rank(rows, "test_accuracy", false);
        assert_eq!(order(&lowest), [1, 3, 5, 2, 4]);
    }

    #[test]
    fn csv_has_one_row_per_trial_and_quotes() {
        let rows = rank(vec![row(1, Status::Ok, Some(0.5)), row(2, Status::Failed(5), None)], "test_accuracy", true);
        let text = csv(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("rank,trial,name,status,exit_code,optimizer.learning_rate,seed,test_accuracy"));
        assert!(lines[1].starts_with("1,1,trial-001-lr0.1,ok,0,0.1,101,0.5,0.5,"), "{}", lines[1]);
        assert!(lines[1].ends_with(",\"ab,c\""), "{}", lines[1]);
        assert!(!lines[0].contains("wall_s") && !lines[0].contains("steady_"), "no timings: {}", lines[0]);
        assert!(lines[2].starts_with(",2,trial-002-lr0.2,failed,5,0.2,102,,"), "{}", lines[2]);
    }

    #[test]
    fn timings_go_to_their_own_file_in_trial_order() {
        let rows = rank(vec![row(1, Status::Ok, Some(0.5)), row(2, Status::Ok, Some(0.9))], "test_accuracy", true);
        assert_eq!(rows[0].trial.index, 2, "ranked best first");
        assert_eq!(
            timings_csv(&rows),
            "trial,name,status,wall_s,steady_examples_per_s\n1,trial-001-lr0.1,ok,2.5,\n2,trial-002-lr0.2,ok,2.5,\n"
        );
    }

    #[test]
    fn the_table_aligns_columns() {
        let rows = rank(vec![row(1, Status::Ok, Some(0.5)), row(2, Status::Failed(5), None)], "test_accuracy", true);
        let text = table(&rows, "test_accuracy");
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("rank  trial            optimizer.learning_rate  test_accuracy"), "{text}");
        assert!(lines[1].contains("0.5000") && lines[1].ends_with("ok"), "{text}");
        assert!(lines[2].ends_with("failed (exit 5)"), "{text}");
    }
}
