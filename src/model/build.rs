//! Layer specs → engine layers, checking shapes as it goes and collecting every problem.
//!
//! After a layer that cannot be built, checking goes on with the shape the layer would have
//! produced when that is known without its input (`reshape`, `dense`, shape-keeping layers),
//! so independent mistakes further down are reported in the same run.

use super::config::{LayerConfig, Padding, Size2, ZooModel};
use super::sequence::gelu_form;
use crate::diagnostic::Diagnostic;
use crate::engine::kernels::Window;
use crate::engine::layers::{
    ActivationLayer, AvgPool2d, BatchNorm, Conv2d, Dense, Dropout, Gelu, GlobalAvgPool2d, KernelInit, LayerNorm,
    MaxPool2d, PositionwiseDense, Residual, View,
};
use crate::engine::{Layer, Shape};
use std::num::NonZeroUsize;

/// Keras's `BatchNormalization` defaults, used inside `residual` blocks.
pub(crate) const BN_MOMENTUM: f32 = 0.99;
pub(crate) const BN_EPSILON: f32 = 1e-3;

/// Where the layers come from, for keys and messages.
#[derive(Debug, Clone, Copy)]
pub(super) enum LayerSource {
    /// `[[model.layers]]`: diagnostics name `model.layers[i].field`.
    Layers,
    /// A zoo model: diagnostics name `model.zoo` and say which of its layers failed.
    Zoo(ZooModel),
}

impl LayerSource {
    pub(super) fn diag(self, i: usize, field: Option<&str>, kind: &str, message: String) -> Diagnostic {
        match self {
            LayerSource::Layers => {
                let key = match field {
                    Some(f) => format!("model.layers[{i}].{f}"),
                    None => format!("model.layers[{i}]"),
                };
                Diagnostic::error(key, message)
            }
            LayerSource::Zoo(zoo) => {
                Diagnostic::error("model.zoo", format!("{} layer {i} ({kind}): {message}", super::zoo::name(zoo)))
            }
        }
    }
}

/// The layers built from specs, the output shape when known, and every problem found.
pub(super) struct Checked {
    pub layers: Vec<Box<dyn Layer>>,
    pub output: Option<Shape>,
    pub diags: Vec<Diagnostic>,
}

/// Builds `specs` on inputs of `input` for a dataset of `classes` classes (a language model's
/// vocabulary), convolutions drawing their kernels by `conv_init`.
pub(super) fn layers(
    specs: &[LayerConfig],
    input: &Shape,
    classes: usize,
    conv_init: KernelInit,
    source: LayerSource,
) -> Checked {
    let mut layers: Vec<Box<dyn Layer>> = Vec::with_capacity(specs.len());
    let mut diags = Vec::new();
    let mut shape = Some(input.clone());
    let blocks = specs.iter().filter(|s| matches!(s, LayerConfig::TransformerBlock { .. })).count();
    let mut embedding = None;
    for (i, spec) in specs.iter().enumerate() {
        let ctx = Ctx { i, kind: spec.kind(), source, classes, blocks, embedding: embedding.clone() };
        let mut problems = ctx.values(spec);
        match &shape {
            Some(s) if problems.is_empty() => match ctx.layer(spec, s, conv_init) {
                Ok(layer) => {
                    shape = Some(layer.output_shape().clone());
                    if let LayerConfig::Embedding { output_dim } = spec {
                        // Sequential's name for it: the kind, numbered from the second on.
                        let earlier = layers.iter().filter(|l| l.kind() == layer.kind()).count();
                        let name = match earlier {
                            0 => layer.kind().to_string(),
                            k => format!("{}_{k}", layer.kind()),
                        };
                        embedding = Some(Tied { path: format!("{name}/embeddings"), dim: output_dim.get() });
                    }
                    layers.push(layer);
                    continue;
                }
                Err(d) => problems.push(d),
            },
            _ => {}
        }
        diags.extend(problems);
        shape = spec.intended_output(shape.as_ref());
    }
    Checked { layers, output: shape, diags }
}

/// The token embedding an `lm_head` can tie to: its table's weight path and width.
#[derive(Debug, Clone)]
pub(super) struct Tied {
    pub path: String,
    pub dim: usize,
}

/// One layer being built.
pub(super) struct Ctx {
    pub i: usize,
    pub kind: &'static str,
    pub source: LayerSource,
    /// The dataset's classes: a language model's vocabulary.
    pub classes: usize,
    /// Transformer blocks in the model, for their scaled initialization.
    pub blocks: usize,
    /// The nearest earlier token embedding.
    pub embedding: Option<Tied>,
}

impl Ctx {
    pub(super) fn diag(&self, field: Option<&str>, message: String) -> Diagnostic {
        self.source.diag(self.i, field, self.kind, message)
    }

    /// Checks of values that do not depend on the input shape.
    fn values(&self, spec: &LayerConfig) -> Vec<Diagnostic> {
        let mut d = Vec::new();
        match spec {
            LayerConfig::Dropout { rate } if !(0.0..1.0).contains(rate) => d.push(
                self.diag(Some("rate"), format!("rate = {rate} is outside [0, 1)"))
                    .help("use a fraction such as `rate = 0.5`; 1 would drop everything"),
            ),
            LayerConfig::BatchNorm { momentum, epsilon } => {
                if !(0.0..=1.0).contains(momentum) {
                    d.push(
                        self.diag(Some("momentum"), format!("momentum = {momentum} is outside [0, 1]"))
                            .help("Keras's default is `momentum = 0.99`"),
                    );
                }
                if !(epsilon.is_finite() && *epsilon > 0.0) {
                    d.push(
                        self.diag(Some("epsilon"), format!("epsilon = {epsilon} must be a positive number"))
                            .help("Keras's default is `epsilon = 0.001`"),
                    );
                }
            }
            LayerConfig::MultiHeadAttention { dropout: rate, .. }
            | LayerConfig::TransformerBlock { dropout: rate, .. }
                if !(0.0..1.0).contains(rate) =>
            {
                d.push(
                    self.diag(Some("dropout"), format!("dropout = {rate} is outside [0, 1)"))
                        .help("use a fraction such as `dropout = 0.1`, or 0 for none"),
                )
            }
            LayerConfig::LayerNorm { epsilon: e } | LayerConfig::TransformerBlock { layer_norm_epsilon: e, .. }
                if !(e.is_finite() && *e > 0.0) =>
            {
                let key = if matches!(spec, LayerConfig::LayerNorm { .. }) { "epsilon" } else { "layer_norm_epsilon" };
                d.push(
                    self.diag(Some(key), format!("{key} = {e} must be a positive number"))
                        .help(format!("GPT-2 uses `{key} = 1e-5`")),
                )
            }
            LayerConfig::Dropout { .. }
            | LayerConfig::MultiHeadAttention { .. }
            | LayerConfig::TransformerBlock { .. }
            | LayerConfig::LayerNorm { .. }
            | LayerConfig::Embedding { .. }
            | LayerConfig::PositionEmbedding { .. }
            | LayerConfig::Gelu { .. }
            | LayerConfig::PositionwiseDense { .. }
            | LayerConfig::LmHead { .. }
            | LayerConfig::Dense { .. }
            | LayerConfig::Conv2d { .. }
            | LayerConfig::MaxPool2d { .. }
            | LayerConfig::AvgPool2d { .. }
            | LayerConfig::GlobalAvgPool2d
            | LayerConfig::Flatten
            | LayerConfig::Reshape { .. }
            | LayerConfig::Activation { .. }
            | LayerConfig::Residual { .. } => {}
        }
        d
    }

    /// Builds `spec` on inputs of `input`.
    fn layer(&self, spec: &LayerConfig, input: &Shape, conv_init: KernelInit) -> Result<Box<dyn Layer>, Diagnostic> {
        Ok(match spec {
            // A multi-axis input is taken flat, as after a `flatten` (Keras would apply the
            // layer to the last axis only).
            LayerConfig::Dense { units, activation, use_bias } => {
                Box::new(Dense::new(input.numel(), units.get(), *activation, *use_bias))
            }
            LayerConfig::Conv2d { filters, kernel_size, strides, padding, activation, use_bias } => {
                let win = self.window(input, "kernel_size", *kernel_size, *strides, *padding)?;
                Box::new(Conv2d::new(win, filters.get(), *activation, *use_bias).with_kernel_init(conv_init))
            }
            LayerConfig::MaxPool2d { pool_size, strides, padding } => Box::new(MaxPool2d::new(self.window(
                input,
                "pool_size",
                *pool_size,
                strides.unwrap_or(*pool_size),
                *padding,
            )?)),
            LayerConfig::AvgPool2d { pool_size, strides, padding } => Box::new(AvgPool2d::new(self.window(
                input,
                "pool_size",
                *pool_size,
                strides.unwrap_or(*pool_size),
                *padding,
            )?)),
            LayerConfig::GlobalAvgPool2d => Box::new(GlobalAvgPool2d::new(self.image(input)?)),
            LayerConfig::Flatten => Box::new(View::flatten(input)),
            LayerConfig::Reshape { target_shape } => {
                let target = Shape(target_shape.iter().map(|d| d.get()).collect());
                if target.numel() != input.numel() {
                    return Err(self.reshape_mismatch(&target, input));
                }
                Box::new(View::reshape(target))
            }
            LayerConfig::Dropout { rate } => Box::new(Dropout::new(*rate as f32, self.i as u64, input.clone())),
            LayerConfig::BatchNorm { momentum, epsilon } => {
                Box::new(BatchNorm::new(input.clone(), *momentum as f32, *epsilon as f32))
            }
            LayerConfig::Activation { activation } => Box::new(ActivationLayer::new(*activation, input.clone())),
            LayerConfig::Residual { filters, strides } => {
                let hwc = self.image(input)?;
                let block = Residual::new(hwc, filters.get(), strides.hw(), BN_MOMENTUM, BN_EPSILON)
                    .ok_or_else(|| self.diag(None, format!("cannot build a block on input {input}")))?;
                Box::new(block)
            }
            LayerConfig::Embedding { output_dim } => self.embedding(input, output_dim.get())?,
            LayerConfig::PositionEmbedding { block_size } => self.position_embedding(input, block_size.get())?,
            LayerConfig::LayerNorm { epsilon } => Box::new(LayerNorm::new(input.clone(), *epsilon as f32)),
            LayerConfig::Gelu { approximate } => Box::new(Gelu::new(gelu_form(*approximate), input.clone())),
            LayerConfig::MultiHeadAttention { num_heads, causal, dropout } => {
                self.attention(input, num_heads.get(), *causal, *dropout)?
            }
            LayerConfig::TransformerBlock {
                num_heads,
                intermediate_dim,
                dropout,
                layer_norm_epsilon,
                approximate_gelu,
            } => self.transformer_block(
                input,
                num_heads.get(),
                intermediate_dim.map(NonZeroUsize::get),
                *dropout,
                *layer_norm_epsilon,
                *approximate_gelu,
            )?,
            LayerConfig::PositionwiseDense { units, use_bias } => {
                let (t, d) = self.sequence(input)?;
                Box::new(PositionwiseDense::new(t, d, units.get(), *use_bias))
            }
            LayerConfig::LmHead { tie_embeddings } => self.lm_head(input, *tie_embeddings)?,
        })
    }

    /// `input` as `(h, w, c)`, or the reshape that would make it one.
    fn image(&self, input: &Shape) -> Result<(usize, usize, usize), Diagnostic> {
        if let Some(hwc) = input.hwc().filter(|_| input.numel() > 0) {
            return Ok(hwc);
        }
        let d = self.diag(None, format!("{} needs an image input (h, w, c) but gets {input}", self.kind));
        Err(match suggest_image(input) {
            Some(t) => {
                d.help(format!("add a reshape layer before it with `target_shape = [{}, {}, {}]`", t.0, t.1, t.2))
            }
            None => d.help(format!(
                "add a reshape layer before it whose `target_shape = [h, w, c]` holds {} values",
                input.numel()
            )),
        })
    }

    /// The window geometry, or why the window does not fit.
    fn window(
        &self,
        input: &Shape,
        field: &str,
        size: Size2,
        strides: Size2,
        padding: Padding,
    ) -> Result<Window, Diagnostic> {
        let hwc = self.image(input)?;
        let same = match padding {
            Padding::Same => true,
            Padding::Valid => false,
        };
        let (kh, kw) = size.hw();
        Window::new(hwc, (kh, kw), strides.hw(), same).ok_or_else(|| {
            self.diag(
                Some(field),
                format!("{field} {kh}×{kw} is larger than its {}×{} input under `valid` padding", hwc.0, hwc.1),
            )
            .help(format!("use `padding = \"same\"`, or a {field} of at most {}×{}", hwc.0, hwc.1))
        })
    }

    fn reshape_mismatch(&self, target: &Shape, input: &Shape) -> Diagnostic {
        let dims = |s: &Shape| {
            let d: Vec<String> = s.0.iter().map(|d| d.to_string()).collect();
            format!("[{}]", d.join(", "))
        };
        let have = input.numel();
        // Keep the leading axes and fix the last, when that works; else one flat axis.
        let lead: usize = target.0[..target.0.len().saturating_sub(1)].iter().product();
        let fix = if lead > 0 && have.is_multiple_of(lead) && target.rank() > 1 {
            let mut d = target.0.clone();
            if let Some(last) = d.last_mut() {
                *last = have / lead;
            }
            Shape(d)
        } else {
            Shape(vec![have])
        };
        self.diag(
            Some("target_shape"),
            format!("target_shape {} holds {} values, input {input} has {have}", dims(target), target.numel()),
        )
        .help(format!("use `target_shape = {}`", dims(&fix)))
    }
}

/// An `(h, w, c)` shape with `input`'s values: a channel axis for `(h, w)`, a square with 1
/// or 3 channels for a flat input.
pub(super) fn suggest_image(input: &Shape) -> Option<(usize, usize, usize)> {
    let square = |k: usize| {
        let s = (k as f64).sqrt().round() as usize;
        (s > 0 && s * s == k).then_some(s)
    };
    match input.0.as_slice() {
        [h, w] => Some((*h, *w, 1)),
        [k] => match (square(*k), square(k / 3)) {
            (Some(s), _) => Some((s, s, 1)),
            (None, Some(s)) if k.is_multiple_of(3) => Some((s, s, 3)),
            _ => None,
        },
        _ => None,
    }
}
