//! Callbacks that run inside the training loop, with Keras's meanings: `early_stopping`,
//! `reduce_lr_on_plateau`, `csv_logger`, `stop_at_target`. Each decides from the logs; the
//! loop acts on what they return. Their memory (best values, wait counters, the learning-rate
//! multiplier) is exported with [`Callbacks::state`] into every backup and put back by
//! [`Callbacks::new`] on resume, so a resumed run decides exactly as an uninterrupted one.

use crate::checkpoint::manifest::{CallbackState, CallbacksState};
use crate::spec::{CallbackSpec, Mode, Monitor};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Metrics after an epoch or an evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Logs {
    /// 1-based epoch.
    pub epoch: u64,
    /// Optimizer steps done.
    pub step: u64,
    /// Training loss of the epoch so far.
    pub loss: f64,
    /// Training accuracy of the epoch so far.
    pub accuracy: f64,
    /// Test-split loss, when evaluated.
    pub val_loss: Option<f64>,
    /// Test-split accuracy, when evaluated.
    pub val_accuracy: Option<f64>,
    /// Learning rate of the last step.
    pub learning_rate: f64,
}

impl Logs {
    pub(crate) fn get(&self, m: Monitor) -> Option<f64> {
        match m {
            Monitor::Loss => Some(self.loss),
            Monitor::Accuracy => Some(self.accuracy),
            Monitor::ValLoss => self.val_loss,
            Monitor::ValAccuracy => self.val_accuracy,
        }
    }
}

/// What the loop should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Keep training.
    Continue,
    /// Stop now; the reason goes into `summary.json`.
    Stop(&'static str),
    /// Stop now and put back the best weights seen (early stopping's `restore_best_weights`).
    StopAndRestore(&'static str),
    /// Remember the current weights as the best so far.
    SaveBest,
}

fn improved(mode: Mode, current: f64, best: f64, min_delta: f64) -> bool {
    match mode {
        Mode::Max => current > best + min_delta,
        Mode::Min | Mode::Auto => current < best - min_delta,
    }
}

fn worst(mode: Mode) -> f64 {
    if mode == Mode::Max { f64::NEG_INFINITY } else { f64::INFINITY }
}

enum Runtime {
    EarlyStopping {
        monitor: Monitor,
        mode: Mode,
        min_delta: f64,
        patience: u32,
        restore: bool,
        best: f64,
        wait: u32,
    },
    Plateau {
        monitor: Monitor,
        mode: Mode,
        min_delta: f64,
        patience: u32,
        factor: f64,
        cooldown: u32,
        min_lr: f64,
        best: f64,
        wait: u32,
        cooling: u32,
    },
    Csv {
        path: PathBuf,
        out: BufWriter<File>,
        /// Keras writes the header with the first row, its columns the keys of that row's logs.
        header: bool,
        /// Whether the header has `val_accuracy,val_loss` (the first row had them).
        val: bool,
    },
    Target {
        monitor: Monitor,
        target: f64,
    },
}

/// A callback could not start (its file could not be opened).
#[derive(Debug, thiserror::Error)]
#[error("callback cannot write {path}: {source}")]
pub struct CallbackError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// The run's loop callbacks and the learning-rate multiplier they control.
pub struct Callbacks {
    items: Vec<Runtime>,
    lr_multiplier: f64,
    lr_floor: f64,
}

impl Callbacks {
    /// Builds the loop callbacks among `specs` (checkpoint callbacks live elsewhere); files are
    /// relative to `run_dir`, and a task without one (a worker that is not the chief) writes none.
    /// `resume` is the state of a backup taken after `epochs_done` epochs: the callbacks take
    /// their memory back, and the CSV log keeps only the rows of those epochs.
    pub fn new(
        specs: &[CallbackSpec],
        run_dir: Option<&Path>,
        resume: Option<(&CallbacksState, u64)>,
    ) -> Result<Self, CallbackError> {
        let mut items = Vec::new();
        let mut saved = resume.map(|(s, _)| s.items.iter());
        for spec in specs {
            let state = match spec {
                CallbackSpec::ModelCheckpoint { .. } | CallbackSpec::BackupAndRestore { .. } => None,
                _ => saved.as_mut().and_then(Iterator::next).copied(),
            };
            match spec {
                CallbackSpec::EarlyStopping { monitor, min_delta, patience, mode, restore_best_weights } => {
                    let (best, wait) = match state {
                        Some(CallbackState::EarlyStopping { best, wait }) => (best, wait),
                        _ => (worst(*mode), 0),
                    };
                    items.push(Runtime::EarlyStopping {
                        monitor: *monitor,
                        mode: *mode,
                        min_delta: *min_delta,
                        patience: *patience,
                        restore: *restore_best_weights,
                        best,
                        wait,
                    })
                }
                CallbackSpec::ReduceLrOnPlateau { monitor, factor, patience, mode, min_delta, cooldown, min_lr } => {
                    let (best, wait, cooling) = match state {
                        Some(CallbackState::ReduceLrOnPlateau { best, wait, cooling }) => (best, wait, cooling),
                        _ => (worst(*mode), 0, 0),
                    };
                    items.push(Runtime::Plateau {
                        monitor: *monitor,
                        mode: *mode,
                        min_delta: *min_delta,
                        patience: *patience,
                        factor: *factor,
                        cooldown: *cooldown,
                        min_lr: *min_lr,
                        best,
                        wait,
                        cooling,
                    })
                }
                CallbackSpec::CsvLogger { filename, append } => {
                    let Some(run_dir) = run_dir else { continue };
                    let path = run_dir.join(filename);
                    let err = |source| CallbackError { path: path.clone(), source };
                    let (file, header, val) = match resume {
                        Some((_, epochs_done)) => {
                            let (header, val) = keep_rows(&path, epochs_done).map_err(err)?;
                            (OpenOptions::new().create(true).append(true).open(&path).map_err(err)?, header, val)
                        }
                        None => {
                            // Keras: appending to a file that has rows adds no second header.
                            let has_rows = *append && std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
                            let val = has_rows
                                && std::fs::read_to_string(&path)
                                    .is_ok_and(|t| t.lines().next().is_some_and(|l| l.contains("val_loss")));
                            let file = OpenOptions::new()
                                .create(true)
                                .append(*append)
                                .write(true)
                                .truncate(!*append)
                                .open(&path)
                                .map_err(err)?;
                            (file, has_rows, val)
                        }
                    };
                    items.push(Runtime::Csv { path, out: BufWriter::new(file), header, val });
                }
                CallbackSpec::StopAtTarget { monitor, target } => {
                    items.push(Runtime::Target { monitor: *monitor, target: *target })
                }
                CallbackSpec::ModelCheckpoint { .. } | CallbackSpec::BackupAndRestore { .. } => {}
            }
        }
        let (lr_multiplier, lr_floor) = resume.map_or((1.0, 0.0), |(s, _)| (s.lr_multiplier, s.lr_floor));
        Ok(Self { items, lr_multiplier, lr_floor })
    }

    /// Everything the callbacks remember, for a backup.
    pub fn state(&self) -> CallbacksState {
        let items = self
            .items
            .iter()
            .map(|item| match item {
                Runtime::EarlyStopping { best, wait, .. } => CallbackState::EarlyStopping { best: *best, wait: *wait },
                Runtime::Plateau { best, wait, cooling, .. } => {
                    CallbackState::ReduceLrOnPlateau { best: *best, wait: *wait, cooling: *cooling }
                }
                Runtime::Csv { header, .. } => CallbackState::CsvLogger { header: *header },
                Runtime::Target { .. } => CallbackState::StopAtTarget,
            })
            .collect();
        CallbacksState {
            items,
            lr_multiplier: self.lr_multiplier,
            lr_floor: self.lr_floor,
            checkpoint_best: Vec::new(),
        }
    }

    /// The learning rate to use where the schedule says `scheduled`.
    pub fn learning_rate(&self, scheduled: f64) -> f64 {
        if self.lr_multiplier < 1.0 { (scheduled * self.lr_multiplier).max(self.lr_floor) } else { scheduled }
    }

    /// After a step-interval evaluation: only targets act mid-epoch, as in Keras.
    pub fn on_evaluation(&mut self, logs: &Logs) -> Control {
        for item in &self.items {
            if let Runtime::Target { monitor, target } = item
                && reached(*monitor, logs, *target)
            {
                return Control::Stop("target_reached");
            }
        }
        Control::Continue
    }

    /// At an epoch's end. Returns every decision, in callback order.
    pub fn on_epoch_end(&mut self, logs: &Logs) -> Result<Vec<Control>, CallbackError> {
        let mut out = Vec::new();
        let (mut multiplier, mut floor) = (self.lr_multiplier, self.lr_floor);
        for item in &mut self.items {
            match item {
                Runtime::EarlyStopping { monitor, mode, min_delta, patience, restore, best, wait } => {
                    let Some(current) = logs.get(*monitor) else { continue };
                    // Keras counts the epoch first, then resets on improvement.
                    *wait += 1;
                    if improved(*mode, current, *best, *min_delta) {
                        *best = current;
                        *wait = 0;
                        if *restore {
                            out.push(Control::SaveBest);
                        }
                    } else if *wait >= *patience && logs.epoch > 1 {
                        out.push(if *restore {
                            Control::StopAndRestore("early_stopping")
                        } else {
                            Control::Stop("early_stopping")
                        });
                    }
                }
                Runtime::Plateau {
                    monitor,
                    mode,
                    min_delta,
                    patience,
                    factor,
                    cooldown,
                    min_lr,
                    best,
                    wait,
                    cooling,
                } => {
                    let Some(current) = logs.get(*monitor) else { continue };
                    if *cooling > 0 {
                        *cooling -= 1;
                        *wait = 0;
                    }
                    if improved(*mode, current, *best, *min_delta) {
                        *best = current;
                        *wait = 0;
                    } else if *cooling == 0 {
                        *wait += 1;
                        if *wait >= *patience && logs.learning_rate > *min_lr {
                            multiplier *= *factor;
                            floor = floor.max(*min_lr);
                            *cooling = *cooldown;
                            *wait = 0;
                        }
                    }
                }
                Runtime::Csv { path, out: file, header, val } => {
                    let err = |source| CallbackError { path: path.clone(), source };
                    if !*header {
                        // Keras's columns: `epoch`, then the first row's log keys, sorted.
                        *val = logs.val_loss.is_some() || logs.val_accuracy.is_some();
                        let extra = if *val { ",val_accuracy,val_loss" } else { "" };
                        writeln!(file, "epoch,accuracy,learning_rate,loss{extra}").map_err(err)?;
                        *header = true;
                    }
                    // Keras writes `NA` for a column a later row lacks.
                    let opt = |v: Option<f64>| v.map_or("NA".to_string(), |v| v.to_string());
                    let mut row = format!("{},{},{},{}", logs.epoch - 1, logs.accuracy, logs.learning_rate, logs.loss);
                    if *val {
                        row.push_str(&format!(",{},{}", opt(logs.val_accuracy), opt(logs.val_loss)));
                    }
                    writeln!(file, "{row}").and_then(|_| file.flush()).map_err(err)?;
                }
                Runtime::Target { monitor, target } => {
                    if reached(*monitor, logs, *target) {
                        out.push(Control::Stop("target_reached"));
                    }
                }
            }
        }
        self.lr_multiplier = multiplier;
        self.lr_floor = floor;
        Ok(out)
    }
}

/// Keeps the header and the rows of the first `epochs` epochs of a CSV log (a resumed run
/// writes the later ones again). Returns whether it has a header, and whether it has
/// validation columns.
fn keep_rows(path: &Path, epochs: u64) -> std::io::Result<(bool, bool)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((false, false)),
        Err(e) => return Err(e),
    };
    let mut lines = text.lines();
    let Some(header) = lines.next() else { return Ok((false, false)) };
    let mut kept = format!("{header}\n");
    for line in lines {
        let epoch = line.split(',').next().and_then(|e| e.parse::<u64>().ok());
        if epoch.is_some_and(|e| e < epochs) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let tmp = path.with_extension("csv.tmp");
    std::fs::write(&tmp, kept)?;
    std::fs::rename(&tmp, path)?;
    Ok((true, header.contains("val_loss")))
}

fn reached(monitor: Monitor, logs: &Logs, target: f64) -> bool {
    match (monitor, logs.get(monitor)) {
        (Monitor::Loss | Monitor::ValLoss, Some(v)) => v <= target,
        (Monitor::Accuracy | Monitor::ValAccuracy, Some(v)) => v >= target,
        (_, None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs(epoch: u64, val_loss: f64) -> Logs {
        Logs {
            epoch,
            step: epoch * 10,
            loss: 1.0,
            accuracy: 0.5,
            val_loss: Some(val_loss),
            val_accuracy: Some(0.9),
            learning_rate: 0.1,
        }
    }

    #[test]
    fn early_stopping_waits_patience_epochs() {
        let spec = CallbackSpec::EarlyStopping {
            monitor: Monitor::ValLoss,
            min_delta: 0.0,
            patience: 2,
            mode: Mode::Min,
            restore_best_weights: false,
        };
        let mut cb = Callbacks::new(&[spec], Some(Path::new(".")), None).unwrap();
        assert!(cb.on_epoch_end(&logs(1, 1.0)).unwrap().is_empty());
        assert!(cb.on_epoch_end(&logs(2, 1.1)).unwrap().is_empty());
        assert_eq!(cb.on_epoch_end(&logs(3, 1.2)).unwrap(), vec![Control::Stop("early_stopping")]);
    }

    #[test]
    fn plateau_multiplies_the_rate_and_respects_the_floor() {
        let spec = CallbackSpec::ReduceLrOnPlateau {
            monitor: Monitor::ValLoss,
            factor: 0.5,
            patience: 1,
            mode: Mode::Min,
            min_delta: 0.0,
            cooldown: 0,
            min_lr: 0.03,
        };
        let mut cb = Callbacks::new(&[spec], Some(Path::new(".")), None).unwrap();
        cb.on_epoch_end(&logs(1, 1.0)).unwrap();
        cb.on_epoch_end(&logs(2, 1.0)).unwrap();
        assert_eq!(cb.learning_rate(0.1), 0.05);
        cb.on_epoch_end(&logs(3, 1.0)).unwrap();
        cb.on_epoch_end(&logs(4, 1.0)).unwrap();
        assert_eq!(cb.learning_rate(0.1), 0.03);
    }

    #[test]
    fn target_stops_mid_epoch() {
        let spec = CallbackSpec::StopAtTarget { monitor: Monitor::ValAccuracy, target: 0.9 };
        let mut cb = Callbacks::new(&[spec], Some(Path::new(".")), None).unwrap();
        assert_eq!(cb.on_evaluation(&logs(1, 0.5)), Control::Stop("target_reached"));
    }

    #[test]
    fn a_restored_callback_decides_as_the_original_would() {
        let spec = CallbackSpec::ReduceLrOnPlateau {
            monitor: Monitor::ValLoss,
            factor: 0.5,
            patience: 2,
            mode: Mode::Min,
            min_delta: 0.0,
            cooldown: 1,
            min_lr: 0.0,
        };
        let stop = CallbackSpec::EarlyStopping {
            monitor: Monitor::ValLoss,
            min_delta: 0.0,
            patience: 3,
            mode: Mode::Min,
            restore_best_weights: false,
        };
        let specs = [spec, stop];
        let losses = [1.0, 1.1, 1.2, 0.9, 1.3, 1.4, 1.5, 1.6];
        let mut straight = Callbacks::new(&specs, None, None).unwrap();
        let mut decisions = Vec::new();
        for (i, &l) in losses.iter().enumerate() {
            decisions.push((straight.on_epoch_end(&logs(i as u64 + 1, l)).unwrap(), straight.learning_rate(0.1)));
        }
        for cut in 1..losses.len() {
            let mut first = Callbacks::new(&specs, None, None).unwrap();
            for (i, &l) in losses[..cut].iter().enumerate() {
                first.on_epoch_end(&logs(i as u64 + 1, l)).unwrap();
            }
            let state = first.state();
            let mut resumed = Callbacks::new(&specs, None, Some((&state, cut as u64))).unwrap();
            for (i, &l) in losses.iter().enumerate().skip(cut) {
                let got = (resumed.on_epoch_end(&logs(i as u64 + 1, l)).unwrap(), resumed.learning_rate(0.1));
                assert_eq!(got, decisions[i], "resumed after {cut} epochs, epoch {}", i + 1);
            }
        }
    }

    #[test]
    fn csv_columns_follow_the_first_row_and_a_resume_keeps_earlier_rows() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CallbackSpec::CsvLogger { filename: "log.csv".into(), append: false };
        let no_val = |epoch| Logs { val_loss: None, val_accuracy: None, ..logs(epoch, 0.0) };
        let mut cb = Callbacks::new(std::slice::from_ref(&spec), Some(dir.path()), None).unwrap();
        for e in 1..=3 {
            cb.on_epoch_end(&no_val(e)).unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join("log.csv")).unwrap();
        assert_eq!(text.lines().next(), Some("epoch,accuracy,learning_rate,loss"));
        assert_eq!(text.lines().count(), 4);
        let state = cb.state();
        drop(cb);
        let mut cb = Callbacks::new(&[spec], Some(dir.path()), Some((&state, 2))).unwrap();
        cb.on_epoch_end(&no_val(3)).unwrap();
        let again = std::fs::read_to_string(dir.path().join("log.csv")).unwrap();
        assert_eq!(again, text, "epoch 3 is written once, after epochs 0 and 1");
    }
}
