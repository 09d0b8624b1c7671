//! The shared-memory transport: every rank on one host, in one segment (`segment.rs`) that
//! holds each rank's staging area and, for each ordered pair of ranks, two counters.
//!
//! Point-to-point ([`PointToPoint`]): a rank's staging area is its outbox, cut into up to
//! [`SLOTS`] slots. Message i of an exchange goes to slot i mod slots: a 64-byte header (the
//! op's descriptor and number, the payload's length), then the payload. The sender writes a
//! slot once the receiver has taken the message that last used it, then bumps the pair's
//! `posted` (Release); the receiver copies or sums the payload into place, then bumps the
//! pair's `taken` (Release). One writer per counter, so no lock. Before an exchange returns,
//! the sender waits until the receiver has taken everything, so the next exchange, to any
//! rank, starts with an empty outbox and both ends count its slots from 0. Message 0 of every
//! exchange is the header alone, which the receiver checks before mixing any data.
//!
//! The all-rank phases of the `direct` algorithm ([`SharedMemory::phase`]) use the cells
//! instead: a phase ends when every rank has published it (its sequence counter, Release) and
//! seen everyone else's (Acquire).
//!
//! Waiting spins briefly, yields for a while, then sleeps on a futex with a deadline, and
//! checks the awaited peer's pid every 2 ms so a dead peer is named quickly ([`Patience`]).
//! A phase sleeps on the segment's bell, which every publisher rings; a point-to-point
//! exchange sleeps on this rank's own bell, which only the two peers it waits on ring, so a
//! message wakes the one rank it concerns rather than every rank of the host.

use super::super::error::{CollectiveError, CollectiveOp, OpDesc};
use super::super::liveness::process_exited;
use super::super::reduce::copy;
use super::super::segment::{Bell, Segment};
use super::super::{CollectiveTimeouts, Peers};
use super::{Combine, Exchange, PointToPoint, TransportKind, combine, internal, out_of_step};
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
    /// Staging bytes per rank: the `direct` algorithm uses it in two halves used alternately
    /// (larger data is reduced in pieces of half this size), point-to-point as the outbox.
    pub staging_bytes: usize,
    /// Zero-copy arena bytes per rank ([`crate::collective::ShmCommunicator::arena_mut`]); 0
    /// for none.
    pub arena_bytes: usize,
    /// Hash of the job's token ([`crate::collective::job_token_hash`]); a segment of another
    /// job is refused.
    pub job_token: u64,
}

impl ShmOptions {
    /// 2 MiB staging (1 MiB pieces: they stay in cache; measured fastest for 11 MB), no
    /// arena, token 0.
    pub fn new(path: impl Into<PathBuf>) -> ShmOptions {
        ShmOptions { path: path.into(), staging_bytes: 2 << 20, arena_bytes: 0, job_token: 0 }
    }
}

/// Most slots an outbox is cut into: enough to keep a pipeline going.
const SLOTS: usize = 4;
/// The header at the front of each slot.
const SLOT_HEADER: usize = 64;
/// Smallest slot: a header and 64 bytes of payload.
const MIN_SLOT: usize = 2 * SLOT_HEADER;

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

/// Ranks of one host sharing a segment; see the module docs.
pub struct SharedMemory {
    peers: Peers,
    seg: Segment,
    op_timeout: Duration,
    /// Busy-wait this long before sleeping on the bell; zero when ranks outnumber cores.
    spin: Duration,
    /// Whether ranks outnumber cores.
    oversubscribed: bool,
    /// Slots per outbox, and bytes per slot (a multiple of 64).
    slots: usize,
    slot_bytes: usize,
}

impl SharedMemory {
    /// Joins the segment: rank 0 creates it, the others open it (retrying until
    /// `timeouts.connect`); returns once every rank is in.
    pub(crate) fn join(
        peers: Peers,
        opts: &ShmOptions,
        timeouts: CollectiveTimeouts,
    ) -> Result<SharedMemory, CollectiveError> {
        let staging = (opts.staging_bytes / 4).max(64);
        let arena = opts.arena_bytes / 4;
        let seg = Segment::join(&peers, &opts.path, staging, arena, opts.job_token, timeouts.connect)?;
        let cores = thread::available_parallelism().map_or(1, |n| n.get());
        // Spinning pays only while every rank has a core of its own; it covers the usual skew
        // between ranks in lockstep, and anything longer sleeps on the futex bell.
        let oversubscribed = peers.world() > cores;
        let spin = if oversubscribed { Duration::ZERO } else { Duration::from_micros(50) };
        let slots = (staging * 4 / MIN_SLOT).clamp(1, SLOTS);
        let slot_bytes = (staging * 4 / slots) & !63;
        Ok(SharedMemory { peers, seg, op_timeout: timeouts.op, spin, oversubscribed, slots, slot_bytes })
    }

    pub(crate) fn peers(&self) -> &Peers {
        &self.peers
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Publishes this rank's phase `*seq + 1` (advancing `seq`) and waits until every rank
    /// published it. On an opening (odd) phase it also publishes `desc` and checks everyone
    /// else's against it.
    pub(crate) fn phase(&self, seq: &mut u64, desc: &OpDesc) -> Result<(), CollectiveError> {
        *seq += 1;
        let target = *seq;
        let opening = target % 2 == 1;
        let (seg, peers) = (&self.seg, &self.peers);
        let rank = peers.rank();
        let me = seg.cell(rank);
        if opening {
            me.kind.store(desc.kind, Ordering::Relaxed);
            me.len.store(desc.len, Ordering::Relaxed);
            me.aux.store(desc.aux, Ordering::Relaxed);
        }
        let mut patience = Patience::new(self, desc.op(), Bell::Everyone);
        me.seq.store(target, Ordering::Release);
        seg.ring(Bell::Everyone);

        let mut q = 0;
        loop {
            let bell = seg.bell(Bell::Everyone);
            while q < peers.world() {
                if q != rank {
                    let c = seg.cell(q);
                    if c.seq.load(Ordering::Acquire) < target {
                        break;
                    }
                    // A peer past phase A is at most in phase B of the same op, so the
                    // descriptor it published is this op's.
                    if opening {
                        let theirs = OpDesc {
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
            patience.wait(q, bell)?;
        }
    }

    /// Slot `i` of `rank`'s outbox.
    fn slot(&self, rank: usize, i: usize) -> *mut u8 {
        (self.seg.staging_ptr(rank) as *mut u8).wrapping_add((i % self.slots) * self.slot_bytes)
    }
}

/// How a rank waits for a peer inside one operation: spinning for `spin`, yielding for
/// [`YIELD_FOR`] (not at all for a point-to-point waiter among more ranks than cores), then
/// asleep on its futex bell, waking at least every 2 ms to check that the awaited peer's
/// process still exists, until the operation timeout.
struct Patience<'a> {
    shm: &'a SharedMemory,
    op: CollectiveOp,
    bell: Bell,
    /// Sleep without yielding first: a point-to-point waiter among more ranks than cores.
    /// Then every yielding waiter stays runnable and takes turns on the cores from the ranks
    /// it waits for, and the cores never idle, so a sleeper's wake-up is cheap. Measured with
    /// 64 ranks as 8 hosts × 8 on 2 cores, 1 KB `hierarchical` over shared memory and TCP:
    /// 4.7–5.2 ms sleeping at once, 5.4–6.2 ms after 200 yields, 6.1–7.2 ms after 8.
    sleep_at_once: bool,
    my_cpu: u64,
    start: Instant,
    next_liveness: Instant,
    spinning: bool,
    polls: u32,
}

impl<'a> Patience<'a> {
    /// Starts waiting now, to sleep on `bell`; publishes the CPU this rank runs on.
    fn new(shm: &'a SharedMemory, op: CollectiveOp, bell: Bell) -> Patience<'a> {
        // SAFETY: no arguments; returns the calling thread's CPU or -1.
        let my_cpu = unsafe { libc::sched_getcpu() } as u64;
        shm.seg.cell(shm.peers.rank()).cpu.store(my_cpu, Ordering::Relaxed);
        let start = Instant::now();
        Patience {
            shm,
            op,
            bell,
            sleep_at_once: shm.oversubscribed && matches!(bell, Bell::Rank(_)),
            my_cpu,
            start,
            next_liveness: start + LIVENESS_EVERY,
            spinning: !shm.spin.is_zero(),
            polls: 0,
        }
    }

    /// Something moved: the timeout counts from now again.
    fn progressed(&mut self) {
        self.start = Instant::now();
        self.spinning = !self.shm.spin.is_zero();
    }

    /// One round of waiting for `q`, called when what this rank waits for has not happened;
    /// `bell` is the bell's value read before looking.
    fn wait(&mut self, q: usize, bell: u32) -> Result<(), CollectiveError> {
        let (seg, peers) = (&self.shm.seg, &self.shm.peers);
        let by = seg.aborted_by();
        if by != 0 && by - 1 != peers.rank() as u64 {
            let peer = usize::try_from(by - 1).ok().filter(|&r| r < peers.world()).map_or("a peer", |r| peers.name(r));
            return Err(CollectiveError::PeerAborted { peer: peer.to_string(), op: self.op });
        }
        if self.spinning {
            self.polls = self.polls.wrapping_add(1);
            if !self.polls.is_multiple_of(64) {
                std::hint::spin_loop();
                return Ok(());
            }
        }
        let now = Instant::now();
        if now >= self.next_liveness {
            let pid = seg.cell(q).pid.load(Ordering::Relaxed);
            if process_exited(pid) {
                return Err(CollectiveError::PeerExited { peer: peers.name(q).to_string(), pid: pid as u32 });
            }
            self.next_liveness = now + LIVENESS_EVERY;
        }
        let (spin, op_timeout) = (self.shm.spin, self.shm.op_timeout);
        let waited = now - self.start;
        if waited >= op_timeout {
            return Err(CollectiveError::Timeout { peer: peers.name(q).to_string(), op: self.op, after: op_timeout });
        }
        // Sharing the awaited peer's CPU, spinning or yielding only delays it: block, so it
        // runs here, and the scheduler places this rank on an idle CPU when it wakes.
        let stacked = seg.cell(q).cpu.load(Ordering::Relaxed) == self.my_cpu;
        if !stacked && waited < spin {
            return Ok(());
        }
        self.spinning = false;
        if !stacked && !self.sleep_at_once && waited < spin + YIELD_FOR {
            thread::yield_now();
            return Ok(());
        }
        seg.sleep(self.bell, bell, (self.next_liveness - now).min(op_timeout - waited));
        Ok(())
    }
}

/// A slot's header: the op's descriptor and number, and the payload's length in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotHeader {
    desc: OpDesc,
    seq: u64,
    bytes: u64,
}

impl SlotHeader {
    /// Writes the header at `slot`.
    ///
    /// # Safety
    /// `slot` is a slot of this rank's outbox that its receiver has taken.
    unsafe fn write(self, slot: *mut u8) {
        let words = [self.desc.kind, self.desc.len, self.desc.aux, self.seq, self.bytes];
        // SAFETY: slots are 64-byte aligned and at least SLOT_HEADER long; per the contract no
        // other rank reads it now.
        unsafe { std::ptr::copy_nonoverlapping(words.as_ptr(), slot as *mut u64, words.len()) };
    }

    /// Reads the header at `slot`.
    ///
    /// # Safety
    /// `slot` holds a message posted (Acquire) and not yet taken.
    unsafe fn read(slot: *const u8) -> SlotHeader {
        let mut w = [0u64; 5];
        // SAFETY: as for `write`; the sender does not touch a slot until it is taken.
        unsafe { std::ptr::copy_nonoverlapping(slot as *const u64, w.as_mut_ptr(), w.len()) };
        SlotHeader { desc: OpDesc { kind: w[0], len: w[1], aux: w[2] }, seq: w[3], bytes: w[4] }
    }
}

/// Where one exchange stands on this rank.
struct Tally<'s> {
    sched: &'s super::Transfers,
    /// Messages this exchange sends (the header, then every send and forward) and receives.
    to_send: usize,
    to_recv: usize,
    sent: usize,
    got: usize,
    /// The pair counters' values when the exchange began.
    sent_before: u64,
    got_before: u64,
    forwarded: Vec<Range<usize>>,
}

impl Tally<'_> {
    /// The byte range message `i` carries, once known (forwards wait for their receipt).
    fn payload(&self, i: usize) -> Option<Range<usize>> {
        let i = i.checked_sub(1)?;
        match self.sched.sends.get(i) {
            Some(r) => Some(r.clone()),
            None => self.forwarded.get(i - self.sched.sends.len()).cloned(),
        }
    }
}

impl SharedMemory {
    /// Posts what can be posted to `to`; whether anything was (then `to`'s bell is rung).
    fn post(&self, to: usize, x: &Exchange<'_>, p: &mut Tally<'_>, data: &[u8]) -> Result<bool, CollectiveError> {
        let pair = self.seg.pair(self.peers.rank(), to);
        let mut moved = false;
        while p.sent < p.to_send {
            let range = match p.sent {
                0 => 0..0,
                i => match p.payload(i) {
                    Some(r) => r,
                    None => break,
                },
            };
            let taken = pair.taken.load(Ordering::Acquire) - p.sent_before;
            if p.sent as u64 - taken >= self.slots as u64 {
                break;
            }
            if range.len() > self.slot_bytes - SLOT_HEADER {
                return Err(internal("a segment larger than a shared-memory slot"));
            }
            let slot = self.slot(self.peers.rank(), p.sent);
            let header = SlotHeader { desc: x.desc, seq: x.seq, bytes: range.len() as u64 };
            // SAFETY: the slot's previous message was taken (checked above), so no rank reads
            // it; the payload fits the slot (checked above) and data is ours.
            unsafe {
                header.write(slot);
                copy_bytes(data[range].as_ptr(), slot.add(SLOT_HEADER), header.bytes as usize);
            }
            p.sent += 1;
            pair.posted.store(p.sent_before + p.sent as u64, Ordering::Release);
            moved = true;
        }
        if moved {
            self.seg.ring(Bell::Rank(to));
        }
        Ok(moved)
    }

    /// Takes what has arrived from `from`; whether anything did (then `from`'s bell is rung).
    fn take(&self, from: usize, x: &Exchange<'_>, p: &mut Tally<'_>, data: &mut [u8]) -> Result<bool, CollectiveError> {
        let pair = self.seg.pair(from, self.peers.rank());
        let mut moved = false;
        while p.got < p.to_recv && pair.posted.load(Ordering::Acquire) > p.got_before + p.got as u64 {
            let slot = self.slot(from, p.got);
            // SAFETY: the message is posted (Acquire above) and we have not taken it.
            let theirs = unsafe { SlotHeader::read(slot) };
            let item = p.got.checked_sub(1).and_then(|i| p.sched.recvs.get(i));
            let want = item.map_or(0, |i| i.range.len()) as u64;
            if (theirs.desc, theirs.seq) != (x.desc, x.seq) || theirs.bytes != want {
                return Err(out_of_step(&self.peers, from, (&x.desc, x.seq), (&theirs.desc, theirs.seq)));
            }
            if let Some(item) = item {
                // SAFETY: the payload lies in the slot and stays until we take it.
                let src = unsafe { std::slice::from_raw_parts(slot.add(SLOT_HEADER), item.range.len()) };
                combine(&mut data[item.range.clone()], src, item.combine)?;
                if item.forward {
                    p.forwarded.push(item.range.clone());
                }
            }
            p.got += 1;
            pair.taken.store(p.got_before + p.got as u64, Ordering::Release);
            moved = true;
        }
        if moved {
            self.seg.ring(Bell::Rank(from));
        }
        Ok(moved)
    }
}

/// Copies `len` bytes through the cache, in f32 words where both ends allow it.
///
/// # Safety
/// Both ranges are valid for `len` bytes and do not overlap; nobody else touches them.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    if len.is_multiple_of(4) && (src as usize).is_multiple_of(4) {
        // SAFETY: forwarded contract; both ends are f32-aligned here.
        unsafe { copy(src as *const f32, dst as *mut f32, len / 4) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

impl PointToPoint for SharedMemory {
    fn peers(&self) -> &Peers {
        &self.peers
    }

    fn kind(&self) -> TransportKind {
        TransportKind::SharedMemory
    }

    fn segment_bytes(&self) -> usize {
        self.slot_bytes - SLOT_HEADER
    }

    fn exchange(&mut self, x: Exchange<'_>, data: &mut [u8]) -> Result<(), CollectiveError> {
        let (rank, world) = (self.peers.rank(), self.peers.world());
        let sched = x.schedule;
        if x.to.is_some_and(|r| r >= world || r == rank) || x.from.is_some_and(|r| r >= world || r == rank) {
            return Err(internal("an exchange with this rank itself or a rank out of range"));
        }
        if (x.to.is_none() && sched.total_sends() > 0) || (x.from.is_none() && !sched.recvs.is_empty()) {
            return Err(internal("a schedule moves data to or from a rank the exchange does not name"));
        }
        if sched.recvs.iter().any(|i| i.combine != Combine::Copy && i.range.len() % i.combine.element_bytes() != 0) {
            return Err(internal("a summed segment of a partial element"));
        }
        let mut p = Tally {
            sched,
            to_send: x.to.map_or(0, |_| 1 + sched.total_sends()),
            to_recv: x.from.map_or(0, |_| 1 + sched.recvs.len()),
            sent: 0,
            got: 0,
            sent_before: x.to.map_or(0, |to| self.seg.pair(rank, to).posted.load(Ordering::Relaxed)),
            got_before: x.from.map_or(0, |from| self.seg.pair(from, rank).taken.load(Ordering::Relaxed)),
            forwarded: Vec::new(),
        };
        let mine = Bell::Rank(rank);
        let mut patience = Patience::new(self, x.desc.op(), mine);
        loop {
            let bell = self.seg.bell(mine);
            let mut moved = match x.to {
                Some(to) => self.post(to, &x, &mut p, data)?,
                None => false,
            };
            if let Some(from) = x.from {
                moved |= self.take(from, &x, &mut p, data)?;
            }
            if moved {
                patience.progressed();
            }
            let drained = x.to.is_none_or(|to| {
                self.seg.pair(rank, to).taken.load(Ordering::Acquire) == p.sent_before + p.sent as u64
            });
            if p.sent == p.to_send && p.got == p.to_recv && drained {
                return Ok(());
            }
            if !moved {
                // Wait on the peer whose move is due: the sender while receipts are missing.
                let q = match (x.from, x.to) {
                    (Some(from), _) if p.got < p.to_recv => from,
                    (_, Some(to)) | (Some(to), None) => to,
                    (None, None) => return Ok(()),
                };
                patience.wait(q, bell)?;
            }
        }
    }

    fn abandon(&mut self) {
        self.seg.abort(self.peers.rank());
    }

    fn overlaps_backward(&self) -> bool {
        false
    }
}
