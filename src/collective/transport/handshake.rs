//! Setting up the TCP transport's connections. Every rank has already bound its listener (the
//! control plane exchanged the addresses). In one nonblocking loop, until the connect deadline,
//! a rank
//! - dials every rank it sends to (retrying refused or failed attempts every 20 ms), sends a
//!   hello (magic, version, world, its rank, the rank it means to reach, job token hash) and
//!   reads the answer: a refusal fails setup at once, naming the peer and the reason;
//! - accepts every rank it receives from: a hello that checks out gets an OK; anything else
//!   that knocks (another job's worker, a mis-wired rank, a port scanner) is refused with the
//!   reason and setup goes on waiting for the real peers; if one never comes, the error lists
//!   the refusals.
//!
//! Doing all at once means no rank waits on a third to make progress, and a refusal is never
//! stuck behind a slow neighbour.

use super::super::Peers;
use super::super::error::{CollectiveError, CollectiveOp, Secs};
use super::super::stranger::Answer;
use super::Wiring;
use super::stream::PeerLink;
use super::tls::LinkStream;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

const MAGIC: [u8; 8] = *b"TRAINRUN";
const VERSION: u32 = 1;
const HELLO: usize = 32;
const REPLY: usize = 16;
const RETRY: Duration = Duration::from_millis(20);

/// Why an acceptor refuses a hello; the number travels in the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Version = 1,
    Token = 2,
    World = 3,
    NotMe = 4,
    NotPrev = 5,
}

impl Refusal {
    fn from_code(c: u32) -> Option<Refusal> {
        [Refusal::Version, Refusal::Token, Refusal::World, Refusal::NotMe, Refusal::NotPrev]
            .into_iter()
            .find(|r| *r as u32 == c)
    }

    fn reason(self) -> &'static str {
        match self {
            Refusal::Version => "it runs another version of the trainrun ring protocol",
            Refusal::Token => "the job tokens differ (is it another job's worker?)",
            Refusal::World => "the world sizes differ",
            Refusal::NotMe => "it is not the rank this one meant to reach: the address lists differ",
            Refusal::NotPrev => {
                "only the ranks it receives from may connect to it, once each: the address lists differ"
            }
        }
    }
}

struct Hello {
    version: u32,
    world: u32,
    from: u32,
    to: u32,
    token: u64,
}

fn hello_bytes(h: &Hello) -> [u8; HELLO] {
    let mut b = [0u8; HELLO];
    b[..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&h.version.to_le_bytes());
    b[12..16].copy_from_slice(&h.world.to_le_bytes());
    b[16..20].copy_from_slice(&h.from.to_le_bytes());
    b[20..24].copy_from_slice(&h.to.to_le_bytes());
    b[24..32].copy_from_slice(&h.token.to_le_bytes());
    b
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    let mut w = [0u8; 4];
    w.copy_from_slice(&b[i..i + 4]);
    u32::from_le_bytes(w)
}

fn parse_hello(b: &[u8; HELLO]) -> Option<Hello> {
    if b[..8] != MAGIC {
        return None;
    }
    let mut t = [0u8; 8];
    t.copy_from_slice(&b[24..32]);
    Some(Hello {
        version: u32_at(b, 8),
        world: u32_at(b, 12),
        from: u32_at(b, 16),
        to: u32_at(b, 20),
        token: u64::from_le_bytes(t),
    })
}

/// Why a hello does not come from a rank still expected (`waiting`), or `None` when it does.
fn judge(p: &Peers, h: &Hello, token: u64, waiting: &[usize]) -> Option<Refusal> {
    if h.version != VERSION {
        Some(Refusal::Version)
    } else if h.token != token {
        Some(Refusal::Token)
    } else if h.world as usize != p.world() {
        Some(Refusal::World)
    } else if h.to as usize != p.rank() {
        Some(Refusal::NotMe)
    } else if !waiting.contains(&(h.from as usize)) {
        Some(Refusal::NotPrev)
    } else {
        None
    }
}

/// Where dialing a rank stands.
enum Dial {
    /// Not connected; try again at this instant.
    Idle(Instant),
    /// A nonblocking connect in flight.
    Connecting(Socket),
    /// Hello sent; this much of the answer has arrived.
    Answer(TcpStream, [u8; REPLY], usize),
    Done(TcpStream),
}

/// One rank this rank sends to: where dialing it stands.
struct Dialing {
    peer: usize,
    addr: SocketAddr,
    hello: [u8; HELLO],
    state: Dial,
    /// Why the last attempt failed, for the error if none succeeds.
    last_attempt: String,
}

/// Connects what `wiring` lists: returns the connections to every rank this one sends to and
/// from every rank it receives from, in the wiring's order.
pub(crate) fn connect(
    p: &Peers,
    addrs: &[SocketAddr],
    listener: &TcpListener,
    token: u64,
    wiring: &Wiring,
    connect: Duration,
) -> Result<(Vec<PeerLink>, Vec<PeerLink>), CollectiveError> {
    let deadline = Instant::now() + connect;
    let mut dials = Vec::with_capacity(wiring.sends_to.len());
    for &peer in &wiring.sends_to {
        let addr = *addrs.get(peer).ok_or_else(|| {
            CollectiveError::Invalid(format!("rank {peer} has no address among {} addresses", addrs.len()))
        })?;
        let hello = Hello { version: VERSION, world: p.world() as u32, from: p.rank() as u32, to: peer as u32, token };
        dials.push(Dialing {
            peer,
            addr,
            hello: hello_bytes(&hello),
            state: Dial::Idle(Instant::now()),
            last_attempt: String::from("none finished"),
        });
    }
    // Whom listener errors are about: the first rank expected to connect.
    let first_in = wiring.receives_from.first().copied().unwrap_or(p.rank());
    let setup_err = |rank: usize, e: io::Error| CollectiveError::Io {
        peer: p.name(rank).to_string(),
        addr: addrs.get(rank).copied().unwrap_or_else(|| addr_or_unspecified(listener)),
        op: CollectiveOp::Setup,
        source: e,
    };
    listener.set_nonblocking(true).map_err(|e| setup_err(first_in, e))?;
    let mut accepted: Vec<Option<TcpStream>> = wiring.receives_from.iter().map(|_| None).collect();
    let mut pending: Vec<Greeting> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    loop {
        let now = Instant::now();
        for d in &mut dials {
            advance(d, now, p)?;
        }
        if accepted.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((s, from)) => match s.set_nonblocking(true) {
                    Ok(()) => pending.push(Greeting { stream: s, from, hello: [0; HELLO], got: 0, since: now }),
                    Err(e) => refused.push(format!("{from}: {e}")),
                },
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(setup_err(first_in, e)),
            }
            let waiting: Vec<usize> =
                wiring.receives_from.iter().zip(&accepted).filter(|(_, a)| a.is_none()).map(|(r, _)| *r).collect();
            let mut i = 0;
            while i < pending.len() {
                match pending[i].progress(p, token, &waiting, now) {
                    Knock::Waiting => i += 1,
                    Knock::Accepted(from) => {
                        let g = pending.swap_remove(i);
                        if let Some(slot) = wiring.receives_from.iter().position(|&r| r == from) {
                            accepted[slot] = Some(g.stream);
                        }
                        break;
                    }
                    Knock::Refused(why) => {
                        pending.swap_remove(i);
                        refused.push(why);
                    }
                }
            }
        }
        if dials.iter().all(|d| matches!(d.state, Dial::Done(_))) && accepted.iter().all(Option::is_some) {
            break;
        }
        if Instant::now() >= deadline {
            return Err(timed_out(p, &dials, (&wiring.receives_from, &accepted), &refused, listener, connect));
        }
        thread::sleep(Duration::from_millis(1));
    }
    let mut outs = Vec::with_capacity(dials.len());
    for d in dials {
        let Dial::Done(s) = d.state else {
            return Err(CollectiveError::Invalid("internal error: setup ended unfinished".into()));
        };
        outs.push(PeerLink { stream: LinkStream::Plain(s), peer: d.peer, addr: d.addr });
    }
    let mut ins = Vec::with_capacity(accepted.len());
    for (&peer, s) in wiring.receives_from.iter().zip(accepted) {
        let Some(s) = s else {
            return Err(CollectiveError::Invalid("internal error: setup ended unfinished".into()));
        };
        ins.push(PeerLink {
            stream: LinkStream::Plain(s),
            peer,
            addr: addrs.get(peer).copied().unwrap_or_else(|| addr_or_unspecified(listener)),
        });
    }
    Ok((outs, ins))
}

fn addr_or_unspecified(l: &TcpListener) -> SocketAddr {
    l.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// One step of dialing a rank: connect, send the hello, read the answer.
fn advance(d: &mut Dialing, now: Instant, p: &Peers) -> Result<(), CollectiveError> {
    let state = std::mem::replace(&mut d.state, Dial::Idle(now));
    d.state = match state {
        Dial::Idle(at) if now >= at => match start_connect(d.addr) {
            Ok(s) => Dial::Connecting(s),
            Err(e) => {
                d.last_attempt = e.to_string();
                Dial::Idle(now + RETRY)
            }
        },
        Dial::Connecting(s) => match connected(&s) {
            Ok(false) => Dial::Connecting(s),
            Ok(true) => match send_hello(s, &d.hello) {
                Ok(stream) => Dial::Answer(stream, [0; REPLY], 0),
                // It accepted, then closed before taking the hello: not a worker's way.
                Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                    return Err(hung_up(p, d, &[]));
                }
                Err(e) => {
                    d.last_attempt = e.to_string();
                    Dial::Idle(now + RETRY)
                }
            },
            Err(e) => {
                d.last_attempt = e.to_string();
                Dial::Idle(now + RETRY)
            }
        },
        Dial::Answer(mut s, mut b, got) => match s.read(&mut b[got..]) {
            Ok(0) => return Err(hung_up(p, d, &b[..got])),
            Ok(n) if got + n == REPLY && b[..8] != MAGIC => {
                let what = Answer::of(&more_of(&mut s, &b), false).describe();
                return Err(CollectiveError::Stranger { peer: p.name(d.peer).to_string(), addr: d.addr, what });
            }
            Ok(n) if got + n == REPLY => {
                check_answer(p, d, &b)?;
                Dial::Done(s)
            }
            Ok(n) => Dial::Answer(s, b, got + n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                Dial::Answer(s, b, got)
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => {
                return Err(hung_up(p, d, &b[..got]));
            }
            Err(e) => {
                return Err(CollectiveError::Io {
                    peer: p.name(d.peer).to_string(),
                    addr: d.addr,
                    op: CollectiveOp::Setup,
                    source: e,
                });
            }
        },
        other => other,
    };
    Ok(())
}

/// Why setup did not finish in time: who did not accept, connect or answer.
fn timed_out(
    p: &Peers,
    dials: &[Dialing],
    (receives_from, accepted): (&[usize], &[Option<TcpStream>]),
    refused: &[String],
    listener: &TcpListener,
    connect: Duration,
) -> CollectiveError {
    if let Some(d) = dials.iter().find(|d| matches!(d.state, Dial::Idle(_) | Dial::Connecting(_))) {
        return CollectiveError::NotJoined {
            peer: p.name(d.peer).to_string(),
            after: connect,
            detail: format!("nothing accepted a connection at {} (last attempt: {})", d.addr, d.last_attempt),
        };
    }
    if let Some((&peer, _)) = receives_from.iter().zip(accepted).find(|(_, a)| a.is_none()) {
        return CollectiveError::NotJoined {
            peer: p.name(peer).to_string(),
            after: connect,
            detail: if refused.is_empty() {
                format!("it never connected to this rank (listening on {})", addr_of(listener))
            } else {
                format!("it never connected; refused meanwhile: {}", refused.join("; "))
            },
        };
    }
    match dials.iter().find(|d| !matches!(d.state, Dial::Done(_))) {
        Some(d) => CollectiveError::Refused {
            peer: p.name(d.peer).to_string(),
            addr: d.addr,
            reason: format!("it did not answer the handshake within {}", Secs(connect)),
        },
        None => CollectiveError::Invalid("internal error: setup timed out with every connection made".into()),
    }
}

fn start_connect(addr: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_nonblocking(true)?;
    match s.connect(&SockAddr::from(addr)) {
        Ok(()) => Ok(s),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) || e.kind() == io::ErrorKind::WouldBlock => Ok(s),
        Err(e) => Err(e),
    }
}

/// Whether a nonblocking connect finished (Ok(true)), is still going (Ok(false)) or failed.
fn connected(s: &Socket) -> io::Result<bool> {
    let mut fd = libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
    // SAFETY: one live pollfd for the duration of the call; a zero timeout never blocks.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    if n <= 0 {
        return Ok(false);
    }
    match s.take_error()? {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

fn send_hello(s: Socket, hello: &[u8; HELLO]) -> io::Result<TcpStream> {
    let mut stream: TcpStream = s.into();
    // A fresh socket's send buffer takes 32 bytes whole; blocking briefly keeps this simple.
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(hello)?;
    stream.set_nonblocking(true)?;
    Ok(stream)
}

/// An accepted connection whose hello is still arriving. Nothing here blocks: a rank stuck
/// reading one peer's hello would never send its own, and around a ring that deadlocks.
struct Greeting {
    stream: TcpStream,
    from: SocketAddr,
    hello: [u8; HELLO],
    got: usize,
    since: Instant,
}

enum Knock {
    Waiting,
    /// A hello from this rank, which was expected.
    Accepted(usize),
    /// Why, for the error if the real peer never comes.
    Refused(String),
}

/// Real peers send their hello right after connecting; a stranger that says nothing for this
/// long is dropped.
const GREETING_LIMIT: Duration = Duration::from_secs(2);

impl Greeting {
    /// Reads what arrived; once the hello is complete, answers it.
    fn progress(&mut self, p: &Peers, token: u64, waiting: &[usize], now: Instant) -> Knock {
        let from = self.from;
        match self.stream.read(&mut self.hello[self.got..]) {
            Ok(0) => return Knock::Refused(format!("{from} hung up before greeting")),
            Ok(n) => self.got += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Knock::Refused(format!("{from} failed before greeting ({e})")),
        }
        if self.got < HELLO {
            if self.got >= 8 && self.hello[..8] != MAGIC {
                return Knock::Refused(format!("{from} is not a trainrun worker (wrong greeting)"));
            }
            if now.saturating_duration_since(self.since) > GREETING_LIMIT {
                return Knock::Refused(format!("{from} sent no greeting within {}", Secs(GREETING_LIMIT)));
            }
            return Knock::Waiting;
        }
        let Some(h) = parse_hello(&self.hello) else {
            return Knock::Refused(format!("{from} is not a trainrun worker (wrong greeting)"));
        };
        let verdict = judge(p, &h, token, waiting);
        let mut reply = [0u8; REPLY];
        reply[..8].copy_from_slice(&MAGIC);
        reply[8..12].copy_from_slice(&verdict.map_or(0, |v| v as u32).to_le_bytes());
        reply[12..16].copy_from_slice(&(p.rank() as u32).to_le_bytes());
        // 16 bytes into a fresh socket's empty send buffer: written whole or not at all.
        let sent = self.stream.write_all(&reply);
        match (verdict, sent) {
            (None, Ok(())) => Knock::Accepted(h.from as usize),
            (None, Err(e)) => Knock::Refused(format!("{from} vanished during the handshake ({e})")),
            (Some(v), _) => Knock::Refused(format!("{from} claiming rank {}: {}", h.from, v.reason())),
        }
    }
}

/// The dialed rank closed the connection after sending `got` (less than a whole answer).
fn hung_up(p: &Peers, d: &Dialing, got: &[u8]) -> CollectiveError {
    let (peer, addr) = (p.name(d.peer).to_string(), d.addr);
    if got.is_empty() || got.starts_with(&MAGIC[..got.len().min(MAGIC.len())]) {
        return CollectiveError::Refused {
            peer,
            addr,
            reason: "it closed the connection without answering the handshake (is it a trainrun worker? did its own setup fail?)".into(),
        };
    }
    CollectiveError::Stranger { peer, addr, what: Answer::of(got, true).describe() }
}

fn addr_of(l: &TcpListener) -> String {
    l.local_addr().map_or_else(|_| "an unknown address".to_string(), |a| a.to_string())
}

/// `first` and whatever else arrives within a moment (up to a line), to say what answered.
fn more_of(s: &mut TcpStream, first: &[u8]) -> Vec<u8> {
    let mut all = first.to_vec();
    let deadline = Instant::now() + Duration::from_millis(200);
    let mut buf = [0u8; 256];
    while all.len() < 256 && !all.contains(&b'\n') && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                thread::sleep(Duration::from_millis(1));
            }
            Err(_) => break,
        }
    }
    all
}

/// A whole answer from a trainrun worker: its verdict on this rank's hello.
fn check_answer(p: &Peers, d: &Dialing, b: &[u8; REPLY]) -> Result<(), CollectiveError> {
    let refused = |reason: String| CollectiveError::Refused { peer: p.name(d.peer).to_string(), addr: d.addr, reason };
    match u32_at(b, 8) {
        0 => Ok(()),
        c => {
            Err(refused(Refusal::from_code(c).map_or_else(|| format!("refusal code {c}"), |r| r.reason().to_string())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hellos_round_trip_and_strangers_are_judged() {
        let h = Hello { version: VERSION, world: 3, from: 2, to: 0, token: 9 };
        let back = parse_hello(&hello_bytes(&h)).unwrap();
        assert_eq!((back.version, back.world, back.from, back.to, back.token), (VERSION, 3, 2, 0, 9));
        let p = Peers::new(0, vec!["a".into(), "b".into(), "c".into()]).unwrap();
        assert_eq!(judge(&p, &back, 9, &[2]), None);
        assert_eq!(judge(&p, &back, 8, &[2]), Some(Refusal::Token));
        assert_eq!(judge(&p, &Hello { from: 1, ..back }, 9, &[2]), Some(Refusal::NotPrev));
        assert_eq!(judge(&p, &back, 9, &[]), Some(Refusal::NotPrev), "a rank already connected");
        let other = Hello { to: 1, from: 2, version: VERSION, world: 3, token: 9 };
        assert_eq!(judge(&p, &other, 9, &[2]), Some(Refusal::NotMe));
        assert!(parse_hello(&[0u8; HELLO]).is_none());
        for r in [Refusal::Version, Refusal::Token, Refusal::World, Refusal::NotMe, Refusal::NotPrev] {
            assert_eq!(Refusal::from_code(r as u32), Some(r));
        }
    }
}
