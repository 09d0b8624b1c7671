//! `model_checkpoint`: Keras's `ModelCheckpoint`. Saves the model every epoch or every N steps
//! (only improvements with `save_best_only`), keeping the newest `max_to_keep`.

use super::{Callback, CallbackError, Moment, Restore};
use crate::checkpoint::manifest::float_opt;
use crate::checkpoint::policy::{self, Admit, Policy};
use crate::checkpoint::{Kind, Store};
use crate::plan::{SaveEvery, Watch};
use crate::train::checkpointer::SaveRequest;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;
use std::path::Path;

/// What it remembers across a resume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
struct Best {
    /// The best monitored value so far (`save_best_only`).
    #[serde(with = "float_opt")]
    best: Option<f64>,
}

/// The callback.
pub struct ModelCheckpoint {
    name: String,
    store: Store,
    every: SaveEvery,
    watch: Option<Watch>,
    policy: Policy,
    memory: Best,
    warned_no_value: bool,
}

impl ModelCheckpoint {
    /// Checkpoints into `dir`.
    pub fn new(
        name: String,
        dir: &Path,
        every: SaveEvery,
        best_only: Option<Watch>,
        max_to_keep: Option<NonZeroUsize>,
    ) -> Self {
        let policy = Policy { max_to_keep, best_only: best_only.map(|w| w.direction) };
        Self {
            name,
            store: Store::new(dir),
            every,
            watch: best_only,
            policy,
            memory: Best::default(),
            warned_no_value: false,
        }
    }
}

impl Callback for ModelCheckpoint {
    fn name(&self) -> &str {
        &self.name
    }

    fn checkpoint(&mut self, at: &Moment<'_>, notes: &mut Vec<String>) -> Option<SaveRequest> {
        if !self.every.due(at.step, at.epoch_end) {
            return None;
        }
        let value = self.watch.and_then(|w| at.logs.get(w.monitor));
        let (admit, best) = policy::admit(&self.policy, value, self.memory.best);
        self.memory.best = best;
        match admit {
            Admit::Write => Some(SaveRequest { kind: Kind::Model, store: self.store.clone(), policy: self.policy }),
            Admit::NotImproved { .. } => None,
            Admit::NoValue => {
                if let Some(w) = self.watch.filter(|_| !self.warned_no_value) {
                    self.warned_no_value = true;
                    notes.push(format!(
                        "model_checkpoint: {} is not known at step {}, so save_best_only skips this save (evaluate at the saves: train.evaluate_every_steps or save_freq = \"epoch\")",
                        w.monitor.name(),
                        at.step
                    ));
                }
                None
            }
        }
    }

    fn state(&self) -> serde_json::Value {
        if self.watch.is_none() {
            return serde_json::Value::Null;
        }
        serde_json::to_value(self.memory).unwrap_or_default()
    }

    fn restore(&mut self, from: &Restore<'_>) -> Result<(), CallbackError> {
        if let Ok(m) = serde_json::from_value::<Best>(from.state.clone()) {
            self.memory = m;
        }
        Ok(())
    }
}
