//! Device names (`cpu:0`, `gpu:1`), parsed once into types.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// What a device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// A CPU replica: a share of the process's threads.
    Cpu,
    /// A CUDA GPU.
    Gpu,
}

/// One device: `cpu:N` or `gpu:N` (TensorFlow's `/gpu:0`, `GPU:0` are accepted too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    /// CPU or GPU.
    pub kind: DeviceKind,
    /// The index among devices of that kind.
    pub index: u32,
}

impl Default for Device {
    fn default() -> Self {
        Self { kind: DeviceKind::Cpu, index: 0 }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Gpu => "gpu",
        };
        write!(f, "{kind}:{}", self.index)
    }
}

/// The text was not a device name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a device; write `cpu:N` or `gpu:N`, e.g. `gpu:0`")]
pub struct BadDevice(pub String);

impl FromStr for Device {
    type Err = BadDevice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadDevice(s.to_string());
        let lower = s.trim().trim_start_matches('/').to_ascii_lowercase();
        let lower = lower.strip_prefix("device:").unwrap_or(&lower);
        let (kind, index) = match lower.split_once(':') {
            Some((k, i)) => (k, i.parse::<u32>().map_err(|_| bad())?),
            None => (lower, 0),
        };
        let kind = match kind {
            "cpu" => DeviceKind::Cpu,
            "gpu" | "cuda" => DeviceKind::Gpu,
            _ => return Err(bad()),
        };
        Ok(Device { kind, index })
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Device {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Device".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "title": "device",
            "description": "A device: `cpu:N` or `gpu:N`.",
            "type": "string",
            "pattern": "^/?([cC][pP][uU]|[gG][pP][uU]|[cC][uU][dD][aA])(:[0-9]+)?$",
            "examples": ["cpu:0", "gpu:1"]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tensorflow_spellings() {
        for (text, want) in [
            ("cpu:0", Device { kind: DeviceKind::Cpu, index: 0 }),
            ("/gpu:1", Device { kind: DeviceKind::Gpu, index: 1 }),
            ("GPU:3", Device { kind: DeviceKind::Gpu, index: 3 }),
            ("/device:CPU:2", Device { kind: DeviceKind::Cpu, index: 2 }),
            ("cpu", Device { kind: DeviceKind::Cpu, index: 0 }),
        ] {
            assert_eq!(text.parse::<Device>(), Ok(want), "{text}");
        }
        assert!("tpu:0".parse::<Device>().is_err());
        assert!("gpu:x".parse::<Device>().is_err());
    }
}
