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
use super::layer::{Backward, Forward, Layer, Pass};
use super::meet::Meeting;
use super::optimizer::FusedStep;
use super::shape::Shape;
use std::ops::Range;

pub use super::arena::{GradSink, TensorInfo};

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
enum Activations {
    Input,
    Own(usize),
}

struct LayerSlot {
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
    input: Activations,
    output: Activations,
}

/// Points each tied layer's view at the tensor it borrows and records the loan on the owner.
fn resolve_ties(
    layers: &[Box<dyn Layer>],
    slots: &mut [LayerSlot],
    tensors: &[TensorInfo],
) -> Result<(), SequentialError> {
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
    slots: Vec<LayerSlot>,
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
    /// The layer replicas meet at ([`Sequential::meet`]): the biggest with a
    /// [`Layer::kernel_product`]; `None` when there is none or the model ties weights.
    meeting: Option<usize>,
    /// Which layers write their input gradient through the ReLU below them
    /// ([`super::layer::pair_relu_masks`]).
    masks_dx: Vec<bool>,
    /// Where a backward walk split at the meeting layer stands.
    walk: Option<Walk>,
}

/// A backward walk paused part way: layers `..end` are left, and the gradient flowing into
/// layer `end − 1` is in `grad_bufs[cur]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Walk {
    end: usize,
    cur: usize,
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
        let mut slots: Vec<LayerSlot> = Vec::with_capacity(layers.len());
        let mut acts = 0;
        for layer in &layers {
            let seen = counts.entry(layer.kind()).or_insert(0);
            let name = match *seen {
                0 => layer.kind().to_string(),
                k => format!("{}_{k}", layer.kind()),
            };
            *seen += 1;
            let input = slots.last().map_or(Activations::Input, |s| s.output);
            let output = if layer.is_view() {
                input
            } else {
                acts += 1;
                Activations::Own(acts - 1)
            };
            slots.push(LayerSlot {
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
        let tied = ties(&slots);
        let meeting = (0..layers.len())
            .filter(|&i| !tied && !layers[i].is_view())
            .filter_map(|i| layers[i].kernel_product().map(|(inputs, units)| (inputs * units, i)))
            .max()
            .map(|(_, i)| i);
        let mut layers = layers;
        let masks_dx = super::layer::pair_relu_masks(&mut layers);
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
            meeting,
            masks_dx,
            walk: None,
        })
    }

    /// Runs every layer's matrix products on `path` (the precision policy), and returns how
    /// many layers now take a bf16 path for some product.
    pub fn use_products(&mut self, path: super::bf16::ProductPath) -> usize {
        self.layers.iter_mut().map(|layer| usize::from(layer.use_products(path))).sum()
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
            let (Activations::Own(out), false) = (slot.output, layer.is_view()) else {
                continue;
            };
            let mut y = std::mem::take(&mut self.acts[out]);
            y.resize(n * layer.output_shape().numel(), 0.0);
            let x = match slot.input {
                Activations::Input => x,
                Activations::Own(i) => &self.acts[i],
            };
            layer.forward(Forward { pass, x, n }, &params[slot.view.clone()], &mut state[slot.state.clone()], &mut y);
            self.acts[out] = y;
        }
        self.output(n)
    }

    /// The output of the first layer of `kind` (`conv2d`, …) from the last forward pass on `n`
    /// examples; `None` without such a layer or before a forward pass that large.
    pub fn layer_output(&self, kind: &str, n: usize) -> Option<&[f32]> {
        let i = self.layers.iter().position(|l| l.kind() == kind)?;
        let Activations::Own(out) = self.slots[i].output else { return None };
        self.acts[out].get(..n * self.layers[i].output_shape().numel())
    }

    fn output(&self, n: usize) -> &[f32] {
        let len = n * self.output_shape().numel();
        match self.slots.last().map_or(Activations::Input, |s| s.output) {
            Activations::Own(i) => &self.acts[i][..len],
            Activations::Input => &[],
        }
    }

    /// The last forward output and the buffer the loss writes its gradient into.
    pub fn output_and_grad(&mut self, n: usize) -> (&[f32], &mut [f32]) {
        let len = n * self.output_shape().numel();
        if self.grad_bufs[0].len() < len {
            self.grad_bufs[0].resize(len, 0.0);
        }
        let out = match self.slots.last().map_or(Activations::Input, |s| s.output) {
            Activations::Own(i) => &self.acts[i][..len],
            Activations::Input => &[],
        };
        (out, &mut self.grad_bufs[0][..len])
    }

    /// Backpropagates the gradient left by [`Sequential::output_and_grad`] through the layers
    /// of the last forward pass on input `x`, writing parameter gradients into `grads` and
    /// marking each finished prefix ready.
    pub fn backward(&mut self, pass: Pass, params: &[f32], grads: &mut dyn GradSink, x: &[f32], n: usize) {
        self.walk = None;
        let start = Walk { end: self.layers.len(), cur: 0 };
        self.backward_range(Forward { pass, x, n }, params, grads, start, 0);
    }

    /// [`Sequential::backward`] of the forward pass `input` over layers `stop..walk.end`, from
    /// gradient buffer `walk.cur`; returns where the walk stands after them.
    fn backward_range(
        &mut self,
        input: Forward<'_>,
        params: &[f32],
        grads: &mut dyn GradSink,
        walk: Walk,
        stop: usize,
    ) -> Walk {
        let pass = input.pass;
        self.backward_layers(input, stop..walk.end, walk.cur, |layer, slot, cx, dx| {
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
            layer.backward(Backward { pass: own, ..cx }, &params[p], g, dx);
            grads.ready(slot.params.end);
        })
    }

    /// The first half of a backward that replicas finish together: [`Sequential::backward`]
    /// through the layers after the meeting layer; `false` (nothing done) without one.
    pub fn backward_above(&mut self, pass: Pass, params: &[f32], grads: &mut [f32], x: &[f32], n: usize) -> bool {
        let Some(m) = self.meeting else { return false };
        let start = Walk { end: self.layers.len(), cur: 0 };
        self.walk = Some(self.backward_range(Forward { pass, x, n }, params, &mut &mut *grads, start, m + 1));
        true
    }

    /// After [`Sequential::backward_above`]: the meeting layer's backward short of its kernel
    /// (other tensors' gradients into `grads`), and what the replicas finish it with (`x`,
    /// `dz`, the `dx` buffer); `None` when no walk stopped there.
    pub fn meet<'a>(&'a mut self, pass: Pass, grads: &mut [f32], x: &'a [f32], n: usize) -> Option<Meeting<'a>> {
        let m = self.meeting?;
        let walk = self.walk.filter(|w| w.end == m + 1)?;
        let (inputs, units) = self.layers[m].kernel_product()?;
        let products = self.layers[m].kernel_products();
        let slot = &self.slots[m];
        let Activations::Own(out) = slot.output else { return None };
        let need_dx = slot.input != Activations::Input;
        self.walk = Some(Walk { end: m, cur: if need_dx { 1 - walk.cur } else { walk.cur } });
        let x = match slot.input {
            Activations::Input => x,
            Activations::Own(i) => &self.acts[i],
        };
        let [a, b] = &mut self.grad_bufs;
        let (dy, dx) = if walk.cur == 0 { (&*a, b) } else { (&*b, a) };
        let cx = Backward { pass, x, y: &self.acts[out], dy, n };
        let dz = self.layers[m].backward_dz(cx, &mut grads[slot.params.clone()]);
        let mask = self.masks_dx[m];
        let dx = need_dx.then_some(&mut dx[..n * inputs]);
        Some(Meeting { x: &x[..n * inputs], dz, dx, mask, n, inputs, units, products })
    }

    /// Whether a backward walk paused just after the meeting layer
    /// ([`Sequential::backward_above`]), so that [`Sequential::meet`] can go on from there.
    pub fn at_meeting(&self) -> bool {
        self.meeting.is_some_and(|m| self.walk.is_some_and(|w| w.end == m + 1))
    }

    /// The arena range of the meeting layer's kernel, which [`Sequential::meet`]'s caller updates.
    pub fn meeting_kernel(&self) -> Option<Range<usize>> {
        let m = self.meeting?;
        let (inputs, units) = self.layers[m].kernel_product()?;
        let start = self.slots[m].params.start;
        Some(start..start + inputs * units)
    }

    /// Finishes a walk [`Sequential::backward_above`] paused into `grads` (from the meeting
    /// layer, or below it after [`Sequential::meet`]); `false` when none was paused.
    pub fn backward_rest(&mut self, pass: Pass, params: &[f32], grads: &mut [f32], x: &[f32], n: usize) -> bool {
        let Some(walk) = self.walk.take() else { return false };
        self.backward_range(Forward { pass, x, n }, params, &mut &mut *grads, walk, 0);
        true
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
        self.walk = None;
        let all = 0..self.layers.len();
        self.backward_layers(Forward { pass, x, n }, all, 0, |layer, slot, cx, dx| {
            let p = slot.params.clone();
            layer.backward_update(cx, &mut params[p.clone()], &mut step.slice(p), &mut scratch, dx);
        });
        self.scratch = scratch;
    }

    /// Whether some layer computes with another's tensor: then a tensor's gradient is only
    /// whole after several layers' backward, and updates cannot be fused into backward.
    pub fn has_ties(&self) -> bool {
        ties(&self.slots)
    }

    /// Walks `layers` of the forward pass `input` back to front, starting from gradient buffer
    /// `cur`, calling `f(layer, its slot, its backward context, dx)` with ping-pong gradient
    /// buffers; `dx` is `None` for the first layer. Returns where the walk stands after them.
    fn backward_layers(
        &mut self,
        input: Forward<'_>,
        layers: Range<usize>,
        mut cur: usize,
        mut f: impl FnMut(&mut dyn Layer, &LayerSlot, Backward<'_>, Option<&mut [f32]>),
    ) -> Walk {
        let Forward { pass, x, n } = input;
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
        let end = layers.start;
        for (layer, slot) in self.layers[layers.clone()].iter_mut().zip(&self.slots[layers]).rev() {
            let (Activations::Own(out), false) = (slot.output, layer.is_view()) else {
                continue;
            };
            let x = match slot.input {
                Activations::Input => x,
                Activations::Own(i) => &self.acts[i],
            };
            let [a, b] = &mut self.grad_bufs;
            let (dy, dx) = if cur == 0 { (&*a, b) } else { (&*b, a) };
            let need_dx = slot.input != Activations::Input;
            let cx = Backward { pass, x, y: &self.acts[out], dy, n };
            f(layer.as_mut(), slot, cx, need_dx.then_some(&mut dx[..]));
            if need_dx {
                cur = 1 - cur;
            }
        }
        Walk { end, cur }
    }
}

/// Whether a slot computes with another's tensor ([`Sequential::has_ties`]).
fn ties(slots: &[LayerSlot]) -> bool {
    slots.iter().any(|s| s.adds || !s.shared.is_empty())
}

#[cfg(test)]
#[path = "sequential_tests.rs"]
pub(crate) mod tests;
