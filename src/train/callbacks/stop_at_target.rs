//! `stop_at_target`: stops as soon as an evaluation reaches a target (time-to-accuracy runs),
//! mid-epoch as well as at an epoch's end.

use super::{Callback, CallbackError, Control, Logs, StopReason};
use crate::strategy::Variables;
use crate::vocab::Monitor;

/// The callback.
pub struct StopAtTarget {
    name: String,
    monitor: Monitor,
    target: f64,
}

impl StopAtTarget {
    /// Stops when `monitor` reaches `target`.
    pub fn new(name: String, monitor: Monitor, target: f64) -> Self {
        Self { name, monitor, target }
    }

    fn decide(&self, logs: &Logs) -> Control {
        let reached = match (self.monitor, logs.get(self.monitor)) {
            (Monitor::Loss | Monitor::ValLoss, Some(v)) => v <= self.target,
            (Monitor::Accuracy | Monitor::ValAccuracy, Some(v)) => v >= self.target,
            (_, None) => false,
        };
        if reached { Control::Stop(StopReason::TargetReached) } else { Control::Continue }
    }
}

impl Callback for StopAtTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn on_evaluation(&mut self, logs: &Logs) -> Control {
        self.decide(logs)
    }

    fn on_epoch_end(&mut self, logs: &Logs, _vars: &Variables) -> Result<Control, CallbackError> {
        Ok(self.decide(logs))
    }
}
