//! `ring`: the chunked, pipelined ring all-reduce, over any point-to-point transport. Rank r
//! sends to r+1 and receives from r−1 (in the group's numbering), all in one exchange.
//!
//! Over N ranks the data is cut into N chunks; reduce-scatter (N−1 steps) leaves rank r with
//! the full sum of chunk r+1, all-gather (N−1 steps) passes the sums around. Each chunk
//! travels in segments of the transport's size, and every received segment is summed (or
//! copied) and queued to be forwarded at once, so sending, receiving and summing overlap
//! segment by segment. Rank r's step t+1 sends exactly what it received in step t, so the
//! send queue is "its own chunk, then whatever arrived", which is all the bookkeeping there is.
//!
//! Determinism: chunk c is summed in the fixed order c+1, c+2, …, c (ring order starting
//! after its owner); the order depends only on ranks and sizes, so every run gives the same
//! bits, and the all-gather gives every rank the same bits. For two ranks this equals the
//! rank-order sum (a single addition commutes); for more it is a fixed rotation of it.

use super::super::error::CollectiveError;
use super::super::transport::{Combine, HostRoute, RecvItem, Transfers, Wiring};
use super::{Exchanges, Group, PointToPointAlgorithm, segments};
use std::ops::Range;

/// The ring; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ring;

/// The ranks after and before this one, in the group's numbering.
fn neighbours(g: &Group) -> (usize, usize) {
    let (rank, world) = (g.rank(), g.size());
    ((rank + 1) % world, (rank + world - 1) % world)
}

impl PointToPointAlgorithm for Ring {
    fn route(&self) -> HostRoute {
        // At a host boundary a rank sends inside its host while receiving from another.
        HostRoute::Network
    }

    fn wiring(&self, g: &Group) -> Wiring {
        if g.size() < 2 {
            return Wiring::default();
        }
        let (next, prev) = neighbours(g);
        Wiring { sends_to: vec![g.global(next)], receives_from: vec![g.global(prev)] }
    }

    fn all_reduce(&self, x: &mut Exchanges<'_>, data: &mut [u8], sum: Combine) -> Result<(), CollectiveError> {
        let g = x.group();
        if g.size() < 2 {
            return Ok(());
        }
        let esize = sum.element_bytes();
        let (next, prev) = neighbours(g);
        let sched = all_reduce(g.rank(), g.size(), data.len() / esize, esize, x.segment_elems(esize), sum);
        x.exchange(Some(next), Some(prev), &sched, data)
    }

    fn broadcast(&self, x: &mut Exchanges<'_>, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        let g = x.group();
        let world = g.size();
        if world < 2 {
            return Ok(());
        }
        let (next, prev) = neighbours(g);
        let pos = (g.rank() + world - root) % world;
        let sched = broadcast(pos, world, data.len() / 4, x.segment_elems(4));
        // The chain starts at the root and ends at the rank before it.
        let to = (pos + 1 < world).then_some(next);
        let from = (pos > 0).then_some(prev);
        x.exchange(to, from, &sched, data)
    }

    fn barrier(&self, x: &mut Exchanges<'_>) -> Result<(), CollectiveError> {
        // One element per chunk, so every rank's contribution travels the whole ring and
        // nobody leaves before everyone arrived.
        let g = x.group();
        let world = g.size();
        if world < 2 {
            return Ok(());
        }
        let (next, prev) = neighbours(g);
        let mut token = vec![0.0f32; world];
        let sched = all_reduce(g.rank(), world, world, 4, 1, Combine::SumF32);
        x.exchange(Some(next), Some(prev), &sched, bytemuck::cast_slice_mut(&mut token))
    }
}

/// Element range of chunk `c` when `elems` are cut into `world` near-equal chunks.
fn chunk(elems: usize, world: usize, c: usize) -> Range<usize> {
    let (base, rem) = (elems / world, elems % world);
    let start = c * base + c.min(rem);
    start..start + base + usize::from(c < rem)
}

/// Ring all-reduce (reduce-scatter, then all-gather) of `elems` elements of `esize` bytes.
fn all_reduce(rank: usize, world: usize, elems: usize, esize: usize, seg_elems: usize, sum: Combine) -> Transfers {
    let ring = |back: usize| chunk(elems, world, (rank + world * 2 - back) % world);
    let mut recvs = Vec::new();
    for t in 0..world - 1 {
        let items = segments(ring(t + 1), seg_elems, esize);
        recvs.extend(items.map(|range| RecvItem { range, combine: sum, forward: true }));
    }
    for t in 0..world - 1 {
        let items = segments(ring(t), seg_elems, esize);
        recvs.extend(items.map(|range| RecvItem { range, combine: Combine::Copy, forward: t + 2 < world }));
    }
    Transfers { sends: segments(ring(0), seg_elems, esize).collect(), recvs }
}

/// Pipelined chain broadcast of `elems` f32 for the rank `pos` places after the root.
fn broadcast(pos: usize, world: usize, elems: usize, seg_elems: usize) -> Transfers {
    let all: Vec<Range<usize>> = segments(0..elems, seg_elems, 4).collect();
    if pos == 0 {
        return Transfers { sends: all, recvs: Vec::new() };
    }
    let forward = pos + 1 < world;
    Transfers {
        sends: Vec::new(),
        recvs: all.into_iter().map(|range| RecvItem { range, combine: Combine::Copy, forward }).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_segments_cover_everything_once() {
        for elems in [0, 1, 2, 7, 100, 1001] {
            for world in 1..=5 {
                let mut at = 0;
                for c in 0..world {
                    let r = chunk(elems, world, c);
                    assert_eq!(r.start, at);
                    at = r.end;
                    let segs: Vec<_> = segments(r.clone(), 3, 4).collect();
                    assert_eq!(segs.iter().map(|s| s.len()).sum::<usize>(), r.len() * 4);
                }
                assert_eq!(at, elems);
            }
        }
    }

    #[test]
    fn what_a_rank_sends_is_what_its_next_expects() {
        for world in 2..=5 {
            for elems in [1, 5, 64, 1003] {
                for rank in 0..world {
                    let me = all_reduce(rank, world, elems, 4, 7, Combine::SumF32);
                    let next = all_reduce((rank + 1) % world, world, elems, 4, 7, Combine::SumF32);
                    let mut sent = me.sends.clone();
                    sent.extend(me.recvs.iter().filter(|i| i.forward).map(|i| i.range.clone()));
                    let expected: Vec<_> = next.recvs.iter().map(|i| i.range.clone()).collect();
                    assert_eq!(sent, expected, "world {world} elems {elems} rank {rank}");
                }
            }
        }
    }

    #[test]
    fn the_broadcast_chain_hands_on_what_it_receives() {
        for world in 2..=4 {
            for pos in 0..world - 1 {
                let me = broadcast(pos, world, 1000, 64);
                let next = broadcast(pos + 1, world, 1000, 64);
                let mut sent = me.sends.clone();
                sent.extend(me.recvs.iter().filter(|i| i.forward).map(|i| i.range.clone()));
                let expected: Vec<_> = next.recvs.iter().map(|i| i.range.clone()).collect();
                assert_eq!(sent, expected, "world {world} position {pos}");
            }
            assert!(broadcast(world - 1, world, 1000, 64).recvs.iter().all(|i| !i.forward));
        }
    }
}
