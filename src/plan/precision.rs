//! `train.precision` resolved for this CPU: the policy the spec asks for, what the CPU
//! offers, and the path the layers' products take (`engine::bf16`).

use crate::engine::ProductPath;
use crate::engine::bf16::Bf16Support;
use crate::model::ModelPlan;
use crate::spec::{Diagnostic, PrecisionPolicy, Spec};
use serde::Serialize;

/// The dtype policy as it will run here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PrecisionPlan {
    /// What the spec asks for.
    pub policy: PrecisionPolicy,
    /// What this CPU offers.
    #[serde(skip)]
    pub cpu: Bf16Support,
    /// How the products run.
    pub products: ProductPath,
}

impl PrecisionPlan {
    /// Whether everything runs in fp32 as asked (for leaving it out of a serialized plan).
    pub fn is_float32(&self) -> bool {
        self.policy == PrecisionPolicy::Float32
    }

    /// The line `trainrun check` prints.
    pub fn summary(&self) -> String {
        match (self.policy, self.products) {
            (PrecisionPolicy::Float32, _) => "float32".to_string(),
            (PrecisionPolicy::MixedBfloat16, ProductPath::Float32) => {
                format!("mixed_bfloat16: runs in fp32 ({})", self.cpu.why_fp32())
            }
            (PrecisionPolicy::MixedBfloat16, path) => format!(
                "mixed_bfloat16: bf16 inputs and fp32 sums on {} for products of layers {} wide or more \
                 (dense kernels, conv2d im2col products, attention projections, MLP, LM head); smaller ones measured faster in fp32 here (this CPU: {})",
                path.name(),
                path.pays_from(),
                self.cpu.name()
            ),
        }
    }
}

/// A warning where `mixed_bfloat16` would change nothing in `model`: no layer of it has a bf16
/// path or none is [`ProductPath::pays_from`] wide on both sides (a convolution's patch length
/// and filters), so the run would be float32's, bit for bit, under a name that says otherwise.
pub fn check_model(plan: &PrecisionPlan, model: &ModelPlan, diags: &mut Vec<Diagnostic>) {
    if plan.products.is_float32() || model.layers_on_bf16().map_or(true, |layers| layers > 0) {
        return;
    }
    diags.push(
        Diagnostic::warning(
            "train.precision",
            format!(
                "mixed_bfloat16 changes nothing in this model: no layer of it takes the bf16 path ({}), which dense, \
                 conv2d (patch length × filters), attention and LM-head products {} wide or more on both sides \
                 take",
                plan.products.name(),
                plan.products.pays_from()
            ),
        )
        .help("the run gives float32's results; set train.precision = \"float32\" so the spec says what runs"),
    );
}

/// The plan for `spec.train.precision` on a CPU with `cpu`; a policy this CPU cannot run
/// is said once, as a warning.
pub fn resolve(spec: &Spec, cpu: Bf16Support, diags: &mut Vec<Diagnostic>) -> PrecisionPlan {
    let policy = spec.train.precision;
    let products = match policy {
        PrecisionPolicy::Float32 => ProductPath::Float32,
        PrecisionPolicy::MixedBfloat16 => cpu.mixed_path().unwrap_or_else(|| {
            diags.push(
                Diagnostic::warning("train.precision", format!("mixed_bfloat16 runs in fp32 here: {}", cpu.why_fp32()))
                    .help("the results will be float32's; a CPU with bf16 instructions runs the policy"),
            );
            ProductPath::Float32
        }),
    };
    PrecisionPlan { policy, cpu, products }
}
