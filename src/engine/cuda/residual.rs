//! A ResNet basic block on the GPU, composed of the layers in `layers.rs` exactly as
//! `engine/layers/residual.rs` composes its CPU children:
//! `relu(bn_2(conv_2(relu(bn_1(conv_1(x))))) + shortcut(x))`.

use super::device::{Buf, DevPtr, Gpu};
use super::error::CudaError;
use super::layers::{BatchNorm, Conv, Scratch, add, add_relu, bias_act, relu_mask};
use crate::vocab::Activation;

/// The block's children and the activations it keeps for backward.
pub struct Block {
    pub conv1: Conv,
    pub bn1: BatchNorm,
    pub conv2: Conv,
    pub bn2: BatchNorm,
    pub shortcut: Option<(Conv, BatchNorm)>,
    /// Values in one input and one output example.
    pub in_len: usize,
    pub out_len: usize,
    /// conv_1's output, relu(bn_1(·)), conv_2's output, the projection's conv output.
    pub kept: Option<[Buf; 4]>,
}

/// Where a pass reads and writes: parameters, gradients (backward) and state (forward).
#[derive(Clone, Copy)]
pub struct Vars {
    pub p: DevPtr,
    pub g: DevPtr,
    pub s: DevPtr,
}

impl Block {
    /// Allocates the kept activations for batches of up to `n`.
    pub fn reserve(&mut self, gpu: &Gpu, n: usize) -> Result<(), CudaError> {
        let len = n * self.out_len;
        self.kept = Some([gpu.alloc_f32(len)?, gpu.alloc_f32(len)?, gpu.alloc_f32(len)?, gpu.alloc_f32(len)?]);
        Ok(())
    }

    fn kept(&self) -> Result<&[Buf; 4], CudaError> {
        self.kept.as_ref().ok_or_else(|| CudaError::Unsupported("residual block used before reserve".into()))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        gpu: &Gpu,
        sc: &Scratch,
        v: Vars,
        x: DevPtr,
        y: DevPtr,
        n: usize,
        training: bool,
    ) -> Result<(), CudaError> {
        let [c1, a1, c2, proj] = self.kept()?;
        let len = n * self.out_len;
        let ps = (v.p, v.s);
        self.conv1.forward(gpu, sc, v.p, x, c1.ptr(), n)?;
        self.bn1.forward(gpu, sc, ps, c1.ptr(), a1.ptr(), n, training)?;
        bias_act(gpu, a1.ptr(), 0, len, 1, Activation::Relu)?;
        self.conv2.forward(gpu, sc, v.p, a1.ptr(), c2.ptr(), n)?;
        self.bn2.forward(gpu, sc, ps, c2.ptr(), y, n, training)?;
        match &self.shortcut {
            None => add_relu(gpu, y, x, len),
            Some((conv, bn)) => {
                // g[0] is backward scratch, free here: it holds the shortcut until added.
                conv.forward(gpu, sc, v.p, x, proj.ptr(), n)?;
                bn.forward(gpu, sc, ps, proj.ptr(), sc.g[0].ptr(), n, training)?;
                add_relu(gpu, y, sc.g[0].ptr(), len)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        gpu: &Gpu,
        sc: &Scratch,
        v: Vars,
        (x, y, dy): (DevPtr, DevPtr, DevPtr),
        dx: Option<DevPtr>,
        n: usize,
        (training, acc): (bool, bool),
    ) -> Result<(), CudaError> {
        let [c1, a1, c2, proj] = self.kept()?;
        let len = n * self.out_len;
        let pg = (v.p, v.g);
        let [g0, g1, g2, gx] = [sc.g[0].ptr(), sc.g[1].ptr(), sc.g[2].ptr(), sc.g[3].ptr()];
        gpu.copy(g0, dy, len)?;
        relu_mask(gpu, g0, y, len)?;
        // Main branch, back to front: g2 = d c2, g1 = d a1, then g2 = d c1.
        self.bn2.backward(gpu, sc, pg, (c2.ptr(), g0), Some(g2), n, (training, acc))?;
        self.conv2.backward(gpu, sc, pg, (a1.ptr(), c2.ptr(), g2), Some(g1), n, acc)?;
        relu_mask(gpu, g1, a1.ptr(), len)?;
        self.bn1.backward(gpu, sc, pg, (c1.ptr(), g1), Some(g2), n, (training, acc))?;
        self.conv1.backward(gpu, sc, pg, (x, c1.ptr(), g2), dx, n, acc)?;
        match &self.shortcut {
            None => match dx {
                Some(dx) => add(gpu, dx, g0, len),
                None => Ok(()),
            },
            Some((conv, bn)) => {
                bn.backward(gpu, sc, pg, (proj.ptr(), g0), Some(g1), n, (training, acc))?;
                conv.backward(gpu, sc, pg, (x, proj.ptr(), g1), dx.map(|_| gx), n, acc)?;
                match dx {
                    Some(dx) => add(gpu, dx, gx, n * self.in_len),
                    None => Ok(()),
                }
            }
        }
    }
}
