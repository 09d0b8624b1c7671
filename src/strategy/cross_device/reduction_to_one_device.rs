//! `reduction_to_one_device`: TensorFlow's `ReductionToOneDevice`: every replica's gradient is
//! added onto the first device's, one after the other.

/// `dst += sources[0] + sources[1] + …`, element by element, in replica order.
#[inline(always)]
pub fn sum(dst: &mut [f32], sources: &[&[f32]]) {
    for src in sources {
        dst.iter_mut().zip(*src).for_each(|(d, s)| *d += s);
    }
}
