//! Scratch buffers that layers borrow for one forward or backward pass and give back when it
//! ends. A model's layers run one after another on a replica's thread, so scratch that no
//! activation outlives (a GPT block's five backward buffers, the attention's gradients of its
//! projections and its per-task tiles) need exist once per thread rather than once per layer:
//! at nanoGPT's size (6 blocks, batch 12, block 256) that was ~450 MB of a 1.3 GB peak
//! (issue 34). Each thread keeps its own free list; a buffer dropped goes back to the list of
//! the thread that drops it. A pass that lends while another pass on the same thread holds
//! buffers (rayon may run a waiting thread's other task) gets buffers of its own, never shared.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// `len` values lent by this thread's pool. Its contents are whatever the last borrower left
/// (callers overwrite what they read, as with a layer's own reused buffers).
pub(super) struct LentBuffer {
    buf: Vec<f32>,
}

/// A buffer of `len` values from this thread's pool: the smallest free one that holds `len`,
/// else the largest (grown), so steady passes reuse the same buffers without growing any.
pub(super) fn lend(len: usize) -> LentBuffer {
    let mut buf = FREE.with(|free| {
        let mut free = free.borrow_mut();
        let by_size = |(_, b): &(usize, &Vec<f32>)| b.capacity();
        let fits = free.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(by_size);
        let pick = fits.or_else(|| free.iter().enumerate().max_by_key(by_size)).map(|(i, _)| i);
        pick.map(|i| free.swap_remove(i)).unwrap_or_default()
    });
    buf.resize(len, 0.0);
    LentBuffer { buf }
}

impl Deref for LentBuffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.buf
    }
}

impl DerefMut for LentBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf
    }
}

impl Drop for LentBuffer {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // During a thread's exit its list may be gone already: then the buffer is just freed.
        let _ = FREE.try_with(|free| free.borrow_mut().push(buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_is_lent_again_and_two_held_ones_are_distinct() {
        let first = lend(100);
        let at = first.as_ptr();
        drop(first);
        let (mut a, mut b) = (lend(60), lend(60));
        assert_eq!(a.as_ptr(), at, "the free buffer that fits is reused");
        assert_ne!(a.as_ptr(), b.as_ptr());
        a.fill(1.0);
        b.fill(2.0);
        assert!(a.iter().all(|&v| v == 1.0) && a.len() == 60 && b.len() == 60);
    }
}
