//! Overlapping gradient reduction with backward. The arena holds layers in reverse order, so
//! backward finishes it from the front and reports progress as `ready(k)`: `grads[..k]` is
//! final. [`BucketReducer`] cuts the arena into packs of `bytes_per_pack` from the front and
//! hands each pack to a communication thread the moment it is final, while backward goes on
//! writing the rest.
//!
//! No `unsafe`: the arena is split with `split_at_mut` as packs become final, so backward
//! holds `&mut grads[offset..]` and the communication thread holds the packs before it, and
//! the borrow checker sees they are disjoint. The thread is scoped to [`BucketReducer::run`],
//! so it cannot outlive the borrow: that is why the API takes backward as a closure instead
//! of returning a handle with a `finish()` (a handle could be leaked while the thread still
//! writes the arena). `run` returning is `finish`: every pack is reduced, or the first error
//! comes back.
//!
//! Packs sit on a fixed grid (multiples of the pack size), so every rank reduces the same
//! packs in the same order whenever its own backward reports progress.

use super::{CollectiveError, PackReduce};
use std::ops::Range;
use std::sync::mpsc;
use std::thread;

/// Reduces gradients in packs while backward runs; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketReducer {
    pack: usize,
}

impl BucketReducer {
    /// Packs of `bytes_per_pack` (at least one float).
    pub fn new(bytes_per_pack: usize) -> BucketReducer {
        BucketReducer { pack: (bytes_per_pack / 4).max(1) }
    }

    /// Floats per pack.
    pub fn pack_floats(&self) -> usize {
        self.pack
    }

    /// Runs `backward` on this thread, which writes `grads` through [`Packs`] and reports
    /// progress with [`Packs::ready`], while a communication thread all-reduces each pack
    /// with `reducer` as soon as it is final. Returns once every pack is reduced (what
    /// backward did not report final is taken as final when it returns), with backward's
    /// result or the first collective error.
    pub fn run<P: PackReduce, R>(
        &self,
        mut reducer: P,
        grads: &mut [f32],
        backward: impl FnOnce(&mut Packs<'_>) -> R,
    ) -> Result<R, CollectiveError> {
        let len = grads.len();
        thread::scope(|s| {
            let (tx, rx) = mpsc::channel::<&mut [f32]>();
            let comm = s.spawn(move || -> Result<(), CollectiveError> {
                // On the first error, stop: dropping rx makes later hand-offs no-ops.
                for pack in rx {
                    reducer.reduce_pack(pack)?;
                }
                Ok(())
            });
            let mut packs = Packs { rest: grads, offset: 0, ready: 0, len, pack: self.pack, tx };
            let out = backward(&mut packs);
            packs.ready(len);
            drop(packs);
            match comm.join() {
                Ok(Ok(())) => Ok(out),
                Ok(Err(e)) => Err(e),
                Err(_) => Err(CollectiveError::Invalid("the communication thread panicked".into())),
            }
        })
    }
}

/// Backward's view of the arena during [`BucketReducer::run`]: the part not yet handed off,
/// and the `ready` callback.
pub struct Packs<'a> {
    rest: &'a mut [f32],
    /// Where `rest` starts in the arena.
    offset: usize,
    ready: usize,
    len: usize,
    pack: usize,
    tx: mpsc::Sender<&'a mut [f32]>,
}

impl<'a> Packs<'a> {
    /// `grads[..k]` is final: hands every whole pack below `k` (and the last, shorter pack
    /// once `k` reaches the end) to the communication thread. Calls may repeat; `k` never
    /// moves back.
    pub fn ready(&mut self, k: usize) {
        self.ready = self.ready.max(k.min(self.len));
        loop {
            let n = self.pack.min(self.len - self.offset);
            if n == 0 || self.offset + n > self.ready {
                return;
            }
            let (front, back) = std::mem::take(&mut self.rest).split_at_mut(n);
            self.rest = back;
            self.offset += n;
            // A send fails only after the communication thread stopped on an error, which
            // `run` reports; the pack simply stays unreduced.
            let _ = self.tx.send(front);
        }
    }

    /// Where [`Packs::rest_mut`] starts in the arena: everything before it is handed off.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// `grads[offset()..]`, the part backward may still write.
    pub fn rest_mut(&mut self) -> &mut [f32] {
        self.rest
    }

    /// `grads[range]`, by arena index, if none of it was handed off yet.
    pub fn get_mut(&mut self, range: Range<usize>) -> Option<&mut [f32]> {
        let start = range.start.checked_sub(self.offset)?;
        let end = range.end.checked_sub(self.offset)?;
        self.rest.get_mut(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the packs it sees and doubles them.
    struct PackRecorder<'r>(&'r mut Vec<usize>);

    impl PackReduce for PackRecorder<'_> {
        fn reduce_pack(&mut self, pack: &mut [f32]) -> Result<(), CollectiveError> {
            self.0.push(pack.len());
            pack.iter_mut().for_each(|x| *x *= 2.0);
            Ok(())
        }
    }

    #[test]
    fn packs_go_out_in_order_as_backward_reports_them() {
        let mut grads = vec![0.0f32; 10];
        let mut seen = Vec::new();
        let r = BucketReducer::new(3 * 4)
            .run(PackRecorder(&mut seen), &mut grads, |p| {
                for layer in [0..4, 4..5, 5..10] {
                    assert!(p.offset() <= layer.start);
                    p.get_mut(layer.clone()).unwrap().iter_mut().for_each(|x| *x = 1.0);
                    p.ready(layer.end);
                }
                assert!(p.get_mut(0..1).is_none(), "handed-off floats are out of reach");
                7
            })
            .unwrap();
        assert_eq!(r, 7);
        assert_eq!(seen, vec![3, 3, 3, 1]);
        assert!(grads.iter().all(|&x| x == 2.0));
    }

    #[test]
    fn what_backward_leaves_unreported_is_reduced_at_the_end() {
        let mut grads = vec![1.0f32; 5];
        let mut seen = Vec::new();
        BucketReducer::new(8).run(PackRecorder(&mut seen), &mut grads, |_| ()).unwrap();
        assert_eq!(seen, vec![2, 2, 1]);
        assert!(grads.iter().all(|&x| x == 2.0));
    }

    struct Failing;

    impl PackReduce for Failing {
        fn reduce_pack(&mut self, _: &mut [f32]) -> Result<(), CollectiveError> {
            Err(CollectiveError::Invalid("boom".into()))
        }
    }

    #[test]
    fn the_first_error_comes_back_and_backward_still_finishes() {
        let mut grads = vec![1.0f32; 100];
        let mut calls = 0;
        let r = BucketReducer::new(4).run(Failing, &mut grads, |p| {
            for k in 1..=100 {
                p.ready(k);
                calls += 1;
            }
        });
        assert_eq!(calls, 100);
        assert!(matches!(r, Err(CollectiveError::Invalid(m)) if m == "boom"));
    }
}
