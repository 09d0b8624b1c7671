//! The `Layer` seam: forward and backward over a flat slice of parameters.

use super::bf16::ProductPath;
use super::optimizer::SliceStep;
use super::shape::Shape;

/// How a parameter tensor starts (Keras's initializers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Uniform in ±sqrt(6 / (fan_in + fan_out)) (Keras's default for kernels).
    GlorotUniform { fan_in: usize, fan_out: usize },
    /// Normal with std sqrt(2 / fan_in), truncated at 2 std (Keras `he_normal`, for ResNets).
    HeNormal { fan_in: usize },
    /// All zeros (biases, batch-norm beta and moving mean).
    Zeros,
    /// All ones (batch-norm gamma and moving variance).
    Ones,
    /// Normal with mean 0 and standard deviation `std`, untruncated (Keras `RandomNormal`;
    /// GPT-2 initializes every kernel and embedding with std 0.02).
    Normal { std: f32 },
}

/// One parameter tensor of a layer; a layer's tensors sit back to back in its slice.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Name inside the layer (`kernel`, `bias`, `gamma`, …), as Keras names weights.
    pub name: String,
    /// Tensor shape in Keras's layout (dense kernel `[in, out]`, conv kernel `[kh, kw, cin, cout]`).
    pub shape: Vec<usize>,
    /// Initial values.
    pub init: Init,
}

impl ParamSpec {
    /// A parameter named `name` of `shape`.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, init: Init) -> Self {
        Self { name: name.into(), shape, init }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor holds no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Weight tying: a layer that owns no tensor and computes with an earlier layer's instead (a
/// GPT head reusing the token embedding matrix).
#[derive(Debug, Clone, PartialEq)]
pub struct Tie {
    /// Weight path of the borrowed tensor, as [`crate::engine::Sequential::tensors`] names it
    /// (`embedding/embeddings`).
    pub path: String,
    /// The shape the borrowing layer expects; it must equal the tensor's.
    pub shape: Vec<usize>,
}

/// What one forward or backward pass is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Training (dropout active, batch-norm uses batch statistics) or inference.
    pub training: bool,
    /// Seed for this pass's randomness (dropout masks), derived from the run seed and step so
    /// that no random state needs saving.
    pub seed: u64,
    /// Add into the gradient buffer instead of overwriting it (gradient accumulation).
    pub accumulate: bool,
    /// Threads this pass may use.
    pub threads: usize,
}

/// The batch a layer's forward pass reads: what the pass is for, the input, and its size.
/// The layer's own tensors and its output are arguments beside it.
#[derive(Debug, Clone, Copy)]
pub struct Forward<'a> {
    /// Training or inference, the seed, the threads.
    pub pass: Pass,
    /// The input, `n × input_shape`.
    pub x: &'a [f32],
    /// Examples.
    pub n: usize,
}

/// What a layer's backward pass reads besides its parameters: what the pass is for, the
/// forward pass's input and output, the gradient of that output, and the batch size. The
/// parameters (read, or updated in place by [`Layer::backward_update`]) and what the pass
/// writes are arguments beside it.
#[derive(Debug, Clone, Copy)]
pub struct Backward<'a> {
    /// Training or inference, the seed, accumulation, the threads.
    pub pass: Pass,
    /// The forward input, `n × input_shape`.
    pub x: &'a [f32],
    /// The forward output, `n × output_shape` (empty where the caller knows the layer
    /// does not read it).
    pub y: &'a [f32],
    /// The gradient of the loss with respect to `y`.
    pub dy: &'a [f32],
    /// Examples.
    pub n: usize,
}

/// A layer: a pure function of its parameters and input, plus its backward pass.
///
/// Layers own scratch buffers (dropout mask, im2col patches), so each replica
/// has its own instance; parameters live outside, in one flat arena shared by the model.
pub trait Layer: Send {
    /// Keras-style layer kind (`dense`, `conv2d`, …), used to name weights.
    fn kind(&self) -> &'static str;

    /// Shape of one output example.
    fn output_shape(&self) -> &Shape;

    /// Values per example that the layer holds after a forward pass: its output, and for a
    /// layer that keeps intermediate results (a transformer block) those too. Evaluation
    /// batches are sized from it.
    fn activation_len(&self) -> usize {
        self.output_shape().numel()
    }

    /// Trainable tensors, in the order they sit in the layer's parameter slice.
    fn params(&self) -> Vec<ParamSpec> {
        Vec::new()
    }

    /// Non-trainable tensors (batch-norm moving statistics), in their state-slice order.
    fn state(&self) -> Vec<ParamSpec> {
        Vec::new()
    }

    /// The tensor this layer borrows instead of owning any (its `params` must be empty): its
    /// parameter slice in `forward` and `backward` is that tensor, and its backward *adds*
    /// the gradient there (or overwrites it when `pass.accumulate` is off; the owner, an
    /// earlier layer whose backward runs later, then adds its own). See `Sequential`.
    fn tie(&self) -> Option<Tie> {
        None
    }

    /// Output equals input reinterpreted (reshape, flatten): the model aliases the buffers and
    /// calls neither `forward` nor `backward`.
    fn is_view(&self) -> bool {
        false
    }

    /// What the layer computes, for engines other than this one (the GPU's); `None` for a
    /// layer that runs on CPUs only.
    fn op(&self) -> Option<super::op::Op> {
        None
    }

    /// Whether the layer's output is ReLU's, `max(0, z)`: the layer above may then pass its
    /// input gradient through ReLU's derivative as it writes it ([`Layer::mask_dx`]).
    fn relu_output(&self) -> bool {
        false
    }

    /// `true` asks the layer to write its input gradient already through ReLU's derivative at
    /// its input (zero where `x > 0` does not hold), because the layer below makes `x` with a
    /// ReLU; returns whether it will. `false` turns that off. See [`pair_relu_masks`].
    fn mask_dx(&mut self, _on: bool) -> bool {
        false
    }

    /// `true`: the gradient the next backward receives has been through this layer's ReLU's
    /// derivative already ([`Layer::mask_dx`] above it), so backward takes it as it is.
    fn dy_masked(&mut self, _on: bool) {}

    /// Runs this layer's matrix products on `path` from now on (the model applies the
    /// precision policy once, when built), and says whether any of them now takes a bf16 path
    /// (`check` warns when no layer does). Layers without products have nothing to change;
    /// `dense` takes it on the products of its kernel, `conv2d` on its im2col products.
    fn use_products(&mut self, _path: ProductPath) -> bool {
        false
    }

    /// Computes `y` (n × output_shape) from `cx.x` (n × input_shape).
    fn forward(&mut self, cx: Forward<'_>, params: &[f32], state: &mut [f32], y: &mut [f32]);

    /// Writes (or, with `cx.pass.accumulate`, adds) parameter gradients into `grads` and,
    /// when `dx` is given, the input gradient into it.
    fn backward(&mut self, cx: Backward<'_>, params: &[f32], grads: &mut [f32], dx: Option<&mut [f32]>);

    /// `Some((inputs, units))` when the layer's first tensor is an `inputs × units` kernel
    /// whose gradient is `xᵀ·dz` and whose input gradient is `dz·kernelᵀ`, `dz` being what
    /// [`Layer::backward_dz`] returns: replicas in one process can then meet at this layer and
    /// update the kernel once from all their products (`engine::meet`).
    fn kernel_product(&self) -> Option<(usize, usize)> {
        None
    }

    /// The path [`Layer::kernel_product`]'s products run on, which replicas meeting at the
    /// layer take too.
    fn kernel_products(&self) -> ProductPath {
        ProductPath::Float32
    }

    /// [`Layer::backward`] short of the kernel, for a layer with a [`Layer::kernel_product`]:
    /// writes the gradients of the tensors after the kernel into `grads` (the layer's whole
    /// slice; the kernel's part is left alone) and returns `dz`. Other layers return nothing.
    fn backward_dz(&mut self, _cx: Backward<'_>, _grads: &mut [f32]) -> &[f32] {
        &[]
    }

    /// [`Layer::backward`] that also applies `update` to this layer's parameters, in place,
    /// once `dx` (computed with the old parameters) is written. Layers whose gradient product
    /// can write the update itself override it (`dense`); the default stores the gradient in
    /// `scratch` (grown to what the layer needs, and kept for the next step) and applies the
    /// optimizer's arithmetic to it, giving the unfused path's bits.
    fn backward_update(
        &mut self,
        cx: Backward<'_>,
        params: &mut [f32],
        update: &mut SliceStep<'_>,
        scratch: &mut Vec<f32>,
        dx: Option<&mut [f32]>,
    ) {
        if scratch.len() < params.len() {
            scratch.resize(params.len(), 0.0);
        }
        let grads = &mut scratch[..params.len()];
        self.backward(Backward { pass: Pass { accumulate: false, ..cx.pass }, ..cx }, params, grads, dx);
        if !params.is_empty() {
            update.apply(params, grads);
        }
    }
}

/// Pairs each layer with the one below it (views skipped, as they alias their input), and
/// returns which layers now mask their input gradient. A layer above a ReLU masks its input
/// gradient while that is still in cache (the dense layer, block by block, and over the
/// ReLU's nonzeros only: [`crate::engine::sparse`]); the ReLU's own layer then skips a pass
/// that read its output and that gradient again (11 MB a step under the tutorial's big dense
/// layer). The derivative is the same select (`dy` where `y > 0`, else 0) either way.
pub(crate) fn pair_relu_masks(layers: &mut [Box<dyn Layer>]) -> Vec<bool> {
    let mut masked = vec![false; layers.len()];
    let mut below: Option<usize> = None;
    for i in 0..layers.len() {
        if layers[i].is_view() {
            continue;
        }
        if let Some(j) = below {
            masked[i] = layers[j].relu_output() && layers[i].mask_dx(true);
            layers[j].dy_masked(masked[i]);
        }
        below = Some(i);
    }
    masked
}
