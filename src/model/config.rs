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
    /// `[model.gpt]`: the sizes of `zoo = "gpt"`. Default: the table's defaults (a 4-layer,
    /// 128-wide "baby GPT"). Example: `[model.gpt]` / `n_layer = 6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpt: Option<GptConfig>,
    /// Weights to start from, loaded by name before training (fine-tuning); the optimizer
    /// state starts fresh, and a backup of the run itself still wins on resume.
    /// Example: `[model]` / `init_from = { path = "runs/pretrain", strict = false }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<InitFrom>,
}

/// `model.init_from`: a warm start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InitFrom {
    /// A checkpoint folder, a run folder (its final `model.safetensors`) or a safetensors
    /// file. Example: `path = "runs/pretrain/checkpoints/ckpt-0000000500"`.
    pub path: std::path::PathBuf,
    /// Refuse any tensor missing from the file, any the model lacks and any of another shape
    /// (`true`), or load what matches and keep the rest freshly initialized, saying which
    /// (`false`: a new classification head). Default: `true`.
    #[serde(default = "strict_by_default")]
    pub strict: bool,
    /// What `path` holds: `trainrun` (a trainrun checkpoint folder, run folder or safetensors
    /// file, tensors named by Keras path) or `hf_gpt2` (a folder `transformers`'
    /// `GPT2LMHeadModel.save_pretrained` wrote: `config.json` + `model.safetensors`, loaded into
    /// a GPT of the same sizes). Default: `hf_gpt2` for a folder with a `config.json`, else
    /// `trainrun`. Example: `format = "hf_gpt2"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<InitFormat>,
}

/// `model.init_from.format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InitFormat {
    /// trainrun's own weights: a checkpoint folder, a run folder or a safetensors file.
    Trainrun,
    /// A Hugging Face GPT-2 folder (`config.json` with `"model_type": "gpt2"`, `model.safetensors`).
    HfGpt2,
}

fn strict_by_default() -> bool {
    true
}

/// `[model.gpt]`: a GPT-2-style decoder-only transformer (Radford et al., 2019, as nanoGPT
/// writes it): token and learned position embeddings, `n_layer` pre-LN transformer blocks, a
/// final layer normalization and a language-model head. The vocabulary comes from the data.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GptConfig {
    /// Transformer blocks. Default: `4`. Example: `n_layer = 6`.
    #[serde(default = "GptConfig::default_n_layer")]
    pub n_layer: NonZeroUsize,
    /// Attention heads per block; must divide `n_embd`. Default: `4`. Example: `n_head = 6`.
    #[serde(default = "GptConfig::default_n_head")]
    pub n_head: NonZeroUsize,
    /// Model width (embedding size). Default: `128`. Example: `n_embd = 384`.
    #[serde(default = "GptConfig::default_n_embd")]
    pub n_embd: NonZeroUsize,
    /// Longest context in tokens: positions the model has embeddings for; at least the data's
    /// sequence length. Default: `64`. Example: `block_size = 256`.
    #[serde(default = "GptConfig::default_block_size")]
    pub block_size: NonZeroUsize,
    /// Dropout rate in training, in [0, 1): after the embeddings, on attention probabilities
    /// and after each residual branch. Default: `0`. Example: `dropout = 0.2`.
    #[serde(default)]
    #[schemars(range(min = 0.0, max = 0.999))]
    pub dropout: f64,
    /// The output head reuses the token embedding's matrix (GPT-2's weight tying). Default:
    /// `true`. Example: `tie_embeddings = false`.
    #[serde(default = "yes")]
    pub tie_embeddings: bool,
    /// The MLPs use GELU's tanh approximation, as GPT-2 does (Hugging Face's `gelu_new`),
    /// instead of the exact form (nanoGPT's). Default: `false`. Example: `approximate_gelu = true`.
    #[serde(default)]
    pub approximate_gelu: bool,
}

impl Default for GptConfig {
    fn default() -> Self {
        Self {
            n_layer: Self::default_n_layer(),
            n_head: Self::default_n_head(),
            n_embd: Self::default_n_embd(),
            block_size: Self::default_block_size(),
            dropout: 0.0,
            tie_embeddings: true,
            approximate_gelu: false,
        }
    }
}

impl GptConfig {
    fn default_n_layer() -> NonZeroUsize {
        NonZeroUsize::new(4).unwrap_or(NonZeroUsize::MIN)
    }
    fn default_n_head() -> NonZeroUsize {
        NonZeroUsize::new(4).unwrap_or(NonZeroUsize::MIN)
    }
    fn default_n_embd() -> NonZeroUsize {
        NonZeroUsize::new(128).unwrap_or(NonZeroUsize::MIN)
    }
    fn default_block_size() -> NonZeroUsize {
        NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN)
    }
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
    /// A GPT-2-style character or token language model, sized by `[model.gpt]`.
    Gpt,
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
    /// Token embeddings (Keras `Embedding`): each id of a `[T]` sequence becomes a vector,
    /// giving `[T, output_dim]`. The vocabulary (`input_dim`) is the data's. Must be the
    /// first layer: ids are not differentiable.
    Embedding {
        /// Vector size per token. Example: `output_dim = 128`.
        output_dim: NonZeroUsize,
    },
    /// Learned absolute positions added to a `[T, dim]` input (GPT-2's `wpe`, Keras Hub
    /// `PositionEmbedding`).
    PositionEmbedding {
        /// Positions the table holds; at least the data's sequence length `T`.
        /// Example: `block_size = 64`.
        block_size: NonZeroUsize,
    },
    /// Normalizes each position's vector over the last axis, then scales and shifts it
    /// (Keras `LayerNormalization`).
    LayerNorm {
        /// Added to the variance. Default: `0.001` (Keras's; GPT-2 uses `1e-5`).
        /// Example: `epsilon = 1e-5`.
        #[serde(default = "default_bn_epsilon")]
        #[schemars(extend("exclusiveMinimum" = 0.0))]
        epsilon: f64,
    },
    /// The Gaussian error linear unit, elementwise (Keras `gelu`).
    Gelu {
        /// Use GPT-2's tanh approximation instead of the exact `x·Φ(x)`. Default: `false`.
        /// Example: `approximate = true`.
        #[serde(default)]
        approximate: bool,
    },
    /// Scaled dot-product self-attention over a `[T, dim]` input (Keras
    /// `MultiHeadAttention` with query = key = value), with one fused query/key/value
    /// projection and an output projection.
    MultiHeadAttention {
        /// Attention heads; must divide the input's width. Example: `num_heads = 4`.
        num_heads: NonZeroUsize,
        /// Each position attends only to itself and earlier ones (Keras `use_causal_mask`).
        /// Default: `false`. Example: `causal = true`.
        #[serde(default)]
        causal: bool,
        /// Dropout on the attention probabilities in training, in [0, 1). Default: `0`.
        /// Example: `dropout = 0.1`.
        #[serde(default)]
        #[schemars(range(min = 0.0, max = 0.999))]
        dropout: f64,
    },
    /// A pre-LN GPT-2 decoder block on a `[T, dim]` input: `x + attention(layer_norm(x))`
    /// (causal), then `x + mlp(layer_norm(x))` with a GELU MLP (Keras Hub
    /// `TransformerDecoder` with `normalize_first = true`, without cross-attention).
    TransformerBlock {
        /// Attention heads; must divide the input's width. Example: `num_heads = 4`.
        num_heads: NonZeroUsize,
        /// The MLP's hidden width. Default: 4 × the input's width. Example: `intermediate_dim = 512`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        intermediate_dim: Option<NonZeroUsize>,
        /// Dropout rate in training, in [0, 1), on attention probabilities and after each
        /// residual branch. Default: `0`. Example: `dropout = 0.1`.
        #[serde(default)]
        #[schemars(range(min = 0.0, max = 0.999))]
        dropout: f64,
        /// The layer normalizations' epsilon. Default: `1e-5` (GPT-2's). Example:
        /// `layer_norm_epsilon = 1e-6`.
        #[serde(default = "default_ln_epsilon")]
        #[schemars(extend("exclusiveMinimum" = 0.0))]
        layer_norm_epsilon: f64,
        /// The MLP uses GELU's tanh approximation (GPT-2's) instead of the exact form.
        /// Default: `false` (nanoGPT's and PyTorch's). Example: `approximate_gelu = true`.
        #[serde(default)]
        approximate_gelu: bool,
    },
    /// A dense layer applied at every position of a `[T, in]` input, giving `[T, units]`
    /// (Keras `Dense` on a sequence; trainrun's `dense` flattens its input instead).
    PositionwiseDense {
        /// Output features per position. Example: `units = 512`.
        units: NonZeroUsize,
        /// Add a bias. Default: `true`. Example: `use_bias = false`.
        #[serde(default = "yes")]
        use_bias: bool,
    },
    /// A language model's output: logits over the data's vocabulary at every position of a
    /// `[T, dim]` input, giving `[T, vocabulary]`; no bias (GPT-2's `lm_head`).
    LmHead {
        /// Reuse the matrix of the nearest `embedding` layer before it (weight tying).
        /// Default: `false`. Example: `tie_embeddings = true`.
        #[serde(default)]
        tie_embeddings: bool,
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
            LayerConfig::Embedding { .. } => "embedding",
            LayerConfig::PositionEmbedding { .. } => "position_embedding",
            LayerConfig::LayerNorm { .. } => "layer_norm",
            LayerConfig::Gelu { .. } => "gelu",
            LayerConfig::MultiHeadAttention { .. } => "multi_head_attention",
            LayerConfig::TransformerBlock { .. } => "transformer_block",
            LayerConfig::PositionwiseDense { .. } => "positionwise_dense",
            LayerConfig::LmHead { .. } => "lm_head",
        }
    }

    /// The activation this layer ends in, when it applies one.
    pub fn output_activation(&self) -> Option<Activation> {
        match self {
            LayerConfig::Dense { activation, .. }
            | LayerConfig::Conv2d { activation, .. }
            | LayerConfig::Activation { activation } => Some(*activation),
            // Both end in a plain product: logits.
            LayerConfig::PositionwiseDense { .. } | LayerConfig::LmHead { .. } => Some(Activation::Linear),
            LayerConfig::MaxPool2d { .. }
            | LayerConfig::AvgPool2d { .. }
            | LayerConfig::GlobalAvgPool2d
            | LayerConfig::Flatten
            | LayerConfig::Reshape { .. }
            | LayerConfig::Dropout { .. }
            | LayerConfig::BatchNorm { .. }
            | LayerConfig::Residual { .. }
            | LayerConfig::Embedding { .. }
            | LayerConfig::PositionEmbedding { .. }
            | LayerConfig::LayerNorm { .. }
            | LayerConfig::Gelu { .. }
            | LayerConfig::MultiHeadAttention { .. }
            | LayerConfig::TransformerBlock { .. } => None,
        }
    }

    /// The output shape when it can be told without the input's (`input` when known), so
    /// checking can go on past a layer that failed.
    pub fn intended_output(&self, input: Option<&Shape>) -> Option<Shape> {
        match self {
            LayerConfig::Dense { units, .. } => Some(Shape(vec![units.get()])),
            LayerConfig::Reshape { target_shape } => Some(Shape(target_shape.iter().map(|d| d.get()).collect())),
            LayerConfig::Flatten => input.map(|s| Shape(vec![s.numel()])),
            LayerConfig::Dropout { .. }
            | LayerConfig::BatchNorm { .. }
            | LayerConfig::Activation { .. }
            | LayerConfig::PositionEmbedding { .. }
            | LayerConfig::LayerNorm { .. }
            | LayerConfig::Gelu { .. }
            | LayerConfig::MultiHeadAttention { .. }
            | LayerConfig::TransformerBlock { .. } => input.cloned(),
            LayerConfig::Embedding { output_dim } => input.map(|s| Shape(vec![s.numel(), output_dim.get()])),
            LayerConfig::PositionwiseDense { units, .. } => {
                input.and_then(|s| s.0.first()).map(|&t| Shape(vec![t, units.get()]))
            }
            LayerConfig::LmHead { .. }
            | LayerConfig::Conv2d { .. }
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

fn default_ln_epsilon() -> f64 {
    1e-5
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
