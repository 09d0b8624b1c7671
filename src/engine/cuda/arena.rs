//! The device arena: parameters, gradients, batch-norm state and the SGD velocity, each one
//! flat buffer with the CPU `Sequential`'s tensor offsets, so checkpoints, the host copy of
//! the variables and all-reduce see one layout on either engine.

use super::device::{Buf, DevPtr, Gpu, launch};
use super::error::CudaError;

/// A model's variables on one device.
pub struct Arena {
    params: Buf,
    grads: Buf,
    state: Buf,
    velocity: Option<Buf>,
    param_len: usize,
    state_len: usize,
}

/// Keras's SGD settings, as `engine::optimizer::Sgd` holds them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdConfig {
    /// Momentum; 0 keeps no velocity.
    pub momentum: f32,
    /// Nesterov momentum.
    pub nesterov: bool,
    /// L2 penalty added to the gradient.
    pub weight_decay: f32,
}

fn check(what: &str, want: usize, got: usize) -> Result<(), CudaError> {
    if want == got {
        Ok(())
    } else {
        Err(CudaError::Unsupported(format!("{what} holds {got} values but the model's arena has {want}")))
    }
}

impl Arena {
    /// Zeroed buffers for `param_len` trainable and `state_len` non-trainable values; a
    /// velocity buffer when `momentum`.
    pub fn new(gpu: &Gpu, param_len: usize, state_len: usize, momentum: bool) -> Result<Self, CudaError> {
        Ok(Self {
            params: gpu.alloc_f32(param_len)?,
            grads: gpu.alloc_f32(param_len)?,
            state: gpu.alloc_f32(state_len)?,
            velocity: if momentum { Some(gpu.alloc_f32(param_len)?) } else { None },
            param_len,
            state_len,
        })
    }

    /// Trainable values.
    pub fn param_len(&self) -> usize {
        self.param_len
    }

    /// Start of the parameters.
    pub fn params(&self) -> DevPtr {
        self.params.ptr()
    }

    /// Start of the gradients.
    pub fn grads(&self) -> DevPtr {
        self.grads.ptr()
    }

    /// The gradient buffer, for all-reduce.
    pub fn grads_mut(&mut self) -> &mut Buf {
        &mut self.grads
    }

    /// Start of the non-trainable state.
    pub fn state(&self) -> DevPtr {
        self.state.ptr()
    }

    /// Copies host parameters in.
    pub fn upload_params(&self, gpu: &Gpu, v: &[f32]) -> Result<(), CudaError> {
        check("the parameters", self.param_len, v.len())?;
        gpu.upload(self.params.ptr(), v)
    }

    /// Copies the parameters out.
    pub fn download_params(&self, gpu: &Gpu, v: &mut [f32]) -> Result<(), CudaError> {
        check("the parameters", self.param_len, v.len())?;
        gpu.download(self.params.ptr(), v)
    }

    /// Copies host state in.
    pub fn upload_state(&self, gpu: &Gpu, v: &[f32]) -> Result<(), CudaError> {
        check("the state", self.state_len, v.len())?;
        gpu.upload(self.state.ptr(), v)
    }

    /// Copies the state out.
    pub fn download_state(&self, gpu: &Gpu, v: &mut [f32]) -> Result<(), CudaError> {
        check("the state", self.state_len, v.len())?;
        gpu.download(self.state.ptr(), v)
    }

    /// Copies host gradients in (tests, all-reduce checks).
    pub fn upload_grads(&self, gpu: &Gpu, v: &[f32]) -> Result<(), CudaError> {
        check("the gradients", self.param_len, v.len())?;
        gpu.upload(self.grads.ptr(), v)
    }

    /// Copies the gradients out.
    pub fn download_grads(&self, gpu: &Gpu, v: &mut [f32]) -> Result<(), CudaError> {
        check("the gradients", self.param_len, v.len())?;
        gpu.download(self.grads.ptr(), v)
    }

    /// Copies a host velocity in; a no-op without momentum.
    pub fn upload_velocity(&self, gpu: &Gpu, v: &[f32]) -> Result<(), CudaError> {
        match &self.velocity {
            Some(buf) => {
                check("the velocity", self.param_len, v.len())?;
                gpu.upload(buf.ptr(), v)
            }
            None => Ok(()),
        }
    }

    /// Copies the velocity out; a no-op without momentum.
    pub fn download_velocity(&self, gpu: &Gpu, v: &mut [f32]) -> Result<(), CudaError> {
        match &self.velocity {
            Some(buf) => {
                check("the velocity", self.param_len, v.len())?;
                gpu.download(buf.ptr(), v)
            }
            None => Ok(()),
        }
    }

    /// One SGD update of the parameters from the gradients, over the whole arena at once.
    pub fn sgd(&self, gpu: &Gpu, lr: f32, cfg: SgdConfig) -> Result<(), CudaError> {
        if self.param_len == 0 {
            return Ok(());
        }
        let v = match (&self.velocity, cfg.momentum > 0.0) {
            (Some(buf), true) => buf.ptr(),
            (None, true) => {
                return Err(CudaError::Unsupported("SGD with momentum needs an arena built with a velocity".into()));
            }
            (_, false) => 0,
        };
        launch!(
            gpu,
            "sgd",
            Gpu::config(self.param_len as u64),
            self.params.ptr(),
            self.grads.ptr(),
            v,
            self.param_len as i64,
            lr,
            cfg.momentum,
            cfg.weight_decay,
            i32::from(cfg.nesterov),
        )
    }
}
