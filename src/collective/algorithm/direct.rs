//! `direct`: the shared-memory all-reduce in which every rank sums its share of the data
//! straight from every rank's buffer, in rank order. It needs every rank's memory, so it runs
//! on the shared-memory transport only ([`SharedMemory`]); each collective is two of its
//! phases.
//!
//! All-reduce of a piece of S floats over N ranks, rank r:
//! 1. copies the shares of its data that the others will sum into its staging area;
//!    phase A;
//! 2. sums share r across all ranks in rank order, reading its own contribution straight from
//!    its private buffer and the others' from their staging areas, and writes the sum to its
//!    private buffer and its staging area; phase B;
//! 3. copies the other shares' sums out of their owners' staging areas.
//!
//! So each rank moves about 2·S floats in and out of memory, not 4·S, and the N ranks sum in
//! parallel. The zero-copy arena ([`ShmCommunicator::arena_mut`]) skips steps 1 and 3: the
//! trainer writes gradients into the segment, and step 2 writes the sums into every rank's
//! arena.
//!
//! Why the phases make the plain (non-atomic) data accesses race-free: between phases A and B
//! only rank p touches share p of any staging area or arena. After B, peers still read a
//! rank's staging area (step 3) while that rank may already be writing the next piece (step
//! 1), whose shares can sit elsewhere when lengths differ; so staging areas are double
//! buffered: consecutive pieces, across ops too, use alternate halves, and a half is written
//! again only after everyone passed phase A of the piece in between, i.e. finished reading.

use super::super::error::{ALL_REDUCE, ARENA, BARRIER, BROADCAST, CollectiveError, F64, OpDesc as Desc};
use super::super::reduce::{copy, sum_to_all};
use super::super::segment::Segment;
use super::super::transport::TransportKind;
use super::super::transport::shared_memory::{SharedMemory, ShmOptions};
use super::super::{CollectiveTimeouts, Communicator, PackReduce, Peers};
use std::ops::Range;

/// A rank's side of the phase protocol.
#[derive(Debug)]
struct Sync {
    seq: u64,
    /// Pieces that went through staging so far; its parity picks the staging half.
    pieces: u64,
    broken: Option<String>,
}

/// The boundaries of rank `p`'s share of `n` floats: near-equal, on 16-float (64-byte)
/// boundaries so no two ranks write the same cache line and the sum loop runs aligned.
fn share(n: usize, world: usize, p: usize) -> Range<usize> {
    let bound = |q: usize| {
        if q >= world { n } else { ((n as u128 * q as u128 / world as u128) as usize) & !15 }
    };
    bound(p)..bound(p + 1)
}

/// The `direct` algorithm's communicator, over shared memory; see the module docs.
pub struct ShmCommunicator {
    shm: SharedMemory,
    st: Sync,
}

impl ShmCommunicator {
    /// Joins the segment: rank 0 creates it, the others open it (retrying until
    /// `timeouts.connect`); returns once every rank is in.
    pub fn join(
        peers: Peers,
        opts: &ShmOptions,
        timeouts: CollectiveTimeouts,
    ) -> Result<ShmCommunicator, CollectiveError> {
        let shm = SharedMemory::join(peers, opts, timeouts)?;
        Ok(ShmCommunicator { shm, st: Sync { seq: 0, pieces: 0, broken: None } })
    }

    /// This rank's zero-copy arena (`arena_bytes / 4` floats): write gradients here and
    /// reduce them with [`ShmCommunicator::all_reduce_arena`]; no copy in or out.
    pub fn arena_mut(&mut self) -> &mut [f32] {
        // SAFETY: the arena lies inside the mapping, which lives as long as self. Peers write
        // into it only while this rank is inside all_reduce_arena or ArenaReducer::reduce_pack,
        // which need &mut self or a pack borrowed from this very slice, so they cannot overlap
        // any use of the slice returned here.
        let seg = self.shm.segment();
        unsafe { std::slice::from_raw_parts_mut(seg.arena_ptr(self.shm.peers().rank()), seg.arena_floats()) }
    }

    /// Sums `range` of every rank's arena, in place, into every rank's arena.
    pub fn all_reduce_arena(&mut self, range: Range<usize>) -> Result<(), CollectiveError> {
        let seg = self.shm.segment();
        if range.start > range.end || range.end > seg.arena_floats() {
            return Err(CollectiveError::Invalid(format!(
                "arena range {range:?} lies outside the arena of {} floats",
                seg.arena_floats()
            )));
        }
        let own = seg.arena_ptr(self.shm.peers().rank()).wrapping_add(range.start);
        let shm = &self.shm;
        guarded(shm, &mut self.st, |st| reduce_arena(shm, st, own, range.start, range.len()))
    }

    /// The arena plus a reducer for packs cut from it, so backward can write one part of the
    /// arena while another is being reduced ([`super::BucketReducer`]).
    pub fn split_arena(&mut self) -> (ArenaReducer<'_>, &mut [f32]) {
        let (seg, rank) = (self.shm.segment(), self.shm.peers().rank());
        // SAFETY: as in arena_mut; the reducer only touches this rank's arena through the
        // packs it is handed, which are borrowed from the slice returned here.
        let arena = unsafe { std::slice::from_raw_parts_mut(seg.arena_ptr(rank), seg.arena_floats()) };
        (ArenaReducer { shm: &self.shm, st: &mut self.st }, arena)
    }
}

/// Runs one collective; any error that leaves peers out of step marks the segment abandoned
/// (so peers stop waiting at once) and this communicator broken.
fn guarded(
    shm: &SharedMemory,
    st: &mut Sync,
    f: impl FnOnce(&mut Sync) -> Result<(), CollectiveError>,
) -> Result<(), CollectiveError> {
    if let Some(why) = &st.broken {
        return Err(CollectiveError::Broken(why.clone()));
    }
    let r = f(st);
    if let Err(e) = &r
        && e.breaks()
    {
        shm.segment().abort(shm.peers().rank());
        st.broken = Some(e.to_string());
    }
    r
}

/// Phases A and B around summing this rank's share of `len` arena floats from `start`.
/// `own` points at this rank's arena float `start`, derived from whatever borrow the caller
/// holds of it.
fn reduce_arena(
    shm: &SharedMemory,
    st: &mut Sync,
    own: *mut f32,
    start: usize,
    len: usize,
) -> Result<(), CollectiveError> {
    let (seg, peers) = (shm.segment(), shm.peers());
    if peers.world() == 1 || len == 0 {
        return Ok(());
    }
    let desc = Desc { kind: ARENA, len: len as u64, aux: start as u64 };
    shm.phase(&mut st.seq, &desc)?;
    let r = share(len, peers.world(), peers.rank());
    let ptrs: Vec<*mut f32> = (0..peers.world())
        .map(|q| if q == peers.rank() { own } else { seg.arena_ptr(q).wrapping_add(start) })
        .map(|p| p.wrapping_add(r.start))
        .collect();
    let srcs: Vec<*const f32> = ptrs.iter().map(|&p| p as *const f32).collect();
    // SAFETY: start + len <= arena length (checked by callers); between phases A and B only
    // this rank touches share r of any arena (module docs).
    unsafe { sum_to_all(&srcs, &ptrs, r.len()) };
    shm.phase(&mut st.seq, &desc)
}

/// Floats in each staging half: a multiple of 16 so halves stay 64-byte aligned.
fn half_floats(seg: &Segment) -> usize {
    (seg.staging_floats() / 2) & !15
}

/// The staging half the next piece uses, by rank; advances the piece counter.
fn next_half<'a>(seg: &'a Segment, st: &mut Sync) -> impl Fn(usize) -> *mut f32 + 'a {
    let offset = (st.pieces % 2) as usize * half_floats(seg);
    st.pieces += 1;
    move |rank| seg.staging_ptr(rank).wrapping_add(offset)
}

/// Reduces one piece (at most a staging half) of a copy-mode all-reduce.
fn all_reduce_piece(shm: &SharedMemory, st: &mut Sync, piece: &mut [f32], desc: &Desc) -> Result<(), CollectiveError> {
    let (seg, peers) = (shm.segment(), shm.peers());
    let (n, world, rank) = (piece.len(), peers.world(), peers.rank());
    let base = piece.as_mut_ptr();
    let half = next_half(seg, st);
    let mine = half(rank);
    for p in (0..world).filter(|&p| p != rank) {
        let r = share(n, world, p);
        // SAFETY: the piece is ours and n fits a half. Peers last read this half of ours two
        // pieces ago, and all of them passed phase A of the piece in between since.
        unsafe { copy(base.add(r.start), mine.add(r.start), r.len()) };
    }
    shm.phase(&mut st.seq, desc)?;
    let r = share(n, world, rank);
    let srcs: Vec<*const f32> = (0..world)
        .map(|q| if q == rank { base as *const f32 } else { half(q) as *const f32 })
        .map(|p| p.wrapping_add(r.start))
        .collect();
    // SAFETY: between A and B only this rank touches share r of the staging areas, and the
    // piece is ours.
    unsafe { sum_to_all(&srcs, &[base.add(r.start), mine.add(r.start)], r.len()) };
    shm.phase(&mut st.seq, desc)?;
    for p in (0..world).filter(|&p| p != rank) {
        let r = share(n, world, p);
        // SAFETY: rank p writes this half again only two pieces on, after everyone (us
        // included) passed phase A of the next piece.
        unsafe { copy(half(p).add(r.start), base.add(r.start), r.len()) };
    }
    Ok(())
}

fn f64_piece(shm: &SharedMemory, st: &mut Sync, piece: &mut [f64], desc: &Desc) -> Result<(), CollectiveError> {
    let (seg, peers) = (shm.segment(), shm.peers());
    let n = piece.len();
    let half = next_half(seg, st);
    // SAFETY: halves are 64-byte aligned and hold half_floats/2 >= n f64; peers last read
    // this half of ours two pieces ago (see all_reduce_piece).
    unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), half(peers.rank()) as *mut f64, n) };
    shm.phase(&mut st.seq, desc)?;
    // Statistics are a handful of numbers: every rank sums all of them, in rank order.
    for (i, out) in piece.iter_mut().enumerate() {
        let mut acc = 0.0;
        for q in 0..peers.world() {
            // SAFETY: inside A..B nobody writes staging areas; i < n.
            let x = unsafe { *(half(q) as *const f64).add(i) };
            acc = if q == 0 { x } else { acc + x };
        }
        *out = acc;
    }
    shm.phase(&mut st.seq, desc)
}

fn broadcast_piece(
    shm: &SharedMemory,
    st: &mut Sync,
    piece: &mut [f32],
    root: usize,
    desc: &Desc,
) -> Result<(), CollectiveError> {
    let (seg, peers) = (shm.segment(), shm.peers());
    let src = next_half(seg, st)(root);
    if peers.rank() == root {
        // SAFETY: as for our staging area in all_reduce_piece.
        unsafe { copy(piece.as_ptr(), src, piece.len()) };
    }
    shm.phase(&mut st.seq, desc)?;
    if peers.rank() != root {
        // SAFETY: the root writes this half again only two pieces on (see all_reduce_piece).
        unsafe { copy(src, piece.as_mut_ptr(), piece.len()) };
    }
    shm.phase(&mut st.seq, desc)
}

impl Communicator for ShmCommunicator {
    fn rank(&self) -> usize {
        self.shm.peers().rank()
    }

    fn world(&self) -> usize {
        self.shm.peers().world()
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError> {
        if self.shm.peers().world() == 1 || data.is_empty() {
            return Ok(());
        }
        let desc = Desc { kind: ALL_REDUCE, len: data.len() as u64, aux: 0 };
        let (shm, seg) = (&self.shm, self.shm.segment());
        guarded(shm, &mut self.st, |st| {
            data.chunks_mut(half_floats(seg)).try_for_each(|piece| all_reduce_piece(shm, st, piece, &desc))
        })
    }

    fn all_reduce_sum_f64(&mut self, data: &mut [f64]) -> Result<(), CollectiveError> {
        if self.shm.peers().world() == 1 || data.is_empty() {
            return Ok(());
        }
        let desc = Desc { kind: F64, len: data.len() as u64, aux: 0 };
        let (shm, seg) = (&self.shm, self.shm.segment());
        guarded(shm, &mut self.st, |st| {
            data.chunks_mut(half_floats(seg) / 2).try_for_each(|piece| f64_piece(shm, st, piece, &desc))
        })
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        self.shm.peers().check_root(root)?;
        if self.shm.peers().world() == 1 || data.is_empty() {
            return Ok(());
        }
        let desc = Desc { kind: BROADCAST, len: data.len() as u64, aux: root as u64 };
        let (shm, seg) = (&self.shm, self.shm.segment());
        guarded(shm, &mut self.st, |st| {
            data.chunks_mut(half_floats(seg)).try_for_each(|piece| broadcast_piece(shm, st, piece, root, &desc))
        })
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        if self.shm.peers().world() == 1 {
            return Ok(());
        }
        let desc = Desc { kind: BARRIER, len: 0, aux: 0 };
        let shm = &self.shm;
        guarded(shm, &mut self.st, |st| {
            shm.phase(&mut st.seq, &desc)?;
            shm.phase(&mut st.seq, &desc)
        })
    }

    fn transport(&self) -> TransportKind {
        TransportKind::SharedMemory
    }

    fn arena(&mut self) -> Option<&mut [f32]> {
        Some(self.arena_mut())
    }

    fn all_reduce_arena(&mut self, len: usize) -> Result<(), CollectiveError> {
        ShmCommunicator::all_reduce_arena(self, 0..len)
    }
}

/// Reduces packs of a [`ShmCommunicator`]'s arena in place, zero-copy; made by
/// [`ShmCommunicator::split_arena`].
pub struct ArenaReducer<'a> {
    shm: &'a SharedMemory,
    st: &'a mut Sync,
}

impl PackReduce for ArenaReducer<'_> {
    fn reduce_pack(&mut self, pack: &mut [f32]) -> Result<(), CollectiveError> {
        // Where the pack sits in the arena follows from its address; anything else is refused.
        let seg = self.shm.segment();
        let base = seg.arena_ptr(self.shm.peers().rank()) as usize;
        let at = (pack.as_ptr() as usize).wrapping_sub(base);
        let start = at / 4;
        if !at.is_multiple_of(4) || start > seg.arena_floats() || pack.len() > seg.arena_floats() - start {
            return Err(CollectiveError::Invalid("the pack is not part of this communicator's arena".into()));
        }
        let own = pack.as_mut_ptr();
        let shm = self.shm;
        guarded(shm, self.st, |st| reduce_arena(shm, st, own, start, pack.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything_on_64_byte_boundaries() {
        for n in [0, 1, 15, 16, 17, 100, 1000, 12345] {
            for world in 1..=5 {
                let mut at = 0;
                for p in 0..world {
                    let r = share(n, world, p);
                    assert_eq!(r.start, at);
                    assert!(r.start.is_multiple_of(16) || r.start == n);
                    at = r.end;
                }
                assert_eq!(at, n);
            }
        }
    }
}
