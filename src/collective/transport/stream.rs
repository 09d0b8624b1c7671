//! One exchange over byte streams (plain TCP or TLS-sealed, [`LinkStream`]): a single nonblocking
//! loop writes the schedule's sends to the connection to `to` and reads receipts from the
//! connection from `from`, applying each completed segment and queueing it to be sent on at
//! once, so sending, receiving and summing overlap segment by segment.
//!
//! One thread drives both sockets with `poll`: no second thread shares the buffer, so there is
//! no unsafe sharing at all, and on two cores a sender thread would only compete with the
//! peer process. Every exchange starts with a 32-byte header on each connection that moves
//! anything (kind, sequence number, length, root), which the receiver checks, so ranks out of
//! step are caught before any data is mixed.

use super::super::Peers;
use super::super::error::{CollectiveError, CollectiveOp, OpDesc};
use super::tls::LinkStream;
use super::{Combine, Transfers, combine, internal, out_of_step};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::ops::Range;
use std::time::{Duration, Instant};

/// One connection: the socket (plain or TLS), and the rank at its other end.
#[derive(Debug)]
pub(crate) struct PeerLink {
    pub stream: LinkStream,
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
    /// The connection to send on; `None` when this rank sends nothing.
    pub to: Option<&'a mut PeerLink>,
    /// The connection to receive from; `None` when this rank receives nothing.
    pub from: Option<&'a mut PeerLink>,
    pub peers: &'a Peers,
    pub desc: OpDesc,
    pub seq: u64,
    pub timeout: Duration,
    /// Reused receive buffer for summed segments; u64 so f32 and f64 views are aligned.
    pub staging: &'a mut Vec<u64>,
}

fn closed(link: &PeerLink, peers: &Peers, op: CollectiveOp) -> CollectiveError {
    CollectiveError::ConnectionClosed { peer: peers.name(link.peer).to_string(), addr: link.addr, op }
}

fn io_error(link: &PeerLink, peers: &Peers, op: CollectiveOp, e: io::Error) -> CollectiveError {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => closed(link, peers, op),
        _ => CollectiveError::Io { peer: peers.name(link.peer).to_string(), addr: link.addr, op, source: e },
    }
}

/// Runs `sched` over `data` until every send is written and every receipt applied.
pub(crate) fn run(r: Run<'_>, data: &mut [u8], sched: &Transfers) -> Result<(), CollectiveError> {
    let Run { mut to, mut from, peers, desc, seq, timeout, staging } = r;
    let op = desc.op();
    let total_sends = sched.total_sends();
    if (to.is_none() && total_sends > 0) || (from.is_none() && !sched.recvs.is_empty()) {
        return Err(internal("a schedule moves data over a connection the exchange does not have"));
    }
    let hdr_out = header(&desc, seq);
    let mut hdr_in = [0u8; HEADER];
    let biggest = sched.biggest_sum();
    if staging.len() * 8 < biggest {
        staging.resize(biggest.div_ceil(8), 0);
    }
    let staging: &mut [u8] = bytemuck::cast_slice_mut(staging.as_mut_slice());

    let mut forwarded: Vec<Range<usize>> = Vec::with_capacity(total_sends - sched.sends.len());
    let (mut hdr_sent, mut send_idx, mut send_off) = (if to.is_some() { 0 } else { HEADER }, 0, 0);
    let (mut hdr_got, mut recv_idx, mut recv_off) = (if from.is_some() { 0 } else { HEADER }, 0, 0);
    let mut last_send = Instant::now();
    let mut last_recv = last_send;

    loop {
        // Write whatever is ready until the socket is full.
        while let Some(next) = to.as_deref_mut() {
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
        while let Some(prev) = from.as_deref_mut() {
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
                            check_header(peers, prev.peer, (&desc, seq), &hdr_in)?;
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
        let flushed = flush(to.as_deref_mut(), peers, op)?;
        let sending = hdr_sent < HEADER || send_idx < total_sends || !flushed;
        let receiving = hdr_got < HEADER || recv_idx < sched.recvs.len();
        if !sending && !receiving {
            return Ok(());
        }
        // A pending send whose data has not arrived yet waits for the receive side only.
        let can_send = hdr_sent < HEADER || send_idx < sched.sends.len() + forwarded.len() || !flushed;
        let (to, from) = (to.as_deref(), from.as_deref());
        wait_or_time_out((to, from), (can_send, receiving), (last_send, last_recv), peers, op, timeout)?;
    }
}

/// Sends what a sealed connection still holds; `Ok(true)` once nothing is left.
fn flush(to: Option<&mut PeerLink>, peers: &Peers, op: CollectiveOp) -> Result<bool, CollectiveError> {
    let Some(next) = to else { return Ok(true) };
    match next.stream.flush_pending() {
        Ok(done) => Ok(done),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(io_error(next, peers, op, e)),
    }
}

/// The header `got` that `from` opened the exchange with, against this rank's.
fn check_header(peers: &Peers, from: usize, ours: (&OpDesc, u64), got: &[u8; HEADER]) -> Result<(), CollectiveError> {
    let (theirs, their_seq) = parse_header(got);
    if (&theirs, their_seq) == ours {
        return Ok(());
    }
    Err(out_of_step(peers, from, ours, (&theirs, their_seq)))
}

/// After a round in which nothing more could move: the timeout error when nothing has moved
/// for `timeout`, blaming the direction that went quiet first; else waits for the sockets.
fn wait_or_time_out(
    (to, from): (Option<&PeerLink>, Option<&PeerLink>),
    (can_send, receiving): (bool, bool),
    (last_send, last_recv): (Instant, Instant),
    peers: &Peers,
    op: CollectiveOp,
    timeout: Duration,
) -> Result<(), CollectiveError> {
    let stalled = Instant::now().saturating_duration_since(last_send.max(last_recv));
    if stalled >= timeout {
        let blame = if can_send && (!receiving || last_send < last_recv) { to.or(from) } else { from.or(to) };
        let peer = blame.map_or_else(|| peers.me().to_string(), |l| peers.name(l.peer).to_string());
        return Err(CollectiveError::Timeout { peer, op, after: timeout });
    }
    wait(to, from, can_send, receiving, timeout - stalled).map_err(|e| match from.or(to) {
        Some(link) => io_error(link, peers, op, e),
        None => internal("an exchange waited without a connection"),
    })
}

/// Blocks until the connection to `to` can take data or the one from `from` has some, or
/// `limit`.
fn wait(to: Option<&PeerLink>, from: Option<&PeerLink>, out: bool, input: bool, limit: Duration) -> io::Result<()> {
    let fd = |l: Option<&PeerLink>, want: bool| l.filter(|_| want).map_or(-1, |l| l.stream.fd());
    let mut fds = [
        libc::pollfd { fd: fd(to, out), events: libc::POLLOUT, revents: 0 },
        libc::pollfd { fd: fd(from, input), events: libc::POLLIN, revents: 0 },
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
    fn header_round_trips() {
        let d = OpDesc { kind: 4, len: 123, aux: 2 };
        assert_eq!(parse_header(&header(&d, 9)), (d, 9));
    }
}
