//! Learning rate: scaling with the global batch, linear warmup, and the decay schedule, as one
//! pure function of the step.

use crate::spec::{Diagnostic, OptimizerSpec, ScalingRule, ScheduleSpec};
use serde::Serialize;

/// The resolved learning-rate policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LrPlan {
    /// `optimizer.learning_rate` (or the optimizer's default) before scaling.
    pub base: f64,
    /// How `base` was scaled to the global batch.
    pub scaling: Scaling,
    /// The learning rate after scaling: the peak the schedule starts from.
    pub scaled: f64,
    /// Warmup, when asked for.
    pub warmup: Option<Warmup>,
    /// Decay after warmup.
    pub schedule: Schedule,
}

/// How the learning rate follows the global batch (`[optimizer.scaling]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Scaling {
    /// `learning_rate` as given.
    None,
    /// `× global / base_batch` (Goyal et al.).
    Linear { base_batch: usize },
    /// `× sqrt(global / base_batch)`.
    Sqrt { base_batch: usize },
    /// The table's entry for the global batch.
    Table,
}

/// A linear ramp over the first `steps` steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Warmup {
    /// Steps of warmup.
    pub steps: u64,
    /// Learning rate at step 0.
    pub start: f64,
}

/// Decay, in steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Schedule {
    /// No decay.
    Constant,
    /// `× factor` every `every_steps` steps (counted from step 0).
    StepDecay { factor: f64, every_steps: u64 },
    /// Cosine from the scaled rate to `alpha ×` it between the end of warmup and `total_steps`.
    Cosine { alpha: f64, total_steps: u64 },
}

impl LrPlan {
    /// The learning rate of optimizer step `step` (0-based).
    pub fn at(&self, step: u64) -> f64 {
        let warm = self.warmup.map_or(0, |w| w.steps);
        if let Some(w) = self.warmup.filter(|w| step < w.steps) {
            return w.start + (self.scaled - w.start) * step as f64 / w.steps as f64;
        }
        match self.schedule {
            Schedule::Constant => self.scaled,
            Schedule::StepDecay { factor, every_steps } => {
                self.scaled * factor.powi(i32::try_from(step / every_steps.max(1)).unwrap_or(i32::MAX))
            }
            Schedule::Cosine { alpha, total_steps } => {
                let span = total_steps.saturating_sub(warm).max(1) as f64;
                let t = (step.saturating_sub(warm) as f64 / span).min(1.0);
                let cosine = 0.5 * (1.0 + (std::f64::consts::PI * t).cos());
                self.scaled * ((1.0 - alpha) * cosine + alpha)
            }
        }
    }
}

/// Resolves scaling, warmup and schedule for a global batch of `global`, with
/// `steps_per_epoch` and `total_steps` to convert epochs into steps. `default_lr` is the
/// optimizer's Keras default.
pub fn resolve(
    spec: &OptimizerSpec,
    default_lr: f64,
    global: usize,
    steps_per_epoch: u64,
    total_steps: u64,
    errors: &mut Vec<Diagnostic>,
) -> Option<LrPlan> {
    let base = spec.learning_rate.unwrap_or(default_lr);
    let before = errors.len();
    if base <= 0.0 || !base.is_finite() {
        errors.push(
            Diagnostic::error("optimizer.learning_rate", format!("optimizer.learning_rate = {base} must be positive"))
                .help("use a small positive rate such as 0.01"),
        );
    }
    let sc = &spec.scaling;
    let needs_base_batch = matches!(sc.rule, ScalingRule::Linear | ScalingRule::Sqrt);
    let base_batch = match (needs_base_batch, sc.base_batch) {
        (true, None) => {
            errors.push(
                Diagnostic::error(
                    "optimizer.scaling.base_batch",
                    format!(
                        "optimizer.scaling.rule = {} needs the global batch that learning_rate = {base} was tuned for",
                        rule_name(sc.rule)
                    ),
                )
                .help(format!("add base_batch = {global} to [optimizer.scaling] (no scaling at this batch)")),
            );
            None
        }
        (false, Some(b)) => {
            errors.push(
                Diagnostic::warning(
                    "optimizer.scaling.base_batch",
                    format!("optimizer.scaling.base_batch = {b} has no effect with rule = {}", rule_name(sc.rule)),
                )
                .help("set rule = \"linear\" or \"sqrt\", or remove base_batch"),
            );
            None
        }
        (_, b) => b,
    };
    if !sc.table.is_empty() && sc.rule != ScalingRule::Table {
        errors.push(
            Diagnostic::warning(
                "optimizer.scaling.table",
                format!("optimizer.scaling.table is ignored with rule = {}", rule_name(sc.rule)),
            )
            .help("set rule = \"table\" to use it"),
        );
    }
    let scaled = match sc.rule {
        ScalingRule::None => base,
        ScalingRule::Linear => base * global as f64 / base_batch.unwrap_or(global) as f64,
        ScalingRule::Sqrt => base * (global as f64 / base_batch.unwrap_or(global) as f64).sqrt(),
        ScalingRule::Table => table_lookup(&sc.table, global, errors).unwrap_or(base),
    };

    let warmup = spec.warmup.as_ref().and_then(|w| {
        let steps = match (w.steps, w.epochs) {
            (Some(s), None) => s,
            (None, Some(e)) => (e * steps_per_epoch as f64).round() as u64,
            (Some(s), Some(e)) => {
                errors.push(
                    Diagnostic::error(
                        "optimizer.warmup",
                        format!("optimizer.warmup gives both steps = {s} and epochs = {e}"),
                    )
                    .help("keep one of them"),
                );
                return None;
            }
            (None, None) => {
                errors.push(
                    Diagnostic::error("optimizer.warmup", "optimizer.warmup needs a length")
                        .help(format!("add steps = N or epochs = N (one epoch is {steps_per_epoch} steps)")),
                );
                return None;
            }
        };
        if steps > total_steps {
            errors.push(
                Diagnostic::warning(
                    "optimizer.warmup",
                    format!("warmup of {steps} steps is longer than training ({total_steps} steps)"),
                )
                .help(format!("use at most {total_steps} steps")),
            );
        }
        let start = w.start_learning_rate.unwrap_or(if scaled > base { base } else { 0.0 });
        (steps > 0).then_some(Warmup { steps, start })
    });

    let schedule = schedule(spec, scaled, steps_per_epoch, total_steps, errors);
    let failed = errors[before..].iter().any(|d| d.severity == crate::spec::Severity::Error);
    let scaling = match (sc.rule, base_batch) {
        (ScalingRule::Linear, Some(base_batch)) => Scaling::Linear { base_batch },
        (ScalingRule::Sqrt, Some(base_batch)) => Scaling::Sqrt { base_batch },
        (ScalingRule::Table, _) => Scaling::Table,
        (ScalingRule::None | ScalingRule::Linear | ScalingRule::Sqrt, _) => Scaling::None,
    };
    (!failed).then_some(LrPlan { base, scaling, scaled, warmup, schedule })
}

/// The decay after warmup, with epochs converted into steps.
fn schedule(
    spec: &OptimizerSpec,
    scaled: f64,
    steps_per_epoch: u64,
    total_steps: u64,
    errors: &mut Vec<Diagnostic>,
) -> Schedule {
    match spec.schedule {
        ScheduleSpec::Constant => Schedule::Constant,
        ScheduleSpec::StepDecay { factor, every_epochs, every_steps } => match (every_epochs, every_steps) {
            (Some(e), None) => Schedule::StepDecay { factor, every_steps: e.saturating_mul(steps_per_epoch).max(1) },
            (None, Some(s)) => Schedule::StepDecay { factor, every_steps: s },
            (e, s) => {
                let what = if e.is_some() && s.is_some() {
                    "gives both every_epochs and every_steps"
                } else {
                    "needs a period"
                };
                errors.push(
                    Diagnostic::error("optimizer.schedule", format!("optimizer.schedule step_decay {what}"))
                        .help("give exactly one of every_epochs = N or every_steps = N"),
                );
                Schedule::Constant
            }
        },
        ScheduleSpec::Cosine { alpha, final_learning_rate: None } => Schedule::Cosine { alpha, total_steps },
        ScheduleSpec::Cosine { alpha, final_learning_rate: Some(last) } => {
            let key = "optimizer.schedule.final_learning_rate";
            if alpha != 0.0 {
                errors.push(
                    Diagnostic::error(
                        key,
                        format!("{key} = {last} and optimizer.schedule.alpha = {alpha} both set the floor"),
                    )
                    .help("keep one of them"),
                );
            } else if !(last.is_finite() && (0.0..=scaled).contains(&last)) {
                errors.push(
                    Diagnostic::error(
                        key,
                        format!("{key} = {last} is not between 0 and the learning rate {scaled} it decays from"),
                    )
                    .help(format!("use a value of at most {scaled}, e.g. {}", scaled / 10.0)),
                );
            }
            let alpha = if scaled > 0.0 { (last / scaled).clamp(0.0, 1.0) } else { 0.0 };
            Schedule::Cosine { alpha, total_steps }
        }
    }
}

fn table_lookup(
    table: &std::collections::BTreeMap<String, f64>,
    global: usize,
    errors: &mut Vec<Diagnostic>,
) -> Option<f64> {
    let mut entries = Vec::new();
    for (k, v) in table {
        match k.trim().parse::<usize>() {
            Ok(b) => entries.push((b, *v)),
            Err(_) => errors.push(
                Diagnostic::error(
                    format!("optimizer.scaling.table.{k}"),
                    format!("optimizer.scaling.table key \"{k}\" is not a batch size"),
                )
                .help("keys are global batch sizes in quotes, e.g. \"128\" = 0.1"),
            ),
        }
    }
    if entries.is_empty() {
        errors.push(
            Diagnostic::error(
                "optimizer.scaling.table",
                "optimizer.scaling.rule = \"table\" needs a table of learning rates by global batch",
            )
            .help(format!("add table = {{ \"{global}\" = 0.1 }}")),
        );
        return None;
    }
    entries.sort_by_key(|(b, _)| *b);
    if let Some((_, lr)) = entries.iter().find(|(b, _)| *b == global) {
        return Some(*lr);
    }
    let known: Vec<String> = entries.iter().map(|(b, _)| b.to_string()).collect();
    let nearest = entries.iter().min_by_key(|(b, _)| b.abs_diff(global)).map_or(0, |(b, _)| *b);
    errors.push(
        Diagnostic::error(
            "optimizer.scaling.table",
            format!("optimizer.scaling.table has no entry for the global batch {global} (it has {})", known.join(", ")),
        )
        .help(format!("add \"{global}\" = <rate> to the table, or use batch.global = {nearest}")),
    );
    None
}

fn rule_name(rule: ScalingRule) -> &'static str {
    match rule {
        ScalingRule::None => "none",
        ScalingRule::Linear => "linear",
        ScalingRule::Sqrt => "sqrt",
        ScalingRule::Table => "table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ScalingSpec, WarmupSpec};

    fn opt(rule: ScalingRule, base_batch: Option<usize>) -> OptimizerSpec {
        OptimizerSpec {
            learning_rate: Some(0.1),
            scaling: ScalingSpec { rule, base_batch, ..Default::default() },
            ..Default::default()
        }
    }

    fn plan(spec: &OptimizerSpec, global: usize) -> (Option<LrPlan>, Vec<Diagnostic>) {
        let mut errors = Vec::new();
        let p = resolve(spec, 0.01, global, 100, 1000, &mut errors);
        (p, errors)
    }

    #[test]
    fn scaling_rules() {
        assert_eq!(plan(&opt(ScalingRule::None, None), 512).0.unwrap().scaled, 0.1);
        assert!((plan(&opt(ScalingRule::Linear, Some(128)), 512).0.unwrap().scaled - 0.4).abs() < 1e-12);
        assert!((plan(&opt(ScalingRule::Sqrt, Some(128)), 512).0.unwrap().scaled - 0.2).abs() < 1e-12);
        let mut t = opt(ScalingRule::Table, None);
        t.scaling.table = [("128".to_string(), 0.05), ("512".to_string(), 0.3)].into();
        assert_eq!(plan(&t, 512).0.unwrap().scaled, 0.3);
        let (p, e) = plan(&t, 256);
        assert!(p.is_none());
        assert!(e[0].message.contains("no entry for the global batch 256 (it has 128, 512)"), "{}", e[0].message);
    }

    #[test]
    fn linear_without_base_batch_is_an_error_with_a_fix() {
        let (p, e) = plan(&opt(ScalingRule::Linear, None), 256);
        assert!(p.is_none());
        assert_eq!(e[0].key, "optimizer.scaling.base_batch");
        assert_eq!(
            e[0].help.as_deref(),
            Some("add base_batch = 256 to [optimizer.scaling] (no scaling at this batch)")
        );
    }

    #[test]
    fn goyal_warmup_ramps_from_the_base_rate_to_the_scaled_one() {
        let mut s = opt(ScalingRule::Linear, Some(128));
        s.warmup = Some(WarmupSpec { steps: None, epochs: Some(2.0), start_learning_rate: None });
        let p = plan(&s, 512).0.unwrap();
        assert_eq!(p.warmup, Some(Warmup { steps: 200, start: 0.1 }));
        assert!((p.at(0) - 0.1).abs() < 1e-12);
        assert!((p.at(100) - 0.25).abs() < 1e-12);
        assert!((p.at(200) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn schedules() {
        let mut s = opt(ScalingRule::None, None);
        s.schedule = ScheduleSpec::StepDecay { factor: 0.1, every_epochs: Some(3), every_steps: None };
        let p = plan(&s, 64).0.unwrap();
        assert_eq!(p.at(299), 0.1);
        assert!((p.at(300) - 0.01).abs() < 1e-12);
        s.schedule = ScheduleSpec::Cosine { alpha: 0.0, final_learning_rate: None };
        s.warmup = Some(WarmupSpec { steps: Some(100), epochs: None, start_learning_rate: Some(0.0) });
        let p = plan(&s, 64).0.unwrap();
        assert_eq!(p.at(0), 0.0);
        assert!((p.at(100) - 0.1).abs() < 1e-12);
        assert!((p.at(550) - 0.05).abs() < 1e-12);
        assert!(p.at(1000).abs() < 1e-12);
    }

    #[test]
    fn cosine_decays_to_the_final_learning_rate() {
        let mut s = opt(ScalingRule::None, None);
        s.warmup = Some(WarmupSpec { steps: Some(100), epochs: None, start_learning_rate: Some(0.0) });
        s.schedule = ScheduleSpec::Cosine { alpha: 0.0, final_learning_rate: Some(0.01) };
        let p = plan(&s, 64).0.unwrap();
        assert!((p.at(100) - 0.1).abs() < 1e-12);
        assert!((p.at(550) - 0.055).abs() < 1e-12);
        assert!((p.at(1000) - 0.01).abs() < 1e-12);
        assert!((p.at(5000) - 0.01).abs() < 1e-12, "the floor holds past the end");
        s.schedule = ScheduleSpec::Cosine { alpha: 0.1, final_learning_rate: Some(0.01) };
        let (p, e) = plan(&s, 64);
        assert!(p.is_none());
        assert_eq!(e[0].key, "optimizer.schedule.final_learning_rate");
        assert_eq!(e[0].help.as_deref(), Some("keep one of them"));
        s.schedule = ScheduleSpec::Cosine { alpha: 0.0, final_learning_rate: Some(0.5) };
        let (p, e) = plan(&s, 64);
        assert!(p.is_none());
        assert_eq!(
            e[0].message,
            "optimizer.schedule.final_learning_rate = 0.5 is not between 0 and the learning rate 0.1 it decays from"
        );
    }

    #[test]
    fn non_positive_rates_are_errors() {
        let mut s = opt(ScalingRule::None, None);
        s.learning_rate = Some(0.0);
        let (p, e) = plan(&s, 64);
        assert!(p.is_none());
        assert_eq!(e[0].message, "optimizer.learning_rate = 0 must be positive");
    }
}
