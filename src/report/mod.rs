//! `trainrun report DIR`: loss and accuracy curves against the step of a run folder (training
//! and validation), or of every trial of a sweep folder overlaid, as `loss.svg`/`.png` and
//! `accuracy.svg`/`.png` in DIR, and `report.html` with the results table and the plots. A
//! sweep also gets its parallel-coordinates plot and, when a scheduler stopped trials, their
//! curves with the rung where each stopped ([`parallel`]).

mod chart;
mod html;
mod parallel;

use crate::exit::RunError;
use crate::sweep::results::{self, SweepRecord};
use chart::{Chart, Curves};
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// DIR holds neither a run nor a sweep.
    #[error(
        "{} is not a run folder (no metrics.jsonl) or a sweep folder (no sweep.json); \
         name a folder that `trainrun SPEC` or `trainrun sweep SPEC` wrote, e.g. runs/mnist_single",
        .0.display()
    )]
    NotAFolder(PathBuf),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file of the run is there but does not parse (cut short, edited): not missing.
    #[error(
        "{}:{line}:{column}: {} is corrupt, not missing: {message}\n  help: it was cut short or edited; \
         run the spec again to write it anew, or delete it to report the curves alone",
        path.display(),
        path.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned())
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the parser stopped, 1-based.
        line: usize,
        /// The column there, 1-based.
        column: usize,
        /// What the parser found.
        message: String,
    },
    /// Plotting failed.
    #[error("cannot draw: {0}")]
    Draw(String),
}

impl ReportError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        ReportError::Io { path: path.to_path_buf(), source }
    }
}

impl From<ReportError> for RunError {
    fn from(e: ReportError) -> Self {
        match e {
            ReportError::NotAFolder(_) => RunError::Usage(e.to_string()),
            ReportError::Io { .. } | ReportError::Corrupt { .. } | ReportError::Draw(_) => {
                RunError::Failure(e.to_string())
            }
        }
    }
}

/// (step, value) points.
type Points = Vec<(f64, f64)>;

/// Training and validation points of one quantity.
type Pair = (Points, Points);

/// The curves of one run folder.
#[derive(Debug, Clone, Default, PartialEq)]
struct RunCurves {
    loss: Pair,
    accuracy: Pair,
}

/// Reads `metrics.jsonl`: training points from `step` lines (or epochs, for runs logged
/// without them), validation points from every line with `val_loss`, one per step.
fn read_curves(dir: &Path) -> Result<RunCurves, ReportError> {
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| ReportError::io(&path, e))?;
    let lines: Vec<Json> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let has_steps = lines.iter().any(|l| l["event"] == "step");
    let mut curves = RunCurves::default();
    let mut evaluated: BTreeMap<u64, ()> = BTreeMap::new();
    for l in &lines {
        let Some(step) = l["step"].as_u64() else { continue };
        let x = step as f64;
        let training = if has_steps { l["event"] == "step" } else { l["event"] == "epoch" };
        // A regression's lines have no accuracy: its loss curves are drawn all the same.
        if training && let Some(loss) = l["loss"].as_f64() {
            curves.loss.0.push((x, loss));
            curves.accuracy.0.extend(l["accuracy"].as_f64().map(|acc| (x, acc)));
        }
        if let Some(loss) = l["val_loss"].as_f64()
            && evaluated.insert(step, ()).is_none()
        {
            curves.loss.1.push((x, loss));
            curves.accuracy.1.extend(l["val_accuracy"].as_f64().map(|acc| (x, acc)));
        }
    }
    Ok(curves)
}

/// Writes the report of `dir` and says what it wrote.
pub fn run(dir: &Path) -> Result<(), RunError> {
    let written = write(dir)?;
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Writes the report of a run or sweep folder; returns the files written.
pub fn write(dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let sweep_json = dir.join("sweep.json");
    if sweep_json.is_file() {
        let text = std::fs::read_to_string(&sweep_json).map_err(|e| ReportError::io(&sweep_json, e))?;
        let record: SweepRecord = serde_json::from_str(&text)
            .map_err(|e| ReportError::io(&sweep_json, std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        return write_sweep(dir, &record);
    }
    if dir.join("metrics.jsonl").is_file() {
        return write_run(dir);
    }
    Err(ReportError::NotAFolder(dir.to_path_buf()))
}

/// The JSON file `name` of `dir`: `None` when it is not there, an error naming where it
/// breaks when it is there but does not parse.
fn read_json(dir: &Path, name: &str) -> Result<Option<Json>, ReportError> {
    let path = dir.join(name);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ReportError::io(&path, e)),
    };
    serde_json::from_str(&text).map(Some).map_err(|e| {
        // serde_json ends its message with the place, which the error puts first.
        let message = e.to_string();
        let message = message.rfind(" at line ").map_or(message.as_str(), |at| &message[..at]).to_string();
        ReportError::Corrupt { path, line: e.line(), column: e.column(), message }
    })
}

fn name_of(dir: &Path, summary: Option<&Json>) -> String {
    let name = summary.and_then(|s| s["name"].as_str().map(String::from));
    name.unwrap_or_else(|| dir.file_name().map_or("run".into(), |n| n.to_string_lossy().into_owned()))
}

fn charts(title: &str, runs: &[(String, RunCurves)]) -> [Chart; 2] {
    let of = |pick: fn(&RunCurves) -> &Pair| {
        runs.iter()
            .map(|(label, c)| Curves { label: label.clone(), train: pick(c).0.clone(), val: pick(c).1.clone() })
            .collect()
    };
    [
        Chart { title: format!("{title}: loss"), quantity: "loss".into(), rising: false, runs: of(|c| &c.loss) },
        Chart {
            title: format!("{title}: accuracy"),
            quantity: "accuracy".into(),
            rising: true,
            runs: of(|c| &c.accuracy),
        },
    ]
}

fn draw_all(dir: &Path, charts: &[Chart; 2]) -> Result<Vec<PathBuf>, ReportError> {
    let mut written = Vec::new();
    for chart in charts {
        let (svg, png) = (dir.join(format!("{}.svg", chart.quantity)), dir.join(format!("{}.png", chart.quantity)));
        chart::draw(chart, &svg, &png)?;
        written.extend([svg, png]);
    }
    Ok(written)
}

fn write_run(dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let summary = read_json(dir, "summary.json")?;
    // How the run ended, for a run without a summary: a failed run is not one still going.
    let record = read_json(dir, "run.json")?;
    let name = name_of(dir, summary.as_ref());
    let curves = read_curves(dir)?;
    let mut written = draw_all(dir, &charts(&name, &[(name.clone(), curves)]))?;
    let page = dir.join("report.html");
    std::fs::write(&page, html::run_page(&name, summary.as_ref(), record.as_ref()))
        .map_err(|e| ReportError::io(&page, e))?;
    written.push(page);
    Ok(written)
}

fn write_sweep(dir: &Path, record: &SweepRecord) -> Result<Vec<PathBuf>, ReportError> {
    let rows = results::rank(results::rows(dir, record, &BTreeMap::new()), &record.metric, record.higher_is_better);
    let mut runs = Vec::new();
    for t in &record.trials {
        // Trials not run yet have no curves; failed ones keep what they logged.
        if let Ok(curves) = read_curves(&dir.join(&t.name)) {
            runs.push((t.name.clone(), curves));
        }
    }
    let mut written = draw_all(dir, &charts(&record.name, &runs))?;
    written.extend(parallel::parallel(dir, &record.name, &rows, &record.metric)?);
    written.extend(parallel::rungs(dir, &record.name, &rows, &record.metric)?);
    let page = dir.join("report.html");
    std::fs::write(&page, html::sweep_page(record, &rows)).map_err(|e| ReportError::io(&page, e))?;
    written.push(page);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curves_come_from_step_lines_and_evaluations() {
        let Ok(dir) = tempfile::tempdir() else { panic!("no temporary folder") };
        let lines = [
            r#"{"event":"step","epoch":1,"step":10,"loss":2.0,"accuracy":0.1}"#,
            r#"{"event":"evaluation","epoch":1,"step":20,"loss":1.5,"accuracy":0.3,"val_loss":1.2,"val_accuracy":0.6}"#,
            r#"{"event":"step","epoch":1,"step":20,"loss":1.0,"accuracy":0.5}"#,
            r#"{"event":"epoch","epoch":1,"step":20,"loss":1.5,"accuracy":0.3,"val_loss":1.2,"val_accuracy":0.6}"#,
        ];
        let _ = std::fs::write(dir.path().join("metrics.jsonl"), lines.join("\n"));
        let Ok(c) = read_curves(dir.path()) else { panic!("reads") };
        assert_eq!(c.loss.0, [(10.0, 2.0), (20.0, 1.0)]);
        assert_eq!(c.accuracy.1, [(20.0, 0.6)], "one validation point per step");
        let _ = std::fs::write(dir.path().join("metrics.jsonl"), lines[3]);
        let Ok(c) = read_curves(dir.path()) else { panic!("reads") };
        assert_eq!(c.loss.0, [(20.0, 1.5)], "epochs when there are no step lines");
    }

    #[test]
    fn a_folder_without_records_is_named() {
        let Ok(dir) = tempfile::tempdir() else { panic!("no temporary folder") };
        assert!(matches!(write(dir.path()), Err(ReportError::NotAFolder(_))));
    }
}
