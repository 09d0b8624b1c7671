//! How big a model is, from arithmetic on its description before anything is allocated: the
//! planner refuses a model the machine cannot hold before it expands the layer list (a GPT
//! of `n_layer = 1e9` is 48 GB of layer descriptions alone). Every count saturates at
//! `u64::MAX` instead of wrapping, so an absurd size reads as absurd, never as small.

use super::build::{self, LayerSource};
use super::config::{GptConfig, LayerConfig, ModelSpec, ZooModel};
use crate::data::LabelKind;
use crate::engine::Shape;
use crate::engine::layers::KernelInit;

/// The values a model holds and keeps per example, and what makes it big.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSize {
    /// Trainable values.
    pub params: u64,
    /// Non-trainable values (batch-norm moving statistics).
    pub state: u64,
    /// Values one example keeps through a forward pass for the backward one (every layer's
    /// output and what layers keep besides): an upper bound of the engine's count.
    pub activations: u64,
    /// The keys that hold the most parameters, largest first, each with its value and share:
    /// what a message tells the user to shrink.
    pub shrink: Vec<Shrink>,
}

/// A key to shrink: `key = now` holds `params` of the model's parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shrink {
    /// The spec key, e.g. `model.gpt.n_layer` or `model.layers[2].units`.
    pub key: String,
    /// Its value now, as the message shows it (`1000000000 blocks`).
    pub now: String,
    /// Parameters this key multiplies.
    pub params: u64,
}

/// The size of the model `spec` describes on inputs of `input` with labels `labels`, or
/// `None` when it does not check out (planning reports why). A GPT is sized in closed form;
/// other models are short lists of layer descriptions, sized from their engine layers, which
/// hold no values until a model is built.
pub fn size(spec: &ModelSpec, input: &Shape, labels: LabelKind) -> Option<ModelSize> {
    let classes = labels.row_width();
    match (spec.zoo, spec.layers.is_empty()) {
        (Some(ZooModel::Gpt), true) => gpt(&spec.gpt.unwrap_or_default(), input, classes as u64),
        (Some(zoo), true) => {
            let (layers, init) = super::zoo::layers(spec, zoo, input, classes).ok()?;
            let mut size = listed(&layers, input, classes, init, LayerSource::Zoo(zoo))?;
            // A zoo model other than the GPT has no size keys of its own.
            size.shrink = vec![Shrink {
                key: "model.zoo".into(),
                now: format!("\"{}\"", super::zoo::name(zoo)),
                params: size.params,
            }];
            Some(size)
        }
        (None, false) => listed(&spec.layers, input, classes, KernelInit::GlorotUniform, LayerSource::Layers),
        (Some(_), false) | (None, true) => None,
    }
}

/// `a × b`, saturating.
fn mul(a: u64, b: u64) -> u64 {
    a.saturating_mul(b)
}

/// GPT-2 as the zoo builds it (see `zoo::gpt`): token embeddings `V × C`, positions `B × C`,
/// `n_layer` blocks of `12 C² + 13 C` (layer norms, fused QKV, output projection, a 4× MLP,
/// with biases), a final layer norm and a head that is tied (no values) or `C × V`.
fn gpt(g: &GptConfig, input: &Shape, vocab: u64) -> Option<ModelSize> {
    let [t] = input.0.as_slice() else { return None };
    let (t, n, h) = (*t as u64, g.n_layer.get() as u64, g.n_head.get() as u64);
    let (c, b) = (g.n_embd.get() as u64, g.block_size.get() as u64);
    let block = mul(12, mul(c, c)).saturating_add(mul(13, c));
    let blocks = mul(n, block);
    let embeddings = mul(vocab, c);
    let head = if g.tie_embeddings { 0 } else { mul(c, vocab) };
    let positions = mul(b, c);
    let params = embeddings.saturating_add(positions).saturating_add(blocks).saturating_add(2 * c).saturating_add(head);
    // Per block: the output, the attention's (output, QKV, probabilities twice under dropout,
    // merged heads), six `[T, C]` and five `[T, 4C]` buffers; around them the embeddings,
    // dropout, final layer norm (with its statistics) and the logits `[T, V]`.
    let per_block = mul(32, mul(t, c)).saturating_add(mul(2 * h, mul(t, t)));
    let around = mul(8, mul(t, c)).saturating_add(mul(4, t)).saturating_add(mul(t, vocab));
    let activations = mul(n, per_block).saturating_add(around);
    let shrink = [
        Shrink { key: "model.gpt.n_layer".into(), now: format!("{n} blocks of 12 × n_embd² values"), params: blocks },
        Shrink {
            key: "model.gpt.n_embd".into(),
            now: format!("{c}, the width of every block and embedding"),
            params: blocks.saturating_add(embeddings).saturating_add(head),
        },
        Shrink {
            key: "the vocabulary".into(),
            now: format!("{vocab} tokens × n_embd (data.tokens.vocab_size, or the text's tokens)"),
            params: embeddings.saturating_add(head),
        },
        Shrink { key: "model.gpt.block_size".into(), now: format!("{b} positions × n_embd"), params: positions },
    ];
    // The key furthest above its usual size first (GPT-2 small's vocabulary, the zoo's other
    // defaults): n_embd multiplies the most parameters, but is rarely the one that was mistyped.
    let ratio = [n / 4, c / 128, vocab / 50_304, b / 64];
    let mut order: Vec<usize> = (0..shrink.len()).collect();
    order.sort_by(|&i, &j| ratio[j].cmp(&ratio[i]).then(shrink[j].params.cmp(&shrink[i].params)));
    let shrink = order.into_iter().map(|i| shrink[i].clone()).collect();
    Some(ModelSize { params, state: 0, activations, shrink })
}

/// A list of layers, sized from its engine layers (which allocate nothing when made).
fn listed(
    layers: &[LayerConfig],
    input: &Shape,
    classes: usize,
    init: KernelInit,
    source: LayerSource,
) -> Option<ModelSize> {
    let checked = build::layers(layers, input, classes, init, source);
    if !checked.diags.is_empty() {
        return None;
    }
    let count = |shape: &[usize]| shape.iter().fold(1u64, |n, &d| mul(n, d as u64));
    let (mut params, mut state, mut activations) = (0u64, 0u64, 0u64);
    let mut shrink = Vec::new();
    for (i, layer) in checked.layers.iter().enumerate() {
        let own = layer.params().iter().fold(0u64, |n, p| n.saturating_add(count(&p.shape)));
        params = params.saturating_add(own);
        state = layer.state().iter().fold(state, |n, p| n.saturating_add(count(&p.shape)));
        if !layer.is_view() {
            // The engine's own count multiplies unchecked; the output's checked size bounds it
            // from below when that wrapped.
            let out = layer.output_shape().checked_numel().map_or(u64::MAX, |v| v as u64);
            activations = activations.saturating_add(out.max(layer.activation_len() as u64));
        }
        if own > 0 {
            shrink.push(layer_shrink(source, i, &layers[i], own));
        }
    }
    shrink.sort_by_key(|s| std::cmp::Reverse(s.params));
    Some(ModelSize { params, state, activations, shrink })
}

/// The key of layer `i`'s size field (`units`, `filters`, …) and what it holds now, or the
/// layer itself when no field of its own sizes it.
fn layer_shrink(source: LayerSource, i: usize, layer: &LayerConfig, params: u64) -> Shrink {
    let (field, now) = match layer {
        LayerConfig::Dense { units, .. } | LayerConfig::PositionwiseDense { units, .. } => {
            (Some("units"), format!("{units} units"))
        }
        LayerConfig::Conv2d { filters, .. } | LayerConfig::Residual { filters, .. } => {
            (Some("filters"), format!("{filters} filters"))
        }
        LayerConfig::Embedding { output_dim } => (Some("output_dim"), format!("{output_dim} per token")),
        LayerConfig::PositionEmbedding { block_size } => (Some("block_size"), format!("{block_size} positions")),
        LayerConfig::TransformerBlock { intermediate_dim, .. } => {
            (Some("intermediate_dim"), intermediate_dim.map_or("4 × the input's width".into(), |d| d.to_string()))
        }
        LayerConfig::MaxPool2d { .. }
        | LayerConfig::AvgPool2d { .. }
        | LayerConfig::GlobalAvgPool2d
        | LayerConfig::Flatten
        | LayerConfig::Reshape { .. }
        | LayerConfig::Dropout { .. }
        | LayerConfig::BatchNorm { .. }
        | LayerConfig::Activation { .. }
        | LayerConfig::LayerNorm { .. }
        | LayerConfig::Gelu { .. }
        | LayerConfig::MultiHeadAttention { .. }
        | LayerConfig::LmHead { .. } => (None, format!("a {} layer", layer.kind())),
    };
    let key = match (source, field) {
        (LayerSource::Layers, Some(f)) => format!("model.layers[{i}].{f}"),
        (LayerSource::Layers, None) => format!("model.layers[{i}]"),
        (LayerSource::Zoo(_), _) => "model.zoo".into(),
    };
    Shrink { key, now, params }
}
