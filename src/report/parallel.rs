//! Seeing a sweep at once: `parallel.svg`/`.png`, a parallel-coordinates plot with one axis
//! per swept key and a last one for the metric, each trial a line through its values, named
//! at the metric's axis; and, for a scheduler's sweep, `rungs.svg`/`.png`, each trial's
//! validation curve of the metric with a mark and its rung where the scheduler stopped it.
//! Written as SVG text (a few lines and labels need no plotting library), rendered to PNG as
//! the line charts are.

use super::ReportError;
use super::chart::{SIZE, colour, rasterize};
use crate::spec::sweep::value_text;
use crate::sweep::results::{Row, Status};
use serde_json::Value as Json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Room around the plot: left, right (trial names), top (title, axis names), bottom (ticks).
const MARGIN: (f64, f64, f64, f64) = (60.0, 230.0, 80.0, 40.0);

/// Where a trial crosses one axis, 0 (bottom) to 1 (top), or nowhere (no value).
type Crossing = Option<f64>;

/// One vertical axis: its name, its tick labels (position, text) and each trial's crossing.
struct Axis {
    name: String,
    ticks: Vec<(f64, String)>,
    crossings: Vec<Crossing>,
}

/// An axis of numbers (log-scaled when they are positive and span 20× or more), or of names in
/// the order they first appear.
fn axis(name: &str, values: &[Option<Json>]) -> Axis {
    let numbers: Vec<Option<f64>> = values.iter().map(|v| v.as_ref().and_then(Json::as_f64)).collect();
    let all_numbers = values.iter().zip(&numbers).all(|(v, n)| v.is_none() || n.is_some());
    if all_numbers {
        let known: Vec<f64> = numbers.iter().flatten().copied().filter(|x| x.is_finite()).collect();
        let (lo, hi) = known.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &x| (l.min(x), h.max(x)));
        let log = lo > 0.0 && hi / lo >= 20.0;
        let scale = |x: f64| if log { x.ln() } else { x };
        let (a, b) = (scale(lo), scale(hi));
        let at = |x: f64| if (b - a).abs() < 1e-300 || !a.is_finite() { 0.5 } else { (scale(x) - a) / (b - a) };
        let mut distinct: Vec<f64> = known.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        // Every distinct value is a tick when few; else the ends and the middle.
        let ticks: Vec<f64> = if distinct.len() <= 8 {
            distinct
        } else {
            vec![lo, if log { (a + (b - a) / 2.0).exp() } else { (lo + hi) / 2.0 }, hi]
        };
        return Axis {
            name: name.to_string(),
            ticks: ticks.into_iter().map(|t| (at(t), short(t))).collect(),
            crossings: numbers.iter().map(|n| n.filter(|x| x.is_finite()).map(at)).collect(),
        };
    }
    let mut names: Vec<String> = Vec::new();
    for v in values.iter().flatten() {
        let t = value_text(v);
        if !names.contains(&t) {
            names.push(t);
        }
    }
    let at = |i: usize| if names.len() < 2 { 0.5 } else { i as f64 / (names.len() - 1) as f64 };
    let crossings = values
        .iter()
        .map(|v| v.as_ref().and_then(|v| names.iter().position(|n| *n == value_text(v))).map(at))
        .collect();
    Axis {
        name: name.to_string(),
        ticks: names.iter().enumerate().map(|(i, n)| (at(i), n.clone())).collect(),
        crossings,
    }
}

/// A number as a tick shows it: four significant digits.
fn short(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e9 {
        return format!("{x}");
    }
    let text = format!("{x:.4e}");
    let plain = format!("{}", (x * 1e4).round() / 1e4);
    if x.abs() >= 1e-3 { plain } else { text }
}

fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn svg_open(title: &str) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" \
         font-family=\"sans-serif\">\n<rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text class=\"title\" x=\"{x}\" y=\"32\" font-size=\"24\" text-anchor=\"middle\">{t}</text>\n",
        w = SIZE.0,
        h = SIZE.1,
        x = SIZE.0 / 2,
        t = esc(title)
    )
}

/// Writes `text` as `<stem>.svg` and `<stem>.png` in `dir`.
fn write_both(dir: &Path, stem: &str, text: &str) -> Result<Vec<PathBuf>, ReportError> {
    let (svg, png) = (dir.join(format!("{stem}.svg")), dir.join(format!("{stem}.png")));
    std::fs::write(&svg, text).map_err(|e| ReportError::io(&svg, e))?;
    let bytes = rasterize(text)?;
    std::fs::write(&png, bytes).map_err(|e| ReportError::io(&png, e))?;
    Ok(vec![svg, png])
}

/// How a trial's line looks: its colour, and dashed when it did not run to its end.
fn stroke(i: usize, row: &Row) -> (String, &'static str) {
    match row.status {
        Status::Ok => (colour(i), ""),
        Status::StoppedEarly { .. } => (colour(i), " stroke-dasharray=\"8 5\""),
        Status::Failed(_) | Status::Pending => ("#b0b0b0".to_string(), " stroke-dasharray=\"2 4\""),
    }
}

/// A trial's line through `points` (pixels), named by its trial.
fn polyline(out: &mut String, row: &Row, points: &[(f64, f64)]) {
    let (colour, dash) = stroke(row.trial.index.saturating_sub(1), row);
    let p: Vec<String> = points.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let _ = writeln!(
        out,
        "<polyline class=\"trial\" data-trial=\"{n}\" points=\"{p}\" fill=\"none\" stroke=\"{colour}\" \
         stroke-width=\"2\" opacity=\"0.85\"{dash}/>",
        n = esc(&row.trial.name),
        p = p.join(" ")
    );
}

/// Draws `parallel.svg`/`.png` of `rows` (ranked) against `metric`.
pub fn parallel(dir: &Path, title: &str, rows: &[Row], metric: &str) -> Result<Vec<PathBuf>, ReportError> {
    let mut keys: Vec<String> = rows.iter().flat_map(|r| r.trial.values.iter().map(|(k, _)| k.clone())).collect();
    keys.sort();
    keys.dedup();
    let mut axes: Vec<Axis> = keys
        .iter()
        .map(|k| {
            let values: Vec<Option<Json>> =
                rows.iter().map(|r| r.trial.values.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())).collect();
            axis(k, &values)
        })
        .collect();
    let scores: Vec<Option<Json>> = rows.iter().map(|r| r.get(metric).map(Json::from)).collect();
    axes.push(axis(metric, &scores));
    let (left, right, top, bottom) = MARGIN;
    let (w, h) = (f64::from(SIZE.0) - left - right, f64::from(SIZE.1) - top - bottom);
    let x = |i: usize| if axes.len() < 2 { left + w / 2.0 } else { left + w * i as f64 / (axes.len() - 1) as f64 };
    let y = |pos: f64| top + (1.0 - pos) * h;
    let mut out = svg_open(&format!("{title}: parameters against {metric}"));
    for (i, a) in axes.iter().enumerate() {
        let _ = writeln!(
            out,
            "<g class=\"axis\"><line x1=\"{x:.1}\" y1=\"{top}\" x2=\"{x:.1}\" y2=\"{b}\" stroke=\"#444\"/>\
             <text class=\"axis-name\" x=\"{x:.1}\" y=\"{ty}\" font-size=\"15\" text-anchor=\"middle\">{n}</text>",
            x = x(i),
            b = top + h,
            ty = top - 18.0,
            n = esc(&a.name)
        );
        for (pos, label) in &a.ticks {
            let _ = writeln!(
                out,
                "<text class=\"tick\" x=\"{tx:.1}\" y=\"{ty:.1}\" font-size=\"12\" text-anchor=\"end\" fill=\"#555\">{l}</text>",
                tx = x(i) - 6.0,
                ty = y(*pos) + 4.0,
                l = esc(label)
            );
        }
        out.push_str("</g>\n");
    }
    for (t, row) in rows.iter().enumerate() {
        let points: Vec<(f64, f64)> =
            axes.iter().enumerate().filter_map(|(i, a)| a.crossings[t].map(|p| (x(i), y(p)))).collect();
        polyline(&mut out, row, &points);
    }
    // Each trial named beside the metric's axis, where its line ends (or at the bottom).
    let last = axes.len() - 1;
    let mut labels: Vec<(f64, String, String)> = rows
        .iter()
        .enumerate()
        .map(|(t, row)| {
            let pos = axes[last].crossings[t].unwrap_or(0.0);
            let value = row.get(metric).map_or("–".to_string(), short);
            (y(pos), format!("{} ({value})", row.trial.name), stroke(row.trial.index.saturating_sub(1), row).0)
        })
        .collect();
    labels.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Labels a line apart, so close values stay readable.
    let mut floor = f64::NEG_INFINITY;
    for (ly, text, colour) in labels {
        let ly = ly.max(floor + 14.0);
        floor = ly;
        let _ = writeln!(
            out,
            "<text class=\"trial-name\" x=\"{lx:.1}\" y=\"{yy:.1}\" font-size=\"12\" fill=\"{colour}\">{t}</text>",
            lx = x(last) + 10.0,
            yy = ly + 4.0,
            t = esc(&text)
        );
    }
    out.push_str("</svg>\n");
    write_both(dir, "parallel", &out)
}

/// A trial's validation curve of `metric` from its `metrics.jsonl`: (step, value), one per
/// step. The test split's values are logged as `val_*` too.
fn curve(dir: &Path, metric: &str) -> Vec<(f64, f64)> {
    let key = metric.strip_prefix("test_").map_or(metric.to_string(), |m| format!("val_{m}"));
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    let mut points: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().filter_map(|l| serde_json::from_str::<Json>(l).ok()) {
        if let (Some(step), Some(v)) = (line["step"].as_f64(), line[key.as_str()].as_f64())
            && points.last().is_none_or(|p| p.0 != step)
        {
            points.push((step, v));
        }
    }
    points
}

/// Draws `rungs.svg`/`.png` when a scheduler stopped some trial: every trial's curve of
/// `metric`, and where each stopped trial stopped, with its rung. None for other sweeps.
pub fn rungs(dir: &Path, title: &str, rows: &[Row], metric: &str) -> Result<Vec<PathBuf>, ReportError> {
    if !rows.iter().any(|r| matches!(r.status, Status::StoppedEarly { .. })) {
        return Ok(Vec::new());
    }
    let curves: Vec<Vec<(f64, f64)>> = rows.iter().map(|r| curve(&dir.join(&r.trial.name), metric)).collect();
    let all = || curves.iter().flatten();
    let max_x = all().map(|p| p.0).fold(1.0f64, f64::max);
    let (lo, hi) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), p| (l.min(p.1), h.max(p.1)));
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (lo.min(0.0), lo.max(0.0) + 1.0) };
    let (left, right, top, bottom) = MARGIN;
    let (w, h) = (f64::from(SIZE.0) - left - right, f64::from(SIZE.1) - top - bottom);
    let px = |s: f64| left + w * s / (max_x * 1.02);
    let py = |v: f64| top + h * (1.0 - (v - lo) / (hi - lo));
    let mut out = svg_open(&format!("{title}: {metric} of each trial, and where the scheduler stopped it"));
    let _ = writeln!(
        out,
        "<g class=\"frame\"><rect x=\"{left}\" y=\"{top}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#444\"/>\
         <text x=\"{cx}\" y=\"{by}\" font-size=\"14\" text-anchor=\"middle\">step</text>\
         <text x=\"{left}\" y=\"{ty}\" font-size=\"14\">{m}</text>\
         <text x=\"{left}\" y=\"{ly}\" font-size=\"12\" text-anchor=\"end\">{lo}</text>\
         <text x=\"{left}\" y=\"{hy}\" font-size=\"12\" text-anchor=\"end\">{hi}</text>\
         <text x=\"{rx}\" y=\"{ly}\" font-size=\"12\" text-anchor=\"end\">{mx}</text></g>",
        cx = left + w / 2.0,
        by = top + h + 30.0,
        ty = top - 10.0,
        m = esc(metric),
        ly = top + h + 14.0,
        hy = top + 4.0,
        lo = short(lo),
        hi = short(hi),
        rx = left + w,
        mx = short(max_x)
    );
    for (row, points) in rows.iter().zip(&curves) {
        let colour = stroke(row.trial.index.saturating_sub(1), row).0;
        polyline(&mut out, row, &points.iter().map(|&(s, v)| (px(s), py(v))).collect::<Vec<_>>());
        let Some(&(s, v)) = points.last() else { continue };
        let note = match row.status {
            Status::StoppedEarly { rung, .. } => format!("{}: stopped at rung {rung}", row.trial.name),
            Status::Ok => format!("{}: ran to the end", row.trial.name),
            Status::Failed(code) => format!("{}: failed (exit {code})", row.trial.name),
            Status::Pending => format!("{}: not run", row.trial.name),
        };
        let _ = writeln!(
            out,
            "<g class=\"end\" data-trial=\"{n}\"><circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"5\" fill=\"{colour}\"/>\
             <text x=\"{tx:.1}\" y=\"{ty:.1}\" font-size=\"12\" fill=\"{colour}\">{t}</text></g>",
            n = esc(&row.trial.name),
            x = px(s),
            y = py(v),
            tx = px(s) + 8.0,
            ty = py(v) + 4.0,
            t = esc(&note)
        );
    }
    out.push_str("</svg>\n");
    write_both(dir, "rungs", &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn axes_scale_numbers_log_when_they_span_decades_and_list_names_in_order() {
        let a = axis("lr", &[Some(json!(0.001)), Some(json!(0.1)), None]);
        assert_eq!(a.crossings, vec![Some(0.0), Some(1.0), None]);
        let b = axis("lr", &[Some(json!(0.001)), Some(json!(0.01)), Some(json!(0.1))]);
        assert!((b.crossings[1].unwrap_or_default() - 0.5).abs() < 1e-9, "log: the middle decade in the middle");
        let c = axis("opt", &[Some(json!("sgd")), Some(json!("adam")), Some(json!("sgd"))]);
        assert_eq!(c.crossings, vec![Some(0.0), Some(1.0), Some(0.0)]);
        assert_eq!(c.ticks.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(), ["sgd", "adam"]);
    }
}
