//! Batch arithmetic: `global = per_replica × num_replicas_in_sync × accumulation_steps`.

use crate::spec::{BatchSpec, Diagnostic};
use serde::Serialize;

/// Which batch number the plan derived (the other two were given or defaulted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Derived {
    /// `global` was derived.
    Global,
    /// `per_replica` was derived.
    PerReplica,
    /// `accumulation_steps` was derived.
    AccumulationSteps,
    /// All three were given and agree.
    Nothing,
}

/// Resolved batch sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchPlan {
    /// Examples per optimizer step across all replicas.
    pub global: usize,
    /// Examples per replica per forward/backward pass.
    pub per_replica: usize,
    /// Forward/backward passes per optimizer step.
    pub accumulation_steps: usize,
    /// Which of the three was derived.
    pub derived: Derived,
}

/// Keras's default batch when the spec gives none.
const DEFAULT_GLOBAL: usize = 32;

/// The multiples of `unit` nearest `n`, for "use 96 or 104" hints.
fn nearest_multiples(n: usize, unit: usize) -> String {
    let below = n / unit * unit;
    let above = below + unit;
    if below == 0 { format!("{above}") } else { format!("{below} or {above}") }
}

/// Resolves the batch triple for `replicas` replicas (`replicas_text` explains the count,
/// e.g. "2 workers × 1 device").
pub fn resolve(spec: &BatchSpec, replicas: usize, replicas_text: &str) -> Result<BatchPlan, Diagnostic> {
    let g = spec.global.map(|n| n.get());
    let p = spec.per_replica.map(|n| n.get());
    let a = spec.accumulation_steps.map(|n| n.get());
    let r = replicas.max(1);
    match (g, p, a) {
        (Some(g), Some(p), Some(a)) => {
            if g == p * r * a {
                Ok(BatchPlan { global: g, per_replica: p, accumulation_steps: a, derived: Derived::Nothing })
            } else {
                Err(Diagnostic::error(
                    "batch.global",
                    format!(
                        "batch.global = {g} but per_replica × replicas × accumulation_steps = {p} × {r} × {a} = {} ({replicas_text})",
                        p * r * a
                    ),
                )
                .help(format!("give only two of the three, or set global = {}", p * r * a)))
            }
        }
        (Some(g), Some(p), None) => {
            if g % (p * r) == 0 {
                Ok(BatchPlan {
                    global: g,
                    per_replica: p,
                    accumulation_steps: g / (p * r),
                    derived: Derived::AccumulationSteps,
                })
            } else {
                let mut help = format!(
                    "use global = {} (a multiple of per_replica × replicas = {p} × {r} = {})",
                    nearest_multiples(g, p * r),
                    p * r
                );
                if g % r == 0 {
                    help.push_str(&format!(", or per_replica = {}", g / r));
                }
                Err(Diagnostic::error(
                    "batch.global",
                    format!("batch.global = {g} is not a multiple of per_replica × replicas = {p} × {r} = {} ({replicas_text})", p * r),
                )
                .help(help))
            }
        }
        (Some(g), None, a) => {
            let a_val = a.unwrap_or(1);
            let unit = r * a_val;
            if g % unit == 0 {
                Ok(BatchPlan {
                    global: g,
                    per_replica: g / unit,
                    accumulation_steps: a_val,
                    derived: Derived::PerReplica,
                })
            } else if a.is_some() {
                Err(Diagnostic::error(
                    "batch.global",
                    format!(
                        "batch.global = {g} is not divisible by {r} replicas × {a_val} accumulation steps = {unit} ({replicas_text})"
                    ),
                )
                .help(format!("use global = {}", nearest_multiples(g, unit))))
            } else {
                Err(Diagnostic::error(
                    "batch.global",
                    format!("batch.global = {g} is not divisible by {r} replicas ({replicas_text})"),
                )
                .help(format!("use global = {}", nearest_multiples(g, r))))
            }
        }
        (None, Some(p), a) => {
            let a = a.unwrap_or(1);
            Ok(BatchPlan { global: p * r * a, per_replica: p, accumulation_steps: a, derived: Derived::Global })
        }
        (None, None, Some(a)) => Err(Diagnostic::error(
            "batch.accumulation_steps",
            format!("batch.accumulation_steps = {a} needs a batch size to go with it"),
        )
        .help("also give batch.global or batch.per_replica")),
        (None, None, None) => {
            if DEFAULT_GLOBAL.is_multiple_of(r) {
                Ok(BatchPlan {
                    global: DEFAULT_GLOBAL,
                    per_replica: DEFAULT_GLOBAL / r,
                    accumulation_steps: 1,
                    derived: Derived::PerReplica,
                })
            } else {
                Err(Diagnostic::error(
                    "batch",
                    format!("the default global batch of {DEFAULT_GLOBAL} is not divisible by {r} replicas ({replicas_text})"),
                )
                .help(format!("set batch.global = {} or batch.per_replica", nearest_multiples(DEFAULT_GLOBAL, r))))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroUsize;

    fn spec(g: Option<usize>, p: Option<usize>, a: Option<usize>) -> BatchSpec {
        let nz = |v: Option<usize>| v.and_then(NonZeroUsize::new);
        BatchSpec { global: nz(g), per_replica: nz(p), accumulation_steps: nz(a) }
    }

    #[test]
    fn any_two_derive_the_third() {
        let b = resolve(&spec(Some(128), Some(64), None), 2, "").unwrap();
        assert_eq!(
            (b.global, b.per_replica, b.accumulation_steps, b.derived),
            (128, 64, 1, Derived::AccumulationSteps)
        );
        let b = resolve(&spec(Some(512), None, Some(4)), 2, "").unwrap();
        assert_eq!((b.per_replica, b.derived), (64, Derived::PerReplica));
        let b = resolve(&spec(None, Some(64), Some(2)), 4, "").unwrap();
        assert_eq!((b.global, b.derived), (512, Derived::Global));
        let b = resolve(&spec(Some(256), Some(32), Some(2)), 4, "").unwrap();
        assert_eq!(b.derived, Derived::Nothing);
    }

    #[test]
    fn one_alone_means_no_accumulation() {
        let b = resolve(&spec(Some(128), None, None), 2, "").unwrap();
        assert_eq!((b.per_replica, b.accumulation_steps), (64, 1));
        let b = resolve(&spec(None, Some(64), None), 2, "").unwrap();
        assert_eq!((b.global, b.accumulation_steps), (128, 1));
        let b = resolve(&spec(None, None, None), 1, "").unwrap();
        assert_eq!(b.global, 32);
    }

    #[test]
    fn indivisible_batches_name_the_numbers_and_the_nearest_fix() {
        let e = resolve(&spec(Some(100), None, None), 8, "2 workers × 4 devices").unwrap_err();
        assert_eq!(e.message, "batch.global = 100 is not divisible by 8 replicas (2 workers × 4 devices)");
        assert_eq!(e.help.as_deref(), Some("use global = 96 or 104"));
        let e = resolve(&spec(Some(100), Some(64), None), 2, "2 workers × 1 device").unwrap_err();
        assert!(e.message.contains("64 × 2 = 128"), "{}", e.message);
        assert_eq!(
            e.help.as_deref(),
            Some("use global = 128 (a multiple of per_replica × replicas = 64 × 2 = 128), or per_replica = 50")
        );
        let e = resolve(&spec(Some(100), Some(10), Some(2)), 2, "x").unwrap_err();
        assert!(e.message.contains("10 × 2 × 2 = 40"), "{}", e.message);
        let e = resolve(&spec(None, None, Some(4)), 1, "x").unwrap_err();
        assert_eq!(e.key, "batch.accumulation_steps");
    }
}
