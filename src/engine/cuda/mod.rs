//! The CUDA engine (the default `cuda` feature): the CPU engine's layers on a GPU, loaded at run time.
//!
//! cudarc loads the driver, NVRTC, cuBLAS and NCCL dynamically, so building needs no CUDA;
//! [`probe`] checks each library before first use, since cudarc panics on a missing one.
//! Kernels are CUDA C compiled by NVRTC at start-up ([`kernels`]); dense and convolution
//! products run on cuBLAS; parameters, gradients, state and velocity each live in one flat
//! device buffer with the CPU model's offsets ([`arena`]).

pub mod arena;
pub mod device;
pub mod error;
pub mod kernels;
mod layers;
pub mod model;
pub mod nccl;
pub mod probe;
pub mod replica;
mod residual;
pub mod worker;

pub use arena::{Arena, SgdConfig};
pub use error::CudaError;
pub use replica::GpuReplica;
