//! `reduce_lr_on_plateau`: Keras's `ReduceLROnPlateau`. Multiplies the learning rate by
//! `factor` when the watched metric stops improving, down to `min_lr`, then waits `cooldown`
//! epochs before counting again.

use super::{Callback, CallbackError, Control, Logs, Restore, improved, worst};
use crate::checkpoint::manifest::float;
use crate::plan::Watch;
use crate::strategy::Variables;
use serde::{Deserialize, Serialize};

/// What it remembers across a resume.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Plateau {
    #[serde(with = "float")]
    best: f64,
    wait: u32,
    cooling: u32,
    /// Product of the reductions so far.
    #[serde(with = "float")]
    multiplier: f64,
}

/// The callback.
pub struct ReduceLrOnPlateau {
    name: String,
    watch: Watch,
    factor: f64,
    patience: u32,
    min_delta: f64,
    cooldown: u32,
    min_lr: f64,
    memory: Plateau,
}

impl ReduceLrOnPlateau {
    /// Reductions on `watch`.
    pub fn new(
        name: String,
        watch: Watch,
        factor: f64,
        patience: u32,
        min_delta: f64,
        cooldown: u32,
        min_lr: f64,
    ) -> Self {
        let memory = Plateau { best: worst(watch.direction), wait: 0, cooling: 0, multiplier: 1.0 };
        Self { name, watch, factor, patience, min_delta, cooldown, min_lr, memory }
    }
}

impl Callback for ReduceLrOnPlateau {
    fn name(&self) -> &str {
        &self.name
    }

    fn learning_rate(&self, lr: f64) -> f64 {
        if self.memory.multiplier < 1.0 { (lr * self.memory.multiplier).max(self.min_lr) } else { lr }
    }

    fn on_epoch_end(&mut self, logs: &Logs, _vars: &Variables) -> Result<Control, CallbackError> {
        let Some(current) = logs.get(self.watch.monitor) else { return Ok(Control::Continue) };
        let m = &mut self.memory;
        if m.cooling > 0 {
            m.cooling -= 1;
            m.wait = 0;
        }
        if improved(self.watch.direction, current, m.best, self.min_delta) {
            m.best = current;
            m.wait = 0;
        } else if m.cooling == 0 {
            m.wait += 1;
            if m.wait >= self.patience && logs.learning_rate > self.min_lr {
                m.multiplier *= self.factor;
                m.cooling = self.cooldown;
                m.wait = 0;
            }
        }
        Ok(Control::Continue)
    }

    fn state(&self) -> serde_json::Value {
        serde_json::to_value(self.memory).unwrap_or_default()
    }

    fn restore(&mut self, from: &Restore<'_>) -> Result<(), CallbackError> {
        if let Ok(m) = serde_json::from_value::<Plateau>(from.state.clone()) {
            self.memory = m;
        }
        Ok(())
    }
}
