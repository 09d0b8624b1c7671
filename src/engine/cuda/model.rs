//! A model on one GPU: the layers of a built CPU `Sequential`, each mapped to its kernels from
//! the layer's own description (`engine::op`), with the same parameter and state offsets, run
//! forward and backward with the loss, over one device arena. A layer without a description
//! is refused here, once, for every kind.

use super::arena::Arena;
use super::device::{Buf, DevPtr, Gpu, at, launch};
use super::error::CudaError;
use super::layers::{
    Conv, DeviceBatchNorm, DeviceDense, DevicePass, MaxPool, Scratch, Vars, bias_act, gap_backward, gap_forward,
};
use super::residual::Block;
use crate::engine::op::{BatchNormOp, ConvOp, Op as EngineOp};
use crate::engine::{LossFn, Sequential, Shape};
use crate::metrics::{self, Sums};
use crate::vocab::{Activation, LossKind};

/// What one layer computes.
enum DeviceOp {
    /// Reshape or flatten: the output aliases the input.
    View,
    Dense(DeviceDense),
    Conv(Conv),
    MaxPool(MaxPool),
    GlobalAvgPool {
        hw: usize,
        c: usize,
    },
    BatchNorm(DeviceBatchNorm),
    Activation {
        act: Activation,
        row: usize,
    },
    Residual(Box<Block>),
}

/// Where a layer reads or writes activations (as `Sequential`'s `Activations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceActivations {
    Input,
    Own(usize),
}

struct DeviceLayer {
    op: DeviceOp,
    input: DeviceActivations,
    output: DeviceActivations,
    out_len: usize,
}

/// A model on one GPU, with its activation buffers.
pub struct GpuModel {
    layers: Vec<DeviceLayer>,
    input_len: usize,
    classes: usize,
    /// Widest example (input or any layer's output), for the gradient buffers.
    widest: usize,
    /// Most batch-norm channels, for their sums.
    channels: usize,
    /// Batch size the buffers hold.
    capacity: usize,
    acts: Vec<Buf>,
    grad: Vec<Buf>,
    scratch: Option<Scratch>,
    x: Option<Buf>,
    labels: Option<Buf>,
    loss: Option<Buf>,
    correct: Option<Buf>,
}

fn unsupported(name: &str, kind: &str) -> CudaError {
    CudaError::Unsupported(format!(
        "layer {name} ({kind}) has no GPU kernel yet; the GPU runs dense, conv2d, max_pool2d, global_avg_pool2d, batch_norm, activation, residual, flatten and reshape; train this model on CPUs (strategy.device = \"cpu:0\")"
    ))
}

/// The sums the GPU loss kernel fills: the loss's, and correct predictions.
const FILLED: [metrics::Slot; 3] = [metrics::loss::SUM, metrics::loss::EXAMPLES, metrics::accuracy::CORRECT];

/// Refuses a metric that reads a sum the GPU loss kernel does not fill: it would read a
/// silent 0.
pub fn check_metrics(listed: &[crate::vocab::MetricKind]) -> Result<(), CudaError> {
    let unfilled = |m: &&dyn metrics::Metric| m.reads().iter().any(|slot| !FILLED.contains(slot));
    match listed.iter().map(|&m| metrics::of(m)).find(unfilled) {
        Some(m) => Err(CudaError::Unsupported(format!(
            "train.metrics = \"{}\" has no GPU kernel yet; drop it from train.metrics, or train on CPUs",
            m.name()
        ))),
        None => Ok(()),
    }
}

/// The loss the GPU computes: sparse or one-hot categorical cross-entropy from logits.
pub fn check_loss(loss: LossFn) -> Result<(), CudaError> {
    match (loss.kind, loss.from_logits) {
        (LossKind::SparseCategoricalCrossentropy | LossKind::CategoricalCrossentropy, true) => Ok(()),
        (kind, from_logits) => Err(CudaError::Unsupported(format!(
            "the GPU computes only (sparse) categorical cross-entropy from logits, not {kind:?} with from_logits = {from_logits}; set train.from_logits = true with a linear last layer, or train on CPUs"
        ))),
    }
}

fn conv(c: ConvOp) -> Conv {
    Conv { win: c.window, filters: c.filters, act: c.activation, kernel: c.kernel, bias: c.bias }
}

/// A batch norm over examples of `numel` values.
fn batch_norm(gpu: &Gpu, b: BatchNormOp, numel: usize) -> Result<DeviceBatchNorm, CudaError> {
    Ok(DeviceBatchNorm {
        channels: b.channels,
        numel,
        momentum: b.momentum,
        epsilon: b.epsilon,
        gamma: b.gamma,
        beta: b.beta,
        moving_mean: b.moving_mean,
        moving_var: b.moving_variance,
        mean: gpu.alloc_f32(b.channels)?,
        inv_std: gpu.alloc_f32(b.channels)?,
    })
}

/// The GPU op of a layer the CPU model built as `op` on inputs of `input`.
fn gpu_op(gpu: &Gpu, op: EngineOp, input: &Shape, output: &Shape) -> Result<DeviceOp, CudaError> {
    Ok(match op {
        EngineOp::View => DeviceOp::View,
        EngineOp::Dense { inputs, units, activation, kernel, bias } => {
            DeviceOp::Dense(DeviceDense { inputs, units, act: activation, kernel, bias })
        }
        EngineOp::Conv2d(c) => DeviceOp::Conv(conv(c)),
        EngineOp::MaxPool2d(win) => DeviceOp::MaxPool(MaxPool { win, argmax: None }),
        EngineOp::GlobalAvgPool2d { positions, channels } => DeviceOp::GlobalAvgPool { hw: positions, c: channels },
        EngineOp::BatchNorm(b) => DeviceOp::BatchNorm(batch_norm(gpu, b, input.numel())?),
        EngineOp::Activation(act) => DeviceOp::Activation { act, row: output.0.last().copied().unwrap_or(1) },
        EngineOp::Residual(r) => {
            let numel = output.numel();
            let shortcut = match r.shortcut {
                Some((c, b)) => Some((conv(c), batch_norm(gpu, b, numel)?)),
                None => None,
            };
            DeviceOp::Residual(Box::new(Block {
                bn1: batch_norm(gpu, r.bn1, numel)?,
                bn2: batch_norm(gpu, r.bn2, numel)?,
                conv1: conv(r.conv1),
                conv2: conv(r.conv2),
                shortcut,
                in_len: input.numel(),
                out_len: numel,
                kept: None,
            }))
        }
    })
}

impl GpuModel {
    /// The GPU twin of `model`, a built CPU model: each layer's kernels come from its
    /// [`EngineOp`] description, at the same offsets as on the CPU, so both engines agree on
    /// every tensor by construction.
    pub fn new(gpu: &Gpu, model: &Sequential, classes: usize) -> Result<Self, CudaError> {
        let input = model.input_shape().clone();
        let (mut widest, mut channels) = (input.numel(), 1);
        let views = model.layer_views();
        let mut layers: Vec<DeviceLayer> = Vec::with_capacity(views.len());
        let mut own = 0;
        for view in &views {
            let op = view.op.ok_or_else(|| unsupported(view.name, view.kind))?;
            let op = gpu_op(gpu, op, &view.input_shape, view.output_shape)?;
            let shape = view.output_shape;
            widest = widest.max(shape.numel());
            match &op {
                DeviceOp::BatchNorm(bn) => channels = channels.max(bn.channels),
                DeviceOp::Residual(b) => channels = channels.max(b.bn1.channels),
                DeviceOp::View
                | DeviceOp::Dense(_)
                | DeviceOp::Conv(_)
                | DeviceOp::MaxPool(_)
                | DeviceOp::GlobalAvgPool { .. }
                | DeviceOp::Activation { .. } => {}
            }
            let input = layers.last().map_or(DeviceActivations::Input, |l| l.output);
            let output = if matches!(op, DeviceOp::View) {
                input
            } else {
                own += 1;
                DeviceActivations::Own(own - 1)
            };
            layers.push(DeviceLayer { op, input, output, out_len: shape.numel() });
        }
        let outputs = views.last().map_or(input.numel(), |v| v.output_shape.numel());
        if outputs != classes {
            return Err(CudaError::Unsupported(format!("the model outputs {outputs} values for {classes} classes")));
        }
        Ok(Self {
            layers,
            input_len: input.numel(),
            classes,
            widest,
            channels,
            capacity: 0,
            acts: Vec::new(),
            grad: Vec::new(),
            scratch: None,
            x: None,
            labels: None,
            loss: None,
            correct: None,
        })
    }

    /// Allocates every per-batch buffer for batches of up to `n` examples.
    fn reserve(&mut self, gpu: &Gpu, n: usize) -> Result<(), CudaError> {
        if n <= self.capacity {
            return Ok(());
        }
        let len = n * self.widest;
        let mut patches = 1;
        self.acts.clear();
        for layer in &mut self.layers {
            if let DeviceActivations::Own(_) = layer.output {
                self.acts.push(gpu.alloc_f32(n * layer.out_len)?);
            }
            match &mut layer.op {
                DeviceOp::Conv(c) => patches = patches.max(c.patch_values(n)),
                DeviceOp::MaxPool(p) => p.argmax = Some(gpu.alloc(n * layer.out_len * 4)?),
                DeviceOp::Residual(b) => {
                    b.reserve(gpu, n)?;
                    for c in [&b.conv1, &b.conv2].into_iter().chain(b.shortcut.as_ref().map(|s| &s.0)) {
                        patches = patches.max(c.patch_values(n));
                    }
                }
                DeviceOp::View
                | DeviceOp::Dense(_)
                | DeviceOp::GlobalAvgPool { .. }
                | DeviceOp::BatchNorm(_)
                | DeviceOp::Activation { .. } => {}
            }
        }
        self.scratch = Some(Scratch {
            patches: gpu.alloc_f32(patches)?,
            d_patches: gpu.alloc_f32(patches)?,
            dz: gpu.alloc_f32(len)?,
            g: [gpu.alloc_f32(len)?, gpu.alloc_f32(len)?, gpu.alloc_f32(len)?, gpu.alloc_f32(len)?],
            sums: gpu.alloc(2 * self.channels * 8)?,
            coef: gpu.alloc_f32(3 * self.channels)?,
        });
        self.grad = vec![gpu.alloc_f32(len)?, gpu.alloc_f32(len)?];
        self.x = Some(gpu.alloc_f32(n * self.input_len)?);
        self.labels = Some(gpu.alloc(n * 4)?);
        self.loss = Some(gpu.alloc_f32(n)?);
        self.correct = Some(gpu.alloc(n * 4)?);
        self.capacity = n;
        Ok(())
    }

    fn ptr(&self, slot: DeviceActivations) -> Result<DevPtr, CudaError> {
        match slot {
            DeviceActivations::Input => self.x.as_ref().map(Buf::ptr),
            DeviceActivations::Own(i) => self.acts.get(i).map(Buf::ptr),
        }
        .ok_or_else(|| CudaError::Unsupported("activation buffer missing".into()))
    }

    fn parts(&self) -> Result<(&Scratch, DevPtr, DevPtr, DevPtr, DevPtr), CudaError> {
        let missing = || CudaError::Unsupported("model buffers used before reserve".into());
        let sc = self.scratch.as_ref().ok_or_else(missing)?;
        let g = |b: Option<&Buf>| b.map(Buf::ptr).ok_or_else(missing);
        Ok((sc, g(self.labels.as_ref())?, g(self.loss.as_ref())?, g(self.correct.as_ref())?, g(self.grad.first())?))
    }

    /// Runs the layers on `n` examples already in the input buffer; returns the output.
    fn forward(&self, gpu: &Gpu, arena: &Arena, n: usize, training: bool) -> Result<DevPtr, CudaError> {
        let (sc, ..) = self.parts()?;
        let vars = Vars { p: arena.params(), g: arena.grads(), s: arena.state() };
        let cx = DevicePass { gpu, sc, vars, n, training, accumulate: false };
        for layer in &self.layers {
            let (x, y) = (self.ptr(layer.input)?, self.ptr(layer.output)?);
            match &layer.op {
                DeviceOp::View => {}
                DeviceOp::Dense(d) => d.forward(cx, x, y)?,
                DeviceOp::Conv(c) => c.forward(cx, x, y)?,
                DeviceOp::MaxPool(p) => p.forward(gpu, x, y, n)?,
                DeviceOp::GlobalAvgPool { hw, c } => gap_forward(gpu, x, y, n, *hw, *c)?,
                DeviceOp::BatchNorm(bn) => bn.forward(cx, x, y)?,
                DeviceOp::Activation { act, row } => {
                    gpu.copy(y, x, n * layer.out_len)?;
                    bias_act(gpu, y, 0, n * layer.out_len / row, *row, *act)?;
                }
                DeviceOp::Residual(b) => b.forward(cx, x, y)?,
            }
        }
        self.ptr(self.layers.last().map_or(DeviceActivations::Input, |l| l.output))
    }

    /// Backpropagates the loss gradient in `grad[0]` into the arena's gradients.
    fn backward(&self, gpu: &Gpu, arena: &Arena, n: usize, acc: bool) -> Result<(), CudaError> {
        let (sc, ..) = self.parts()?;
        let vars = Vars { p: arena.params(), g: arena.grads(), s: arena.state() };
        // Backward follows a training forward: batch norm's statistics are the batch's.
        let cx = DevicePass { gpu, sc, vars, n, training: true, accumulate: acc };
        let mut cur = 0;
        for layer in self.layers.iter().rev() {
            let DeviceActivations::Own(_) = layer.output else { continue };
            if matches!(layer.op, DeviceOp::View) {
                continue;
            }
            let (x, y) = (self.ptr(layer.input)?, self.ptr(layer.output)?);
            let (dy, dx_buf) = (self.grad[cur].ptr(), self.grad[1 - cur].ptr());
            let dx = (layer.input != DeviceActivations::Input).then_some(dx_buf);
            match &layer.op {
                DeviceOp::View => {}
                DeviceOp::Dense(d) => d.backward(cx, (x, y, dy), dx)?,
                DeviceOp::Conv(c) => c.backward(cx, (x, y, dy), dx)?,
                DeviceOp::MaxPool(p) => {
                    if let Some(dx) = dx {
                        p.backward(gpu, dy, dx, n)?;
                    }
                }
                DeviceOp::GlobalAvgPool { hw, c } => {
                    if let Some(dx) = dx {
                        gap_backward(gpu, dy, dx, n, *hw, *c)?;
                    }
                }
                DeviceOp::BatchNorm(bn) => bn.backward(cx, (x, dy), dx)?,
                DeviceOp::Activation { act, row } => {
                    if let Some(dx) = dx {
                        let rows = n * layer.out_len / row;
                        let dz = super::layers::act_backward(gpu, *act, y, dy, dx, rows, *row)?;
                        if dz != dx {
                            gpu.copy(dx, dz, n * layer.out_len)?;
                        }
                    }
                }
                DeviceOp::Residual(b) => b.backward(cx, (x, y, dy), dx)?,
            }
            if dx.is_some() {
                cur = 1 - cur;
            }
        }
        Ok(())
    }

    /// Uploads `n` examples and their labels.
    fn load(&mut self, gpu: &Gpu, (x, y, n): (&[f32], &[u32], usize)) -> Result<(), CudaError> {
        if x.len() != n * self.input_len || y.len() != n {
            return Err(CudaError::Unsupported(format!(
                "a batch of {n} examples needs {} inputs and {n} labels, got {} and {}",
                n * self.input_len,
                x.len(),
                y.len()
            )));
        }
        if let Some(&bad) = y.iter().find(|&&l| l as usize >= self.classes) {
            return Err(CudaError::Unsupported(format!("label {bad} is outside the model's {} classes", self.classes)));
        }
        self.reserve(gpu, n)?;
        let (_, labels, ..) = self.parts()?;
        gpu.upload(self.ptr(DeviceActivations::Input)?, x)?;
        gpu.upload(labels, y)
    }

    /// The loss over the output `out`, writing `scale × dloss/dout` into `grad[0]`.
    fn loss(&self, gpu: &Gpu, out: DevPtr, n: usize, scale: f32) -> Result<Sums, CudaError> {
        let (_, labels, loss, correct, dout) = self.parts()?;
        let classes = self.classes;
        launch!(
            gpu,
            "sce_logits",
            Gpu::config(n as u64),
            out,
            labels,
            n as i64,
            classes as i32,
            scale,
            dout,
            loss,
            correct
        )?;
        let (mut l, mut c) = (vec![0f32; n], vec![0i32; n]);
        gpu.download(loss, &mut l)?;
        gpu.download(correct, &mut c)?;
        // The GPU loss kernel takes class labels only: it fills the slots of `FILLED`.
        let mut sums = Sums::of_examples(n);
        sums.accumulate(metrics::loss::SUM, l.iter().map(|&v| f64::from(v)).sum());
        sums.accumulate(metrics::accuracy::CORRECT, c.iter().filter(|&&v| v != 0).count() as f64);
        Ok(sums)
    }

    /// Adds (or, unless `accumulate`, writes) the gradient of the `n` examples `x` labelled
    /// `y` into the arena's gradients, each example's loss weighted by `scale`, and moves the
    /// batch-norm statistics.
    pub fn train_step(
        &mut self,
        gpu: &Gpu,
        arena: &Arena,
        (x, y, n): (&[f32], &[u32], usize),
        scale: f32,
        accumulate: bool,
    ) -> Result<Sums, CudaError> {
        if n == 0 {
            if !accumulate {
                gpu.zero(arena.grads(), arena.param_len())?;
            }
            return Ok(Sums::default());
        }
        self.load(gpu, (x, y, n))?;
        let out = self.forward(gpu, arena, n, true)?;
        let stats = self.loss(gpu, out, n, scale)?;
        self.backward(gpu, arena, n, accumulate)?;
        Ok(stats)
    }

    /// Loss and accuracy sums of `n` examples in inference mode.
    pub fn evaluate(&mut self, gpu: &Gpu, arena: &Arena, x: &[f32], y: &[u32], n: usize) -> Result<Sums, CudaError> {
        if n == 0 {
            return Ok(Sums::default());
        }
        self.load(gpu, (x, y, n))?;
        let out = self.forward(gpu, arena, n, false)?;
        self.loss(gpu, out, n, 0.0)
    }

    /// The outputs (logits) of `n` examples in inference mode, for checks against the CPU.
    pub fn predict(&mut self, gpu: &Gpu, arena: &Arena, x: &[f32], n: usize) -> Result<Vec<f32>, CudaError> {
        let labels = vec![0u32; n];
        self.load(gpu, (x, &labels, n))?;
        let out = self.forward(gpu, arena, n, false)?;
        let mut v = vec![0.0; n * self.classes];
        gpu.download(at(out, 0), &mut v)?;
        Ok(v)
    }
}
