//! What a built layer computes, described for engines other than the CPU one: the GPU engine
//! maps each layer of a built model to its kernels from this (geometry and where each tensor
//! lies), never from the spec. A layer without a description runs on CPUs only, and other
//! engines refuse it once, generically.

use super::kernels::Window;
use crate::vocab::Activation;

/// A convolution: geometry, activation and the offsets of its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvOp {
    pub window: Window,
    pub filters: usize,
    pub activation: Activation,
    /// Offset of the kernel (`[kh, kw, cin, cout]`) in the parameters.
    pub kernel: usize,
    /// Offset of the bias, when there is one.
    pub bias: Option<usize>,
}

/// A batch normalization over the last axis, and the offsets of its tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNormOp {
    pub channels: usize,
    pub momentum: f32,
    pub epsilon: f32,
    /// Offsets of γ and β in the parameters.
    pub gamma: usize,
    pub beta: usize,
    /// Offsets of the moving statistics in the state.
    pub moving_mean: usize,
    pub moving_variance: usize,
}

/// A ResNet basic block's children.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ResidualOp {
    pub conv1: ConvOp,
    pub bn1: BatchNormOp,
    pub conv2: ConvOp,
    pub bn2: BatchNormOp,
    /// The 1×1 projection, when the block changes shape.
    pub shortcut: Option<(ConvOp, BatchNormOp)>,
}

/// What a layer computes. Offsets are in values, relative to the layer's own parameter or
/// state slice until [`Op::placed`] moves them into the model's arenas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    /// The output is the input reinterpreted (reshape, flatten).
    View,
    /// `activation(x · W + b)` over the flattened input.
    Dense { inputs: usize, units: usize, activation: Activation, kernel: usize, bias: Option<usize> },
    /// 2-D convolution.
    Conv2d(ConvOp),
    /// Max over windows.
    MaxPool2d(Window),
    /// Mean over height and width per channel.
    GlobalAvgPool2d { positions: usize, channels: usize },
    /// Batch normalization.
    BatchNorm(BatchNormOp),
    /// An activation over rows of the last axis.
    Activation(Activation),
    /// A ResNet basic block.
    Residual(ResidualOp),
}

impl ConvOp {
    fn placed(self, p: usize) -> Self {
        Self { kernel: self.kernel + p, bias: self.bias.map(|b| b + p), ..self }
    }
}

impl BatchNormOp {
    fn placed(self, p: usize, s: usize) -> Self {
        Self {
            gamma: self.gamma + p,
            beta: self.beta + p,
            moving_mean: self.moving_mean + s,
            moving_variance: self.moving_variance + s,
            ..self
        }
    }
}

impl Op {
    /// The same op with its offsets moved by the layer's place in the parameter (`p`) and
    /// state (`s`) arenas.
    pub fn placed(self, p: usize, s: usize) -> Op {
        match self {
            Op::View | Op::MaxPool2d(_) | Op::GlobalAvgPool2d { .. } | Op::Activation(_) => self,
            Op::Dense { inputs, units, activation, kernel, bias } => {
                Op::Dense { inputs, units, activation, kernel: kernel + p, bias: bias.map(|b| b + p) }
            }
            Op::Conv2d(c) => Op::Conv2d(c.placed(p)),
            Op::BatchNorm(b) => Op::BatchNorm(b.placed(p, s)),
            Op::Residual(r) => Op::Residual(ResidualOp {
                conv1: r.conv1.placed(p),
                bn1: r.bn1.placed(p, s),
                conv2: r.conv2.placed(p),
                bn2: r.bn2.placed(p, s),
                shortcut: r.shortcut.map(|(c, b)| (c.placed(p), b.placed(p, s))),
            }),
        }
    }
}
