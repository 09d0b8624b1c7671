//! `hierarchical_copy`: TensorFlow's `HierarchicalCopyAllReduce`: the replicas form two groups
//! (the first and second half); each group sums onto its first device, then the second
//! group's sum is added onto the first's. On GPUs this keeps traffic inside each group's
//! links; on CPUs it is an alternative summation order.

/// `dst = (dst + first-half sources) + (second-half sources)`.
#[inline(always)]
pub fn sum(dst: &mut [f32], sources: &[&[f32]]) {
    let replicas = sources.len() + 1;
    // The first group holds `dst` and the next `half - 1` sources.
    let half = replicas.div_ceil(2);
    let (first, second) = sources.split_at(half - 1);
    for src in first {
        dst.iter_mut().zip(*src).for_each(|(d, s)| *d += s);
    }
    if let Some((lead, rest)) = second.split_first() {
        for (i, d) in dst.iter_mut().enumerate() {
            let group: f32 = rest.iter().fold(lead[i], |acc, s| acc + s[i]);
            *d += group;
        }
    }
}
