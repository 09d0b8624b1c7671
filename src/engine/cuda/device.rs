//! One GPU as the engine sees it: its context, one stream, a cuBLAS handle, the loaded
//! kernels, raw device buffers, and the row-major matrix product.
//!
//! Everything on a device runs in order on one stream, so buffers are addressed by raw device
//! pointers (offsets into flat arenas, like the CPU engine's slices) without cudarc's
//! per-slice event tracking. A `Gpu` stays on the thread that opened it.

use super::error::CudaError;
use super::kernels::{self, BLOCK};
use cudarc::cublas::{CudaBlas, sys as blas_sys};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, result};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::sync::Arc;

/// A device address (`CUdeviceptr`), passed to kernels as a pointer.
pub type DevPtr = u64;

/// Bytes per `f32`, for pointer arithmetic.
const F32: u64 = 4;

/// `ptr` advanced by `values` f32s.
pub fn at(ptr: DevPtr, values: usize) -> DevPtr {
    ptr + values as u64 * F32
}

/// A device allocation; freed when dropped.
pub struct Buf {
    _mem: CudaSlice<u8>,
    ptr: DevPtr,
    bytes: usize,
}

impl Buf {
    /// Its start.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// f32 values it holds.
    pub fn len_f32(&self) -> usize {
        self.bytes / 4
    }

    /// The buffer as f32 values, for cudarc's safe APIs (NCCL).
    pub fn view_f32(&mut self) -> Result<cudarc::driver::CudaViewMut<'_, f32>, CudaError> {
        let len = self.len_f32();
        // SAFETY: the allocation holds at least `len` f32 values (`bytes / 4`), and any bit
        // pattern is a valid f32.
        unsafe { self._mem.transmute_mut::<f32>(len) }
            .ok_or_else(|| CudaError::Unsupported("a device buffer is smaller than its f32 length".into()))
    }
}

/// One opened GPU.
pub struct Gpu {
    index: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    functions: HashMap<&'static str, CudaFunction>,
}

/// Launches kernel `$name` with launch configuration `$cfg` ([`Gpu::config`] for `n` work
/// items, [`Gpu::per_block`] for one block per output) and the given arguments, each a
/// `DevPtr`, `i64`, `i32` or `f32` matching the kernel's signature.
macro_rules! launch {
    ($gpu:expr, $name:literal, $cfg:expr, $($arg:expr),+ $(,)?) => {{
        let gpu: &$crate::engine::cuda::device::Gpu = $gpu;
        let f = gpu.function($name)?;
        let cfg: cudarc::driver::LaunchConfig = $cfg;
        let mut b = gpu.stream().launch_builder(f);
        $( let a = $arg; cudarc::driver::PushKernelArg::arg(&mut b, &a); )+
        // SAFETY: the argument list matches the kernel's signature in `kernels::SOURCE`, and
        // every pointer addresses a live buffer of this device large enough for the launch.
        unsafe { b.launch(cfg) }.map(|_| ()).map_err($crate::engine::cuda::error::CudaError::from)
    }};
}
pub(crate) use launch;

impl Gpu {
    /// Opens `gpu:index` and loads `ptx` (from [`kernels::compile`]); probe the libraries first.
    pub fn open(index: usize, ptx: &str) -> Result<Self, CudaError> {
        let ctx = CudaContext::new(index)?;
        // One stream per device and raw pointers: ordering is the stream's, so per-slice
        // events would only cost time.
        // SAFETY: this engine uses a single stream per context (see the module doc).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let blas = CudaBlas::new(stream.clone())?;
        let module = ctx.load_module(Ptx::from_src(ptx))?;
        let mut functions = HashMap::new();
        for &name in kernels::NAMES {
            functions.insert(name, module.load_function(name)?);
        }
        Ok(Self { index, ctx, stream, blas, functions })
    }

    /// The device index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The device's stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device's name, for reports.
    pub fn name(&self) -> Result<String, CudaError> {
        Ok(self.ctx.name()?)
    }

    /// A loaded kernel.
    pub fn function(&self, name: &'static str) -> Result<&CudaFunction, CudaError> {
        self.functions.get(name).ok_or_else(|| CudaError::Unsupported(format!("kernel {name} is not loaded")))
    }

    /// Blocks of [`BLOCK`] threads for `n` work items, capped (kernels loop over the rest).
    pub fn config(n: u64) -> LaunchConfig {
        let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, 1 << 16) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    }

    /// One block of [`BLOCK`] threads per output (the reduction kernels).
    pub fn per_block(blocks: usize) -> LaunchConfig {
        LaunchConfig { grid_dim: (blocks.max(1) as u32, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    }

    /// `bytes` of zeroed device memory.
    pub fn alloc(&self, bytes: usize) -> Result<Buf, CudaError> {
        let mem = self.stream.alloc_zeros::<u8>(bytes.max(8))?;
        let ptr = {
            let (ptr, _sync) = mem.device_ptr(&self.stream);
            ptr
        };
        Ok(Buf { _mem: mem, ptr, bytes })
    }

    /// Room for `len` f32 values, zeroed.
    pub fn alloc_f32(&self, len: usize) -> Result<Buf, CudaError> {
        self.alloc(len * 4)
    }

    /// Copies `src` to `dst` and waits.
    pub fn upload<T>(&self, dst: DevPtr, src: &[T]) -> Result<(), CudaError> {
        if src.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: `dst` addresses at least `size_of_val(src)` bytes (callers size buffers from
        // the same layout), and the wait below keeps `src` borrowed until the copy is done.
        unsafe { result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }?;
        self.sync()
    }

    /// Copies device memory at `src` into `dst` and waits.
    pub fn download<T>(&self, src: DevPtr, dst: &mut [T]) -> Result<(), CudaError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        // SAFETY: as in `upload`; `dst` stays borrowed until the stream is synchronized.
        unsafe { result::memcpy_dtoh_async(dst, src, self.stream.cu_stream()) }?;
        self.sync()
    }

    /// `len` f32 values from `src` to `dst` on the stream.
    pub fn copy(&self, dst: DevPtr, src: DevPtr, len: usize) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: both ranges lie in live buffers of this device (callers' layout).
        unsafe { result::memcpy_dtod_async(dst, src, len * 4, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// Sets `len` f32 values at `dst` to zero.
    pub fn zero(&self, dst: DevPtr, len: usize) -> Result<(), CudaError> {
        if len == 0 {
            return Ok(());
        }
        // SAFETY: the range lies in a live buffer of this device.
        unsafe { result::memset_d8_async(dst, 0, len * 4, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// Waits for everything queued on the stream.
    pub fn sync(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }

    /// `c[m×n] = (accumulate ? c : 0) + op(a) · op(b)`, all row-major, as the CPU engine's
    /// `strided::gemm` on row-major views: `a` is `(pointer, transposed)`, the pointer to an
    /// `m×k` matrix (`k×m` when transposed), `b` likewise with `k×n` (`n×k`).
    ///
    /// cuBLAS is column-major: a row-major matrix is its transpose there, so this computes
    /// `cᵀ = op(b)ᵀ · op(a)ᵀ`, swapping the operands instead of transposing anything.
    pub fn matmul(
        &self,
        (m, n, k): (usize, usize, usize),
        (a, a_t): (DevPtr, bool),
        (b, b_t): (DevPtr, bool),
        c: DevPtr,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return if accumulate { Ok(()) } else { self.zero(c, m * n) };
        }
        let g = ColumnMajor::of((m, n, k), a_t, b_t);
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| CudaError::Unsupported(format!("a matrix side of {v} exceeds cuBLAS's range")))
        };
        let op = |t: bool| {
            if t { blas_sys::cublasOperation_t::CUBLAS_OP_T } else { blas_sys::cublasOperation_t::CUBLAS_OP_N }
        };
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0 });
        // SAFETY: the handle is bound to this device's stream; the pointers address matrices of
        // the stated sizes (callers size them from the same geometry).
        unsafe {
            cudarc::cublas::result::sgemm(
                *self.blas.handle(),
                op(g.trans_first),
                op(g.trans_second),
                dim(g.m)?,
                dim(g.n)?,
                dim(g.k)?,
                &alpha,
                b as *const f32,
                dim(g.ld_first)?,
                a as *const f32,
                dim(g.ld_second)?,
                &beta,
                c as *mut f32,
                dim(g.ldc)?,
            )?;
        }
        Ok(())
    }
}

/// The column-major `sgemm` arguments for a row-major product `c[m×n] = op(a) · op(b)`.
///
/// A row-major matrix read column-major is its transpose, so cuBLAS computes
/// `cᵀ[n×m] = op(b)ᵀ · op(a)ᵀ`: `b` goes first, `a` second, the sizes swap, and each leading
/// dimension is the row length of the matrix as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnMajor {
    /// Transpose the first operand (`b`), the second (`a`).
    pub trans_first: bool,
    pub trans_second: bool,
    /// cuBLAS's m, n, k.
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Leading dimensions of `b`, `a` and `c`.
    pub ld_first: usize,
    pub ld_second: usize,
    pub ldc: usize,
}

impl ColumnMajor {
    /// The arguments for `c[m×n] = op(a) · op(b)` with `a` `m×k` (`k×m` when `a_t`) and `b`
    /// `k×n` (`n×k` when `b_t`), all row-major.
    pub fn of((m, n, k): (usize, usize, usize), a_t: bool, b_t: bool) -> Self {
        Self {
            trans_first: b_t,
            trans_second: a_t,
            m: n,
            n: m,
            k,
            ld_first: if b_t { k } else { n },
            ld_second: if a_t { m } else { k },
            ldc: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ColumnMajor;
    use crate::engine::strided::{MatMut, MatRef, gemm};

    /// A plain column-major sgemm, as cuBLAS defines it (alpha 1, beta 0).
    fn sgemm(g: &ColumnMajor, a: &[f32], b: &[f32]) -> Vec<f32> {
        let at = |x: &[f32], t: bool, ld: usize, i: usize, j: usize| if t { x[j + i * ld] } else { x[i + j * ld] };
        let mut c = vec![0.0; g.ldc * g.n];
        for j in 0..g.n {
            for i in 0..g.m {
                c[i + j * g.ldc] = (0..g.k)
                    .map(|p| at(a, g.trans_first, g.ld_first, i, p) * at(b, g.trans_second, g.ld_second, p, j))
                    .sum();
            }
        }
        c
    }

    #[test]
    fn column_major_arguments_compute_the_row_major_product() {
        let (m, n, k) = (5, 3, 4);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
        for (a_t, b_t) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut want = vec![0.0; m * n];
            // The same values read as `a_t`/`b_t` say: row-major, or the transpose's row-major.
            let aa = if a_t { MatRef::rows(&a, k, m).t() } else { MatRef::rows(&a, m, k) };
            let bb = if b_t { MatRef::rows(&b, n, k).t() } else { MatRef::rows(&b, k, n) };
            gemm(MatMut::rows(&mut want, m, n), aa, bb, false, 1.0, 1);
            // The first operand cuBLAS reads is `b`, the second `a`.
            let got = sgemm(&ColumnMajor::of((m, n, k), a_t, b_t), &b, &a);
            assert_eq!(got, want, "a_t={a_t} b_t={b_t}");
        }
    }
}
