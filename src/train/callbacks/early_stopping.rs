//! `early_stopping`: Keras's `EarlyStopping`. Stops when the watched metric has not improved
//! for `patience` epochs, optionally putting back the best weights seen.

use super::{Callback, CallbackError, Control, Logs, Restore, StopReason, improved, worst};
use crate::checkpoint::manifest::float;
use crate::plan::Watch;
use crate::strategy::Variables;
use serde::{Deserialize, Serialize};

/// What it remembers across a resume.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct BestAndWait {
    #[serde(with = "float")]
    best: f64,
    wait: u32,
}

/// The callback.
pub struct EarlyStopping {
    name: String,
    watch: Watch,
    min_delta: f64,
    patience: u32,
    restore_best: bool,
    memory: BestAndWait,
    /// The weights at the best value, when `restore_best_weights`.
    best_vars: Option<Variables>,
}

impl EarlyStopping {
    /// Early stopping on `watch`.
    pub fn new(name: String, watch: Watch, min_delta: f64, patience: u32, restore_best: bool) -> Self {
        let memory = BestAndWait { best: worst(watch.direction), wait: 0 };
        Self { name, watch, min_delta, patience, restore_best, memory, best_vars: None }
    }
}

impl Callback for EarlyStopping {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_epoch_end(&mut self, logs: &Logs, vars: &Variables) -> Result<Control, CallbackError> {
        let Some(current) = logs.get(self.watch.monitor) else { return Ok(Control::Continue) };
        let m = &mut self.memory;
        // Keras counts the epoch first, then resets on improvement.
        m.wait += 1;
        if improved(self.watch.direction, current, m.best, self.min_delta) {
            m.best = current;
            m.wait = 0;
            if self.restore_best {
                match &mut self.best_vars {
                    Some(b) => b.clone_from(vars),
                    None => self.best_vars = Some(vars.clone()),
                }
            }
        } else if m.wait >= self.patience && logs.epoch > 1 {
            return Ok(if self.restore_best {
                Control::StopAndRestore(StopReason::EarlyStopping)
            } else {
                Control::Stop(StopReason::EarlyStopping)
            });
        }
        Ok(Control::Continue)
    }

    fn state(&self) -> serde_json::Value {
        serde_json::to_value(self.memory).unwrap_or_default()
    }

    fn restore(&mut self, from: &Restore<'_>) -> Result<(), CallbackError> {
        if let Ok(m) = serde_json::from_value::<BestAndWait>(from.state.clone()) {
            self.memory = m;
        }
        if self.restore_best {
            self.best_vars = from.best.cloned();
        }
        Ok(())
    }

    fn best_weights(&self) -> Option<&Variables> {
        self.best_vars.as_ref()
    }
}
