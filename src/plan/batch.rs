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
    match (below, below.checked_add(unit)) {
        (0, Some(above)) => format!("{above}"),
        (_, Some(above)) => format!("{below} or {above}"),
        (_, None) => format!("{below}"),
    }
}

/// Refuses a batch product too large to count (`4 × 1 × 2^62` wraps to 0 otherwise, and
/// a batch of 0 divides by zero later).
fn overflow(key: &str, product: &str, replicas_text: &str) -> Diagnostic {
    Diagnostic::error(key, format!("{product} is more examples per step than can be counted ({replicas_text})"))
        .help(format!("use a {key} that keeps the global batch at most the number of training examples"))
}

/// `per_replica × replicas × accumulation_steps`, refused when it cannot be counted.
fn triple(p: usize, r: usize, a: usize, replicas_text: &str) -> Result<usize, Diagnostic> {
    p.checked_mul(r).and_then(|pr| pr.checked_mul(a)).ok_or_else(|| {
        overflow(
            "batch.accumulation_steps",
            &format!("batch.per_replica × replicas × batch.accumulation_steps = {p} × {r} × {a}"),
            replicas_text,
        )
    })
}

/// Resolves the batch triple for `replicas` replicas (`replicas_text` explains the count,
/// e.g. "2 workers × 1 device").
pub fn resolve(spec: &BatchSpec, replicas: usize, replicas_text: &str) -> Result<BatchPlan, Diagnostic> {
    let g = spec.global.map(|n| n.get());
    let p = spec.per_replica.map(|n| n.get());
    let a = spec.accumulation_steps.map(|n| n.get());
    let r = replicas.max(1);
    let pr = p.map(|p| {
        p.checked_mul(r).ok_or_else(|| {
            overflow("batch.per_replica", &format!("batch.per_replica × replicas = {p} × {r}"), replicas_text)
        })
    });
    let pr = pr.transpose()?;
    match (g, p, a) {
        (Some(g), Some(p), Some(a)) => {
            let pra = triple(p, r, a, replicas_text)?;
            if g == pra {
                Ok(BatchPlan { global: g, per_replica: p, accumulation_steps: a, derived: Derived::Nothing })
            } else {
                Err(Diagnostic::error(
                    "batch.global",
                    format!(
                        "batch.global = {g} but per_replica × replicas × accumulation_steps = {p} × {r} × {a} = {pra} ({replicas_text})"
                    ),
                )
                .help(format!("give only two of the three, or set global = {pra}")))
            }
        }
        (Some(g), Some(p), None) => {
            let pr = pr.unwrap_or(p);
            if g % pr == 0 {
                Ok(BatchPlan {
                    global: g,
                    per_replica: p,
                    accumulation_steps: g / pr,
                    derived: Derived::AccumulationSteps,
                })
            } else {
                let mut help = format!(
                    "use global = {} (a multiple of per_replica × replicas = {p} × {r} = {})",
                    nearest_multiples(g, pr),
                    pr
                );
                if g % r == 0 {
                    help.push_str(&format!(", or per_replica = {}", g / r));
                }
                Err(Diagnostic::error(
                    "batch.global",
                    format!("batch.global = {g} is not a multiple of per_replica × replicas = {p} × {r} = {pr} ({replicas_text})"),
                )
                .help(help))
            }
        }
        (Some(g), None, a) => {
            let a_val = a.unwrap_or(1);
            let unit = r.checked_mul(a_val).ok_or_else(|| {
                overflow(
                    "batch.accumulation_steps",
                    &format!("replicas × batch.accumulation_steps = {r} × {a_val}"),
                    replicas_text,
                )
            })?;
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
            let global = triple(p, r, a, replicas_text)?;
            Ok(BatchPlan { global, per_replica: p, accumulation_steps: a, derived: Derived::Global })
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

    #[test]
    fn products_too_large_to_count_are_refused_not_wrapped() {
        let huge = 1 << 62;
        for (g, p, a, r, key) in [
            (Some(64), Some(4), Some(huge), 1, "batch.accumulation_steps"),
            (None, Some(4), Some(huge), 1, "batch.accumulation_steps"),
            (None, Some(huge), None, 8, "batch.per_replica"),
            (Some(64), Some(huge), None, 4, "batch.per_replica"),
            (Some(64), None, Some(huge), 4, "batch.accumulation_steps"),
        ] {
            let e = resolve(&spec(g, p, a), r, "x").unwrap_err();
            assert_eq!(e.key, key, "{g:?} {p:?} {a:?} × {r}");
            assert!(e.message.contains("more examples per step than can be counted"), "{}", e.message);
        }
        assert_eq!(nearest_multiples(usize::MAX - 1, 4), format!("{}", (usize::MAX - 1) / 4 * 4));
    }
}
