//! Probes each CUDA library before its first use. cudarc loads libraries lazily and panics
//! when one is missing; probing first turns that into a [`CudaError::Missing`] that names the
//! library and the fix.

use super::error::CudaError;

/// A CUDA library the GPU path loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Library {
    /// `libcuda.so`, installed with the NVIDIA driver.
    Driver,
    /// NVRTC, which compiles trainrun's kernels at start-up.
    Nvrtc,
    /// cuBLAS, for dense and convolution matrix products.
    Cublas,
    /// NCCL, for all-reduce between GPUs (needed with more than one GPU).
    Nccl,
}

impl Library {
    /// The name a user searches for.
    pub fn name(self) -> &'static str {
        match self {
            Library::Driver => "libcuda.so (the NVIDIA driver)",
            Library::Nvrtc => "libnvrtc (CUDA's runtime compiler)",
            Library::Cublas => "libcublas",
            Library::Nccl => "libnccl",
        }
    }

    /// How to make it visible.
    pub fn fix(self) -> &'static str {
        match self {
            Library::Driver => {
                "install the NVIDIA driver on a machine with a GPU, or run on CPUs (strategy.device = \"cpu:0\")"
            }
            Library::Nvrtc => {
                "install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc` and put its nvidia/cu13/lib folder on LD_LIBRARY_PATH"
            }
            Library::Cublas => {
                "install the CUDA toolkit, or `pip install nvidia-cublas` and put its nvidia/cu13/lib folder on LD_LIBRARY_PATH"
            }
            Library::Nccl => {
                "install NCCL; pip's nvidia-nccl wheel ships only libnccl.so.2: symlink it as libnccl.so in a folder on LD_LIBRARY_PATH"
            }
        }
    }

    /// Whether the dynamic loader finds the library under any name cudarc tries.
    pub fn present(self) -> bool {
        // SAFETY: each probe only tries `dlopen` on candidate names and closes what it opened;
        // loading a CUDA library runs no code of ours.
        unsafe {
            match self {
                Library::Driver => cudarc::driver::sys::is_culib_present(),
                Library::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
                Library::Cublas => cudarc::cublas::sys::is_culib_present(),
                Library::Nccl => cudarc::nccl::sys::is_culib_present(),
            }
        }
    }
}

/// Checks `libs` in order; the first missing one is the error.
pub fn require(libs: &[Library]) -> Result<(), CudaError> {
    match libs.iter().find(|l| !l.present()) {
        Some(l) => Err(CudaError::Missing { library: l.name(), fix: l.fix() }),
        None => Ok(()),
    }
}

/// GPUs the driver sees; probes the driver first.
pub fn device_count() -> Result<usize, CudaError> {
    require(&[Library::Driver])?;
    match cudarc::driver::CudaContext::device_count() {
        Ok(count) => Ok(usize::try_from(count).unwrap_or(0)),
        // A driver without a usable GPU fails `cuInit` itself with this code.
        Err(e) if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// Everything a training run on `devices` GPU indices needs: the driver, NVRTC, cuBLAS, NCCL
/// when there are several GPUs, and that each index exists.
pub fn training(devices: &[usize]) -> Result<(), CudaError> {
    let count = device_count()?;
    if count == 0 {
        return Err(CudaError::NoDevice);
    }
    let mut libs = vec![Library::Nvrtc, Library::Cublas];
    if devices.len() > 1 {
        libs.push(Library::Nccl);
    }
    require(&libs)?;
    match devices.iter().find(|&&d| d >= count) {
        Some(&index) => Err(CudaError::NoSuchDevice { index, count }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_names_its_library_and_a_fix() {
        for lib in [Library::Driver, Library::Nvrtc, Library::Cublas, Library::Nccl] {
            let msg = CudaError::Missing { library: lib.name(), fix: lib.fix() }.to_string();
            assert!(msg.contains(lib.name()) && msg.contains(lib.fix()), "{msg}");
        }
        assert!(Library::Nccl.fix().contains("libnccl.so.2"));
    }

    #[test]
    fn probing_never_panics() {
        // Whatever this machine has, probing answers instead of panicking.
        match training(&[0]) {
            Ok(()) => {}
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
