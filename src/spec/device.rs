//! Device lists: a count or named devices (the names themselves are `vocab::Device`).

use crate::vocab::Device;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

/// The devices of one worker: a list, or a count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Devices {
    /// That many devices: GPUs when the build and machine have them, else CPU replicas.
    Count(NonZeroU32),
    /// These devices, one replica each.
    List(Vec<Device>),
}

impl Devices {
    /// One device per worker.
    pub fn one() -> Self {
        Devices::Count(NonZeroU32::MIN)
    }
}

impl Default for Devices {
    fn default() -> Self {
        Devices::Count(NonZeroU32::new(2).unwrap_or(NonZeroU32::MIN))
    }
}
