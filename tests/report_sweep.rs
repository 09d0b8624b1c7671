//! Seeing a sweep: `trainrun report SWEEP_DIR` on a real grid sweep (4 trials) and a real
//! successive-halving sweep draws the parallel-coordinates plot of the swept parameters
//! against the metric (`parallel.svg`/`.png`) and, for the scheduler's sweep, each trial's curve
//! with the rung where it stopped (`rungs.svg`/`.png`); `report.html` shows them. The SVGs'
//! structure is snapshotted (elements, classes, trials and texts with numbers masked), not
//! their pixels.

mod common;

use common::{assert_exit, run, tempdir, text};
use std::path::Path;

/// The elements of an SVG with their class, trial and text, numbers masked as `#`: what the
/// picture says, not where it draws it.
fn structure(svg: &str) -> String {
    let mut out = String::new();
    for part in svg.split('<').skip(1) {
        let (tag, rest) = part.split_once('>').unwrap_or((part, ""));
        if tag.starts_with('/') {
            continue;
        }
        let name = tag.split_whitespace().next().unwrap_or_default().trim_end_matches('/');
        let attr =
            |key: &str| tag.split(&format!("{key}=\"")).nth(1).and_then(|v| v.split('"').next()).map(str::to_string);
        let mut line = name.to_string();
        for key in ["class", "data-trial"] {
            if let Some(v) = attr(key) {
                line.push_str(&format!(" {key}={v}"));
            }
        }
        let body = rest.trim();
        if !body.is_empty() {
            let masked: String = body.chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
            // Runs of masked digits (and their points) read as one number.
            let mut squeezed = String::new();
            for c in masked.chars() {
                if !(matches!(c, '#' | '.') && squeezed.ends_with('#')) {
                    squeezed.push(c);
                }
            }
            line.push_str(&format!(" \"{squeezed}\""));
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn report(dir: &Path) {
    let out = run(&["report", &dir.display().to_string()]);
    assert_exit(&out, 0);
    let stdout = text(&out).0;
    for file in ["parallel.svg", "parallel.png", "report.html"] {
        assert!(dir.join(file).is_file() && stdout.contains(file), "{file} missing:\n{stdout}");
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_grid_sweeps_report_draws_its_parameters_against_the_metric_naming_every_trial() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    let sets = [
        "--set",
        "train.steps_per_epoch=20",
        "--set",
        "train.evaluate_every_steps=10",
        "--set",
        "run.log_every_steps=5",
    ];
    let mut args = vec!["sweep", "specs/mnist_sweep.toml", "-q", "--set", &o];
    args.extend(sets);
    assert_exit(&run(&args), 0);
    report(dir.path());
    let svg = read(&dir.path().join("parallel.svg"));
    let trials = [
        "trial-001-batch32-lr0.01",
        "trial-002-batch32-lr0.05",
        "trial-003-batch64-lr0.01",
        "trial-004-batch64-lr0.05",
    ];
    for t in trials {
        assert_eq!(svg.matches(&format!("data-trial=\"{t}\"")).count(), 1, "one line for {t}");
        assert!(svg.contains(&format!(">{t} (")), "{t} named at the metric's axis");
    }
    assert!(!dir.path().join("rungs.svg").exists(), "no scheduler, no rungs");
    let html = read(&dir.path().join("report.html"));
    assert!(html.contains("<img src=\"parallel.svg\"") && !html.contains("rungs.svg"));
    insta::assert_snapshot!("grid_parallel", structure(&svg));
}

#[test]
fn a_halving_sweeps_report_marks_the_rung_where_each_stopped_trial_stopped() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().display());
    assert_exit(&run(&["sweep", "tests/fixtures/sweeps/mnist_halving.toml", "-q", "--set", &o]), 0);
    report(dir.path());
    let rungs = read(&dir.path().join("rungs.svg"));
    assert!(dir.path().join("rungs.png").is_file());
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("metrics.jsonl").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for n in &names {
        assert!(rungs.contains(&format!("data-trial=\"{n}\"")), "{n} has a curve");
        assert!(read(&dir.path().join("parallel.svg")).contains(&format!("data-trial=\"{n}\"")));
    }
    assert_eq!(rungs.matches(": stopped at rung 1<").count(), 2, "two trials stopped at the first rung:\n{rungs}");
    assert_eq!(rungs.matches(": ran to the end<").count(), 1);
    let html = read(&dir.path().join("report.html"));
    assert!(html.contains("<img src=\"rungs.svg\"") && html.contains("<img src=\"parallel.svg\""));
    insta::assert_snapshot!("halving_rungs", structure(&rungs));
}
