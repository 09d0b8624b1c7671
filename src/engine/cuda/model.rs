//! A model on one GPU: the layer list of the CPU `Sequential` built from the same spec, with
//! the same parameter and state offsets (looked up by weight name), run forward and backward
//! with the loss, over one device arena.
//!
//! The layer geometry comes from the spec (the zoo expanded like `model::build` does); the
//! layout comes from the CPU model, so both engines agree on every offset by construction.

use super::arena::Arena;
use super::device::{Buf, DevPtr, Gpu, at, launch};
use super::error::CudaError;
use super::layers::{BatchNorm, Conv, Dense, MaxPool, Scratch, bias_act, gap_backward, gap_forward};
use super::residual::{Block, Vars};
use crate::engine::kernels::Window;
use crate::engine::{BatchStats, LossFn, Sequential, Shape};
use crate::spec::{Activation, LayerSpec, Loss, ModelSpec, Padding};
use std::borrow::Cow;

// The residual blocks' batch norms use the CPU model's settings, so both engines agree.
use crate::model::{BN_EPSILON, BN_MOMENTUM};

/// What one layer computes.
enum Op {
    /// Reshape or flatten: the output aliases the input.
    View,
    Dense(Dense),
    Conv(Conv),
    MaxPool(MaxPool),
    GlobalAvgPool {
        hw: usize,
        c: usize,
    },
    BatchNorm(BatchNorm),
    Activation {
        act: Activation,
        row: usize,
    },
    Residual(Box<Block>),
}

/// Where a layer reads or writes activations (as `Sequential`'s `Buf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Input,
    Own(usize),
}

struct Layer {
    op: Op,
    input: Slot,
    output: Slot,
    out_len: usize,
}

/// A model on one GPU, with its activation buffers.
pub struct GpuModel {
    layers: Vec<Layer>,
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

/// Offsets of a model's tensors by weight name.
struct Layout<'a> {
    model: &'a Sequential,
}

impl Layout<'_> {
    fn param(&self, name: &str) -> Result<usize, CudaError> {
        find(self.model.tensors(), name)
    }

    fn state(&self, name: &str) -> Result<usize, CudaError> {
        find(self.model.state_tensors(), name)
    }
}

fn find(tensors: &[crate::engine::TensorInfo], name: &str) -> Result<usize, CudaError> {
    tensors
        .iter()
        .find(|t| t.name == name)
        .map(|t| t.offset)
        .ok_or_else(|| CudaError::Unsupported(format!("the model has no tensor {name} (GPU and CPU layouts disagree)")))
}

fn unsupported(name: &str, kind: &str) -> CudaError {
    CudaError::Unsupported(format!(
        "layer {name} ({kind}) has no GPU kernel yet; the GPU runs dense, conv2d, max_pool2d, global_avg_pool2d, batch_norm, activation, residual, flatten and reshape; train this model on CPUs (strategy.device = \"cpu:0\")"
    ))
}

/// The loss the GPU computes: sparse or one-hot categorical cross-entropy from logits.
pub fn check_loss(loss: LossFn) -> Result<(), CudaError> {
    match (loss.kind, loss.from_logits) {
        (Loss::SparseCategoricalCrossentropy | Loss::CategoricalCrossentropy, true) => Ok(()),
        (kind, from_logits) => Err(CudaError::Unsupported(format!(
            "the GPU computes only (sparse) categorical cross-entropy from logits, not {kind:?} with from_logits = {from_logits}; set train.from_logits = true with a linear last layer, or train on CPUs"
        ))),
    }
}

fn conv(
    win: Window,
    filters: usize,
    act: Activation,
    prefix: &str,
    bias: bool,
    layout: &Layout<'_>,
) -> Result<Conv, CudaError> {
    Ok(Conv {
        win,
        filters,
        act,
        kernel: layout.param(&format!("{prefix}/kernel"))?,
        bias: if bias { Some(layout.param(&format!("{prefix}/bias"))?) } else { None },
    })
}

fn batch_norm(
    gpu: &Gpu,
    shape: &Shape,
    (momentum, epsilon): (f32, f32),
    prefix: &str,
    layout: &Layout<'_>,
) -> Result<BatchNorm, CudaError> {
    let channels = shape.0.last().copied().unwrap_or(1);
    Ok(BatchNorm {
        channels,
        numel: shape.numel(),
        momentum,
        epsilon,
        gamma: layout.param(&format!("{prefix}/gamma"))?,
        beta: layout.param(&format!("{prefix}/beta"))?,
        moving_mean: layout.state(&format!("{prefix}/moving_mean"))?,
        moving_var: layout.state(&format!("{prefix}/moving_variance"))?,
        mean: gpu.alloc_f32(channels)?,
        inv_std: gpu.alloc_f32(channels)?,
    })
}

fn window(
    input: &Shape,
    size: (usize, usize),
    strides: (usize, usize),
    padding: Padding,
    name: &str,
) -> Result<Window, CudaError> {
    let hwc = input.hwc().ok_or_else(|| CudaError::Unsupported(format!("layer {name} needs an image input")))?;
    Window::new(hwc, size, strides, padding == Padding::Same)
        .ok_or_else(|| CudaError::Unsupported(format!("layer {name}: the window does not fit its input")))
}

impl GpuModel {
    /// The GPU twin of `model`, which `crate::model::build(spec, input, classes)` returned.
    pub fn new(gpu: &Gpu, spec: &ModelSpec, model: &Sequential, classes: usize) -> Result<Self, CudaError> {
        let input = model.input_shape().clone();
        let specs: Cow<'_, [LayerSpec]> = match spec.zoo {
            Some(zoo) => Cow::Owned(
                crate::model::zoo::layers(zoo, &input, classes)
                    .map_err(|d| CudaError::Unsupported(format!("{d:?}")))?
                    .0,
            ),
            None => Cow::Borrowed(&spec.layers),
        };
        let summary = model.summary();
        if summary.len() != specs.len() {
            return Err(CudaError::Unsupported("the spec and the built model have different layer counts".into()));
        }
        let layout = Layout { model };
        let mut shape = input.clone();
        let (mut widest, mut channels) = (input.numel(), 1);
        let mut layers: Vec<Layer> = Vec::with_capacity(specs.len());
        let mut own = 0;
        for (spec, row) in specs.iter().zip(&summary) {
            let name = row.name.as_str();
            let op = match spec {
                LayerSpec::Flatten | LayerSpec::Reshape { .. } => Op::View,
                LayerSpec::Dense { units, activation, use_bias } => Op::Dense(Dense {
                    inputs: shape.numel(),
                    units: units.get(),
                    act: *activation,
                    kernel: layout.param(&format!("{name}/kernel"))?,
                    bias: if *use_bias { Some(layout.param(&format!("{name}/bias"))?) } else { None },
                }),
                LayerSpec::Conv2d { filters, kernel_size, strides, padding, activation, use_bias } => {
                    let win = window(&shape, kernel_size.hw(), strides.hw(), *padding, name)?;
                    Op::Conv(conv(win, filters.get(), *activation, name, *use_bias, &layout)?)
                }
                LayerSpec::MaxPool2d { pool_size, strides, padding } => {
                    let win = window(&shape, pool_size.hw(), strides.unwrap_or(*pool_size).hw(), *padding, name)?;
                    Op::MaxPool(MaxPool { win, argmax: None })
                }
                LayerSpec::GlobalAvgPool2d => {
                    let (h, w, c) =
                        shape.hwc().ok_or_else(|| CudaError::Unsupported(format!("layer {name} needs an image")))?;
                    Op::GlobalAvgPool { hw: h * w, c }
                }
                LayerSpec::BatchNorm { momentum, epsilon } => {
                    Op::BatchNorm(batch_norm(gpu, &shape, (*momentum as f32, *epsilon as f32), name, &layout)?)
                }
                LayerSpec::Activation { activation } => {
                    Op::Activation { act: *activation, row: shape.0.last().copied().unwrap_or(1) }
                }
                LayerSpec::Residual { filters, strides } => {
                    let (h, w, c) =
                        shape.hwc().ok_or_else(|| CudaError::Unsupported(format!("layer {name} needs an image")))?;
                    let f = filters.get();
                    let bn = (BN_MOMENTUM, BN_EPSILON);
                    let c3 = |input, k, s, child: &str| -> Result<Conv, CudaError> {
                        let win = Window::new(input, (k, k), s, true)
                            .ok_or_else(|| CudaError::Unsupported(format!("layer {name}: empty input")))?;
                        conv(win, f, Activation::Linear, &format!("{name}/{child}"), false, &layout)
                    };
                    let conv1 = c3((h, w, c), 3, strides.hw(), "conv_1")?;
                    let out = Shape(vec![conv1.win.oh, conv1.win.ow, f]);
                    let conv2 = c3((conv1.win.oh, conv1.win.ow, f), 3, (1, 1), "conv_2")?;
                    let shortcut = if strides.hw() != (1, 1) || c != f {
                        Some((
                            c3((h, w, c), 1, strides.hw(), "shortcut_conv")?,
                            batch_norm(gpu, &out, bn, &format!("{name}/shortcut_bn"), &layout)?,
                        ))
                    } else {
                        None
                    };
                    Op::Residual(Box::new(Block {
                        bn1: batch_norm(gpu, &out, bn, &format!("{name}/bn_1"), &layout)?,
                        bn2: batch_norm(gpu, &out, bn, &format!("{name}/bn_2"), &layout)?,
                        conv1,
                        conv2,
                        shortcut,
                        in_len: h * w * c,
                        out_len: out.numel(),
                        kept: None,
                    }))
                }
                LayerSpec::Dropout { .. } => return Err(unsupported(name, "dropout")),
                LayerSpec::AvgPool2d { .. } => return Err(unsupported(name, "avg_pool2d")),
            };
            shape = row.output_shape.clone();
            widest = widest.max(shape.numel());
            if let Op::BatchNorm(bn) = &op {
                channels = channels.max(bn.channels);
            }
            if let Op::Residual(b) = &op {
                channels = channels.max(b.bn1.channels);
            }
            let input = layers.last().map_or(Slot::Input, |l| l.output);
            let output = if matches!(op, Op::View) {
                input
            } else {
                own += 1;
                Slot::Own(own - 1)
            };
            layers.push(Layer { op, input, output, out_len: shape.numel() });
        }
        if shape.numel() != classes {
            return Err(CudaError::Unsupported(format!(
                "the model outputs {} values for {classes} classes",
                shape.numel()
            )));
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
            if let Slot::Own(_) = layer.output {
                self.acts.push(gpu.alloc_f32(n * layer.out_len)?);
            }
            match &mut layer.op {
                Op::Conv(c) => patches = patches.max(c.patch_values(n)),
                Op::MaxPool(p) => p.argmax = Some(gpu.alloc(n * layer.out_len * 4)?),
                Op::Residual(b) => {
                    b.reserve(gpu, n)?;
                    for c in [&b.conv1, &b.conv2].into_iter().chain(b.shortcut.as_ref().map(|s| &s.0)) {
                        patches = patches.max(c.patch_values(n));
                    }
                }
                _ => {}
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

    fn ptr(&self, slot: Slot) -> Result<DevPtr, CudaError> {
        match slot {
            Slot::Input => self.x.as_ref().map(Buf::ptr),
            Slot::Own(i) => self.acts.get(i).map(Buf::ptr),
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
        let v = Vars { p: arena.params(), g: arena.grads(), s: arena.state() };
        for layer in &self.layers {
            let (x, y) = (self.ptr(layer.input)?, self.ptr(layer.output)?);
            match &layer.op {
                Op::View => {}
                Op::Dense(d) => d.forward(gpu, v.p, x, y, n)?,
                Op::Conv(c) => c.forward(gpu, sc, v.p, x, y, n)?,
                Op::MaxPool(p) => p.forward(gpu, x, y, n)?,
                Op::GlobalAvgPool { hw, c } => gap_forward(gpu, x, y, n, *hw, *c)?,
                Op::BatchNorm(bn) => bn.forward(gpu, sc, (v.p, v.s), x, y, n, training)?,
                Op::Activation { act, row } => {
                    gpu.copy(y, x, n * layer.out_len)?;
                    bias_act(gpu, y, 0, n * layer.out_len / row, *row, *act)?;
                }
                Op::Residual(b) => b.forward(gpu, sc, v, x, y, n, training)?,
            }
        }
        self.ptr(self.layers.last().map_or(Slot::Input, |l| l.output))
    }

    /// Backpropagates the loss gradient in `grad[0]` into the arena's gradients.
    fn backward(&self, gpu: &Gpu, arena: &Arena, n: usize, acc: bool) -> Result<(), CudaError> {
        let (sc, ..) = self.parts()?;
        let v = Vars { p: arena.params(), g: arena.grads(), s: arena.state() };
        let pg = (v.p, v.g);
        let mut cur = 0;
        for layer in self.layers.iter().rev() {
            let Slot::Own(_) = layer.output else { continue };
            if matches!(layer.op, Op::View) {
                continue;
            }
            let (x, y) = (self.ptr(layer.input)?, self.ptr(layer.output)?);
            let (dy, dx_buf) = (self.grad[cur].ptr(), self.grad[1 - cur].ptr());
            let dx = (layer.input != Slot::Input).then_some(dx_buf);
            match &layer.op {
                Op::View => {}
                Op::Dense(d) => d.backward(gpu, sc, pg, (x, y, dy), dx, n, acc)?,
                Op::Conv(c) => c.backward(gpu, sc, pg, (x, y, dy), dx, n, acc)?,
                Op::MaxPool(p) => {
                    if let Some(dx) = dx {
                        p.backward(gpu, dy, dx, n)?;
                    }
                }
                Op::GlobalAvgPool { hw, c } => {
                    if let Some(dx) = dx {
                        gap_backward(gpu, dy, dx, n, *hw, *c)?;
                    }
                }
                Op::BatchNorm(bn) => bn.backward(gpu, sc, pg, (x, dy), dx, n, (true, acc))?,
                Op::Activation { act, row } => {
                    if let Some(dx) = dx {
                        let rows = n * layer.out_len / row;
                        let dz = super::layers::act_backward(gpu, *act, y, dy, dx, rows, *row)?;
                        if dz != dx {
                            gpu.copy(dx, dz, n * layer.out_len)?;
                        }
                    }
                }
                Op::Residual(b) => b.backward(gpu, sc, v, (x, y, dy), dx, n, (true, acc))?,
            }
            if dx.is_some() {
                cur = 1 - cur;
            }
        }
        Ok(())
    }

    /// Uploads `n` examples and their labels.
    fn load(&mut self, gpu: &Gpu, x: &[f32], y: &[u32], n: usize) -> Result<(), CudaError> {
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
        gpu.upload(self.ptr(Slot::Input)?, x)?;
        gpu.upload(labels, y)
    }

    /// The loss over the output `out`, writing `scale × dloss/dout` into `grad[0]`.
    fn loss(&self, gpu: &Gpu, out: DevPtr, n: usize, scale: f32) -> Result<BatchStats, CudaError> {
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
        Ok(BatchStats {
            loss_sum: l.iter().map(|&v| f64::from(v)).sum(),
            correct: c.iter().filter(|&&v| v != 0).count() as u64,
            examples: n as u64,
        })
    }

    /// Adds (or, unless `accumulate`, writes) the gradient of `n` examples into the arena's
    /// gradients, each example's loss weighted by `scale`, and moves the batch-norm statistics.
    #[allow(clippy::too_many_arguments)]
    pub fn train_step(
        &mut self,
        gpu: &Gpu,
        arena: &Arena,
        x: &[f32],
        y: &[u32],
        n: usize,
        scale: f32,
        accumulate: bool,
    ) -> Result<BatchStats, CudaError> {
        if n == 0 {
            if !accumulate {
                gpu.zero(arena.grads(), arena.param_len())?;
            }
            return Ok(BatchStats::default());
        }
        self.load(gpu, x, y, n)?;
        let out = self.forward(gpu, arena, n, true)?;
        let stats = self.loss(gpu, out, n, scale)?;
        self.backward(gpu, arena, n, accumulate)?;
        Ok(stats)
    }

    /// Loss and accuracy sums of `n` examples in inference mode.
    pub fn evaluate(
        &mut self,
        gpu: &Gpu,
        arena: &Arena,
        x: &[f32],
        y: &[u32],
        n: usize,
    ) -> Result<BatchStats, CudaError> {
        if n == 0 {
            return Ok(BatchStats::default());
        }
        self.load(gpu, x, y, n)?;
        let out = self.forward(gpu, arena, n, false)?;
        self.loss(gpu, out, n, 0.0)
    }

    /// The outputs (logits) of `n` examples in inference mode, for checks against the CPU.
    pub fn predict(&mut self, gpu: &Gpu, arena: &Arena, x: &[f32], n: usize) -> Result<Vec<f32>, CudaError> {
        let labels = vec![0u32; n];
        self.load(gpu, x, &labels, n)?;
        let out = self.forward(gpu, arena, n, false)?;
        let mut v = vec![0.0; n * self.classes];
        gpu.download(at(out, 0), &mut v)?;
        Ok(v)
    }
}
