//! A Keras-style `Sequential` model: layers in order over one flat parameter arena.
//!
//! The arena holds layers in reverse order, so backward finishes gradients from the front of
//! the buffer: every finished prefix can start its all-reduce while backward continues.
//!
//! Weight tying ([`Layer::tie`]): a layer may compute with an earlier layer's tensor instead of
//! owning one. The tensor stays in its owner's part of the arena, which lies *after* every
//! later layer's part, so the prefix marks reported while backward passes the borrowing layer
//! never cover it: the owner's backward runs last of all contributors, adds its gradient to
//! theirs, and only then marks the tensor ready. One copy of the tensor lives in the arena,
//! so checkpoints and optimizers see it once.

use super::init;
use super::layer::{Layer, Pass};
use super::optimizer::FusedStep;
use super::shape::Shape;
use std::ops::Range;

/// A model whose layers cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequentialError {
    /// A layer ties to a tensor no earlier layer has.
    #[error("layer `{layer}` ties to `{path}`, which no earlier layer has (earlier tensors: {known})")]
    UnknownTie { layer: String, path: String, known: String },
    /// A tied tensor's shape is not the one the borrowing layer expects.
    #[error("layer `{layer}` ties to `{path}` of shape {found:?}, but expects {expected:?}")]
    TieShape { layer: String, path: String, found: Vec<usize>, expected: Vec<usize> },
    /// A layer declares a tie and tensors of its own.
    #[error("layer `{layer}` ties to `{path}` and also owns tensors; a tied layer owns none")]
    TieWithParams { layer: String, path: String },
}

/// A named tensor inside the parameter or state arena (`dense_1/kernel`).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// `layer_name/weight_name`, Keras's weight path.
    pub name: String,
    /// Shape in Keras's layout.
    pub shape: Vec<usize>,
    /// Offset in the arena, in values.
    pub offset: usize,
}

impl TensorInfo {
    /// Values in the tensor.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tensor's range in its arena.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// Where backward writes parameter gradients: a plain buffer, or the part of the arena a
/// collective has not yet taken away for reduction (`collective::Packs`).
pub trait GradSink {
    /// `grads[range]`, by arena index. Backward asks only for ranges starting at or after the
    /// last [`GradSink::ready`] mark.
    fn slice(&mut self, range: Range<usize>) -> &mut [f32];

    /// `grads[..k]` is final.
    fn ready(&mut self, _k: usize) {}
}

impl GradSink for &mut [f32] {
    fn slice(&mut self, range: Range<usize>) -> &mut [f32] {
        &mut self[range]
    }
}

impl GradSink for Vec<f32> {
    fn slice(&mut self, range: Range<usize>) -> &mut [f32] {
        &mut self[range]
    }
}

/// One row of a model summary.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerSummary {
    /// Keras-style unique name (`conv2d`, `dense_1`).
    pub name: String,
    /// Shape of one output example.
    pub output_shape: Shape,
    /// Trainable values.
    pub params: usize,
}

/// One built layer as other engines see it.
#[derive(Debug, Clone)]
pub struct LayerView<'a> {
    /// Keras-style unique name (`conv2d`, `dense_1`).
    pub name: &'a str,
    /// The layer kind.
    pub kind: &'static str,
    /// What it computes, its tensors placed in the model's arenas; `None`: CPUs only.
    pub op: Option<super::op::Op>,
    /// Shape of one input example.
    pub input_shape: Shape,
    /// Shape of one output example.
    pub output_shape: &'a Shape,
}

/// Where a layer reads or writes its activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Buf {
    Input,
    Own(usize),
}

struct Slot {
    name: String,
    /// The tensors this layer owns, in the arena.
    params: Range<usize>,
    /// The slice its forward and backward get: `params`, or the tensor it ties to.
    view: Range<usize>,
    /// Parts of `params` that later (tied) layers write gradients into before this layer's
    /// backward runs.
    shared: Vec<Range<usize>>,
    /// A later layer ties to the same tensor as this one: its gradient is there first.
    adds: bool,
    state: Range<usize>,
    input: Buf,
    output: Buf,
}

/// Points each tied layer's view at the tensor it borrows and records the loan on the owner.
fn resolve_ties(layers: &[Box<dyn Layer>], slots: &mut [Slot], tensors: &[TensorInfo]) -> Result<(), SequentialError> {
    for i in 0..layers.len() {
        let Some(tie) = layers[i].tie() else { continue };
        let layer = slots[i].name.clone();
        if !layers[i].params().is_empty() {
            return Err(SequentialError::TieWithParams { layer, path: tie.path });
        }
        let owner = tensors
            .iter()
            .find(|t| t.name == tie.path)
            .and_then(|t| (0..i).find(|&j| slots[j].params.contains(&t.offset)).map(|j| (j, t)));
        let Some((j, t)) = owner else {
            let earlier: Vec<&str> = tensors
                .iter()
                .filter(|t| (0..i).any(|j| slots[j].params.contains(&t.offset)))
                .map(|t| t.name.as_str())
                .collect();
            return Err(SequentialError::UnknownTie { layer, path: tie.path, known: earlier.join(", ") });
        };
        if t.shape != tie.shape {
            return Err(SequentialError::TieShape {
                layer,
                path: tie.path,
                found: t.shape.clone(),
                expected: tie.shape,
            });
        }
        slots[i].view = t.range();
        // Backward runs in reverse: an earlier layer tied to the same tensor runs after this.
        for other in &mut slots[j + 1..i] {
            if other.view == t.range() {
                other.adds = true;
            }
        }
        if !slots[j].shared.contains(&t.range()) {
            slots[j].shared.push(t.range());
            slots[j].shared.sort_by_key(|r| r.start);
        }
    }
    Ok(())
}

/// Layers applied in order, with their activation buffers.
pub struct Sequential {
    input: Shape,
    layers: Vec<Box<dyn Layer>>,
    slots: Vec<Slot>,
    tensors: Vec<TensorInfo>,
    state_tensors: Vec<TensorInfo>,
    param_len: usize,
    state_len: usize,
    acts: Vec<Vec<f32>>,
    /// Ping-pong gradient buffers for backward; `[0]` receives the loss gradient.
    grad_bufs: [Vec<f32>; 2],
    /// One layer's parameter gradient, for layers a fused update reaches through a stored
    /// gradient ([`Sequential::backward_update`]).
    scratch: Vec<f32>,
}

impl Sequential {
    /// Lays out `layers` (built for inputs of `input`) over one arena.
    ///
    /// # Panics
    /// When a layer's [`Layer::tie`] cannot be resolved: build models with tied layers through
    /// [`Sequential::try_new`].
    pub fn new(input: Shape, layers: Vec<Box<dyn Layer>>) -> Self {
        match Self::try_new(input, layers) {
            Ok(model) => model,
            Err(e) => panic!("{e}; build tied models with Sequential::try_new"),
        }
    }

    /// Lays out `layers` (built for inputs of `input`) over one arena, resolving weight ties.
    pub fn try_new(input: Shape, layers: Vec<Box<dyn Layer>>) -> Result<Self, SequentialError> {
        let mut counts = std::collections::HashMap::<&str, usize>::new();
        let mut slots: Vec<Slot> = Vec::with_capacity(layers.len());
        let mut acts = 0;
        for layer in &layers {
            let seen = counts.entry(layer.kind()).or_insert(0);
            let name = match *seen {
                0 => layer.kind().to_string(),
                k => format!("{}_{k}", layer.kind()),
            };
            *seen += 1;
            let input = slots.last().map_or(Buf::Input, |s| s.output);
            let output = if layer.is_view() {
                input
            } else {
                acts += 1;
                Buf::Own(acts - 1)
            };
            slots.push(Slot {
                name,
                params: 0..0,
                view: 0..0,
                shared: Vec::new(),
                adds: false,
                state: 0..0,
                input,
                output,
            });
        }
        let (mut tensors, mut state_tensors) = (Vec::new(), Vec::new());
        let (mut param_len, mut state_len) = (0, 0);
        for (layer, slot) in layers.iter().zip(&mut slots).rev() {
            let start = param_len;
            for p in layer.params() {
                tensors.push(TensorInfo {
                    name: format!("{}/{}", slot.name, p.name),
                    shape: p.shape,
                    offset: param_len,
                });
                param_len += tensors.last().map_or(0, TensorInfo::len);
            }
            slot.params = start..param_len;
            slot.view = start..param_len;
            let start = state_len;
            for p in layer.state() {
                state_tensors.push(TensorInfo {
                    name: format!("{}/{}", slot.name, p.name),
                    shape: p.shape,
                    offset: state_len,
                });
                state_len += state_tensors.last().map_or(0, TensorInfo::len);
            }
            slot.state = start..state_len;
        }
        resolve_ties(&layers, &mut slots, &tensors)?;
        Ok(Self {
            input,
            layers,
            slots,
            tensors,
            state_tensors,
            param_len,
            state_len,
            acts: vec![Vec::new(); acts],
            grad_bufs: [Vec::new(), Vec::new()],
            scratch: Vec::new(),
        })
    }

    /// Shape of one input example.
    pub fn input_shape(&self) -> &Shape {
        &self.input
    }

    /// Shape of one output example.
    pub fn output_shape(&self) -> &Shape {
        self.layers.last().map_or(&self.input, |l| l.output_shape())
    }

    /// Activation values one example keeps during a forward pass (every layer's output and
    /// what layers keep besides, [`Layer::activation_len`]).
    pub fn activation_len(&self) -> usize {
        self.layers.iter().filter(|l| !l.is_view()).map(|l| l.activation_len()).sum()
    }

    /// Every layer, in order, as other engines see it.
    pub fn layer_views(&self) -> Vec<LayerView<'_>> {
        let mut input = self.input.clone();
        self.layers
            .iter()
            .zip(&self.slots)
            .map(|(layer, slot)| {
                let view = LayerView {
                    name: &slot.name,
                    kind: layer.kind(),
                    op: layer.op().map(|op| op.placed(slot.params.start, slot.state.start)),
                    input_shape: input.clone(),
                    output_shape: layer.output_shape(),
                };
                input = layer.output_shape().clone();
                view
            })
            .collect()
    }

    /// Trainable values in the arena.
    pub fn param_len(&self) -> usize {
        self.param_len
    }

    /// Non-trainable values (moving statistics).
    pub fn state_len(&self) -> usize {
        self.state_len
    }

    /// Trainable tensors with their arena offsets.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Non-trainable tensors with their state-arena offsets.
    pub fn state_tensors(&self) -> &[TensorInfo] {
        &self.state_tensors
    }

    /// Layer names, output shapes and parameter counts, as Keras's `model.summary()`.
    pub fn summary(&self) -> Vec<LayerSummary> {
        self.layers
            .iter()
            .zip(&self.slots)
            .map(|(l, s)| LayerSummary {
                name: s.name.clone(),
                output_shape: l.output_shape().clone(),
                params: s.params.len(),
            })
            .collect()
    }

    /// Initial parameters and state for `seed`, as Keras's initializers would draw them.
    pub fn init(&self, seed: u64) -> (Vec<f32>, Vec<f32>) {
        let mut params = vec![0.0; self.param_len];
        let mut state = vec![0.0; self.state_len];
        for (layer, slot) in self.layers.iter().zip(&self.slots) {
            let mut offset = slot.params.start;
            for p in layer.params() {
                let len = p.len();
                let id = init::tensor_id(&format!("{}/{}", slot.name, p.name));
                init::fill(&mut params[offset..offset + len], p.init, seed, id);
                offset += len;
            }
            let mut offset = slot.state.start;
            for p in layer.state() {
                let len = p.len();
                init::fill(&mut state[offset..offset + len], p.init, seed, 0);
                offset += len;
            }
        }
        (params, state)
    }

    /// Runs the layers on `n` examples `x`; returns the output (`n × output_shape`).
    pub fn forward(&mut self, pass: Pass, params: &[f32], state: &mut [f32], x: &[f32], n: usize) -> &[f32] {
        assert_eq!(x.len(), n * self.input.numel(), "input batch does not match the model's input shape");
        for (layer, slot) in self.layers.iter_mut().zip(&self.slots) {
            // Views alias their input buffer: nothing to compute.
            let (Buf::Own(out), false) = (slot.output, layer.is_view()) else {
                continue;
            };
            let mut y = std::mem::take(&mut self.acts[out]);
            y.resize(n * layer.output_shape().numel(), 0.0);
            let x = match slot.input {
                Buf::Input => x,
                Buf::Own(i) => &self.acts[i],
            };
            layer.forward(pass, &params[slot.view.clone()], &mut state[slot.state.clone()], x, &mut y, n);
            self.acts[out] = y;
        }
        self.output(n)
    }

    fn output(&self, n: usize) -> &[f32] {
        let len = n * self.output_shape().numel();
        match self.slots.last().map_or(Buf::Input, |s| s.output) {
            Buf::Own(i) => &self.acts[i][..len],
            Buf::Input => &[],
        }
    }

    /// The last forward output and the buffer the loss writes its gradient into.
    pub fn output_and_grad(&mut self, n: usize) -> (&[f32], &mut [f32]) {
        let len = n * self.output_shape().numel();
        if self.grad_bufs[0].len() < len {
            self.grad_bufs[0].resize(len, 0.0);
        }
        let out = match self.slots.last().map_or(Buf::Input, |s| s.output) {
            Buf::Own(i) => &self.acts[i][..len],
            Buf::Input => &[],
        };
        (out, &mut self.grad_bufs[0][..len])
    }

    /// Backpropagates the gradient left by [`Sequential::output_and_grad`] through the layers
    /// of the last forward pass on input `x`, writing parameter gradients into `grads` and
    /// marking each finished prefix ready.
    pub fn backward(&mut self, pass: Pass, params: &[f32], grads: &mut dyn GradSink, x: &[f32], n: usize) {
        self.backward_layers(x, n, |layer, slot, x, y, dy, dx| {
            let p = slot.view.clone();
            let g = grads.slice(p.clone());
            let mut own = pass;
            own.accumulate |= slot.adds;
            if !slot.shared.is_empty() && !pass.accumulate {
                // Tied layers already wrote their part: overwrite the rest, add onto theirs.
                let mut from = 0;
                for r in slot.shared.iter().map(|r| r.start - p.start..r.end - p.start) {
                    g[from..r.start].fill(0.0);
                    from = r.end;
                }
                g[from..].fill(0.0);
                own.accumulate = true;
            }
            layer.backward(own, &params[p], g, x, y, dy, dx, n);
            grads.ready(slot.params.end);
        });
    }

    /// [`Sequential::backward`] that applies `step` to each layer's parameters as soon as the
    /// layer's backward is done, instead of leaving gradients for an optimizer pass: for one
    /// replica with nothing else reading the gradient (no all-reduce, no accumulation). Layers
    /// run back to front and each uses only its own parameters, so every `dx` still sees the
    /// weights forward used.
    pub fn backward_update(&mut self, pass: Pass, params: &mut [f32], step: &mut FusedStep<'_>, x: &[f32], n: usize) {
        let pass = Pass { accumulate: false, ..pass };
        // Sized by the layers that store a gradient, not by the arena: the fused dense kernel
        // never does, and sizing by it would make its 11 MB resident again.
        let mut scratch = std::mem::take(&mut self.scratch);
        self.backward_layers(x, n, |layer, slot, x, y, dy, dx| {
            let p = slot.params.clone();
            layer.backward_update(pass, &mut params[p.clone()], &mut step.slice(p), &mut scratch, x, y, dy, dx, n);
        });
        self.scratch = scratch;
    }

    /// Whether some layer computes with another's tensor: then a tensor's gradient is only
    /// whole after several layers' backward, and updates cannot be fused into backward.
    pub fn has_ties(&self) -> bool {
        self.slots.iter().any(|s| s.adds || !s.shared.is_empty())
    }

    /// Walks the layers back to front, calling `f(layer, its slot, x, y, dy, dx)` with
    /// ping-pong gradient buffers; `dx` is `None` for the first layer.
    #[allow(clippy::type_complexity)]
    fn backward_layers(
        &mut self,
        x: &[f32],
        n: usize,
        mut f: impl FnMut(&mut dyn Layer, &Slot, &[f32], &[f32], &[f32], Option<&mut [f32]>),
    ) {
        let widest = std::iter::once(&self.input)
            .chain(self.layers.iter().map(|l| l.output_shape()))
            .map(Shape::numel)
            .max()
            .unwrap_or(0);
        for buf in &mut self.grad_bufs {
            if buf.len() < n * widest {
                buf.resize(n * widest, 0.0);
            }
        }
        let mut cur = 0;
        for (layer, slot) in self.layers.iter_mut().zip(&self.slots).rev() {
            let (Buf::Own(out), false) = (slot.output, layer.is_view()) else {
                continue;
            };
            let x = match slot.input {
                Buf::Input => x,
                Buf::Own(i) => &self.acts[i],
            };
            let [a, b] = &mut self.grad_bufs;
            let (dy, dx) = if cur == 0 { (&*a, b) } else { (&*b, a) };
            let need_dx = slot.input != Buf::Input;
            f(layer.as_mut(), slot, x, &self.acts[out], dy, need_dx.then_some(&mut dx[..]));
            if need_dx {
                cur = 1 - cur;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::kernels::Window;
    use crate::engine::layers::{Conv2d, Dense, View};
    use crate::engine::optimizer::{Optimizer, Sgd};
    use crate::engine::{LossFn, init};
    use crate::vocab::{Activation, Loss};
    use rand::RngExt;

    /// The tutorial model's shape, small: reshape → conv relu → flatten → dense relu → dense.
    fn model() -> Sequential {
        let win = Window::new((8, 8, 1), (3, 3), (1, 1), false).unwrap();
        let layers: Vec<Box<dyn Layer>> = vec![
            Box::new(View::reshape(Shape(vec![8, 8, 1]))),
            Box::new(Conv2d::new(win, 4, Activation::Relu, true)),
            Box::new(View::flatten(&Shape(vec![6, 6, 4]))),
            Box::new(Dense::new(144, 16, Activation::Relu, true)),
            Box::new(Dense::new(16, 5, Activation::Linear, true)),
        ];
        Sequential::new(Shape(vec![64]), layers)
    }

    /// Three steps of backward + optimizer pass against three of `backward_update`.
    #[test]
    fn fused_update_equals_the_unfused_one_within_rounding() {
        let n = 6;
        let mut r = init::rng(&[3]);
        let x: Vec<f32> = (0..n * 64).map(|_| r.random_range(0.0..1.0)).collect();
        let labels: Vec<u32> = (0..n).map(|_| r.random_range(0..5)).collect();
        let loss = LossFn { kind: Loss::SparseCategoricalCrossentropy, from_logits: true };
        for (momentum, wd) in [(0.0, 0.0), (0.9, 0.0), (0.9, 1e-3)] {
            let (mut a, mut b) = (model(), model());
            let (init, _) = a.init(5);
            let (mut pa, mut pb) = (init.clone(), init);
            let mut oa = Optimizer::Sgd(Sgd::new(pa.len(), momentum, false, wd));
            let mut ob = oa.clone();
            let mut grads = vec![0.0; pa.len()];
            for step in 0..3 {
                let pass = Pass { training: true, seed: step, accumulate: false, threads: 2 };
                a.forward(pass, &pa, &mut [], &x, n);
                let (out, dout) = a.output_and_grad(n);
                loss.evaluate(out, crate::engine::Truth::Classes(&labels), 5, 1.0 / n as f32, Some(dout));
                a.backward(pass, &pa, &mut grads, &x, n);
                oa.step(&mut pa, &grads, 0.05);

                b.forward(pass, &pb, &mut [], &x, n);
                let (out, dout) = b.output_and_grad(n);
                loss.evaluate(out, crate::engine::Truth::Classes(&labels), 5, 1.0 / n as f32, Some(dout));
                let Some(mut fused) = ob.fused(0.05) else { panic!("SGD must fuse") };
                b.backward_update(pass, &mut pb, &mut fused, &x, n);
            }
            let worst = pa.iter().zip(&pb).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
            assert!(worst < 1e-5, "momentum {momentum}, weight decay {wd}: off by {worst}");
            assert_ne!(pa, init_of(&a), "training moved the weights");
            assert_eq!(oa.state().len(), ob.state().len());
            if let (Some((_, va)), Some((_, vb))) = (oa.state().first(), ob.state().first()) {
                let worst = va.iter().zip(*vb).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
                assert!(worst < 1e-5, "velocity off by {worst}");
            }
            assert_eq!(oa.iterations(), ob.iterations());
        }
    }

    fn init_of(m: &Sequential) -> Vec<f32> {
        m.init(5).0
    }
}
