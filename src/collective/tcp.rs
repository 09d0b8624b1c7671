//! TCP ring transport: rank r sends to r+1 and receives from r−1, one connection each way
//! (for two ranks, two connections between the same pair). Works across hosts; the tests and
//! the benchmark also run it over loopback. The collectives themselves are in [`super::ring`].
//!
//! Setup, with its handshake that refuses strangers, is in `handshake.rs`.
//!
//! After setup both sockets are nonblocking with `TCP_NODELAY`; a silent peer is caught by the
//! operation timeout, a dead one by EOF or reset, and either way the error names it.

use super::error::{ALL_REDUCE, BARRIER, BROADCAST, CollectiveError, F64, OpDesc, Secs};
use super::handshake;
use super::ring::{self, Combine, Link, Run, Schedule};
use super::tls::{self, TlsPeers, Upgrade, Wire};
use super::{Communicator, Peers, Timeouts};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// How to set up the ring.
#[derive(Debug)]
pub struct TcpOptions {
    /// Every rank's listening address, by rank.
    pub addrs: Vec<SocketAddr>,
    /// This rank's listener, already bound to `addrs[rank]`.
    pub listener: TcpListener,
    /// Hash of the job's token ([`super::job_token_hash`]); peers with another are refused.
    pub job_token: u64,
    /// Bytes per pipelined segment.
    pub segment_bytes: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` for both links; `None` leaves the kernel's autotuning on.
    pub socket_buffer_bytes: Option<usize>,
    /// Mutual TLS on both links; `None` sends gradients in clear.
    pub tls: Option<TlsPeers>,
}

impl TcpOptions {
    /// Token 0 and 512 KiB segments, the fastest size measured over loopback here.
    pub fn new(addrs: Vec<SocketAddr>, listener: TcpListener) -> TcpOptions {
        TcpOptions { addrs, listener, job_token: 0, segment_bytes: 512 << 10, socket_buffer_bytes: None, tls: None }
    }
}

/// A communicator over a TCP ring; see the module docs.
pub struct TcpRing {
    peers: Peers,
    /// (next, prev); `None` for a world of one.
    links: Option<(Link, Link)>,
    op_timeout: Duration,
    segment_bytes: usize,
    seq: u64,
    staging: Vec<u64>,
    broken: Option<String>,
    /// Links upgraded to mutual TLS (`cluster.tls`).
    encrypted: bool,
}

impl TcpRing {
    /// Connects the ring; see the module docs. Returns once both neighbours shook hands.
    pub fn connect(peers: Peers, opts: TcpOptions, timeouts: Timeouts) -> Result<TcpRing, CollectiveError> {
        if opts.addrs.len() != peers.world() {
            return Err(CollectiveError::Invalid(format!(
                "{} addresses for {} ranks: every rank needs one",
                opts.addrs.len(),
                peers.world()
            )));
        }
        let mut ring = TcpRing {
            links: None,
            op_timeout: timeouts.op,
            segment_bytes: opts.segment_bytes.max(64),
            seq: 0,
            staging: Vec::new(),
            broken: None,
            encrypted: opts.tls.is_some(),
            peers,
        };
        if ring.peers.world() == 1 {
            return Ok(ring);
        }
        let p = &ring.peers;
        let (next, prev) = handshake::connect(p, &opts.addrs, &opts.listener, opts.job_token, timeouts.connect)?;
        for link in [&next, &prev] {
            tune(link.stream.tcp(), opts.socket_buffer_bytes).map_err(|e| CollectiveError::Io {
                peer: p.name(link.peer).to_string(),
                addr: link.addr,
                op: super::Op::Setup,
                source: e,
            })?;
        }
        let (next, prev) = match &opts.tls {
            None => (next, prev),
            Some(t) => secure(p, t, next, prev, timeouts.connect)?,
        };
        ring.links = Some((next, prev));
        Ok(ring)
    }

    fn run(&mut self, desc: OpDesc, data: &mut [u8], sched: &Schedule) -> Result<(), CollectiveError> {
        if let Some(why) = &self.broken {
            return Err(CollectiveError::Broken(why.clone()));
        }
        let Some((next, prev)) = self.links.as_mut() else {
            return Ok(());
        };
        self.seq += 1;
        let run = Run {
            next,
            prev,
            peers: &self.peers,
            desc,
            seq: self.seq,
            timeout: self.op_timeout,
            staging: &mut self.staging,
        };
        let r = ring::run(run, data, sched);
        if let Err(e) = &r
            && e.breaks()
        {
            self.broken = Some(e.to_string());
            // Closing both links tells the neighbours now instead of at their timeout.
            next.stream.shutdown();
            prev.stream.shutdown();
        }
        r
    }

    fn segment_elems(&self, esize: usize) -> usize {
        (self.segment_bytes / esize).max(1)
    }
}

/// Upgrades both links to mutual TLS; a refusal names the peer and why.
fn secure(p: &Peers, t: &TlsPeers, next: Link, prev: Link, within: Duration) -> Result<(Link, Link), CollectiveError> {
    let Link { stream: out, peer: next_peer, addr: next_addr } = next;
    let Link { stream: inc, peer: prev_peer, addr: prev_addr } = prev;
    let refused = |peer: usize, addr: SocketAddr, reason: String| CollectiveError::Refused {
        peer: p.name(peer).to_string(),
        addr,
        reason,
    };
    let (Wire::Plain(out), Wire::Plain(inc)) = (out, inc) else {
        return Err(CollectiveError::Invalid("internal error: a link was upgraded to TLS twice".into()));
    };
    let name = t.names.get(next_peer).map_or("", String::as_str);
    match tls::upgrade(&t.config, out, inc, name, within) {
        Ok((out, inc)) => Ok((
            Link { stream: out, peer: next_peer, addr: next_addr },
            Link { stream: inc, peer: prev_peer, addr: prev_addr },
        )),
        Err(Upgrade::Next(why)) => Err(refused(next_peer, next_addr, why)),
        Err(Upgrade::Prev(why)) => Err(refused(prev_peer, prev_addr, why)),
        Err(Upgrade::Timeout) => {
            Err(refused(next_peer, next_addr, format!("the TLS handshake did not finish within {}", Secs(within))))
        }
    }
}

fn tune(s: &TcpStream, buffer: Option<usize>) -> io::Result<()> {
    s.set_nodelay(true)?;
    if let Some(b) = buffer {
        let sock = socket2::SockRef::from(s);
        sock.set_send_buffer_size(b)?;
        sock.set_recv_buffer_size(b)?;
    }
    s.set_read_timeout(None)?;
    s.set_write_timeout(None)?;
    s.set_nonblocking(true)
}

impl Communicator for TcpRing {
    fn rank(&self) -> usize {
        self.peers.rank()
    }

    fn world(&self) -> usize {
        self.peers.world()
    }

    fn all_reduce_sum(&mut self, data: &mut [f32]) -> Result<(), CollectiveError> {
        if data.is_empty() {
            return Ok(());
        }
        let (rank, world) = (self.peers.rank(), self.peers.world());
        let sched = ring::all_reduce(rank, world, data.len(), 4, self.segment_elems(4), Combine::SumF32);
        let desc = OpDesc { kind: ALL_REDUCE, len: data.len() as u64, aux: 0 };
        self.run(desc, bytemuck::cast_slice_mut(data), &sched)
    }

    fn all_reduce_sum_f64(&mut self, data: &mut [f64]) -> Result<(), CollectiveError> {
        if data.is_empty() {
            return Ok(());
        }
        let (rank, world) = (self.peers.rank(), self.peers.world());
        let sched = ring::all_reduce(rank, world, data.len(), 8, self.segment_elems(8), Combine::SumF64);
        let desc = OpDesc { kind: F64, len: data.len() as u64, aux: 0 };
        self.run(desc, bytemuck::cast_slice_mut(data), &sched)
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CollectiveError> {
        self.peers.check_root(root)?;
        if data.is_empty() {
            return Ok(());
        }
        let (rank, world) = (self.peers.rank(), self.peers.world());
        let sched = ring::broadcast(rank, world, root, data.len(), self.segment_elems(4));
        let desc = OpDesc { kind: BROADCAST, len: data.len() as u64, aux: root as u64 };
        self.run(desc, bytemuck::cast_slice_mut(data), &sched)
    }

    fn barrier(&mut self) -> Result<(), CollectiveError> {
        // One element per chunk, so every rank's contribution travels the whole ring and
        // nobody leaves before everyone arrived.
        let world = self.peers.world();
        let mut token = vec![0.0f32; world];
        let sched = ring::all_reduce(self.peers.rank(), world, world, 4, 1, Combine::SumF32);
        let desc = OpDesc { kind: BARRIER, len: 0, aux: 0 };
        self.run(desc, bytemuck::cast_slice_mut(&mut token), &sched)
    }

    fn transport(&self) -> super::TransportKind {
        super::TransportKind::Tcp
    }

    fn encrypted(&self) -> bool {
        self.encrypted
    }

    fn overlaps_backward(&self) -> bool {
        true
    }
}
