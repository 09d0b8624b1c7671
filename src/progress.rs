//! Keras-style progress: an indicatif bar per epoch on a terminal, one line per epoch
//! otherwise, nothing with `--quiet`. Under the local launcher the chief streams [`Event`]s
//! to the launcher, which shows them: one display for the whole job.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// Marks a progress event line in a task's output (ASCII record separator).
pub const EVENT_MARK: char = '\u{1e}';

/// Metrics shown after the step counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Shown {
    /// Mean training loss of the epoch so far.
    pub loss: f64,
    /// Training accuracy of the epoch so far; none for float targets.
    pub accuracy: Option<f64>,
    /// Latest test-split loss and accuracy.
    pub val: Option<(f64, Option<f64>)>,
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// A live bar (stderr is a terminal).
    Bar,
    /// One line per epoch.
    Lines,
    /// Nothing.
    Quiet,
    /// [`Event`] lines on stdout, for the launcher to show.
    Events,
}

/// One thing the display shows, as the chief streams it to the launcher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Epoch `epoch` of `steps` steps begins (after `done` steps when a run resumes mid-epoch).
    StartEpoch {
        epoch: u64,
        steps: u64,
        #[serde(default)]
        done: u64,
    },
    /// `done` steps of the epoch are finished.
    Step { done: u64, shown: Shown },
    /// The epoch ended after `done` steps.
    EndEpoch { epoch: u64, done: u64, shown: Shown },
    /// A line of text (evaluation results, why training stopped).
    Note { text: String },
}

impl ProgressMode {
    /// A bar on a terminal, lines otherwise, unless `quiet`.
    pub fn detect(quiet: bool) -> Self {
        if quiet {
            ProgressMode::Quiet
        } else if std::io::stderr().is_terminal() {
            ProgressMode::Bar
        } else {
            ProgressMode::Lines
        }
    }
}

/// The display of one run.
pub struct Progress {
    mode: ProgressMode,
    epochs: u64,
    bar: Option<ProgressBar>,
    started: Instant,
    steps: u64,
    /// Steps of the epoch done before this process started (a resumed run).
    resumed: u64,
    /// Prefix for every line, e.g. `[worker:0] ` under the launcher.
    prefix: String,
}

fn metrics_text(m: &Shown) -> String {
    let mut s = format!("loss: {:.4}", m.loss);
    if let Some(a) = m.accuracy {
        s.push_str(&format!(" - accuracy: {a:.4}"));
    }
    if let Some((l, a)) = m.val {
        s.push_str(&format!(" - val_loss: {l:.4}"));
        if let Some(a) = a {
            s.push_str(&format!(" - val_accuracy: {a:.4}"));
        }
    }
    s
}

fn per_step(elapsed: Duration, steps: u64) -> String {
    let ms = elapsed.as_secs_f64() * 1e3 / steps.max(1) as f64;
    if ms >= 1.0 { format!("{ms:.0}ms/step") } else { format!("{:.0}us/step", ms * 1e3) }
}

impl Progress {
    /// A display for `epochs` epochs.
    pub fn new(mode: ProgressMode, epochs: u64, prefix: impl Into<String>) -> Self {
        Self { mode, epochs, bar: None, started: Instant::now(), steps: 0, resumed: 0, prefix: prefix.into() }
    }

    /// Starts epoch `epoch` (1-based) of `steps` steps, `done` of them already trained before
    /// a resume.
    pub fn start_epoch(&mut self, epoch: u64, steps: u64, done: u64) {
        self.show(Event::StartEpoch { epoch, steps, done });
    }

    /// Shows `done` steps of the epoch finished with running metrics `shown`.
    pub fn step(&mut self, done: u64, shown: &Shown) {
        self.show(Event::Step { done, shown: *shown });
    }

    /// Ends epoch `epoch` after `done` steps (fewer when training stops early) with its final
    /// metrics (including evaluation).
    pub fn end_epoch(&mut self, epoch: u64, done: u64, shown: &Shown) {
        self.show(Event::EndEpoch { epoch, done, shown: *shown });
    }

    /// Prints a note (evaluation results, early stop).
    pub fn note(&mut self, text: &str) {
        self.show(Event::Note { text: text.to_string() });
    }

    /// Shows `event`: draws it, or in [`ProgressMode::Events`] passes it on.
    pub fn show(&mut self, event: Event) {
        if self.mode == ProgressMode::Events {
            if let Ok(json) = serde_json::to_string(&event) {
                println!("{EVENT_MARK}{json}");
            }
            return;
        }
        match event {
            Event::StartEpoch { epoch, steps, done } => {
                self.started = Instant::now();
                self.steps = steps;
                self.resumed = done;
                if self.mode == ProgressMode::Bar {
                    let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::stderr());
                    let style = ProgressStyle::with_template("{prefix} {pos}/{len} [{bar:30}] {elapsed} {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=>.");
                    bar.set_style(style);
                    bar.set_prefix(format!("{}Epoch {epoch}/{}", self.prefix, self.epochs));
                    bar.set_position(done);
                    self.bar = Some(bar);
                }
            }
            Event::Step { done, shown } => {
                if let Some(bar) = &self.bar {
                    bar.set_position(done);
                    let timed = done.saturating_sub(self.resumed);
                    bar.set_message(format!("{} - {}", per_step(self.started.elapsed(), timed), metrics_text(&shown)));
                }
            }
            Event::EndEpoch { epoch, done, shown } => {
                let elapsed = self.started.elapsed();
                let timed = done.saturating_sub(self.resumed);
                match (self.mode, self.bar.take()) {
                    (ProgressMode::Bar, Some(bar)) => {
                        bar.set_position(done);
                        bar.set_message(format!("{} - {}", per_step(elapsed, timed), metrics_text(&shown)));
                        bar.abandon();
                    }
                    (ProgressMode::Lines, _) => println!(
                        "{}Epoch {epoch}/{} - {done}/{} - {:.1}s {} - {}",
                        self.prefix,
                        self.epochs,
                        self.steps,
                        elapsed.as_secs_f64(),
                        per_step(elapsed, timed),
                        metrics_text(&shown)
                    ),
                    _ => {}
                }
            }
            Event::Note { text } => match (&self.bar, self.mode) {
                (Some(bar), _) => bar.println(format!("{}{text}", self.prefix)),
                (None, ProgressMode::Quiet) => {}
                (None, _) => println!("{}{text}", self.prefix),
            },
        }
    }
}
