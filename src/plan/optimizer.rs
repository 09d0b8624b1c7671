//! `[optimizer]`, resolved: the optimizer with every default filled in (Keras's defaults).
//! The learning rate is planned apart, in `lr`.

use crate::spec::{Diagnostic, OptimizerKind, Spec};
use serde::Serialize;

/// The resolved optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum OptimizerPlan {
    /// SGD.
    Sgd { momentum: f64, nesterov: bool, weight_decay: f64 },
    /// Adam (`decoupled = false`) or AdamW.
    Adam { beta_1: f64, beta_2: f64, epsilon: f64, weight_decay: f64, decoupled: bool },
}

/// The optimizer `spec` asks for, and its kind's default learning rate.
pub fn resolve(spec: &Spec, diags: &mut Vec<Diagnostic>) -> (f64, OptimizerPlan) {
    let o = &spec.optimizer;
    let kind = match o.kind {
        OptimizerKind::Sgd => "sgd",
        OptimizerKind::Adam => "adam",
        OptimizerKind::Adamw => "adamw",
    };
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
            (0.01, OptimizerPlan::Sgd { momentum, nesterov, weight_decay: o.weight_decay.unwrap_or(0.0) })
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
                },
            )
        }
    }
}
