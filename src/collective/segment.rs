//! The shared-memory segment: one file (normally under `/dev/shm`) that rank 0 creates
//! exclusively and every other rank maps. Layout, all offsets fixed by the world size and the
//! region sizes, which every rank is given and checks against the header:
//!
//! | offset | what |
//! |---|---|
//! | 0 | header: magic, version, world, staging and arena sizes, job token, abort flag |
//! | 128 + 128·r | rank r's cell: sequence counter, pid, descriptor of its current op; its bell on the second line |
//! | `pairs_off` + 128·(s·world + r) | the counters of messages from rank s to rank r |
//! | `data_off` + r·`stride` | rank r's staging area, then its arena (f32 each) |
//!
//! Header and cells are only touched through atomics: other processes write them at any time.
//! The creator stores the magic last (Release), so whoever loads it (Acquire) sees the rest.
//! Rank 0 unlinks the file as soon as every rank has mapped it, so a crash later leaves
//! nothing behind; a crash during setup leaves a file whose owner is dead, which the next
//! rank 0 replaces.

use super::Peers;
use super::error::CollectiveError;
use super::liveness::process_exited;
use memmap2::{MmapOptions, MmapRaw};
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const MAGIC: u64 = u64::from_le_bytes(*b"TRNSHM\0\x01");
/// 2: the pairs' counters for point-to-point transfers follow the cells. 3: each cell has a
/// bell of its own, rung for point-to-point moves that rank waits on.
const VERSION: u64 = 3;
const CELLS_OFF: usize = 128;
/// Two cache lines per cell: the adjacent-line prefetcher pulls lines in pairs, and a rank
/// spinning on its neighbour's counter must not steal the line its own counter lives in.
const CELL: usize = 128;
/// Two cache lines per pair: its two counters are written by different ranks.
const PAIR: usize = 128;
const POLL: Duration = Duration::from_millis(5);

#[repr(C)]
struct SegmentHeader {
    magic: AtomicU64,
    version: AtomicU64,
    world: AtomicU64,
    staging_floats: AtomicU64,
    arena_floats: AtomicU64,
    job_token: AtomicU64,
    /// 0, or 1 + the rank that gave up first.
    abort: AtomicU64,
    _pad: u64,
    /// Futex word, on its own cache line: bumped on every publish, so a waiter that read it
    /// before checking counters and then sleeps on that value cannot miss a wake-up.
    bell: AtomicU32,
    /// Ranks asleep on the bell; publishers make the wake syscall only when it is nonzero.
    sleepers: AtomicU32,
}

/// One rank's published state.
#[repr(C)]
pub(crate) struct Cell {
    /// Phases this rank has completed; it only grows.
    pub seq: AtomicU64,
    /// The process id, 0 until the rank joined.
    pub pid: AtomicU64,
    /// Descriptor of the op this rank is in: kind, length, extra (root or arena offset).
    pub kind: AtomicU64,
    pub len: AtomicU64,
    pub aux: AtomicU64,
    /// The CPU this rank last published from, so a waiter can tell it shares the peer's CPU.
    pub cpu: AtomicU64,
    _line: [u64; 2],
    /// This rank's own futex word, on the cell's second line (peers ring it while the rank
    /// spins on others' counters): point-to-point senders and receivers ring only the rank
    /// that waits on their move, so a message wakes one sleeper, not the whole host.
    bell: AtomicU32,
    /// Whether this rank sleeps on its bell (0 or 1): ringers skip the syscall otherwise.
    sleepers: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Cell>() <= CELL && std::mem::offset_of!(Cell, bell) == 64);

/// Which futex word a waiter sleeps on and a publisher rings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bell {
    /// The segment's, rung on every phase (`direct`): every rank waits on all the others.
    Everyone,
    /// Rank r's: rung by the peers whose point-to-point moves rank r waits on.
    Rank(usize),
}

/// The counters of one ordered pair of ranks (sender, receiver) for point-to-point transfers,
/// on two cache lines: each is written by one end and read by the other.
#[repr(C)]
pub(crate) struct PairCounters {
    /// Messages the sender has posted for the receiver; only grows.
    pub posted: AtomicU64,
    _line: [u64; 7],
    /// Of those, the messages the receiver has taken; only grows.
    pub taken: AtomicU64,
}

/// Byte layout for a world and region sizes; `None` when it overflows.
#[derive(Debug, Clone, Copy, PartialEq)]
struct SegmentLayout {
    pairs_off: usize,
    data_off: usize,
    stride: usize,
    total: usize,
}

impl SegmentLayout {
    fn new(world: usize, staging: usize, arena: usize) -> Option<SegmentLayout> {
        let pairs_off = CELLS_OFF.checked_add(CELL.checked_mul(world)?)?;
        let data_off = pairs_off.checked_add(PAIR.checked_mul(world.checked_mul(world)?)?)?.next_multiple_of(4096);
        let region = staging.checked_add(arena)?.checked_mul(4)?.next_multiple_of(4096);
        // An odd number of cache lines past a page keeps slots from sharing their low 12
        // address bits, so loads from one slot never falsely wait on stores to another.
        let stride = region.checked_add(5 * 64)?;
        let total = data_off.checked_add(stride.checked_mul(world)?)?;
        Some(SegmentLayout { pairs_off, data_off, stride, total })
    }
}

/// A mapped segment. Send and Sync: all shared state is atomics or raw memory whose use the
/// communicator's phase protocol serializes.
pub(crate) struct Segment {
    map: MmapRaw,
    path: PathBuf,
    world: usize,
    staging: usize,
    arena: usize,
    layout: SegmentLayout,
    file: FileGuard,
}

/// Rank 0 owns the file from creating it until everyone mapped it: dropping the guard then
/// removes it, so no error path leaves it behind.
struct FileGuard {
    path: PathBuf,
    owned: bool,
}

impl FileGuard {
    fn release(&mut self) {
        if self.owned {
            let _ = fs::remove_file(&self.path);
            self.owned = false;
        }
    }
}

impl Drop for FileGuard {
    fn drop(&mut self) {
        self.release();
    }
}

impl Segment {
    /// Creates (rank 0) or opens (others) the segment, registers this process and waits
    /// until every rank did, all within `connect`.
    pub(crate) fn join(
        peers: &Peers,
        path: &Path,
        staging: usize,
        arena: usize,
        job_token: u64,
        connect: Duration,
    ) -> Result<Segment, CollectiveError> {
        let layout = SegmentLayout::new(peers.world(), staging, arena).ok_or_else(|| {
            CollectiveError::Invalid(format!(
                "a shared-memory segment for {} ranks of {staging} + {arena} floats does not fit in memory",
                peers.world()
            ))
        })?;
        let deadline = Instant::now() + connect;
        let wanted = Wanted { path, world: peers.world(), staging, arena, job_token, layout };
        let mut seg =
            if peers.rank() == 0 { create(&wanted, deadline)? } else { open(peers, &wanted, deadline, connect)? };
        seg.register(peers)?;
        seg.wait_for_all(peers, deadline, connect)?;
        seg.file.release();
        Ok(seg)
    }

    pub(crate) fn staging_floats(&self) -> usize {
        self.staging
    }

    pub(crate) fn arena_floats(&self) -> usize {
        self.arena
    }

    fn header(&self) -> &SegmentHeader {
        // SAFETY: the mapping is page-aligned and at least `layout.total` >= 4096 bytes long;
        // any bit pattern is a valid atomic, and atomics may be shared across processes.
        unsafe { &*(self.map.as_ptr() as *const SegmentHeader) }
    }

    pub(crate) fn cell(&self, rank: usize) -> &Cell {
        let rank = rank.min(self.world - 1);
        // SAFETY: as for `header`: cells lie inside the header page(s), 128-byte aligned.
        unsafe { &*(self.map.as_ptr().add(CELLS_OFF + rank * CELL) as *const Cell) }
    }

    /// The counters of messages from rank `from` to rank `to`.
    pub(crate) fn pair(&self, from: usize, to: usize) -> &PairCounters {
        let (from, to) = (from.min(self.world - 1), to.min(self.world - 1));
        // SAFETY: as for `header`: pairs lie between the cells and the data, 128-byte aligned.
        unsafe {
            &*(self.map.as_ptr().add(self.layout.pairs_off + (from * self.world + to) * PAIR) as *const PairCounters)
        }
    }

    /// Start of rank `rank`'s staging area (`staging_floats` long, 64-byte aligned).
    pub(crate) fn staging_ptr(&self, rank: usize) -> *mut f32 {
        let rank = rank.min(self.world - 1);
        // SAFETY: data_off + rank * stride + region <= total, the mapping's length.
        unsafe { self.map.as_mut_ptr().add(self.layout.data_off + rank * self.layout.stride) as *mut f32 }
    }

    /// Start of rank `rank`'s arena (`arena_floats` long).
    pub(crate) fn arena_ptr(&self, rank: usize) -> *mut f32 {
        // SAFETY: the arena follows the staging area inside the same region.
        unsafe { self.staging_ptr(rank).add(self.staging) }
    }

    /// 1 + the rank that gave up first, or 0.
    pub(crate) fn aborted_by(&self) -> u64 {
        self.header().abort.load(Ordering::Acquire)
    }

    /// Tells every peer this rank gave up, unless someone already did.
    pub(crate) fn abort(&self, rank: usize) {
        let _ = self.header().abort.compare_exchange(0, rank as u64 + 1, Ordering::AcqRel, Ordering::Acquire);
        self.ring(Bell::Everyone);
        for r in 0..self.world {
            self.ring(Bell::Rank(r));
        }
    }

    /// The bell's futex word and its sleeper count.
    fn bell_words(&self, bell: Bell) -> (&AtomicU32, &AtomicU32) {
        match bell {
            Bell::Everyone => (&self.header().bell, &self.header().sleepers),
            Bell::Rank(r) => {
                let c = self.cell(r);
                (&c.bell, &c.sleepers)
            }
        }
    }

    /// The bell's value; read it before checking what you wait for, then [`Segment::sleep`]
    /// on it.
    pub(crate) fn bell(&self, bell: Bell) -> u32 {
        self.bell_words(bell).0.load(Ordering::SeqCst)
    }

    /// Wakes everyone asleep on the bell; call after publishing.
    pub(crate) fn ring(&self, bell: Bell) {
        let (word, sleepers) = self.bell_words(bell);
        word.fetch_add(1, Ordering::SeqCst);
        if sleepers.load(Ordering::SeqCst) > 0 {
            // SAFETY: the bell is a live, aligned u32 inside the shared mapping; FUTEX_WAKE
            // does not access memory beyond it. Shared (not PRIVATE) because the waiters are
            // other processes.
            unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32) };
        }
    }

    /// Sleeps until the bell moves past `seen` or `limit` passes (whichever first; spurious
    /// wake-ups are fine: callers re-check).
    pub(crate) fn sleep(&self, bell: Bell, seen: u32, limit: Duration) {
        let (word, sleepers) = self.bell_words(bell);
        sleepers.fetch_add(1, Ordering::SeqCst);
        let ts = libc::timespec {
            // `as _`: the field's own type (`libc::time_t` is deprecated on musl, whose width changes).
            tv_sec: limit.as_secs().min(i32::MAX as u64) as _,
            tv_nsec: limit.subsec_nanos() as libc::c_long,
        };
        // SAFETY: as in ring; FUTEX_WAIT only reads the word, and ts outlives the call.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &ts as *const libc::timespec,
                0usize,
                0u32,
            )
        };
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    fn register(&self, peers: &Peers) -> Result<(), CollectiveError> {
        let me = std::process::id() as u64;
        match self.cell(peers.rank()).pid.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(()),
            // Rank 0 wrote its pid while creating the header.
            Err(other) if other == me => Ok(()),
            Err(other) => Err(self.error(format!(
                "another process (pid {other}) already joined as {}; do two workers share a rank?",
                peers.me()
            ))),
        }
    }

    fn wait_for_all(&self, peers: &Peers, deadline: Instant, connect: Duration) -> Result<(), CollectiveError> {
        loop {
            let mut missing = None;
            for q in 0..peers.world() {
                let pid = self.cell(q).pid.load(Ordering::Acquire);
                if pid == 0 {
                    missing.get_or_insert(q);
                } else if process_exited(pid) {
                    return Err(CollectiveError::PeerExited { peer: peers.name(q).to_string(), pid: pid as u32 });
                }
            }
            let Some(q) = missing else { return Ok(()) };
            if Instant::now() >= deadline {
                return Err(CollectiveError::NotJoined {
                    peer: peers.name(q).to_string(),
                    after: connect,
                    detail: format!("it never opened the shared-memory segment {}", self.path.display()),
                });
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn error(&self, detail: String) -> CollectiveError {
        CollectiveError::Segment { path: self.path.clone(), detail }
    }
}

fn seg_err(path: &Path, what: &str, e: io::Error) -> CollectiveError {
    CollectiveError::Segment { path: path.to_path_buf(), detail: format!("{what}: {e}") }
}

fn map(file: &File, path: &Path, len: usize) -> Result<MmapRaw, CollectiveError> {
    // Faulting every page in now keeps first-touch page faults out of the first collectives.
    MmapOptions::new().len(len).populate().map_raw(file).map_err(|e| seg_err(path, "cannot map it", e))
}

/// The segment a rank asks for: where, for how many ranks, with which region sizes, for which
/// job.
#[derive(Clone, Copy)]
struct Wanted<'a> {
    path: &'a Path,
    world: usize,
    staging: usize,
    arena: usize,
    job_token: u64,
    layout: SegmentLayout,
}

fn create(w: &Wanted<'_>, deadline: Instant) -> Result<Segment, CollectiveError> {
    let Wanted { path, world, staging, arena, job_token, layout } = *w;
    let file = loop {
        match File::options().read(true).write(true).create_new(true).mode(0o600).open(path) {
            Ok(f) => break f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && Instant::now() < deadline => {
                remove_if_stale(path, deadline)?;
            }
            Err(e) => return Err(seg_err(path, "cannot create it", e)),
        }
    };
    let guard = FileGuard { path: path.to_path_buf(), owned: true };
    file.set_len(layout.total as u64).map_err(|e| seg_err(path, "cannot size it", e))?;
    let seg = Segment {
        map: map(&file, path, layout.total)?,
        path: path.to_path_buf(),
        world,
        staging,
        arena,
        layout,
        file: guard,
    };
    let h = seg.header();
    h.version.store(VERSION, Ordering::Relaxed);
    h.world.store(world as u64, Ordering::Relaxed);
    h.staging_floats.store(staging as u64, Ordering::Relaxed);
    h.arena_floats.store(arena as u64, Ordering::Relaxed);
    h.job_token.store(job_token, Ordering::Relaxed);
    seg.cell(0).pid.store(std::process::id() as u64, Ordering::Relaxed);
    h.magic.store(MAGIC, Ordering::Release);
    Ok(seg)
}

/// What a segment file's header says, read with `pread` (no mapping needed to judge it).
struct Peek {
    magic: u64,
    world: u64,
    staging: u64,
    arena: u64,
    job_token: u64,
    pid0: u64,
}

fn peek(file: &File) -> Option<Peek> {
    let mut b = [0u8; CELLS_OFF + 16];
    file.read_exact_at(&mut b, 0).ok()?;
    let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    Some(Peek {
        magic: word(0),
        world: word(2),
        staging: word(3),
        arena: word(4),
        job_token: word(5),
        pid0: word(CELLS_OFF / 8 + 1),
    })
}

/// Rank 0 found the path taken. A segment whose creator is dead (a crash during an earlier
/// setup) is removed; one whose creator lives belongs to a running job and is an error.
fn remove_if_stale(path: &Path, deadline: Instant) -> Result<(), CollectiveError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(seg_err(path, "it exists and cannot be read", e)),
    };
    let p = peek(&file).filter(|p| p.magic == MAGIC);
    match p {
        Some(p) if !process_exited(p.pid0) => {
            return Err(CollectiveError::Segment {
                path: path.to_path_buf(),
                detail: format!(
                    "it is in use by a running job (its rank 0 is pid {}); give this job its own path",
                    p.pid0
                ),
            });
        }
        Some(_) => {}
        None => {
            // No magic yet: its creator may be initializing it this very moment. Give it
            // time before calling it stale.
            if Instant::now() + Duration::from_millis(200) < deadline {
                thread::sleep(Duration::from_millis(200));
                if peek(&file).is_some_and(|p| p.magic == MAGIC) {
                    return Ok(());
                }
            }
        }
    }
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(seg_err(path, "a stale copy is in the way and cannot be removed", e)),
    }
}

fn open(peers: &Peers, w: &Wanted<'_>, deadline: Instant, connect: Duration) -> Result<Segment, CollectiveError> {
    let Wanted { path, staging, arena, job_token, layout, .. } = *w;
    let mut seen = format!("it never created the shared-memory segment {}", path.display());
    loop {
        if Instant::now() >= deadline {
            return Err(CollectiveError::NotJoined { peer: peers.name(0).to_string(), after: connect, detail: seen });
        }
        let file = match File::options().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                thread::sleep(POLL);
                continue;
            }
            Err(e) => return Err(seg_err(path, "cannot open it", e)),
        };
        let Some(p) = peek(&file).filter(|p| p.magic == MAGIC) else {
            thread::sleep(POLL);
            continue;
        };
        if process_exited(p.pid0) {
            seen = format!("{} holds only a stale segment whose creator (pid {}) exited", path.display(), p.pid0);
            thread::sleep(POLL);
            continue;
        }
        if p.job_token != job_token {
            return Err(seg_err_text(
                path,
                format!("it belongs to another job (its job token differs; its rank 0 is pid {})", p.pid0),
            ));
        }
        if (p.world, p.staging, p.arena) != (peers.world() as u64, staging as u64, arena as u64) {
            return Err(seg_err_text(
                path,
                format!(
                    "{} created it for {} ranks with {} staging and {} arena floats per rank, \
                     but this rank expects {} ranks, {staging} and {arena}",
                    peers.name(0),
                    p.world,
                    p.staging,
                    p.arena,
                    peers.world()
                ),
            ));
        }
        let len = file.metadata().map_err(|e| seg_err(path, "cannot stat it", e))?.len();
        if len != layout.total as u64 {
            thread::sleep(POLL);
            continue;
        }
        let seg = Segment {
            map: map(&file, path, layout.total)?,
            path: path.to_path_buf(),
            world: peers.world(),
            staging,
            arena,
            layout,
            file: FileGuard { path: path.to_path_buf(), owned: false },
        };
        // The pread above was a hint; the mapping is the truth.
        if seg.header().magic.load(Ordering::Acquire) != MAGIC
            || seg.header().job_token.load(Ordering::Relaxed) != job_token
            || seg.header().version.load(Ordering::Relaxed) != VERSION
        {
            thread::sleep(POLL);
            continue;
        }
        return Ok(seg);
    }
}

fn seg_err_text(path: &Path, detail: String) -> CollectiveError {
    CollectiveError::Segment { path: path.to_path_buf(), detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_keeps_slots_aligned_and_apart() {
        let l = SegmentLayout::new(4, 1000, 0).unwrap();
        assert_eq!(l.data_off % 4096, 0);
        assert!(l.pairs_off + 16 * PAIR <= l.data_off);
        assert_eq!(l.stride % 64, 0);
        assert_ne!(l.stride % 4096, 0);
        assert!(l.stride >= 4000);
        assert_eq!(l.total, l.data_off + 4 * l.stride);
        assert!(SegmentLayout::new(usize::MAX / 2, 10, 0).is_none());
    }
}
