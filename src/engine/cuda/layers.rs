//! GPU forward and backward of each layer kind, mirroring `engine/layers/*.rs` line for line:
//! dense and convolution on cuBLAS (convolution as im2col + gemm, in chunks of images that
//! bound the patch buffer), everything else on the kernels of `kernels.rs`.

use super::device::{Buf, DevPtr, Gpu, at, launch};
use super::error::CudaError;
use super::kernels::{ACT_LINEAR, ACT_RELU, ACT_SIGMOID, ACT_TANH};
use crate::engine::kernels::Window;
use crate::vocab::Activation;

/// Patch values one im2col chunk may hold (128 MiB of f32); bigger batches go in chunks.
pub const PATCH_VALUES: usize = 1 << 25;

/// Scratch shared by all layers of a model (they run one at a time on one stream).
pub struct Scratch {
    /// im2col patches of one chunk.
    pub patches: Buf,
    /// Patch gradients of one chunk.
    pub d_patches: Buf,
    /// Gradient before an activation: `n × widest` values.
    pub dz: Buf,
    /// Residual blocks' gradients and shortcut output: `n × widest` each.
    pub g: [Buf; 4],
    /// Batch-norm sums, `2 × widest channel count` doubles.
    pub sums: Buf,
    /// Batch-norm backward coefficients, `3 × widest channel count`.
    pub coef: Buf,
}

/// Where a pass reads and writes the arena: parameters, gradients (backward) and state
/// (forward).
#[derive(Debug, Clone, Copy)]
pub struct Vars {
    pub p: DevPtr,
    pub g: DevPtr,
    pub s: DevPtr,
}

/// What a layer's pass on the GPU reads besides its activations: the device, the scratch the
/// layers share, the arena, the batch size, and what the pass is for (the GPU's
/// [`crate::engine::Pass`]).
#[derive(Clone, Copy)]
pub struct DevicePass<'a> {
    pub gpu: &'a Gpu,
    pub sc: &'a Scratch,
    pub vars: Vars,
    /// Examples.
    pub n: usize,
    /// Batch normalization uses (and moves) the batch's statistics, not the moving ones.
    pub training: bool,
    /// Backward adds into the gradients instead of overwriting them.
    pub accumulate: bool,
}

/// An activation as the kernels take it: the elementwise code, and whether softmax follows.
fn act_code(act: Activation) -> (i32, bool) {
    match act {
        Activation::Linear => (ACT_LINEAR, false),
        Activation::Relu => (ACT_RELU, false),
        Activation::Sigmoid => (ACT_SIGMOID, false),
        Activation::Tanh => (ACT_TANH, false),
        Activation::Softmax => (ACT_LINEAR, true),
    }
}

/// `y = act(y + bias)` over `rows` rows of `cols`; `bias` 0 for none.
pub fn bias_act(
    gpu: &Gpu,
    y: DevPtr,
    bias: DevPtr,
    rows: usize,
    cols: usize,
    act: Activation,
) -> Result<(), CudaError> {
    let (code, softmax) = act_code(act);
    if bias != 0 || code != ACT_LINEAR {
        launch!(gpu, "bias_act_fwd", Gpu::config((rows * cols) as u64), y, bias, rows as i64, cols as i32, code)?;
    }
    if softmax {
        launch!(gpu, "softmax_fwd", Gpu::config(rows as u64), y, rows as i64, cols as i32)?;
    }
    Ok(())
}

/// The gradient before `act` from its output `y` and `dy`: `dy` itself when linear, else `dz`.
pub fn act_backward(
    gpu: &Gpu,
    act: Activation,
    y: DevPtr,
    dy: DevPtr,
    dz: DevPtr,
    rows: usize,
    cols: usize,
) -> Result<DevPtr, CudaError> {
    match act_code(act) {
        (ACT_LINEAR, false) => Ok(dy),
        (_, true) => {
            launch!(gpu, "softmax_bwd", Gpu::config(rows as u64), y, dy, dz, rows as i64, cols as i32)?;
            Ok(dz)
        }
        (code, false) => {
            launch!(gpu, "act_bwd", Gpu::config((rows * cols) as u64), y, dy, dz, (rows * cols) as i64, code)?;
            Ok(dz)
        }
    }
}

/// A dense layer's geometry and parameter offsets.
#[derive(Debug, Clone)]
pub struct DeviceDense {
    pub inputs: usize,
    pub units: usize,
    pub act: Activation,
    pub kernel: usize,
    pub bias: Option<usize>,
}

impl DeviceDense {
    pub fn forward(&self, cx: DevicePass<'_>, x: DevPtr, y: DevPtr) -> Result<(), CudaError> {
        let DevicePass { gpu, vars: Vars { p, .. }, n, .. } = cx;
        gpu.matmul((n, self.units, self.inputs), (x, false), (at(p, self.kernel), false), y, false)?;
        bias_act(gpu, y, self.bias.map_or(0, |b| at(p, b)), n, self.units, self.act)
    }

    pub fn backward(
        &self,
        cx: DevicePass<'_>,
        (x, y, dy): (DevPtr, DevPtr, DevPtr),
        dx: Option<DevPtr>,
    ) -> Result<(), CudaError> {
        let DevicePass { gpu, sc, vars: Vars { p, g, .. }, n, accumulate: acc, .. } = cx;
        let dz = act_backward(gpu, self.act, y, dy, sc.dz.ptr(), n, self.units)?;
        gpu.matmul((self.inputs, self.units, n), (x, true), (dz, false), at(g, self.kernel), acc)?;
        if let Some(b) = self.bias {
            col_sum(gpu, dz, n, self.units, at(g, b), acc)?;
        }
        if let Some(dx) = dx {
            gpu.matmul((n, self.inputs, self.units), (dz, false), (at(p, self.kernel), true), dx, false)?;
        }
        Ok(())
    }
}

/// `dst (+)= Σ rows of src`.
fn col_sum(gpu: &Gpu, src: DevPtr, rows: usize, cols: usize, dst: DevPtr, acc: bool) -> Result<(), CudaError> {
    launch!(gpu, "col_sum", Gpu::per_block(cols), src, rows as i64, cols as i32, dst, i32::from(acc))
}

/// Window geometry as kernel arguments, after the image count.
fn geometry(w: &Window) -> [i32; 11] {
    [w.h, w.w, w.c, w.kh, w.kw, w.sh, w.sw, w.pad_top, w.pad_left, w.oh, w.ow].map(|v| v as i32)
}

/// A convolution's geometry and parameter offsets.
#[derive(Debug, Clone)]
pub struct Conv {
    pub win: Window,
    pub filters: usize,
    pub act: Activation,
    pub kernel: usize,
    pub bias: Option<usize>,
}

impl Conv {
    fn per_image(&self) -> usize {
        self.win.positions() * self.win.patch_len()
    }

    /// Images per im2col chunk for a batch of `n`.
    pub fn chunk(&self, n: usize) -> usize {
        (PATCH_VALUES / self.per_image().max(1)).clamp(1, n.max(1))
    }

    /// Patch values the scratch needs for a batch of `n`.
    pub fn patch_values(&self, n: usize) -> usize {
        self.chunk(n) * self.per_image()
    }

    fn im2col(&self, gpu: &Gpu, x: DevPtr, patches: DevPtr, imgs: usize) -> Result<(), CudaError> {
        let [h, w, c, kh, kw, sh, sw, pt, pl, oh, ow] = geometry(&self.win);
        let total = imgs * self.per_image();
        launch!(
            gpu,
            "im2col",
            Gpu::config(total as u64),
            x,
            patches,
            imgs as i64,
            h,
            w,
            c,
            kh,
            kw,
            sh,
            sw,
            pt,
            pl,
            oh,
            ow
        )
    }

    fn col2im(&self, gpu: &Gpu, patches: DevPtr, dx: DevPtr, imgs: usize) -> Result<(), CudaError> {
        let [h, w, c, kh, kw, sh, sw, pt, pl, oh, ow] = geometry(&self.win);
        let total = imgs * (self.win.h * self.win.w * self.win.c);
        launch!(
            gpu,
            "col2im",
            Gpu::config(total as u64),
            patches,
            dx,
            imgs as i64,
            h,
            w,
            c,
            kh,
            kw,
            sh,
            sw,
            pt,
            pl,
            oh,
            ow
        )
    }

    pub fn forward(&self, cx: DevicePass<'_>, x: DevPtr, y: DevPtr) -> Result<(), CudaError> {
        let DevicePass { gpu, sc, vars: Vars { p, .. }, n, .. } = cx;
        let (win, f) = (&self.win, self.filters);
        let (in_len, out_len) = (win.h * win.w * win.c, win.positions() * f);
        let chunk = self.chunk(n);
        for start in (0..n).step_by(chunk) {
            let imgs = chunk.min(n - start);
            self.im2col(gpu, at(x, start * in_len), sc.patches.ptr(), imgs)?;
            let rows = imgs * win.positions();
            let (patches, kernel) = ((sc.patches.ptr(), false), (at(p, self.kernel), false));
            gpu.matmul((rows, f, win.patch_len()), patches, kernel, at(y, start * out_len), false)?;
        }
        bias_act(gpu, y, self.bias.map_or(0, |b| at(p, b)), n * win.positions(), f, self.act)
    }

    pub fn backward(
        &self,
        cx: DevicePass<'_>,
        (x, y, dy): (DevPtr, DevPtr, DevPtr),
        dx: Option<DevPtr>,
    ) -> Result<(), CudaError> {
        let DevicePass { gpu, sc, vars: Vars { p, g, .. }, n, accumulate: acc, .. } = cx;
        let (win, f) = (&self.win, self.filters);
        let (in_len, out_len, pl) = (win.h * win.w * win.c, win.positions() * f, win.patch_len());
        let dz = act_backward(gpu, self.act, y, dy, sc.dz.ptr(), n * win.positions(), f)?;
        if let Some(b) = self.bias {
            col_sum(gpu, dz, n * win.positions(), f, at(g, b), acc)?;
        }
        let chunk = self.chunk(n);
        for start in (0..n).step_by(chunk) {
            let imgs = chunk.min(n - start);
            let rows = imgs * win.positions();
            let dz = at(dz, start * out_len);
            self.im2col(gpu, at(x, start * in_len), sc.patches.ptr(), imgs)?;
            gpu.matmul((pl, f, rows), (sc.patches.ptr(), true), (dz, false), at(g, self.kernel), acc || start > 0)?;
            if let Some(dx) = dx {
                gpu.matmul((rows, pl, f), (dz, false), (at(p, self.kernel), true), sc.d_patches.ptr(), false)?;
                self.col2im(gpu, sc.d_patches.ptr(), at(dx, start * in_len), imgs)?;
            }
        }
        if n == 0 && !acc {
            gpu.zero(at(g, self.kernel), pl * f)?;
        }
        Ok(())
    }
}

/// Max pooling: the window, and where each maximum came from (kept for backward).
pub struct MaxPool {
    pub win: Window,
    pub argmax: Option<Buf>,
}

impl MaxPool {
    pub fn forward(&self, gpu: &Gpu, x: DevPtr, y: DevPtr, n: usize) -> Result<(), CudaError> {
        let [h, w, c, kh, kw, sh, sw, pt, pl, oh, ow] = geometry(&self.win);
        let arg = self.argmax.as_ref().map_or(0, Buf::ptr);
        let total = n * self.win.positions() * self.win.c;
        launch!(
            gpu,
            "max_pool_fwd",
            Gpu::config(total as u64),
            x,
            y,
            arg,
            n as i64,
            h,
            w,
            c,
            kh,
            kw,
            sh,
            sw,
            pt,
            pl,
            oh,
            ow
        )
    }

    pub fn backward(&self, gpu: &Gpu, dy: DevPtr, dx: DevPtr, n: usize) -> Result<(), CudaError> {
        let [h, w, c, kh, kw, sh, sw, pt, pl, oh, ow] = geometry(&self.win);
        let arg = self.argmax.as_ref().map_or(0, Buf::ptr);
        let total = n * self.win.h * self.win.w * self.win.c;
        launch!(
            gpu,
            "max_pool_bwd",
            Gpu::config(total as u64),
            dy,
            arg,
            dx,
            n as i64,
            h,
            w,
            c,
            kh,
            kw,
            sh,
            sw,
            pt,
            pl,
            oh,
            ow
        )
    }
}

/// Global average pooling over `hw` positions of `c` channels.
pub fn gap_forward(gpu: &Gpu, x: DevPtr, y: DevPtr, n: usize, hw: usize, c: usize) -> Result<(), CudaError> {
    launch!(gpu, "gap_fwd", Gpu::config((n * c) as u64), x, y, n as i64, hw as i32, c as i32)
}

/// The gradient of [`gap_forward`].
pub fn gap_backward(gpu: &Gpu, dy: DevPtr, dx: DevPtr, n: usize, hw: usize, c: usize) -> Result<(), CudaError> {
    launch!(gpu, "gap_bwd", Gpu::config((n * hw * c) as u64), dy, dx, n as i64, hw as i32, c as i32)
}

/// Batch normalization over the last axis: offsets of γ, β and the moving statistics, and
/// the mean and 1/σ of the last forward pass.
pub struct DeviceBatchNorm {
    pub channels: usize,
    /// Values per example (`channels` divides it).
    pub numel: usize,
    pub momentum: f32,
    pub epsilon: f32,
    pub gamma: usize,
    pub beta: usize,
    pub moving_mean: usize,
    pub moving_var: usize,
    pub mean: Buf,
    pub inv_std: Buf,
}

impl DeviceBatchNorm {
    fn rows(&self, n: usize) -> usize {
        n * self.numel / self.channels.max(1)
    }

    pub fn forward(&self, cx: DevicePass<'_>, x: DevPtr, y: DevPtr) -> Result<(), CudaError> {
        let DevicePass { gpu, sc, vars: Vars { p, s, .. }, n, training, .. } = cx;
        let (c, rows) = (self.channels, self.rows(n));
        if training {
            launch!(gpu, "channel_sums", Gpu::per_block(c), x, x, rows as i64, c as i32, sc.sums.ptr())?;
        }
        launch!(
            gpu,
            "bn_stats",
            Gpu::config(c as u64),
            sc.sums.ptr(),
            rows as i64,
            c as i32,
            self.momentum,
            self.epsilon,
            i32::from(training),
            at(s, self.moving_mean),
            at(s, self.moving_var),
            self.mean.ptr(),
            self.inv_std.ptr(),
        )?;
        launch!(
            gpu,
            "bn_fwd",
            Gpu::config((rows * c) as u64),
            x,
            y,
            at(p, self.gamma),
            at(p, self.beta),
            self.mean.ptr(),
            self.inv_std.ptr(),
            (rows * c) as i64,
            c as i32,
        )
    }

    pub fn backward(&self, cx: DevicePass<'_>, (x, dy): (DevPtr, DevPtr), dx: Option<DevPtr>) -> Result<(), CudaError> {
        let DevicePass { gpu, sc, vars: Vars { p, g, .. }, n, training, accumulate: acc } = cx;
        let (c, rows) = (self.channels, self.rows(n));
        launch!(gpu, "channel_sums", Gpu::per_block(c), dy, x, rows as i64, c as i32, sc.sums.ptr())?;
        launch!(
            gpu,
            "bn_bwd_coef",
            Gpu::config(c as u64),
            sc.sums.ptr(),
            rows as i64,
            c as i32,
            i32::from(training),
            at(p, self.gamma),
            self.mean.ptr(),
            self.inv_std.ptr(),
            at(g, self.gamma),
            at(g, self.beta),
            i32::from(acc),
            sc.coef.ptr(),
        )?;
        match dx {
            Some(dx) => launch!(
                gpu,
                "bn_bwd",
                Gpu::config((rows * c) as u64),
                dy,
                x,
                dx,
                sc.coef.ptr(),
                (rows * c) as i64,
                c as i32
            ),
            None => Ok(()),
        }
    }
}

/// `a = max(a + b, 0)` over `len` values.
pub fn add_relu(gpu: &Gpu, a: DevPtr, b: DevPtr, len: usize) -> Result<(), CudaError> {
    launch!(gpu, "add_relu", Gpu::config(len as u64), a, b, len as i64)
}

/// `g = y > 0 ? g : 0` over `len` values.
pub fn relu_mask(gpu: &Gpu, g: DevPtr, y: DevPtr, len: usize) -> Result<(), CudaError> {
    launch!(gpu, "relu_mask", Gpu::config(len as u64), g, y, len as i64)
}

/// `a += b` over `len` values.
pub fn add(gpu: &Gpu, a: DevPtr, b: DevPtr, len: usize) -> Result<(), CudaError> {
    launch!(gpu, "add", Gpu::config(len as u64), a, b, len as i64)
}
