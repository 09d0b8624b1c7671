//! `report.html`: a self-contained page (inline CSS, the SVG plots beside it) with a run's
//! summary or a sweep's ranked results table.

use crate::spec::sweep::value_text;
use crate::sweep::results::{Row, Status, SweepRecord};
use serde_json::Value as Json;
use std::fmt::Write as _;

const STYLE: &str = "body{font-family:system-ui,-apple-system,'DejaVu Sans',sans-serif;margin:2em auto;\
max-width:1100px;color:#222;padding:0 1em}h1{font-size:1.6em}table{border-collapse:collapse;margin:1em 0;\
font-size:.92em}th,td{padding:.35em .8em;border-bottom:1px solid #ddd;text-align:left}th{background:#f4f4f4}\
td.n{text-align:right;font-variant-numeric:tabular-nums}tr.best td{background:#eef6ee}.failed{color:#b00}\
img{max-width:100%;border:1px solid #eee;margin:.5em 0}.meta{color:#666;font-size:.9em}";

/// Escapes text for HTML.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{t}</title>\n\
         <style>{STYLE}</style>\n</head>\n<body>\n<h1>{t}</h1>\n{body}\
         <h2>Loss</h2>\n<img src=\"loss.svg\" alt=\"loss against step\">\n\
         <h2>Accuracy</h2>\n<img src=\"accuracy.svg\" alt=\"accuracy against step\">\n</body>\n</html>\n",
        t = esc(title)
    )
}

fn number(v: Option<&Json>, digits: usize) -> String {
    match v.and_then(Json::as_f64) {
        Some(x) if x.fract() == 0.0 && x.abs() < 1e15 => format!("{x}"),
        Some(x) => format!("{x:.digits$}"),
        None => "–".to_string(),
    }
}

/// The page of one run: its summary (or, without one, how `record`, its `run.json`, says it
/// ended), then the plots.
pub fn run_page(name: &str, summary: Option<&Json>, record: Option<&Json>) -> String {
    let mut body = String::from("<table>\n");
    let keys = [
        ("test_accuracy", 4),
        ("test_loss", 4),
        ("train_accuracy", 4),
        ("train_loss", 4),
        ("steps", 0),
        ("examples", 0),
        ("wall_s", 1),
        ("steady_examples_per_s", 0),
    ];
    for (key, digits) in keys {
        let _ =
            writeln!(body, "<tr><th>{key}</th><td class=\"n\">{}</td></tr>", number(summary.map(|s| &s[key]), digits));
    }
    body.push_str("</table>\n");
    if summary.is_none() {
        let status = record.and_then(|r| r["status"].as_str());
        let line = match (status, record.and_then(|r| r["exit_code"].as_u64())) {
            (None | Some("running"), _) => "No summary.json: the run has not finished.".to_string(),
            (Some(status), code) => format!(
                "No summary.json: run.json says the run ended `{status}`{}{}.",
                code.map_or(String::new(), |c| format!(" (exit code {c})")),
                record.and_then(|r| r["error"].as_str()).map_or(String::new(), |e| format!(": {e}"))
            ),
        };
        let _ = writeln!(body, "<p class=\"meta\">{}</p>", esc(&line));
    }
    page(&format!("Run {name}"), &body)
}

/// The page of a sweep: what it is, the ranked results, then the plots.
pub fn sweep_page(record: &SweepRecord, rows: &[Row]) -> String {
    let order = if record.higher_is_better { "higher is better" } else { "lower is better" };
    let mut body = format!(
        "<p class=\"meta\">Spec <code>{}</code>{} · {} trials · ranked by <b>{}</b> ({order}) · sweep seed {} · \
         trainrun {} · started {}</p>\n",
        esc(&record.spec),
        record.sets.iter().map(|s| format!(" <code>--set {}</code>", esc(s))).collect::<String>(),
        record.trials.len(),
        esc(&record.metric),
        record.seed,
        esc(&record.trainrun_version),
        esc(&record.started_at),
    );
    let keys: Vec<String> = {
        let mut k: Vec<String> = rows.iter().flat_map(|r| r.trial.values.iter().map(|(k, _)| k.clone())).collect();
        k.sort();
        k.dedup();
        k
    };
    let mut columns = vec![record.metric.clone()];
    for c in ["test_accuracy", "test_loss", "train_accuracy", "train_loss"] {
        if c != record.metric {
            columns.push(c.to_string());
        }
    }
    body.push_str("<table>\n<tr><th>rank</th><th>trial</th>");
    for k in keys
        .iter()
        .chain(["seed".to_string()].iter())
        .chain(columns.iter())
        .chain(["wall_s".to_string(), "status".to_string()].iter())
    {
        let _ = write!(body, "<th>{}</th>", esc(k));
    }
    body.push_str("</tr>\n");
    let mut rank = 0;
    for row in rows {
        let ok = row.status == Status::Ok;
        let rank_text = if ok {
            rank += 1;
            rank.to_string()
        } else {
            "–".to_string()
        };
        let class = if ok && rank == 1 { " class=\"best\"" } else { "" };
        let _ = write!(body, "<tr{class}><td class=\"n\">{rank_text}</td><td>{}</td>", esc(&row.trial.name));
        for k in &keys {
            let v = row.trial.values.iter().find(|(key, _)| key == k).map_or("–".to_string(), |(_, v)| value_text(v));
            let _ = write!(body, "<td class=\"n\">{}</td>", esc(&v));
        }
        let _ = write!(body, "<td class=\"n\">{}</td>", row.trial.seed);
        for c in &columns {
            let _ = write!(body, "<td class=\"n\">{}</td>", number(row.summary.as_ref().map(|s| &s[c.as_str()]), 4));
        }
        let _ = write!(body, "<td class=\"n\">{}</td>", number(row.summary.as_ref().map(|s| &s["wall_s"]), 1));
        let status = match row.status {
            Status::Ok => "ok".to_string(),
            Status::Failed(code) => format!("<span class=\"failed\">failed (exit {code})</span>"),
            Status::Pending => "not run".to_string(),
            Status::StoppedEarly { rung, at, unit } => format!("stopped early (rung {rung}, {at} {})", unit.as_str()),
        };
        let _ = writeln!(body, "<td>{status}</td></tr>");
    }
    body.push_str(
        "</table>\n<p class=\"meta\">Solid lines: training (mean over each logging interval); \
                   dashed lines with dots: validation. The same table is in <code>results.csv</code>.</p>\n",
    );
    body.push_str(
        "<h2>Parameters against the metric</h2>\n<img src=\"parallel.svg\" alt=\"parallel coordinates of the \
         swept parameters and the metric, one line per trial\">\n",
    );
    if rows.iter().any(|r| matches!(r.status, Status::StoppedEarly { .. })) {
        body.push_str(
            "<h2>Where the scheduler stopped trials</h2>\n<img src=\"rungs.svg\" alt=\"each trial's curve of \
             the metric, marked where it stopped\">\n",
        );
    }
    page(&format!("Sweep {}", record.name), &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_and_formats() {
        assert_eq!(esc("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
        assert_eq!(number(Some(&Json::from(0.123456)), 4), "0.1235");
        assert_eq!(number(Some(&Json::from(100)), 4), "100");
        assert_eq!(number(None, 4), "–");
        let page = run_page("r<1>", None, None);
        assert!(page.contains("<title>Run r&lt;1&gt;</title>") && page.contains("loss.svg"));
        assert!(page.contains("the run has not finished"));
        let crashed = serde_json::json!({"status": "failed", "exit_code": 70, "error": "index out of bounds"});
        let page = run_page("r", None, Some(&crashed));
        assert!(page.contains("the run ended `failed` (exit code 70): index out of bounds"), "{page}");
    }
}
