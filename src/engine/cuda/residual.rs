//! A ResNet basic block on the GPU, composed of the layers in `layers.rs` exactly as
//! `engine/layers/residual.rs` composes its CPU children:
//! `relu(bn_2(conv_2(relu(bn_1(conv_1(x))))) + shortcut(x))`.

use super::device::{Buf, DevPtr, Gpu};
use super::error::CudaError;
use super::layers::{Conv, DeviceBatchNorm, DevicePass, add, add_relu, bias_act, relu_mask};
use crate::vocab::Activation;

/// The block's children and the activations it keeps for backward.
pub struct Block {
    pub conv1: Conv,
    pub bn1: DeviceBatchNorm,
    pub conv2: Conv,
    pub bn2: DeviceBatchNorm,
    pub shortcut: Option<(Conv, DeviceBatchNorm)>,
    /// Values in one input and one output example.
    pub in_len: usize,
    pub out_len: usize,
    /// conv_1's output, relu(bn_1(·)), conv_2's output, the projection's conv output.
    pub kept: Option<[Buf; 4]>,
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

    pub fn forward(&self, cx: DevicePass<'_>, x: DevPtr, y: DevPtr) -> Result<(), CudaError> {
        let DevicePass { gpu, sc, n, .. } = cx;
        let [c1, a1, c2, proj] = self.kept()?;
        let len = n * self.out_len;
        self.conv1.forward(cx, x, c1.ptr())?;
        self.bn1.forward(cx, c1.ptr(), a1.ptr())?;
        bias_act(gpu, a1.ptr(), 0, len, 1, Activation::Relu)?;
        self.conv2.forward(cx, a1.ptr(), c2.ptr())?;
        self.bn2.forward(cx, c2.ptr(), y)?;
        match &self.shortcut {
            None => add_relu(gpu, y, x, len),
            Some((conv, bn)) => {
                // g[0] is backward scratch, free here: it holds the shortcut until added.
                conv.forward(cx, x, proj.ptr())?;
                bn.forward(cx, proj.ptr(), sc.g[0].ptr())?;
                add_relu(gpu, y, sc.g[0].ptr(), len)
            }
        }
    }

    pub fn backward(
        &self,
        cx: DevicePass<'_>,
        (x, y, dy): (DevPtr, DevPtr, DevPtr),
        dx: Option<DevPtr>,
    ) -> Result<(), CudaError> {
        let DevicePass { gpu, sc, n, .. } = cx;
        let [c1, a1, c2, proj] = self.kept()?;
        let len = n * self.out_len;
        let [g0, g1, g2, gx] = [sc.g[0].ptr(), sc.g[1].ptr(), sc.g[2].ptr(), sc.g[3].ptr()];
        gpu.copy(g0, dy, len)?;
        relu_mask(gpu, g0, y, len)?;
        // Main branch, back to front: g2 = d c2, g1 = d a1, then g2 = d c1.
        self.bn2.backward(cx, (c2.ptr(), g0), Some(g2))?;
        self.conv2.backward(cx, (a1.ptr(), c2.ptr(), g2), Some(g1))?;
        relu_mask(gpu, g1, a1.ptr(), len)?;
        self.bn1.backward(cx, (c1.ptr(), g1), Some(g2))?;
        self.conv1.backward(cx, (x, c1.ptr(), g2), dx)?;
        match &self.shortcut {
            None => match dx {
                Some(dx) => add(gpu, dx, g0, len),
                None => Ok(()),
            },
            Some((conv, bn)) => {
                bn.backward(cx, (proj.ptr(), g0), Some(g1))?;
                conv.backward(cx, (x, proj.ptr(), g1), dx.map(|_| gx))?;
                match dx {
                    Some(dx) => add(gpu, dx, gx, n * self.in_len),
                    None => Ok(()),
                }
            }
        }
    }
}
