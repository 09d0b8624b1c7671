//! Summing the gradients of the replicas in one process: TensorFlow's `cross_device_ops`, one
//! file per algorithm behind one exhaustive `match`. The sum lands in the first buffer; on CPU
//! the replicas share that buffer afterwards, so no copy back is needed.

mod hierarchical_copy;
mod nccl;
mod reduction_to_one_device;

use super::StrategyError;
use crate::plan::CrossDevice;
use rayon::prelude::*;

/// Values one task sums at a time: every chunk is independent, so the split only sets the
/// parallelism, never the result.
const CHUNK: usize = 1 << 14;

/// Sums `buffers[1..]` into `buffers[0]` with `algorithm`.
pub fn reduce(algorithm: CrossDevice, buffers: &mut [&mut [f32]]) -> Result<(), StrategyError> {
    match algorithm {
        CrossDevice::ReductionToOneDevice => {
            chunked(buffers, reduction_to_one_device::sum);
            Ok(())
        }
        CrossDevice::HierarchicalCopy => {
            chunked(buffers, hierarchical_copy::sum);
            Ok(())
        }
        CrossDevice::Nccl => nccl::reduce(buffers),
    }
}

/// Runs `sum(dst, sources)` over aligned chunks of the buffers in parallel.
fn chunked(buffers: &mut [&mut [f32]], sum: fn(&mut [f32], &[&[f32]])) {
    let Some((first, rest)) = buffers.split_first_mut() else { return };
    if rest.is_empty() {
        return;
    }
    let rest: Vec<&[f32]> = rest.iter().map(|b| &**b).collect();
    first.par_chunks_mut(CHUNK).enumerate().for_each(|(c, dst)| {
        let range = c * CHUNK..c * CHUNK + dst.len();
        let sources: Vec<&[f32]> = rest.iter().map(|s| &s[range.clone()]).collect();
        crate::engine::simd::vectorized(|| sum(dst, &sources));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every algorithm × 2, 3, 4 replicas × sizes (odd, not divisible by the replica count,
    /// smaller and larger than a chunk) against a plain sum.
    #[test]
    fn every_algorithm_sums_like_a_plain_sum() {
        for algorithm in [CrossDevice::ReductionToOneDevice, CrossDevice::HierarchicalCopy] {
            for replicas in [2, 3, 4] {
                for len in [0, 1, 7, 1000, CHUNK + 3, 3 * CHUNK + 1] {
                    let mut bufs: Vec<Vec<f32>> = (0..replicas)
                        .map(|r| (0..len).map(|i| ((i * 7 + r * 13) % 17) as f32 - 8.0).collect())
                        .collect();
                    let want: Vec<f32> = (0..len).map(|i| bufs.iter().map(|b| b[i]).sum()).collect();
                    let mut refs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                    reduce(algorithm, &mut refs).unwrap();
                    // Small integers sum exactly in any order.
                    assert_eq!(bufs[0], want, "{algorithm:?} × {replicas} replicas, {len} values");
                }
            }
        }
    }

    #[test]
    fn two_replicas_sum_in_the_same_order_either_way() {
        let a: Vec<f32> = (0..5000).map(|i| (i as f32).sin()).collect();
        let b: Vec<f32> = (0..5000).map(|i| (i as f32 * 0.3).cos() * 1e-3).collect();
        let run = |alg| {
            let (mut x, mut y) = (a.clone(), b.clone());
            reduce(alg, &mut [x.as_mut_slice(), y.as_mut_slice()]).unwrap();
            x
        };
        assert_eq!(run(CrossDevice::ReductionToOneDevice), run(CrossDevice::HierarchicalCopy));
    }

    #[test]
    fn nccl_needs_gpus() {
        let (mut a, mut b) = (vec![1.0], vec![2.0]);
        let e = reduce(CrossDevice::Nccl, &mut [a.as_mut_slice(), b.as_mut_slice()]).unwrap_err();
        assert!(e.to_string().contains("nccl"), "{e}");
    }
}
