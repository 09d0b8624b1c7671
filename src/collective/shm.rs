//! Shared-memory transport: every rank on one host, exchanging data through one segment
//! (`segment.rs`). Each collective is two phases; a phase ends when every rank has
//! published it (its sequence counter, Release) and seen everyone else's (Acquire).
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
//! arena. Waiting spins briefly, yields for a while, then sleeps on a futex in the segment
//! that publishers ring, with a deadline, and checks the awaited peer's pid every 2 ms so a
//! dead peer is named quickly.
//!
//! Why the phases make the plain (non-atomic) data accesses race-free: between phases A and B
//! only rank p touches share p of any staging area or arena. After B, peers still read a
//! rank's staging area (step 3) while that rank may already be writing the next piece (step
//! 1), whose shares can sit elsewhere when lengths differ; so staging areas are double
//! buffered: consecutive pieces, across ops too, use alternate halves, and a half is written
//! again only after everyone passed phase A of the piece in between, i.e. finished reading.

use super::error::{ALL_REDUCE, ARENA, BARRIER, BROADCAST, CollectiveError, F64, OpDesc as Desc};
use super::liveness::process_exited;
use super::reduce::{copy, sum_to_all};
use super::segment::Segment;
use super::{Communicator, PackReduce, Peers, Timeouts};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

/// How to set up shared memory.
#[derive(Debug, Clone)]
pub struct ShmOptions {
    /// The segment file, normally under `/dev/shm`, unique per job. Rank 0 creates it (a
    /// stale one whose creator died is replaced) and removes it once everyone joined.
    pub path: PathBuf,
    /// Staging bytes per rank, in two halves used alternately; larger data is reduced in
    /// pieces of half this size.
    pub staging_bytes: usize,
    /// Zero-copy arena bytes per rank ([`ShmCommunicator::arena_mut`]); 0 for none.
    pub arena_bytes: usize,
    /// Hash of the job's token ([`super::job_token_hash`]); a segment of another job is refused.
    pub job_token: u64,
}

impl ShmOptions {
    /// 2 MiB staging (1 MiB pieces: they stay in cache; measured fastest for 11 MB), no
    /// arena, token 0.
    pub fn new(path: impl Into<PathBuf>) -> ShmOptions {
        ShmOptions { path: path.into(), staging_bytes: 2 << 20, arena_bytes: 0, job_token: 0 }
    }
}

/// A rank's side of the phase protocol.
#[derive(Debug)]
struct Sync {
    seq: u64,
    /// Pieces that went through staging so far; its parity picks the staging half.
    pieces: u64,
    op_timeout: Duration,
    /// Busy-wait this long before sleeping on the bell; zero when ranks outnumber cores.
    spin: Duration,
    broken: Option<String>,
}

const LIVENESS_EVERY: Duration = Duration::from_millis(2);
/// After spinning, yield this long before sleeping. A sleeping rank lets its (virtual) CPU
/// halt, and waking a halted vCPU took 0.3-0.5 ms on the development VM: once one rank
/// slept, the other outwaited its spin and slept too, and every later phase paid a wake-up
/// (11 MB all-reduce bimodal, 0.8 or 6 ms). Yielding keeps the CPU awake yet hands it to any
/// runnable thread, so it costs nothing when there is other work. The exception is a peer on
/// this very CPU (ranks stacked by the scheduler, seen 1 run in 26 here): then yielding
/// ping-pongs the CPU and keeps both ranks cache-hot, so the load balancer never separates
/// them; the waiter blocks at once instead.
const YIELD_FOR: Duration = Duration::from_millis(1);

/// Publishes this rank's next phase and waits until every rank published it: spinning for
/// `st.spin`, yielding for [`YIELD_FOR`], then asleep on the segment's futex bell, waking at
/// least every 2 ms to check that the awaited peer's process still exists.
fn phase(seg: &Segment, peers: &Peers, st: &mut Sync, desc: &Desc) -> Result<(), CollectiveError> {
    st.seq += 1;
    let target = st.seq;
    let opening = target % 2 == 1;
    let rank = peers.rank();
    let me = seg.cell(rank);
    if opening {
        me.kind.store(desc.kind, Ordering::Relaxed);
        me.len.store(desc.len, Ordering::Relaxed);
        me.aux.store(desc.aux, Ordering::Relaxed);
    }
    // SAFETY: no arguments; returns the calling thread's CPU or -1.
    let my_cpu = unsafe { libc::sched_getcpu() } as u64;
    me.cpu.store(my_cpu, Ordering::Relaxed);
    me.seq.store(target, Ordering::Release);
    seg.ring();

    let start = Instant::now();
    let mut next_liveness = start + LIVENESS_EVERY;
    let mut spinning = !st.spin.is_zero();
    let mut polls = 0u32;
    let mut q = 0;
    loop {
        let bell = seg.bell();
        while q < peers.world() {
            if q != rank {
                let c = seg.cell(q);
                if c.seq.load(Ordering::Acquire) < target {
                    break;
                }
                // A peer past phase A is at most in phase B of the same op, so the
                // descriptor it published is this op's.
                if opening {
                    let theirs = Desc {
                        kind: c.kind.load(Ordering::Relaxed),
                        len: c.len.load(Ordering::Relaxed),
                        aux: c.aux.load(Ordering::Relaxed),
                    };
                    if theirs != *desc {
                        return Err(CollectiveError::OutOfStep {
                            peer: peers.name(q).to_string(),
                            ours: desc.describe(peers),
                            theirs: theirs.describe(peers),
                        });
                    }
                }
            }
            q += 1;
        }
        if q == peers.world() {
            return Ok(());
        }
        let by = seg.aborted_by();
        if by != 0 && by - 1 != rank as u64 {
            let peer = usize::try_from(by - 1).ok().filter(|&r| r < peers.world()).map_or("a peer", |r| peers.name(r));
            return Err(CollectiveError::PeerAborted { peer: peer.to_string(), op: desc.op() });
        }
        if spinning {
            polls = polls.wrapping_add(1);
            if !polls.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
        }
        let now = Instant::now();
        if now >= next_liveness {
            let pid = seg.cell(q).pid.load(Ordering::Relaxed);
            if process_exited(pid) {
                return Err(CollectiveError::PeerExited { peer: peers.name(q).to_string(), pid: pid as u32 });
            }
            next_liveness = now + LIVENESS_EVERY;
        }
        let waited = now - start;
        if waited >= st.op_timeout {
            return Err(CollectiveError::Timeout {
                peer: peers.name(q).to_string(),
                op: desc.op(),
                after: st.op_timeout,
            });
        }
        // Sharing the awaited peer's CPU, spinning or yielding only delays it: block, so it
        // runs here, and the scheduler places this rank on an idle CPU when it wakes.
        let stacked = seg.cell(q).cpu.load(Ordering::Relaxed) == my_cpu;
        if !stacked && waited < st.spin {
            continue;
        }
        spinning = false;
        if !stacked && waited < st.spin + YIELD_FOR {
            thread::yield_now();
            continue;
        }
        seg.sleep(bell, (next_liveness - now).min(st.op_timeout - waited));
    }
}

/// The boundaries of rank `p`'s share of `n` floats: near-equal, on 16-float (64-byte)
/// boundaries so no two ranks write the same cache line and the sum loop runs aligned.
fn share(n: usize, world: usize, p: usize) -> Range<usize> {
    let bound = |q: usize| {
        if q >= world { n } else { ((n as u128 * q as u128 / world as u128) as usize) & !15 }
    };
    bound(p)..bound(p + 1)
}

/// A communicator over shared memory; see the module docs.
pub struct ShmCommunicator {
    peers: Peers,
    seg: Segment,
    st: Sync,
}

impl ShmCommunicator {
    /// Joins the segment: rank 0 creates it, the others open it (retrying until
    /// `timeouts.connect`); returns once every rank is in.
    pub fn join(peers: Peers, opts: &ShmOptions, timeouts: Timeouts) -> Result<ShmCommunicator, CollectiveError> {
        let staging = (opts.staging_bytes / 4).max(64);
        let arena = opts.arena_bytes / 4;
        let seg = Segment::join(&peers, &opts.path, staging, arena, opts.job_token, timeouts.connect)?;
        let cores = thread::available_parallelism().map_or(1, |n| n.get());
        // Spinning pays only while every rank has a core of its own; it covers the usual skew
        // between ranks in lockstep, and anything longer sleeps on the futex bell.
        let spin = if peers.world() <= cores { Duration::from_micros(50) } else { Duration::ZERO };
        Ok(ShmCommunicator { peers, seg, st: Sync { seq: 0, pieces: 0, op_timeout: timeouts.op, spin, broken: None } })
    }

    /// This rank's zero-copy arena (`arena_bytes / 4` floats): write gradients here and
    /// reduce them with [`ShmCommunicator::all_reduce_arena`]; no copy in or out.
    pub fn arena_mut(&mut self) -> &mut [f32] {
        // SAFETY: the arena lies inside the mapping, which lives as long as self. Peers write
        // into it only while this rank is inside all_reduce_arena or ArenaReducer::reduce_pack,
        // which need &mut self or a pack borrowed from this very slice, so they cannot overlap
        // any use of the slice returned here.
        unsafe { std::slice::from_raw_parts_mut(self.seg.arena_ptr(self.peers.rank()), self.seg.arena_floats()) }
    }

    /// Sums `range` of every rank's arena, in place, into every rank's arena.
    pub fn all_reduce_arena(&mut self, range: Range<usize>) -> Result<(), CollectiveError> {
        if range.start > range.end || range.end > self.seg.arena_floats() {
            return Err(CollectiveError::Invalid(format!(
                "arena range {range:?} lies outside the arena of {} floats",
                self.seg.arena_floats()
            )));
        }
        let own = self.seg.arena_ptr(self.peers.rank()).wrapping_add(range.start);
        let (seg, peers) = (&self.seg, &self.peers);
        guarded(seg, peers, &mut self.st, |st| reduce_arena(seg, peers, st, own, range.start, range.len()))
    }

    /// The arena plus a reducer for packs cut from it, so backward can write one part of the
    /// arena while another is being reduced ([`super::BucketReducer`]).
    pub fn split_arena(&mut self) -> (ArenaReducer<'_>, &mut [f32]) {
        let rank = self.peers.rank();
        // SAFETY: as in arena_mut; the reducer only touches this rank's arena through the
        // packs it is handed, which are borrowed from the slice returned here.
        let arena = unsafe { std::slice::from_raw_parts_mut(self.seg.arena_ptr(rank), self.seg.arena_floats()) };
        (ArenaReducer { seg: &self.seg, peers: &self.peers, st: &mut self.st }, arena)
    }
}

/// Runs one collective; any error that leaves peers out of step marks the segment abandoned
/// (so peers stop waiting at once) and this communicator broken.
fn guarded(
    seg: &Segment,
    peers: &Peers,
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
        seg.abort(peers.rank());
        st.broken = Some(e.to_string());
    }
    r
}

/// Phases A and B around summing this rank's share of `len` arena floats from `start`.
/// `own` points at this rank's arena float `start`, derived from whatever borrow the caller
/// holds of it.
fn reduce_arena(
    seg: &Segment,
    peers: &Peers,
    st: &mut Sync,
    own: *mut f32,
    start: usize,
    len: usize,
) -> Result<(), CollectiveError> {
    if peers.world() == 1 || len == 0 {
        return Ok(());
    }
    let desc = Desc { kind: ARENA, len: len as u64, aux: start as u64 };
    phase(seg, peers, st, &desc)?;
    let r = share(len, peers.world(), peers.rank());
    let ptrs: Vec<*mut f32> = (0..peers.world())
        .map(|q| if q == peers.rank() { own } else { seg.arena_ptr(q).wrapping_add(start) })
        .map(|p| p.wrapping_add(r.start))
        .collect();
    let srcs: Vec<*const f32> = ptrs.iter().map(|&p| p as *const f32).collect();
    // SAFETY: start + len <= arena length (checked by callers); between phases A and B only
    // this rank touches share r of any arena (module docs).
    unsafe { sum_to_all(&srcs, &ptrs, r.len()) };
    phase(seg, peers, st, &desc)
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
fn all_reduce_piece(
    seg: &Segment,
    peers: &Peers,
    st: &mut Sync,
    piece: &mut [f32],
    desc: &Desc,
) -> Result<(), CollectiveError> {
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
    phase(seg, peers, st, desc)?;
    let r = share(n, world, rank);
    let srcs: Vec<*const f32> = (0..world)
        .map(|q| if q == rank { base as *const f32 } else { half(q) as *const f32 })
        .map(|p| p.wrapping_add(r.start))
        .collect();
    // SAFETY: between A and B only this rank touches share r of the staging areas, and the
    // piece is ours.
    unsafe { sum_to_all(&srcs, &[base.add(r.start), mine.add(r.start)], r.len()) };
    phase(seg, peers, st, desc)?;
    for p in (0..world).filter(|&p| p != rank) {
        let r = share(n, world, p);
        // SAFETY: rank p writes this half again only two pieces on, after everyone (us
        // included) passed phase A of the next piece.
        unsafe { copy(half(p).add(r.start), base.add(r.start), r.len()) };
    }
    Ok(())
}

fn f64_piece(
    seg: &Segment,
    peers: &Peers,
    st: &mut Sync,
    piece: &mut [f64],
    desc: &Desc,
) -> Result<(), CollectiveError> {
    let n = piece.len();
    let half = next_half(seg, st);
    // SAFETY: halves are 64-byte aligned and hold half_floats/2 >= n f64; peers last read
    // this half of ours two pieces ago (see all_reduce_piece).
    unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), half(peers.rank()) as *mut f64, n) };
    phase(seg, peers, st, desc)?;
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
    phase(seg, peers, st, desc)
}

fn broadcast_piece(
    seg: &Segment,
    peers: &Peers,
    st: &mut Sync,
    piece: &mut [f32],
    root: usize,
    desc: &Desc,
) -> Result<(), CollectiveError> {
    let src = next_half(seg, st)(root);
    if peers.rank() == root {
        // SAFETY: as for our staging area in all_reduce_piece.
        unsafe { copy(piece.as_ptr(), src, piece.len()) };
    }
    phase(seg, peers, st, desc)?;
    if peers.rank() != root {
        // SAFETY: the root writes this half again only two pieces on (see all_reduce_piece).
        unsafe { copy(src, piece.as_mut_ptr(), piece.len()) };
    }
    phase(seg, peers, st, desc)
}

impl Communicator for ShmCommunicator {
    fn rank(&self) -> usize {
        self.peers.rank()
    }

    fn world(&self) -> usize {
        self.peers.world()
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError> {
        if self.peers.world() == 1 || data.is_empty() {
            return Ok(());
        }
        let desc = Desc { kind: ALL_REDUCE, len: data.len() as u64, aux: 0 };
        let (seg, peers) = (&self.seg, &self.peers);
        guarded(seg, peers, &mut self.st, |st| {
            data.chunks_mut(half_floats(seg)).try_for_each(|piece| all_reduce_piece(seg, peers, st, piece, &desc))
        })
    }

    fn all_reduce_sum_f64(&mut self, data: &mut [f64]) -> Result<(), CollectiveError> {
        if self.peers.world() == 1 || data.is_empty() {
            return Ok(());
        }
        let desc = Desc { kind: F64, len: data.len() as u64, aux: 0 };
        let (seg, peers) = (&self.seg, &self.peers);
        guarded(seg, peers, &mut self.st, |st| {
            data.chunks_mut(half_floats(seg) / 2).try_for_each(|piece| f64_piece(seg, peers, st, piece, &desc))
        })
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        self.peers.check_root(root)?;
        if self.peers.world() == 1 || data.is_empty() {
            return Ok(());
        }
        let desc = Desc { kind: BROADCAST, len: data.len() as u64, aux: root as u64 };
        let (seg, peers) = (&self.seg, &self.peers);
        guarded(seg, peers, &mut self.st, |st| {
            data.chunks_mut(half_floats(seg)).try_for_each(|piece| broadcast_piece(seg, peers, st, piece, root, &desc))
        })
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        if self.peers.world() == 1 {
            return Ok(());
        }
        let desc = Desc { kind: BARRIER, len: 0, aux: 0 };
        let (seg, peers) = (&self.seg, &self.peers);
        guarded(seg, peers, &mut self.st, |st| {
            phase(seg, peers, st, &desc)?;
            phase(seg, peers, st, &desc)
        })
    }

    fn transport(&self) -> super::TransportKind {
        super::TransportKind::SharedMemory
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
    seg: &'a Segment,
    peers: &'a Peers,
    st: &'a mut Sync,
}

impl PackReduce for ArenaReducer<'_> {
    fn reduce_pack(&mut self, pack: &mut [f32]) -> Result<(), CollectiveError> {
        // Where the pack sits in the arena follows from its address; anything else is refused.
        let base = self.seg.arena_ptr(self.peers.rank()) as usize;
        let at = (pack.as_ptr() as usize).wrapping_sub(base);
        let start = at / 4;
        if !at.is_multiple_of(4) || start > self.seg.arena_floats() || pack.len() > self.seg.arena_floats() - start {
            return Err(CollectiveError::Invalid("the pack is not part of this communicator's arena".into()));
        }
        let own = pack.as_mut_ptr();
        let (seg, peers) = (self.seg, self.peers);
        guarded(seg, peers, self.st, |st| reduce_arena(seg, peers, st, own, start, pack.len()))
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
