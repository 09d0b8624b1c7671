//! `[model]` and its `[[model.layers]]` entries: the description of a model, as a spec writes
//! it and as the plan carries it to the builder (zoo models expand into the same list of
//! layers). The engine builds its layers from these; nothing past the plan reads the spec.

use crate::engine::Shape;
use crate::vocab::Activation;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::NonZeroUsize;

/// `[model]`: give `zoo` or `layers`, not both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A model from the zoo, shaped to the dataset's input and classes.
    /// Example: `zoo = "resnet20"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zoo: Option<ZooModel>,
    /// The layers in order, as a Keras `Sequential` model; the input shape comes from the data.
    /// Example: `[[model.layers]]` / `type = "dense"` / `units = 10`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerConfig>,
}

/// `model.zoo`: ready-made models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ZooModel {
    /// TensorFlow's multi-worker tutorial CNN: Reshape → Conv2D 32 3×3 relu → Flatten →
    /// Dense 128 relu → Dense (classes).
    MnistCnn,
    /// CIFAR-style ResNet-20 (He et al., 2016): 3 stages × 3 basic blocks, 16/32/64 filters.
    Resnet20,
    /// CIFAR-style ResNet-56: 3 stages × 9 basic blocks.
    Resnet56,
}

/// `[[model.layers]]`: one layer, chosen by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum LayerConfig {
    /// Fully connected: `activation(x · W + b)` (Keras `Dense`).
    Dense {
        /// Output features. Example: `units = 128`.
        units: NonZeroUsize,
        /// Activation applied to the output. Default: `linear`. Example: `activation = "relu"`.
        #[serde(default)]
        activation: Activation,
        /// Add a bias. Default: `true`. Example: `use_bias = false`.
        #[serde(default = "yes")]
        use_bias: bool,
    },
    /// 2-D convolution over height × width × channels inputs (Keras `Conv2D`, channels last).
    Conv2d {
        /// Output channels. Example: `filters = 32`.
        filters: NonZeroUsize,
        /// Window size: `3` or `[3, 3]`. Example: `kernel_size = 3`.
        kernel_size: Size2,
        /// Step between windows. Default: `1`. Example: `strides = 2`.
        #[serde(default = "Size2::one")]
        strides: Size2,
        /// `valid` (no padding) or `same` (output = ceil(input / stride)). Default: `valid`.
        /// Example: `padding = "same"`.
        #[serde(default)]
        padding: Padding,
        /// Activation applied to the output. Default: `linear`. Example: `activation = "relu"`.
        #[serde(default)]
        activation: Activation,
        /// Add a bias per filter. Default: `true`. Example: `use_bias = false`.
        #[serde(default = "yes")]
        use_bias: bool,
    },
    /// Max over windows (Keras `MaxPooling2D`).
    MaxPool2d {
        /// Window size. Default: `2`. Example: `pool_size = [2, 2]`.
        #[serde(default = "Size2::two")]
        pool_size: Size2,
        /// Step between windows. Default: `pool_size`. Example: `strides = 2`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strides: Option<Size2>,
        /// `valid` or `same`. Default: `valid`. Example: `padding = "same"`.
        #[serde(default)]
        padding: Padding,
    },
    /// Mean over windows (Keras `AveragePooling2D`); `same` padding averages real pixels only.
    AvgPool2d {
        /// Window size. Default: `2`. Example: `pool_size = 2`.
        #[serde(default = "Size2::two")]
        pool_size: Size2,
        /// Step between windows. Default: `pool_size`. Example: `strides = 2`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strides: Option<Size2>,
        /// `valid` or `same`. Default: `valid`. Example: `padding = "same"`.
        #[serde(default)]
        padding: Padding,
    },
    /// Mean over height and width, one value per channel (Keras `GlobalAveragePooling2D`).
    GlobalAvgPool2d,
    /// Flattens each example to one dimension (Keras `Flatten`).
    Flatten,
    /// Gives each example a new shape with the same number of values (Keras `Reshape`).
    Reshape {
        /// The new shape of one example. Example: `target_shape = [28, 28, 1]`.
        #[schemars(length(min = 1))]
        target_shape: Vec<NonZeroUsize>,
    },
    /// Zeroes a random fraction of inputs in training and scales the rest (Keras `Dropout`).
    Dropout {
        /// Fraction dropped, in [0, 1). Example: `rate = 0.25`.
        #[schemars(range(min = 0.0, max = 0.999))]
        rate: f64,
    },
    /// Normalizes each channel with batch statistics in training and moving averages in
    /// evaluation (Keras `BatchNormalization`).
    BatchNorm {
        /// Moving-average momentum. Default: `0.99`. Example: `momentum = 0.9`.
        #[serde(default = "default_bn_momentum")]
        #[schemars(range(min = 0.0, max = 1.0))]
        momentum: f64,
        /// Added to the variance. Default: `0.001`. Example: `epsilon = 1e-5`.
        #[serde(default = "default_bn_epsilon")]
        #[schemars(extend("exclusiveMinimum" = 0.0))]
        epsilon: f64,
    },
    /// An activation on its own (Keras `Activation`).
    Activation {
        /// The function. Example: `activation = "softmax"`.
        activation: Activation,
    },
    /// A ResNet basic block (He et al., 2016): conv3×3 → batch_norm → relu → conv3×3 →
    /// batch_norm, plus the input (through a 1×1 conv + batch_norm when the shape changes),
    /// then relu.
    Residual {
        /// Output channels. Example: `filters = 16`.
        filters: NonZeroUsize,
        /// Stride of the first convolution (and of the projection). Default: `1`. Example: `strides = 2`.
        #[serde(default = "Size2::one")]
        strides: Size2,
    },
}

impl LayerConfig {
    /// The `type` name, as written in TOML.
    pub fn kind(&self) -> &'static str {
        match self {
            LayerConfig::Dense { .. } => "dense",
            LayerConfig::Conv2d { .. } => "conv2d",
            LayerConfig::MaxPool2d { .. } => "max_pool2d",
            LayerConfig::AvgPool2d { .. } => "avg_pool2d",
            LayerConfig::GlobalAvgPool2d => "global_avg_pool2d",
            LayerConfig::Flatten => "flatten",
            LayerConfig::Reshape { .. } => "reshape",
            LayerConfig::Dropout { .. } => "dropout",
            LayerConfig::BatchNorm { .. } => "batch_norm",
            LayerConfig::Activation { .. } => "activation",
            LayerConfig::Residual { .. } => "residual",
        }
    }

    /// The activation this layer ends in, when it applies one.
    pub fn output_activation(&self) -> Option<Activation> {
        match self {
            LayerConfig::Dense { activation, .. }
            | LayerConfig::Conv2d { activation, .. }
            | LayerConfig::Activation { activation } => Some(*activation),
            LayerConfig::MaxPool2d { .. }
            | LayerConfig::AvgPool2d { .. }
            | LayerConfig::GlobalAvgPool2d
            | LayerConfig::Flatten
            | LayerConfig::Reshape { .. }
            | LayerConfig::Dropout { .. }
            | LayerConfig::BatchNorm { .. }
            | LayerConfig::Residual { .. } => None,
        }
    }

    /// The output shape when it can be told without the input's (`input` when known), so
    /// checking can go on past a layer that failed.
    pub fn intended_output(&self, input: Option<&Shape>) -> Option<Shape> {
        match self {
            LayerConfig::Dense { units, .. } => Some(Shape(vec![units.get()])),
            LayerConfig::Reshape { target_shape } => Some(Shape(target_shape.iter().map(|d| d.get()).collect())),
            LayerConfig::Flatten => input.map(|s| Shape(vec![s.numel()])),
            LayerConfig::Dropout { .. } | LayerConfig::BatchNorm { .. } | LayerConfig::Activation { .. } => {
                input.cloned()
            }
            LayerConfig::Conv2d { .. }
            | LayerConfig::MaxPool2d { .. }
            | LayerConfig::AvgPool2d { .. }
            | LayerConfig::GlobalAvgPool2d
            | LayerConfig::Residual { .. } => None,
        }
    }
}

fn yes() -> bool {
    true
}

fn default_bn_momentum() -> f64 {
    0.99
}

fn default_bn_epsilon() -> f64 {
    0.001
}

/// `valid` or `same` padding, as Keras.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Padding {
    /// No padding: windows stay inside the input.
    #[default]
    Valid,
    /// Zero padding so that output = ceil(input / stride).
    Same,
}

/// A 2-D size: one number for both axes, or `[height, width]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Size2 {
    /// The same size on both axes.
    Square(NonZeroUsize),
    /// `[height, width]`.
    Pair([NonZeroUsize; 2]),
}

impl Size2 {
    /// `(height, width)`.
    pub fn hw(self) -> (usize, usize) {
        match self {
            Size2::Square(n) => (n.get(), n.get()),
            Size2::Pair([h, w]) => (h.get(), w.get()),
        }
    }

    fn one() -> Self {
        Size2::Square(NonZeroUsize::MIN)
    }

    fn two() -> Self {
        Size2::Square(NonZeroUsize::MIN.saturating_add(1))
    }
}
