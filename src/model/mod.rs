//! `[model]` → an engine [`Sequential`]: a zoo model or `[[model.layers]]`, shaped to the
//! data's examples and classes, with every shape problem reported at once.
//!
//! Inputs are channels last, `(h, w)` or `(h, w, c)` as the data gives them. Layers that need
//! an image (`conv2d`, pooling, `residual`) do not add a channel axis to `(h, w)` by
//! themselves: that is an error whose help names the `reshape` to add, as Keras would fail
//! too, so the spec says what the model sees. `dense` takes any input flat (as after a
//! `flatten`), so `(h, w)` data can go straight into an MLP.

mod build;
mod config;
mod sequence;
mod size;

pub use config::{GptConfig, InitFormat, InitFrom, LayerConfig, ModelSpec, Padding, Size2, ZooModel};
pub use size::{ModelSize, Shrink, size};

pub mod zoo;

#[cfg(test)]
#[path = "bench_tests.rs"]
mod bench;
#[cfg(test)]
mod gpt_tests;
#[cfg(test)]
mod size_tests;
#[cfg(test)]
mod tests;

use crate::data::LabelKind;
use crate::diagnostic::Diagnostic;
use crate::engine::layers::KernelInit;
use crate::engine::{ProductPath, Sequential, Shape};
use build::LayerSource;
use serde::Serialize;

/// A model as planned: the layers (a zoo model expanded into its layers), checked against
/// the data's example shape and classes. The builder makes one engine model per replica from
/// it, and the GPU engine maps those models' layers to its kernels: nothing past the plan
/// reads `[model]` again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelPlan {
    /// Shape of one input example.
    pub input: Shape,
    /// Values in one row of output the loss reads: the dataset's classes (per example, or per
    /// position of a sequence), or its float targets per example.
    pub classes: usize,
    /// Shape of one example's output: `[classes]`, or `[T, classes]` for a model that
    /// predicts at every position of a `[T]` input (a language model).
    pub output: Shape,
    /// The layers in order.
    pub layers: Vec<LayerConfig>,
    /// How convolution kernels start.
    pub conv_init: KernelInit,
    /// Trainable values.
    pub params: usize,
    /// Non-trainable values (batch-norm moving statistics).
    pub state: usize,
    /// Weights to start from (`model.init_from`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
    /// How the layers' matrix products run: `train.precision` resolved for this CPU.
    #[serde(skip_serializing_if = "ProductPath::is_float32")]
    pub products: ProductPath,
}

/// A planned model that did not build (planning checked it, so this is a bug).
#[derive(Debug, thiserror::Error)]
#[error("the planned model does not build: {0}")]
pub struct BuildError(String);

impl ModelPlan {
    /// A fresh engine model: one per replica, each with its own activation buffers.
    pub fn build(&self) -> Result<Sequential, BuildError> {
        let checked = build::layers(&self.layers, &self.input, self.classes, self.conv_init, LayerSource::Layers);
        match checked.diags.first() {
            None => {
                let mut model =
                    Sequential::try_new(self.input.clone(), checked.layers).map_err(|e| BuildError(e.to_string()))?;
                model.use_products(self.products);
                Ok(model)
            }
            Some(d) => Err(BuildError(d.message.clone())),
        }
    }

    /// How many layers take a bf16 path for some product under [`ModelPlan::products`] (0
    /// under float32, and for models whose layers have no bf16 path yet or are too narrow).
    pub fn layers_on_bf16(&self) -> Result<usize, BuildError> {
        Ok(self.build()?.use_products(self.products))
    }

    /// The model predicts at every position of its input (a `[T, classes]` output).
    pub fn per_position(&self) -> bool {
        per_position(&self.input, &self.output)
    }
}

/// `output` is `input`'s shape plus one axis: a prediction per position.
fn per_position(input: &Shape, output: &Shape) -> bool {
    output.rank() == input.rank() + 1 && output.0.starts_with(&input.0)
}

/// Plans the model `spec` describes for examples of `input` and `classes` classes, reporting
/// every problem at once.
pub fn describe(spec: &ModelSpec, input: &Shape, classes: usize) -> Result<ModelPlan, Vec<Diagnostic>> {
    describe_for(spec, input, LabelKind::Class { classes: classes as u32 })
}

/// Plans the model `spec` describes for examples of `input` labelled as `labels` says: it must
/// output one value per class, per class at each position, or per float target.
pub fn describe_for(spec: &ModelSpec, input: &Shape, labels: LabelKind) -> Result<ModelPlan, Vec<Diagnostic>> {
    let classes = labels.row_width();
    if input.numel() == 0 {
        return Err(vec![Diagnostic::error("data", format!("examples have shape {input}, which holds no values"))]);
    }
    if let (Some(_), false) = (spec.gpt, spec.zoo == Some(ZooModel::Gpt)) {
        return Err(vec![
            Diagnostic::error("model.gpt", "[model.gpt] sizes the gpt zoo model, but `zoo = \"gpt\"` is not set")
                .help("add `zoo = \"gpt\"` to [model], or remove [model.gpt]"),
        ]);
    }
    let (layers, conv_init, source) = match (spec.zoo, spec.layers.is_empty()) {
        (Some(zoo), false) => {
            return Err(vec![
                Diagnostic::error(
                    "model",
                    format!(
                        "both `zoo = \"{}\"` and {} `[[model.layers]]` are given",
                        zoo::name(zoo),
                        spec.layers.len()
                    ),
                )
                .help("keep one: remove `zoo` to use your layers, or the layers to use the zoo model"),
            ]);
        }
        (None, true) => {
            return Err(vec![
                Diagnostic::error("model", "no model: neither `zoo` nor `[[model.layers]]` is given")
                    .help("add `zoo = \"mnist_cnn\"` (or `resnet20`, `resnet56`, `gpt`), or list `[[model.layers]]`"),
            ]);
        }
        (Some(zoo), true) => {
            let (layers, init) = zoo::layers(spec, zoo, input, classes).map_err(|d| vec![d])?;
            (layers, init, LayerSource::Zoo(zoo))
        }
        (None, false) => (spec.layers.clone(), KernelInit::GlorotUniform, LayerSource::Layers),
    };
    let mut checked = build::layers(&layers, input, classes, conv_init, source);
    if let Some(out) = checked.output.as_ref().filter(|o| o.numel() != labels.outputs()) {
        let mismatch = output_mismatch(&layers, out, labels, source);
        checked.diags.push(mismatch);
    }
    if !checked.diags.is_empty() {
        return Err(checked.diags);
    }
    let output = checked.output.clone().unwrap_or_else(|| Shape(vec![classes]));
    let model = Sequential::try_new(input.clone(), checked.layers)
        .map_err(|e| vec![source.diag(0, None, "model", e.to_string())])?;
    Ok(ModelPlan {
        input: input.clone(),
        classes,
        output,
        layers,
        conv_init,
        params: model.param_len(),
        state: model.state_len(),
        init_from: spec.init_from.clone(),
        products: ProductPath::Float32,
    })
}

/// Plans and builds the model `spec` describes: for tools and tests that start from a spec.
pub fn build_spec(spec: &ModelSpec, input: &Shape, classes: usize) -> Result<Sequential, Vec<Diagnostic>> {
    let plan = describe(spec, input, classes)?;
    plan.build().map_err(|e| vec![Diagnostic::error("model", e.to_string())])
}

/// The model's output size differs from what the labels need: point at the dense layer that
/// sets it, when the layers after it keep its shape.
fn output_mismatch(specs: &[LayerConfig], out: &Shape, labels: LabelKind, source: LayerSource) -> Diagnostic {
    let (outputs, width) = (out.numel(), labels.row_width());
    let message = match labels {
        LabelKind::Class { classes } => {
            format!("model outputs {outputs} values per example but the dataset has {classes} classes")
        }
        LabelKind::Target { width } => {
            format!("model outputs {outputs} values per example but the dataset has {width} float targets per example")
        }
        LabelKind::Sequence { classes, len } => format!(
            "model outputs {outputs} values per example ({out}) but the dataset labels each of {len} positions with one of {classes} classes, so it needs ({len}, {classes})"
        ),
    };
    let last_dense = specs.iter().rposition(|s| {
        !matches!(s, LayerConfig::Dropout { .. } | LayerConfig::BatchNorm { .. } | LayerConfig::Activation { .. })
    });
    match (last_dense.map(|i| (i, &specs[i])), labels) {
        (Some((i, LayerConfig::Dense { .. })), LabelKind::Class { .. } | LabelKind::Target { .. }) => {
            source.diag(i, Some("units"), "dense", message).help(format!("make the last dense layer `units = {width}`"))
        }
        (_, LabelKind::Sequence { .. }) => source
            .diag(specs.len().saturating_sub(1), None, specs.last().map_or("", LayerConfig::kind), message)
            .help(format!("end the model with a layer that outputs {width} logits at every position")),
        (_, LabelKind::Class { .. } | LabelKind::Target { .. }) => source
            .diag(specs.len().saturating_sub(1), None, specs.last().map_or("", LayerConfig::kind), message)
            .help(format!(
                "end the model with a dense layer of `units = {width}` (after a flatten or global_avg_pool2d for images)"
            )),
    }
}

/// A text table like Keras's `model.summary()`: each layer's name, output shape (with the
/// batch axis as `None`) and values (trainable and moving statistics), then the totals.
pub fn summary(model: &Sequential) -> String {
    let state_of = |layer: &str| -> usize {
        model.state_tensors().iter().filter(|t| t.name.split('/').next() == Some(layer)).map(|t| t.len()).sum()
    };
    let shape = |s: &Shape| {
        let dims: Vec<String> = s.0.iter().map(|d| d.to_string()).collect();
        format!("(None, {})", dims.join(", "))
    };
    let rule = "─".repeat(64);
    let mut out = format!("{:<28}{:<24}{:>12}\n{rule}\n", "Layer", "Output shape", "Param #");
    for row in model.summary() {
        let values = row.params + state_of(&row.name);
        out += &format!("{:<28}{:<24}{:>12}\n", row.name, shape(&row.output_shape), thousands(values));
    }
    let (trainable, state) = (model.param_len(), model.state_len());
    out += &format!(
        "{rule}\nTotal params: {}\nTrainable params: {}\nNon-trainable params: {}\n",
        thousands(trainable + state),
        thousands(trainable),
        thousands(state)
    );
    out
}

/// `1234567` → `1,234,567`.
pub(crate) fn thousands(v: usize) -> String {
    let digits = v.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}
