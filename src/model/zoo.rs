//! The model zoo, written in the same layer vocabulary as `[[model.layers]]`, so a zoo model
//! is checked like any spec and can be printed as one. Each adapts to the data: a channel axis
//! is added to `(h, w)` inputs, and the head has one output per class.
//!
//! Zoo models end in a linear dense layer: train them with `from_logits = true`.

use super::build::suggest_image;
use super::config::{GptConfig, LayerConfig, ModelSpec, Padding, Size2, ZooModel};
use crate::diagnostic::Diagnostic;
use crate::engine::Shape;
use crate::engine::layers::KernelInit;
use crate::vocab::Activation;
use std::num::NonZeroUsize;

/// The name as written in `model.zoo`.
pub fn name(zoo: ZooModel) -> &'static str {
    match zoo {
        ZooModel::MnistCnn => "mnist_cnn",
        ZooModel::Resnet20 => "resnet20",
        ZooModel::Resnet56 => "resnet56",
        ZooModel::Gpt => "gpt",
    }
}

/// The layers of `zoo` for inputs of `input` and `classes` classes, and how its convolution
/// kernels start (Keras's Glorot-uniform for the tutorial CNN, He-normal for ResNets).
pub fn layers(
    spec: &ModelSpec,
    zoo: ZooModel,
    input: &Shape,
    classes: usize,
) -> Result<(Vec<LayerConfig>, KernelInit), Diagnostic> {
    let classes = NonZeroUsize::new(classes)
        .ok_or_else(|| Diagnostic::error("model.zoo", "the dataset has 0 classes: nothing to classify"))?;
    if input.numel() == 0 {
        return Err(Diagnostic::error(
            "model.zoo",
            format!("the data's examples have shape {input}, which holds no values"),
        ));
    }
    if zoo == ZooModel::Gpt {
        return Ok((gpt(&spec.gpt.unwrap_or_default(), input)?, KernelInit::GlorotUniform));
    }
    let mut specs = Vec::new();
    if input.hwc().is_none() {
        let (h, w, c) = suggest_image(input).ok_or_else(|| {
            Diagnostic::error(
                "model.zoo",
                format!("{} needs image examples (h, w) or (h, w, c), but the data gives {input}", name(zoo)),
            )
            .help("use `[[model.layers]]` starting with a reshape to the image's shape")
        })?;
        specs.push(reshape(&[h, w, c]));
    }
    Ok(match zoo {
        // TensorFlow's multi-worker tutorial (`mnist_setup.build_and_compile_cnn_model`).
        ZooModel::MnistCnn => {
            specs.extend([
                conv(32, Padding::Valid, Activation::Relu, true),
                LayerConfig::Flatten,
                dense(nz(128), Activation::Relu),
                dense(classes, Activation::Linear),
            ]);
            (specs, KernelInit::GlorotUniform)
        }
        ZooModel::Resnet20 => (resnet(specs, 3, classes), KernelInit::HeNormal),
        ZooModel::Resnet56 => (resnet(specs, 9, classes), KernelInit::HeNormal),
        // Returned above: it takes token sequences, not images.
        ZooModel::Gpt => (gpt(&spec.gpt.unwrap_or_default(), input)?, KernelInit::GlorotUniform),
    })
}

/// nanoGPT's model: token and position embeddings, dropout, `n_layer` pre-LN blocks (exact
/// GELU unless `approximate_gelu`, MLP ratio 4, layer-norm epsilon 1e-5), a final layer norm and the head.
fn gpt(g: &GptConfig, input: &Shape) -> Result<Vec<LayerConfig>, Diagnostic> {
    let [t] = input.0.as_slice() else {
        return Err(Diagnostic::error(
            "model.zoo",
            format!("gpt needs sequences of token ids [T], but the data gives examples of shape {input}"),
        )
        .help("use a `text` or `tokens` data source"));
    };
    if *t > g.block_size.get() {
        return Err(Diagnostic::error(
            "model.gpt.block_size",
            format!("model.gpt.block_size = {} is shorter than the data's sequences of {t} tokens", g.block_size),
        )
        .help(format!("use `block_size = {t}` or more")));
    }
    if !g.n_embd.get().is_multiple_of(g.n_head.get()) {
        return Err(Diagnostic::error(
            "model.gpt.n_head",
            format!("model.gpt.n_head = {} does not divide n_embd = {}", g.n_head, g.n_embd),
        )
        .help("pick n_head and n_embd so that n_embd / n_head is a whole head size, e.g. 4 and 128"));
    }
    if !(0.0..1.0).contains(&g.dropout) {
        return Err(Diagnostic::error(
            "model.gpt.dropout",
            format!("model.gpt.dropout = {} is outside [0, 1)", g.dropout),
        )
        .help("use a fraction such as `dropout = 0.2`, or 0 for none"));
    }
    let mut specs = vec![
        LayerConfig::Embedding { output_dim: g.n_embd },
        LayerConfig::PositionEmbedding { block_size: g.block_size },
    ];
    if g.dropout > 0.0 {
        specs.push(LayerConfig::Dropout { rate: g.dropout });
    }
    specs.extend((0..g.n_layer.get()).map(|_| LayerConfig::TransformerBlock {
        num_heads: g.n_head,
        intermediate_dim: None,
        dropout: g.dropout,
        layer_norm_epsilon: 1e-5,
        approximate_gelu: g.approximate_gelu,
    }));
    specs.extend([LayerConfig::LayerNorm { epsilon: 1e-5 }, LayerConfig::LmHead { tie_embeddings: g.tie_embeddings }]);
    Ok(specs)
}

/// He et al.'s CIFAR ResNet-(6n+2): a 3×3 stem, three stages of `n` basic blocks with 16, 32
/// and 64 filters (the second and third start with stride 2, through a projection shortcut),
/// global average pooling and a dense head.
fn resnet(mut specs: Vec<LayerConfig>, n: usize, classes: NonZeroUsize) -> Vec<LayerConfig> {
    specs.extend([
        conv(16, Padding::Same, Activation::Linear, false),
        LayerConfig::BatchNorm { momentum: 0.99, epsilon: 1e-3 },
        LayerConfig::Activation { activation: Activation::Relu },
    ]);
    for stage in 0..3 {
        for block in 0..n {
            let stride = if stage > 0 && block == 0 { 2 } else { 1 };
            specs.push(LayerConfig::Residual { filters: nz(16 << stage), strides: Size2::Square(nz(stride)) });
        }
    }
    specs.extend([LayerConfig::GlobalAvgPool2d, dense(classes, Activation::Linear)]);
    specs
}

/// A size from the zoo's constants or a non-empty input's axes, so never zero.
fn nz(v: usize) -> NonZeroUsize {
    NonZeroUsize::new(v).unwrap_or(NonZeroUsize::MIN)
}

fn reshape(dims: &[usize]) -> LayerConfig {
    LayerConfig::Reshape { target_shape: dims.iter().map(|&d| nz(d)).collect() }
}

/// A 3×3, stride-1 convolution.
fn conv(filters: usize, padding: Padding, activation: Activation, use_bias: bool) -> LayerConfig {
    LayerConfig::Conv2d {
        filters: nz(filters),
        kernel_size: Size2::Square(nz(3)),
        strides: Size2::Square(NonZeroUsize::MIN),
        padding,
        activation,
        use_bias,
    }
}

fn dense(units: NonZeroUsize, activation: Activation) -> LayerConfig {
    LayerConfig::Dense { units, activation, use_bias: true }
}
