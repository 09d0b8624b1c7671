//! Everything that can go wrong on the GPU path, as one `thiserror` enum: a missing library or
//! device is a message that names it and the fix, never a panic inside cudarc.

/// A GPU path could not start or a GPU call failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library is not on the loader's path.
    #[error("{library} was not found: {fix}")]
    Missing {
        /// The library, as a user would search for it (`libcublas`).
        library: &'static str,
        /// How to install it or make it visible.
        fix: &'static str,
    },
    /// The driver loaded but sees no GPU.
    #[error(
        "no GPU device: the NVIDIA driver (libcuda.so) loaded but reports 0 devices; check `nvidia-smi` and CUDA_VISIBLE_DEVICES"
    )]
    NoDevice,
    /// The spec names a GPU this machine does not have.
    #[error("gpu:{index} does not exist: this machine has {count} GPU(s), gpu:0 to gpu:{last}", last = count.saturating_sub(1))]
    NoSuchDevice {
        /// The requested index.
        index: usize,
        /// GPUs the driver sees.
        count: usize,
    },
    /// A driver call failed (out of memory, a faulting kernel, …).
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0:?}")]
    Cublas(cudarc::cublas::result::CublasError),
    /// An NCCL call failed.
    #[error("NCCL: {0:?}")]
    Nccl(cudarc::nccl::result::NcclError),
    /// NVRTC rejected a kernel source (a bug in trainrun: the sources are fixed).
    #[error("NVRTC could not compile the {module} kernels: {log}")]
    Compile {
        /// Which source.
        module: &'static str,
        /// The compiler's log.
        log: String,
    },
    /// The model or training setup uses something the GPU path does not implement yet.
    #[error("{0}")]
    Unsupported(String),
    /// A device thread is gone (it panicked or its GPU failed earlier).
    #[error("the thread driving gpu:{0} stopped")]
    ThreadGone(usize),
}

impl From<cudarc::cublas::result::CublasError> for CudaError {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        CudaError::Cublas(e)
    }
}

impl From<cudarc::nccl::result::NcclError> for CudaError {
    fn from(e: cudarc::nccl::result::NcclError) -> Self {
        CudaError::Nccl(e)
    }
}
