//! Runs plain loops under the widest vector instructions this CPU has (AVX-512, AVX2),
//! chosen at run time, so one portable binary is fast everywhere. Only the instruction width
//! changes: without fast-math the compiler neither reorders sums nor fuses multiply-adds, so
//! results are the same bits either way.

/// Runs `f` compiled for the best instruction set detected on this CPU.
#[inline(always)]
pub fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    pulp::Arch::new().dispatch(f)
}
