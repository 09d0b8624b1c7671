//! `halving_doubling`: Rabenseifner's all-reduce, a reduce-scatter by recursive halving then
//! an all-gather by recursive doubling, over any point-to-point transport. Its latency grows
//! as 2·log₂N messages where the ring's grows as 2(N−1), for the same bytes per rank
//! (2(N−1)/N of the data), so it wins for small buckets and many ranks.
//!
//! Over a power of two p: in step k (distance d = p/2, p/4, …, 1) rank v exchanges with
//! v XOR d: each keeps the half of its current range on its side of bit d, sends the other
//! half and sums what it receives into the kept half; after log₂p steps rank v holds the sum
//! of block v. The all-gather runs the steps backwards, each rank sending what it holds and
//! copying its partner's.
//!
//! Not a power of two (MPICH's handling): with p the largest power of two below N and
//! r = N − p extra ranks, each even rank 2i < 2r first hands its whole buffer to rank 2i+1,
//! which sums it and takes part as core rank i; the others are core ranks r.. in order. The
//! folded ranks get the result back from their partner last.
//!
//! Determinism: every element is summed in an order fixed by N and the length alone (the
//! fold's pair, then the butterfly's pairs), at one rank, then copied to all, so every rank
//! and every run has the same bits. For two ranks it is the one addition, which commutes.
//!
//! Broadcast: the root's data goes down a binomial tree of the same XOR partners (a folded
//! root first hands it to its partner), then back to the folded ranks; so the connections the
//! all-reduce needs carry the broadcast too.

use super::super::error::CollectiveError;
use super::super::transport::{Combine, HostRoute, RecvItem, Transfers, Wiring};
use super::{Exchanges, Group, PointToPointAlgorithm, Round, run_steps, segments};
use std::ops::Range;

/// Rabenseifner's halving-doubling; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HalvingDoubling;

/// Where a rank of `n` sits: the core's size p (a power of two), the extra ranks r = n − p,
/// and the rank's core rank (`None` for a folded rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fold {
    p: usize,
    extra: usize,
}

impl Fold {
    fn of(n: usize) -> Fold {
        let p = if n == 0 { 0 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) };
        Fold { p, extra: n - p }
    }

    /// The core rank of `rank`, or `None` when it folds into `rank + 1`.
    fn core(self, rank: usize) -> Option<usize> {
        if rank < 2 * self.extra { (rank % 2 == 1).then_some(rank / 2) } else { Some(rank - self.extra) }
    }

    /// The group rank of core rank `v`.
    fn rank_of(self, v: usize) -> usize {
        if v < self.extra { 2 * v + 1 } else { v + self.extra }
    }

    /// Distances of the reduce-scatter, largest first.
    fn distances(self) -> impl Iterator<Item = usize> {
        let p = self.p;
        (0..p.trailing_zeros()).map(move |k| p >> (k + 1))
    }
}

fn send(to: usize, ranges: Vec<Range<usize>>) -> Round {
    Round { to: Some(to), from: None, transfers: Transfers { sends: ranges, recvs: Vec::new() } }
}

fn receive(from: usize, ranges: impl Iterator<Item = Range<usize>>, combine: Combine) -> Round {
    let recvs = ranges.map(|range| RecvItem { range, combine, forward: false }).collect();
    Round { to: None, from: Some(from), transfers: Transfers { sends: Vec::new(), recvs } }
}

/// Both ways with one partner: send `out`, receive `into` with `combine`.
fn swap(partner: usize, out: Vec<Range<usize>>, into: impl Iterator<Item = Range<usize>>, combine: Combine) -> Round {
    let recvs = into.map(|range| RecvItem { range, combine, forward: false }).collect();
    Round { to: Some(partner), from: Some(partner), transfers: Transfers { sends: out, recvs } }
}

/// The exchanges of one rank's all-reduce of `elems` elements of `esize` bytes over `n`
/// ranks, segments of `seg` elements.
pub(super) fn all_reduce(rank: usize, n: usize, elems: usize, esize: usize, seg: usize, sum: Combine) -> Vec<Round> {
    let s = Fold::of(n);
    let bytes = |r: Range<usize>| segments(r, seg, esize);
    let Some(v) = s.core(rank) else {
        return vec![send(rank + 1, bytes(0..elems).collect()), receive(rank + 1, bytes(0..elems), Combine::Copy)];
    };
    let mut steps = Vec::new();
    let folded = rank < 2 * s.extra;
    if folded {
        steps.push(receive(rank - 1, bytes(0..elems), sum));
    }
    let mut range = 0..elems;
    let mut halves = Vec::new();
    for d in s.distances() {
        let mid = range.start + range.len() / 2;
        let (keep, give) =
            if v & d == 0 { (range.start..mid, mid..range.end) } else { (mid..range.end, range.start..mid) };
        let partner = s.rank_of(v ^ d);
        steps.push(swap(partner, bytes(give.clone()).collect(), bytes(keep.clone()), sum));
        halves.push((partner, keep.clone(), give));
        range = keep;
    }
    for (partner, keep, give) in halves.into_iter().rev() {
        steps.push(swap(partner, bytes(keep).collect(), bytes(give), Combine::Copy));
    }
    if folded {
        steps.push(send(rank - 1, bytes(0..elems).collect()));
    }
    steps
}

/// The exchanges of one rank's broadcast of `elems` f32 from `root` over `n` ranks.
pub(super) fn broadcast(rank: usize, n: usize, root: usize, elems: usize, seg: usize) -> Vec<Round> {
    let s = Fold::of(n);
    let all = || segments(0..elems, seg, 4);
    let mut steps = Vec::new();
    // A folded root hands the data to its partner, which roots the core's tree.
    let core_root = match s.core(root) {
        Some(v) => v,
        None if rank == root => return vec![send(root + 1, all().collect())],
        None => {
            if rank == root + 1 {
                steps.push(receive(root, all(), Combine::Copy));
            }
            root / 2
        }
    };
    let Some(v) = s.core(rank) else {
        return vec![receive(rank + 1, all(), Combine::Copy)];
    };
    let relative = v ^ core_root;
    for d in s.distances() {
        let partner = s.rank_of(v ^ d);
        if relative % (2 * d) == 0 {
            steps.push(send(partner, all().collect()));
        } else if relative % (2 * d) == d {
            steps.push(receive(partner, all(), Combine::Copy));
        }
    }
    if rank < 2 * s.extra && rank - 1 != root {
        steps.push(send(rank - 1, all().collect()));
    }
    steps
}

impl PointToPointAlgorithm for HalvingDoubling {
    fn route(&self) -> HostRoute {
        // Flat, as the cost model prices it: every step over the network.
        HostRoute::Network
    }

    fn wiring(&self, g: &Group) -> Wiring {
        let (n, rank) = (g.size(), g.rank());
        let s = Fold::of(n);
        let mut partners = Vec::new();
        match s.core(rank) {
            None => partners.push(rank + 1),
            Some(v) => {
                if rank < 2 * s.extra {
                    partners.push(rank - 1);
                }
                partners.extend(s.distances().map(|d| s.rank_of(v ^ d)));
            }
        }
        let global: Vec<usize> = partners.into_iter().map(|r| g.global(r)).collect();
        Wiring { sends_to: global.clone(), receives_from: global }
    }

    fn all_reduce(&self, x: &mut Exchanges<'_>, data: &mut [u8], sum: Combine) -> Result<(), CollectiveError> {
        let g = x.group();
        let esize = sum.element_bytes();
        let steps = all_reduce(g.rank(), g.size(), data.len() / esize, esize, x.segment_elems(esize), sum);
        run_steps(x, &steps, data)
    }

    fn broadcast(&self, x: &mut Exchanges<'_>, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        let g = x.group();
        let steps = broadcast(g.rank(), g.size(), root, data.len() / 4, x.segment_elems(4));
        run_steps(x, &steps, data)
    }

    fn barrier(&self, x: &mut Exchanges<'_>) -> Result<(), CollectiveError> {
        // The butterfly carries every rank's header to every other, so nobody leaves early.
        let mut token = [0.0f32; 1];
        self.all_reduce(x, bytemuck::cast_slice_mut(&mut token), Combine::SumF32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_is_the_largest_power_of_two_and_the_extras_fold_in_pairs() {
        let s = Fold::of(6);
        assert_eq!((s.p, s.extra), (4, 2));
        let cores: Vec<Option<usize>> = (0..6).map(|r| s.core(r)).collect();
        assert_eq!(cores, [None, Some(0), None, Some(1), Some(2), Some(3)]);
        assert!((0..4).all(|v| s.core(s.rank_of(v)) == Some(v)));
        assert_eq!(Fold::of(64).distances().collect::<Vec<_>>(), [32, 16, 8, 4, 2, 1]);
        assert_eq!(Fold::of(1).distances().count(), 0);
    }
}
