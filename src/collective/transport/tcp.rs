//! The TCP transport: one connection for each (sender, receiver) pair the algorithm's
//! [`Wiring`] lists, dialed by the sender, each used in one direction (the ring: rank r dials
//! r+1 and accepts r−1; for two ranks, two connections between the same pair). Works across
//! hosts; the tests and the benchmark also run it over loopback. With [`TcpOptions::tls`] the
//! connections are upgraded to mutual TLS (`tls.rs`) and the transport is `tcp_tls`.
//!
//! Setup, with its handshake that refuses strangers, is in `handshake.rs`; an exchange runs
//! in `stream.rs`. After setup every socket is nonblocking with `TCP_NODELAY`; a silent peer
//! is caught by the operation timeout, a dead one by EOF or reset, and either way the error
//! names it.

use super::super::error::{CollectiveError, CollectiveOp};
use super::super::{CollectiveTimeouts, Peers};
use super::stream::{self, PeerLink, Run};
use super::tls::{self, TlsPeers};
use super::{Exchange, PointToPoint, TransportKind, Wiring, handshake};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// How to connect.
#[derive(Debug)]
pub struct TcpOptions {
    /// Every rank's listening address, by rank.
    pub addrs: Vec<SocketAddr>,
    /// This rank's listener, already bound to `addrs[rank]`.
    pub listener: TcpListener,
    /// Hash of the job's token ([`crate::collective::job_token_hash`]); peers with another are
    /// refused.
    pub job_token: u64,
    /// Bytes per pipelined segment.
    pub segment_bytes: usize,
    /// `SO_SNDBUF`/`SO_RCVBUF` for every connection; `None` leaves the kernel's autotuning on.
    pub socket_buffer_bytes: Option<usize>,
    /// Mutual TLS on every connection; `None` sends gradients in clear.
    pub tls: Option<TlsPeers>,
}

impl TcpOptions {
    /// Token 0 and 512 KiB segments, the fastest size measured over loopback here.
    pub fn new(addrs: Vec<SocketAddr>, listener: TcpListener) -> TcpOptions {
        TcpOptions { addrs, listener, job_token: 0, segment_bytes: 512 << 10, socket_buffer_bytes: None, tls: None }
    }
}

/// Connections to and from the ranks an algorithm talks to; see the module docs.
pub struct TcpTransport {
    peers: Peers,
    /// Connections this rank sends on, one per rank it sends to.
    outs: Vec<PeerLink>,
    /// Connections this rank receives on, one per rank it receives from.
    ins: Vec<PeerLink>,
    op_timeout: Duration,
    segment_bytes: usize,
    staging: Vec<u64>,
    /// Connections upgraded to mutual TLS (`cluster.tls`).
    encrypted: bool,
}

impl TcpTransport {
    /// Connects what `wiring` lists; returns once every connection shook hands (and finished
    /// its TLS handshake).
    pub(crate) fn connect(
        peers: Peers,
        opts: TcpOptions,
        wiring: &Wiring,
        timeouts: CollectiveTimeouts,
    ) -> Result<TcpTransport, CollectiveError> {
        if opts.addrs.len() != peers.world() {
            return Err(CollectiveError::Invalid(format!(
                "{} addresses for {} ranks: every rank needs one",
                opts.addrs.len(),
                peers.world()
            )));
        }
        let mut t = TcpTransport {
            outs: Vec::new(),
            ins: Vec::new(),
            op_timeout: timeouts.op,
            segment_bytes: opts.segment_bytes.max(64),
            staging: Vec::new(),
            encrypted: opts.tls.is_some(),
            peers,
        };
        if wiring.sends_to.is_empty() && wiring.receives_from.is_empty() {
            return Ok(t);
        }
        let p = &t.peers;
        let (outs, ins) = handshake::connect(p, &opts.addrs, &opts.listener, opts.job_token, wiring, timeouts.connect)?;
        for link in outs.iter().chain(&ins) {
            tune(link.stream.tcp(), opts.socket_buffer_bytes).map_err(|e| CollectiveError::Io {
                peer: p.name(link.peer).to_string(),
                addr: link.addr,
                op: CollectiveOp::Setup,
                source: e,
            })?;
        }
        (t.outs, t.ins) = match &opts.tls {
            None => (outs, ins),
            Some(tls) => tls::secure(p, tls, outs, ins, timeouts.connect)?,
        };
        Ok(t)
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

/// The connection to or from `rank` among `links`, or an error naming what is missing.
fn link<'a>(
    links: &'a mut [PeerLink],
    rank: usize,
    peers: &Peers,
    way: &str,
) -> Result<&'a mut PeerLink, CollectiveError> {
    links.iter_mut().find(|l| l.peer == rank).ok_or_else(|| {
        CollectiveError::Invalid(format!(
            "internal error: the algorithm {way} {}, but its wiring did not list that connection",
            peers.name(rank)
        ))
    })
}

impl PointToPoint for TcpTransport {
    fn peers(&self) -> &Peers {
        &self.peers
    }

    fn kind(&self) -> TransportKind {
        if self.encrypted { TransportKind::TcpTls } else { TransportKind::Tcp }
    }

    fn segment_bytes(&self) -> usize {
        self.segment_bytes
    }

    fn exchange(&mut self, x: Exchange<'_>, data: &mut [u8]) -> Result<(), CollectiveError> {
        let peers = &self.peers;
        let to = x.to.map(|r| link(&mut self.outs, r, peers, "sends to")).transpose()?;
        let from = x.from.map(|r| link(&mut self.ins, r, peers, "receives from")).transpose()?;
        let run =
            Run { to, from, peers, desc: x.desc, seq: x.seq, timeout: self.op_timeout, staging: &mut self.staging };
        stream::run(run, data, x.schedule)
    }

    fn abandon(&mut self) {
        // Closing every connection tells the peers now instead of at their timeout.
        for link in self.outs.iter().chain(&self.ins) {
            link.stream.shutdown();
        }
    }

    fn overlaps_backward(&self) -> bool {
        true
    }
}
