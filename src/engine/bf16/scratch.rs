//! Per-thread buffers the bf16 products pack into, kept between calls: a nanoGPT-size step
//! packs tens of megabytes, and allocating them afresh each product cost page faults. A
//! buffer is taken out while in use, so a product that runs inside another on the same
//! thread (rayon may lend a waiting thread another task) gets an empty one, never a shared one.

use super::aligned::Aligned;
use std::cell::Cell;

thread_local! {
    static WORDS: [Cell<Aligned<u32>>; 2] = const { [Cell::new(Aligned::new()), Cell::new(Aligned::new())] };
    static FLOATS: [Cell<Vec<f32>>; 2] = const { [Cell::new(Vec::new()), Cell::new(Vec::new())] };
    static SUMS: Cell<Aligned<f32>> = const { Cell::new(Aligned::new()) };
}

/// This thread's buffer of micro-kernel sums, taken out until [`give_floats`] returns it (a
/// nested product meanwhile gets an empty one).
pub fn take_floats() -> Aligned<f32> {
    SUMS.with(Cell::take)
}

/// Returns the buffer [`take_floats`] took.
pub fn give_floats(buf: Aligned<f32>) {
    SUMS.with(|s| s.set(buf));
}

/// Calls `f` with this thread's word buffer `slot` (0 or 1).
pub fn with_words<R>(slot: usize, f: impl FnOnce(&mut Aligned<u32>) -> R) -> R {
    let mut buf = WORDS.with(|w| w[slot].take());
    let out = f(&mut buf);
    WORDS.with(|w| w[slot].set(buf));
    out
}

/// Calls `f` with this thread's two float buffers.
pub fn with_floats<R>(f: impl FnOnce(&mut Vec<f32>, &mut Vec<f32>) -> R) -> R {
    let (mut a, mut b) = FLOATS.with(|w| (w[0].take(), w[1].take()));
    let out = f(&mut a, &mut b);
    FLOATS.with(|w| {
        w[0].set(a);
        w[1].set(b);
    });
    out
}
