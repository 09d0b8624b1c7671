//! Callbacks that run inside the training loop, with Keras's meanings: `early_stopping`,
//! `reduce_lr_on_plateau`, `csv_logger`, `stop_at_target`. Each decides from the logs; the
//! loop acts on what they return.

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
    fn get(&self, m: Monitor) -> Option<f64> {
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
    pub fn new(specs: &[CallbackSpec], run_dir: Option<&Path>) -> Result<Self, CallbackError> {
        let mut items = Vec::new();
        for spec in specs {
            match spec {
                CallbackSpec::EarlyStopping { monitor, min_delta, patience, mode, restore_best_weights } => {
                    items.push(Runtime::EarlyStopping {
                        monitor: *monitor,
                        mode: *mode,
                        min_delta: *min_delta,
                        patience: *patience,
                        restore: *restore_best_weights,
                        best: worst(*mode),
                        wait: 0,
                    })
                }
                CallbackSpec::ReduceLrOnPlateau { monitor, factor, patience, mode, min_delta, cooldown, min_lr } => {
                    items.push(Runtime::Plateau {
                        monitor: *monitor,
                        mode: *mode,
                        min_delta: *min_delta,
                        patience: *patience,
                        factor: *factor,
                        cooldown: *cooldown,
                        min_lr: *min_lr,
                        best: worst(*mode),
                        wait: 0,
                        cooling: 0,
                    })
                }
                CallbackSpec::CsvLogger { filename, append } => {
                    let Some(run_dir) = run_dir else { continue };
                    let path = run_dir.join(filename);
                    let fresh = !*append || !path.exists();
                    let file = OpenOptions::new()
                        .create(true)
                        .append(*append)
                        .write(true)
                        .truncate(!*append)
                        .open(&path)
                        .map_err(|source| CallbackError { path: path.clone(), source })?;
                    let mut out = BufWriter::new(file);
                    if fresh {
                        writeln!(out, "epoch,accuracy,learning_rate,loss,val_accuracy,val_loss")
                            .map_err(|source| CallbackError { path: path.clone(), source })?;
                    }
                    items.push(Runtime::Csv { path, out });
                }
                CallbackSpec::StopAtTarget { monitor, target } => {
                    items.push(Runtime::Target { monitor: *monitor, target: *target })
                }
                CallbackSpec::ModelCheckpoint { .. } | CallbackSpec::BackupAndRestore { .. } => {}
            }
        }
        Ok(Self { items, lr_multiplier: 1.0, lr_floor: 0.0 })
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
                Runtime::Csv { path, out: file } => {
                    let opt = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
                    writeln!(
                        file,
                        "{},{},{},{},{},{}",
                        logs.epoch - 1,
                        logs.accuracy,
                        logs.learning_rate,
                        logs.loss,
                        opt(logs.val_accuracy),
                        opt(logs.val_loss)
                    )
                    .and_then(|_| file.flush())
                    .map_err(|source| CallbackError { path: path.clone(), source })?;
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
        let mut cb = Callbacks::new(&[spec], Some(Path::new("."))).unwrap();
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
        let mut cb = Callbacks::new(&[spec], Some(Path::new("."))).unwrap();
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
        let mut cb = Callbacks::new(&[spec], Some(Path::new("."))).unwrap();
        assert_eq!(cb.on_evaluation(&logs(1, 0.5)), Control::Stop("target_reached"));
    }
}
