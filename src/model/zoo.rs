//! The model zoo, written in the same layer vocabulary as `[[model.layers]]`, so a zoo model
//! is checked like any spec and can be printed as one. Each adapts to the data: a channel axis
//! is added to `(h, w)` inputs, and the head has one output per class.
//!
//! Zoo models end in a linear dense layer: train them with `from_logits = true`.

use super::build::suggest_image;
use super::config::{LayerConfig, Padding, Size2, ZooModel};
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
    }
}

/// The layers of `zoo` for inputs of `input` and `classes` classes, and how its convolution
/// kernels start (Keras's Glorot-uniform for the tutorial CNN, He-normal for ResNets).
pub fn layers(zoo: ZooModel, input: &Shape, classes: usize) -> Result<(Vec<LayerConfig>, KernelInit), Diagnostic> {
    let classes = NonZeroUsize::new(classes)
        .ok_or_else(|| Diagnostic::error("model.zoo", "the dataset has 0 classes: nothing to classify"))?;
    if input.numel() == 0 {
        return Err(Diagnostic::error(
            "model.zoo",
            format!("the data's examples have shape {input}, which holds no values"),
        ));
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
    })
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
