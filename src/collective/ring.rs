//! The ring engine under [`super::TcpRing`]: schedules (which byte ranges go to the next
//! rank, which arrive from the previous one, and what to do with them) and one nonblocking
//! loop that runs a schedule.
//!
//! Ring all-reduce over N ranks: the data is cut into N chunks; reduce-scatter (N−1 steps)
//! leaves rank r with the full sum of chunk r+1, all-gather (N−1 steps) passes the sums
//! around. Each chunk travels in segments, and every received segment is summed (or copied)
//! and queued to be forwarded at once, so sending, receiving and summing overlap segment by
//! segment. Rank r's step t+1 sends exactly what it received in step t, so the send queue is
//! "its own chunk, then whatever arrived", which is all the bookkeeping there is.
//!
//! One thread drives both sockets with `poll`: no second thread shares the buffer, so there is
//! no unsafe sharing at all, and on two cores a sender thread would only compete with the
//! peer process. Every collective starts with a 32-byte header on each link (kind, sequence
//! number, length, root) that the receiver checks, so ranks out of step are caught before any
//! data is mixed.
//!
//! Determinism: chunk c is summed in the fixed order c+1, c+2, …, c (ring order starting
//! after its owner); the order depends only on ranks and sizes, so every run gives the same
//! bits, and the all-gather gives every rank the same bits. For two ranks this equals the
//! rank-order sum (a single addition commutes); for more it is a fixed rotation of it.

use super::Peers;
use super::error::{CollectiveError, Op, OpDesc};
use super::reduce::{add_assign_f32, add_assign_f64};
use super::tls::Wire;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

/// What happens to a received segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Combine {
    /// Overwrite the destination (all-gather, broadcast).
    Copy,
    /// Add into the destination as f32 (reduce-scatter).
    SumF32,
    /// Add into the destination as f64.
    SumF64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecvItem {
    /// Byte range of the buffer.
    pub range: Range<usize>,
    pub combine: Combine,
    /// Whether to send it on to the next rank once it is in place.
    pub forward: bool,
}

/// One rank's part of a collective: byte ranges sent first, then every forwarded receipt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Schedule {
    pub sends: Vec<Range<usize>>,
    pub recvs: Vec<RecvItem>,
    pub send_header: bool,
    pub recv_header: bool,
}

/// Element range of chunk `c` when `elems` are cut into `world` near-equal chunks.
fn chunk(elems: usize, world: usize, c: usize) -> Range<usize> {
    let (base, rem) = (elems / world, elems % world);
    let start = c * base + c.min(rem);
    start..start + base + usize::from(c < rem)
}

/// Byte ranges of the segments of an element range.
fn segments(r: Range<usize>, seg_elems: usize, esize: usize) -> impl Iterator<Item = Range<usize>> {
    let seg = seg_elems.max(1);
    (r.start..r.end).step_by(seg).map(move |s| s * esize..(s + seg).min(r.end) * esize)
}

/// Ring all-reduce (reduce-scatter, then all-gather) of `elems` elements of `esize` bytes.
pub(crate) fn all_reduce(
    rank: usize,
    world: usize,
    elems: usize,
    esize: usize,
    seg_elems: usize,
    sum: Combine,
) -> Schedule {
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
    Schedule {
        sends: segments(ring(0), seg_elems, esize).collect(),
        recvs,
        send_header: world > 1,
        recv_header: world > 1,
    }
}

/// Pipelined chain broadcast from `root` around the ring.
pub(crate) fn broadcast(rank: usize, world: usize, root: usize, elems: usize, seg_elems: usize) -> Schedule {
    let pos = (rank + world - root) % world;
    let all: Vec<Range<usize>> = segments(0..elems, seg_elems, 4).collect();
    if world == 1 {
        return Schedule::default();
    }
    if pos == 0 {
        return Schedule { sends: all, recvs: Vec::new(), send_header: true, recv_header: false };
    }
    let forward = pos + 1 < world;
    let recvs = all.into_iter().map(|range| RecvItem { range, combine: Combine::Copy, forward }).collect();
    Schedule { sends: Vec::new(), recvs, send_header: forward, recv_header: true }
}

/// One direction of the ring: the socket (plain or TLS), and whom it leads to.
#[derive(Debug)]
pub(crate) struct Link {
    pub stream: Wire,
    pub peer: usize,
    /// The peer's listening address (what the user configured), for errors.
    pub addr: SocketAddr,
}

pub(crate) const HEADER: usize = 32;

/// The op header: kind, sequence number, length, aux, little-endian.
pub(crate) fn header(desc: &OpDesc, seq: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    for (i, w) in [desc.kind, seq, desc.len, desc.aux].into_iter().enumerate() {
        h[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    h
}

fn parse_header(h: &[u8; HEADER]) -> (OpDesc, u64) {
    let w = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    (OpDesc { kind: w(0), len: w(2), aux: w(3) }, w(1))
}

/// Everything a run needs besides the schedule.
pub(crate) struct Run<'a> {
    pub next: &'a mut Link,
    pub prev: &'a mut Link,
    pub peers: &'a Peers,
    pub desc: OpDesc,
    pub seq: u64,
    pub timeout: Duration,
    /// Reused receive buffer for summed segments; u64 so f32 and f64 views are aligned.
    pub staging: &'a mut Vec<u64>,
}

fn closed(link: &Link, peers: &Peers, op: Op) -> CollectiveError {
    CollectiveError::ConnectionClosed { peer: peers.name(link.peer).to_string(), addr: link.addr, op }
}

fn io_error(link: &Link, peers: &Peers, op: Op, e: io::Error) -> CollectiveError {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => closed(link, peers, op),
        _ => CollectiveError::Io { peer: peers.name(link.peer).to_string(), addr: link.addr, op, source: e },
    }
}

fn internal(what: &str) -> CollectiveError {
    CollectiveError::Invalid(format!("internal error in the ring engine: {what}"))
}

/// Applies a received segment that arrived in staging.
fn combine(dst: &mut [u8], src: &[u8], how: Combine) -> Result<(), CollectiveError> {
    match how {
        Combine::Copy => dst.copy_from_slice(src),
        Combine::SumF32 => add_assign_f32(
            bytemuck::try_cast_slice_mut(dst).map_err(|_| internal("misaligned f32 segment"))?,
            bytemuck::try_cast_slice(src).map_err(|_| internal("misaligned f32 staging"))?,
        ),
        Combine::SumF64 => add_assign_f64(
            bytemuck::try_cast_slice_mut(dst).map_err(|_| internal("misaligned f64 segment"))?,
            bytemuck::try_cast_slice(src).map_err(|_| internal("misaligned f64 staging"))?,
        ),
    }
    Ok(())
}

/// Runs `sched` over `data` until every send is written and every receipt applied.
pub(crate) fn run(r: Run<'_>, data: &mut [u8], sched: &Schedule) -> Result<(), CollectiveError> {
    let Run { next, prev, peers, desc, seq, timeout, staging } = r;
    let op = desc.op();
    let hdr_out = header(&desc, seq);
    let mut hdr_in = [0u8; HEADER];
    let biggest = sched.recvs.iter().filter(|i| i.combine != Combine::Copy).map(|i| i.range.len()).max();
    if staging.len() * 8 < biggest.unwrap_or(0) {
        staging.resize(biggest.unwrap_or(0).div_ceil(8), 0);
    }
    let staging: &mut [u8] = bytemuck::cast_slice_mut(staging.as_mut_slice());

    let total_sends = sched.sends.len() + sched.recvs.iter().filter(|i| i.forward).count();
    let mut forwarded: Vec<Range<usize>> = Vec::with_capacity(total_sends - sched.sends.len());
    let (mut hdr_sent, mut send_idx, mut send_off) = (if sched.send_header { 0 } else { HEADER }, 0, 0);
    let (mut hdr_got, mut recv_idx, mut recv_off) = (if sched.recv_header { 0 } else { HEADER }, 0, 0);
    let mut last_send = Instant::now();
    let mut last_recv = last_send;

    loop {
        // Write whatever is ready until the socket is full.
        loop {
            let buf: &[u8] = if hdr_sent < HEADER {
                &hdr_out[hdr_sent..]
            } else if send_idx < total_sends {
                let range = match sched.sends.get(send_idx) {
                    Some(range) => range,
                    None => match forwarded.get(send_idx - sched.sends.len()) {
                        Some(range) => range,
                        None => break, // not received yet
                    },
                };
                &data[range.start + send_off..range.end]
            } else {
                break;
            };
            match next.stream.write(buf) {
                Ok(0) => return Err(closed(next, peers, op)),
                Ok(n) => {
                    last_send = Instant::now();
                    if hdr_sent < HEADER {
                        hdr_sent += n;
                    } else if n == buf.len() {
                        send_idx += 1;
                        send_off = 0;
                    } else {
                        send_off += n;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(next, peers, op, e)),
            }
        }
        // Read whatever has arrived; apply and queue each completed segment.
        loop {
            let item = sched.recvs.get(recv_idx);
            let buf: &mut [u8] = if hdr_got < HEADER {
                &mut hdr_in[hdr_got..]
            } else if let Some(item) = item {
                match item.combine {
                    Combine::Copy => &mut data[item.range.start + recv_off..item.range.end],
                    Combine::SumF32 | Combine::SumF64 => &mut staging[recv_off..item.range.len()],
                }
            } else {
                break;
            };
            match prev.stream.read(buf) {
                Ok(0) => return Err(closed(prev, peers, op)),
                Ok(n) => {
                    last_recv = Instant::now();
                    if hdr_got < HEADER {
                        hdr_got += n;
                        if hdr_got == HEADER {
                            check_header(peers, prev.peer, &desc, seq, &hdr_in)?;
                        }
                        continue;
                    }
                    let Some(item) = item else { break };
                    recv_off += n;
                    if recv_off == item.range.len() {
                        if item.combine != Combine::Copy {
                            combine(&mut data[item.range.clone()], &staging[..item.range.len()], item.combine)?;
                        }
                        if item.forward {
                            forwarded.push(item.range.clone());
                        }
                        recv_idx += 1;
                        recv_off = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error(prev, peers, op, e)),
            }
        }

        // TLS may still hold records of what was written.
        let flushed = match next.stream.flush_pending() {
            Ok(done) => done,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            Err(e) => return Err(io_error(next, peers, op, e)),
        };
        let sending = hdr_sent < HEADER || send_idx < total_sends || !flushed;
        let receiving = hdr_got < HEADER || recv_idx < sched.recvs.len();
        if !sending && !receiving {
            return Ok(());
        }
        // A pending send whose data has not arrived yet waits for the receive side only.
        let can_send = hdr_sent < HEADER || send_idx < sched.sends.len() + forwarded.len() || !flushed;
        let now = Instant::now();
        let stalled = now.saturating_duration_since(last_send.max(last_recv));
        if stalled >= timeout {
            // Blame the direction that went quiet first.
            let blame = if can_send && (!receiving || last_send < last_recv) { &*next } else { &*prev };
            return Err(CollectiveError::Timeout { peer: peers.name(blame.peer).to_string(), op, after: timeout });
        }
        wait(next, prev, can_send, receiving, timeout - stalled).map_err(|e| io_error(prev, peers, op, e))?;
    }
}

fn check_header(
    peers: &Peers,
    from: usize,
    ours: &OpDesc,
    seq: u64,
    got: &[u8; HEADER],
) -> Result<(), CollectiveError> {
    let (theirs, their_seq) = parse_header(got);
    if theirs == *ours && their_seq == seq {
        return Ok(());
    }
    Err(CollectiveError::OutOfStep {
        peer: peers.name(from).to_string(),
        ours: format!("collective #{seq} ({})", ours.describe(peers)),
        theirs: format!("collective #{their_seq} ({})", theirs.describe(peers)),
    })
}

/// Blocks until the next link can take data or the previous one has some, or `limit`.
fn wait(next: &Link, prev: &Link, out: bool, input: bool, limit: Duration) -> io::Result<()> {
    let mut fds = [
        libc::pollfd { fd: if out { next.stream.fd() } else { -1 }, events: libc::POLLOUT, revents: 0 },
        libc::pollfd { fd: if input { prev.stream.fd() } else { -1 }, events: libc::POLLIN, revents: 0 },
    ];
    let ms = limit.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: fds is a live array of two pollfd for the duration of the call; negative fds
    // are ignored by poll.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
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
    fn header_round_trips() {
        let d = OpDesc { kind: 4, len: 123, aux: 2 };
        assert_eq!(parse_header(&header(&d, 9)), (d, 9));
    }
}
