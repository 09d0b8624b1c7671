//! The memory one task needs at its peak, estimated from the plan's arithmetic before
//! anything is allocated, and the refusal of a model this machine cannot hold
//! (docs/reliability.md, "Models too big"; docs/specs.md, "Memory estimate").
//!
//! The estimate is meant to err high: every value is counted as a 4-byte float, activations
//! twice (kept for backward, and their gradients), and every replica of the process holds its
//! own gradients and activations. Counts saturate instead of wrapping.

use super::OptimizerPlan;
use crate::data::{DataFacts, LabelKind};
use crate::model::{ModelSize, Shrink, thousands};
use serde::Serialize;
use std::fmt;

/// Bytes one process can address on x86-64 and AArch64 (47 bits of user space): the limit
/// when the machine's memory is unknown.
pub const ADDRESS_SPACE: u64 = 1 << 47;

/// Bytes of one value (f32), and of one label or token id (u32 at most).
const VALUE: u64 = 4;

/// Where the memory limit a run is held to comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// `MemAvailable` in /proc/meminfo.
    Available,
    /// `MemTotal` in /proc/meminfo.
    Total,
    /// The cgroup's `memory.max`.
    Cgroup,
    /// `TRAINRUN_MEMORY_LIMIT`.
    Variable,
    /// Nothing known: what a process can address.
    AddressSpace,
}

/// The memory this machine gives a job: the smallest of what is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MachineMemory {
    /// Bytes.
    pub bytes: u64,
    /// Where the number comes from.
    pub source: MemorySource,
}

impl fmt::Display for MachineMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = match self.source {
            MemorySource::Available => "MemAvailable in /proc/meminfo",
            MemorySource::Total => "MemTotal in /proc/meminfo",
            MemorySource::Cgroup => "the cgroup's memory.max",
            MemorySource::Variable => "TRAINRUN_MEMORY_LIMIT",
            MemorySource::AddressSpace => "what one process can address; the machine's memory is unknown",
        };
        write!(f, "{} ({from})", size(self.bytes))
    }
}

/// What one task holds at its peak, in bytes, and the counts behind each part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// The weights and moving statistics, once.
    pub params: u64,
    /// One gradient per replica of this process.
    pub gradients: u64,
    /// The optimizer's slots (Adam 2, SGD with momentum 1, plain SGD 0 per weight).
    pub optimizer: u64,
    /// Activations at the per-replica batch, for every replica of this process, twice.
    pub activations: u64,
    /// The training and test examples held in memory.
    pub data: u64,
    /// The sum: one task.
    pub per_task: u64,
    /// Tasks of the job on this machine (a local cluster runs them all here).
    pub tasks_here: u64,
    /// `per_task × tasks_here`: what this machine must hold.
    pub needed: u64,
    /// Trainable values.
    pub param_count: u64,
    /// Optimizer slots per weight.
    pub slots: u64,
    /// Replicas in one process.
    pub replicas: u64,
    /// Examples per replica per pass.
    pub per_replica: u64,
    /// Activation values one example keeps.
    pub activation_values: u64,
    /// Examples held (train and test).
    pub examples: u64,
    /// Bytes one held example takes.
    pub example_bytes: u64,
}

/// The estimate of a model of `model`'s size trained by `optimizer` at `per_replica`
/// examples on each of `replicas` replicas per process, on data of `data`, with `tasks_here`
/// tasks of the job on this machine.
pub fn estimate(
    model: &ModelSize,
    optimizer: &OptimizerPlan,
    per_replica: usize,
    replicas: usize,
    data: &DataFacts,
    tasks_here: usize,
) -> MemoryEstimate {
    let (per_replica, replicas, tasks_here) = (per_replica as u64, replicas.max(1) as u64, tasks_here.max(1) as u64);
    let slots = match optimizer {
        OptimizerPlan::Adam { .. } => 2,
        OptimizerPlan::Sgd { momentum, .. } if *momentum > 0.0 => 1,
        OptimizerPlan::Sgd { .. } => 0,
    };
    let weights = model.params.saturating_mul(VALUE);
    let params = model.params.saturating_add(model.state).saturating_mul(VALUE);
    let gradients = weights.saturating_mul(replicas);
    let optimizer = weights.saturating_mul(slots);
    let activations = model.activations.saturating_mul(per_replica).saturating_mul(replicas).saturating_mul(2 * VALUE);
    let examples = (data.train_examples as u64).saturating_add(data.test_examples as u64);
    let example_bytes = match data.labels {
        // Windows over one token stream: each example starts one token further.
        LabelKind::Sequence { .. } => VALUE,
        LabelKind::Class { .. } | LabelKind::Target { .. } => {
            let values = data.example_shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
            values.saturating_add(data.labels.row_width() as u64).saturating_mul(VALUE)
        }
    };
    let data = examples.saturating_mul(example_bytes);
    let per_task = [params, gradients, optimizer, activations, data].iter().fold(0u64, |n, &b| n.saturating_add(b));
    MemoryEstimate {
        params,
        gradients,
        optimizer,
        activations,
        data,
        per_task,
        tasks_here,
        needed: per_task.saturating_mul(tasks_here),
        param_count: model.params,
        slots,
        replicas,
        per_replica,
        activation_values: model.activations,
        examples,
        example_bytes,
    }
}

impl MemoryEstimate {
    /// One line for `trainrun check`'s plan.
    pub fn summary(&self) -> String {
        let here = match self.tasks_here {
            1 => String::new(),
            n => format!(" × {n} tasks here = {}", size(self.needed)),
        };
        format!(
            "about {} per task{here}: parameters {}, gradients {}, optimizer {}, activations {}, data {}",
            size(self.per_task),
            size(self.params),
            size(self.gradients),
            size(self.optimizer),
            size(self.activations),
            size(self.data)
        )
    }

    /// Each part with its arithmetic, one per line, indented.
    pub fn parts(&self) -> String {
        let values = |n: u64| if n == u64::MAX { "more than 18 × 10¹⁸".to_string() } else { thousands(n as usize) };
        let rows = [
            ("parameters", self.params, format!("{} values × 4 B", values(self.param_count))),
            ("gradients", self.gradients, format!("one copy per replica × {}", self.replicas)),
            ("optimizer", self.optimizer, format!("{} slots per parameter", self.slots)),
            (
                "activations",
                self.activations,
                format!(
                    "{} values per example × per_replica {} × {} replicas × 4 B, twice for backward",
                    values(self.activation_values),
                    self.per_replica,
                    self.replicas
                ),
            ),
            (
                "data held",
                self.data,
                format!(
                    "{} examples × {} B",
                    thousands(self.examples as usize),
                    thousands(self.example_bytes as usize)
                ),
            ),
        ];
        let mut out = String::new();
        for (name, bytes, how) in rows {
            out += &format!("  {name:<12}{:>12}  ({how})\n", size(bytes));
        }
        if self.tasks_here > 1 {
            out += &format!(
                "  {:<12}{:>12}  (× {} tasks of the job on this machine)\n",
                "in all",
                size(self.needed),
                self.tasks_here
            );
        }
        out
    }
}

/// A model this machine cannot hold: what it needs, what there is, and what to shrink.
#[derive(Debug, Clone, PartialEq)]
pub struct TooBig {
    /// The estimate.
    pub estimate: MemoryEstimate,
    /// What the machine gives.
    pub machine: MachineMemory,
    /// The model's keys that hold the most parameters, largest first.
    pub shrink: Vec<Shrink>,
    /// The per-replica batch's key and value, when activations are the largest part.
    pub batch_key: String,
}

impl fmt::Display for TooBig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.estimate;
        writeln!(
            f,
            "the model needs an estimated {} of memory, more than this machine's {}:",
            size(e.needed),
            self.machine
        )?;
        write!(f, "{}", e.parts())?;
        let model = e.params.saturating_add(e.gradients).saturating_add(e.optimizer);
        let mut keys: Vec<String> = Vec::new();
        // The batch or the data first only when they are the largest part and the model's
        // own values would fit without them.
        let model_fits = model.saturating_mul(e.tasks_here) < self.machine.bytes;
        if model_fits && e.activations > model && e.activations >= e.data {
            keys.push(format!("{} (activations grow with it)", self.batch_key));
        }
        if model_fits && e.data > model && e.data > e.activations {
            keys.push("the data, which a task holds in memory whole (use fewer or smaller examples)".to_string());
        }
        keys.extend(self.shrink.iter().take(2).map(|s| {
            let share = match e.param_count {
                0 => 0,
                n => (u128::from(s.params) * 100 / u128::from(n)).min(100),
            };
            format!("{} ({}: {share}% of the parameters)", s.key, s.now)
        }));
        write!(
            f,
            "  = help: shrink {}; or, on a machine you know holds it, set TRAINRUN_MEMORY_LIMIT (e.g. `TRAINRUN_MEMORY_LIMIT=512GiB`) to the memory to plan for",
            keys.join(", or ")
        )
    }
}

/// Bytes in binary units with three significant figures: `1.50 GiB`.
pub fn size(bytes: u64) -> String {
    if bytes == u64::MAX {
        return "more than 16 EiB".to_string();
    }
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ if value >= 100.0 => format!("{value:.0} {}", units[unit]),
        _ if value >= 10.0 => format!("{value:.1} {}", units[unit]),
        _ => format!("{value:.2} {}", units[unit]),
    }
}

/// Parses a byte size as `TRAINRUN_MEMORY_LIMIT` takes it: `512GiB`, `64G`, `1.5TiB`,
/// `1000000` (bytes). Decimal (`GB`) and binary (`GiB`, `G`) units.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "p" | "pib" => 1024f64.powi(5),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "pb" => 1e15,
        _ => return None,
    };
    let bytes = value * scale;
    (bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.50 KiB");
        assert_eq!(size(3 << 40), "3.00 TiB");
        assert_eq!(size(u64::MAX), "more than 16 EiB");
        assert_eq!(parse_size("512GiB"), Some(512 << 30));
        assert_eq!(parse_size("64G"), Some(64 << 30));
        assert_eq!(parse_size("2 GB"), Some(2_000_000_000));
        assert_eq!(parse_size("1000"), Some(1000));
        for bad in ["", "lots", "-1G", "1e999", "0", "5 parsecs"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
    }
}
