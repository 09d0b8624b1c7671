//! `[optimizer]`, resolved: the optimizer with every default filled in (Keras's defaults).
//! The learning rate is planned apart, in `lr`.

use crate::spec::{Diagnostic, OptimizerKind, Spec};
use serde::Serialize;

/// The resolved optimizer; `clip_norm` is Keras's `global_clipnorm`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerPlan {
    /// SGD.
    Sgd { momentum: f64, nesterov: bool, weight_decay: f64, clip_norm: Option<f64> },
    /// Adam (`decoupled = false`) or AdamW.
    Adam {
        beta_1: f64,
        beta_2: f64,
        epsilon: f64,
        weight_decay: f64,
        decoupled: bool,
        clip_norm: Option<f64>,
        decay: DecayPlan,
    },
}

/// Which weights weight decay applies to; the builder maps it onto the model's tensors.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecayPlan {
    /// Every weight.
    All,
    /// Weights of two or more dimensions: no biases or normalization weights (GPT-2's recipe).
    Matrices,
    /// Every weight whose path contains none of these patterns.
    Excluding(Vec<String>),
}

impl DecayPlan {
    /// Whether the weight at `path` with `shape` decays.
    pub fn decays(&self, path: &str, shape: &[usize]) -> bool {
        match self {
            DecayPlan::All => true,
            DecayPlan::Matrices => shape.len() >= 2,
            DecayPlan::Excluding(patterns) => !patterns.iter().any(|p| path.contains(p.as_str())),
        }
    }
}

/// The optimizer `spec` asks for, and its kind's default learning rate.
pub fn resolve(spec: &Spec, diags: &mut Vec<Diagnostic>) -> (f64, OptimizerPlan) {
    let o = &spec.optimizer;
    let kind = match o.kind {
        OptimizerKind::Sgd => "sgd",
        OptimizerKind::Adam => "adam",
        OptimizerKind::Adamw => "adamw",
    };
    let clip_norm = o.clip_norm;
    if let Some(c) = clip_norm.filter(|c| !(c.is_finite() && *c > 0.0)) {
        diags.push(
            Diagnostic::error("optimizer.clip_norm", format!("optimizer.clip_norm = {c} must be a positive number"))
                .help("use a norm such as `clip_norm = 1.0`, or remove the key for no clipping"),
        );
    }
    let mut only = |key: &str, given: bool, for_kind: &str| {
        if given {
            diags.push(
                Diagnostic::error(
                    format!("optimizer.{key}"),
                    format!("optimizer.{key} applies to {for_kind} only, but optimizer.kind = \"{kind}\""),
                )
                .help(format!("remove {key}, or change optimizer.kind")),
            );
        }
    };
    match o.kind {
        OptimizerKind::Sgd => {
            only("beta_1", o.beta_1.is_some(), "adam and adamw");
            only("beta_2", o.beta_2.is_some(), "adam and adamw");
            only("epsilon", o.epsilon.is_some(), "adam and adamw");
            only("exclude_from_weight_decay", o.exclude_from_weight_decay.is_some(), "adam and adamw");
            let momentum = o.momentum.unwrap_or(0.0);
            let nesterov = o.nesterov.unwrap_or(false);
            if nesterov && momentum == 0.0 {
                diags.push(
                    Diagnostic::warning(
                        "optimizer.nesterov",
                        "optimizer.nesterov = true has no effect without momentum",
                    )
                    .help("set optimizer.momentum, e.g. 0.9"),
                );
            }
            let weight_decay = o.weight_decay.unwrap_or(0.0);
            (0.01, OptimizerPlan::Sgd { momentum, nesterov, weight_decay, clip_norm })
        }
        OptimizerKind::Adam | OptimizerKind::Adamw => {
            only("momentum", o.momentum.is_some(), "sgd");
            only("nesterov", o.nesterov.is_some(), "sgd");
            let decoupled = o.kind == OptimizerKind::Adamw;
            (
                0.001,
                OptimizerPlan::Adam {
                    beta_1: o.beta_1.unwrap_or(0.9),
                    beta_2: o.beta_2.unwrap_or(0.999),
                    epsilon: o.epsilon.unwrap_or(1e-7),
                    weight_decay: o.weight_decay.unwrap_or(if decoupled { 0.004 } else { 0.0 }),
                    decoupled,
                    clip_norm,
                    decay: match (&o.exclude_from_weight_decay, decoupled) {
                        (Some(patterns), _) => DecayPlan::Excluding(patterns.clone()),
                        (None, true) => DecayPlan::Matrices,
                        (None, false) => DecayPlan::All,
                    },
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(toml_text: &str) -> (OptimizerPlan, Vec<Diagnostic>) {
        let spec: Spec = toml::from_str(&format!("{toml_text}[model]\nzoo = \"gpt\"\n")).unwrap();
        let mut diags = Vec::new();
        let (_, plan) = resolve(&spec, &mut diags);
        (plan, diags)
    }

    #[test]
    fn adamw_skips_vectors_unless_told_and_clips_when_asked() {
        let (p, d) = plan("[optimizer]\nkind = \"adamw\"\nclip_norm = 1.0\n");
        assert!(d.is_empty(), "{d:?}");
        let OptimizerPlan::Adam { decay, clip_norm, .. } = p else { panic!("{p:?}") };
        assert_eq!((decay.clone(), clip_norm), (DecayPlan::Matrices, Some(1.0)));
        assert!(decay.decays("transformer_block/mlp_fc/kernel", &[128, 512]));
        assert!(!decay.decays("transformer_block/mlp_fc/bias", &[512]));
        assert!(!decay.decays("layer_norm/gamma", &[128]));
        let (p, _) = plan("[optimizer]\nkind = \"adamw\"\nexclude_from_weight_decay = [\"embeddings\", \"bias\"]\n");
        let OptimizerPlan::Adam { decay, .. } = p else { panic!("{p:?}") };
        assert!(!decay.decays("embedding/embeddings", &[65, 128]));
        assert!(decay.decays("layer_norm/gamma", &[128]));
        let (p, _) = plan("[optimizer]\nkind = \"adam\"\nweight_decay = 0.1\n");
        assert!(matches!(p, OptimizerPlan::Adam { decay: DecayPlan::All, clip_norm: None, .. }));
    }

    #[test]
    fn misplaced_or_bad_keys_name_the_key_and_the_fix() {
        let (_, d) = plan("[optimizer]\nkind = \"sgd\"\nexclude_from_weight_decay = [\"bias\"]\nclip_norm = -1.0\n");
        let text: Vec<String> = d.iter().map(|d| format!("{}: {d}", d.key)).collect();
        assert_eq!(
            text,
            [
                "optimizer.clip_norm: error: optimizer.clip_norm = -1 must be a positive number\n  \
                 help: use a norm such as `clip_norm = 1.0`, or remove the key for no clipping",
                "optimizer.exclude_from_weight_decay: error: optimizer.exclude_from_weight_decay applies to adam and adamw only, \
                 but optimizer.kind = \"sgd\"\n  help: remove exclude_from_weight_decay, or change optimizer.kind",
            ]
        );
    }
}
