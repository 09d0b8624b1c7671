//! Setting up the TCP ring. Every rank has already bound its listener (the control plane
//! exchanged the addresses). In one nonblocking loop, until the connect deadline, a rank
//! - dials its next rank (retrying refused or failed attempts every 20 ms), sends a hello
//!   (magic, version, world, its rank, the rank it means to reach, job token hash) and reads
//!   the answer: a refusal fails setup at once, naming the peer and the reason;
//! - accepts its previous rank: a hello that checks out gets an OK; anything else that knocks
//!   (another job's worker, a mis-wired rank, a port scanner) is refused with the reason and
//!   setup goes on waiting for the real peer; if it never comes, the error lists the
//!   refusals.
//!
//! Doing both at once means no rank waits on a third to make progress, and a refusal is
//! never stuck behind a slow neighbour.

use super::Peers;
use super::error::{CollectiveError, Op, Secs};
use super::ring::Link;
use super::stranger::Answer;
use super::tls::Wire;
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
            Refusal::NotPrev => "only the previous rank in the ring may connect to it: the address lists differ",
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

/// Why a hello does not come from the rank expected, or `None` when it does.
fn judge(p: &Peers, h: &Hello, token: u64) -> Option<Refusal> {
    if h.version != VERSION {
        Some(Refusal::Version)
    } else if h.token != token {
        Some(Refusal::Token)
    } else if h.world as usize != p.world() {
        Some(Refusal::World)
    } else if h.to as usize != p.rank() {
        Some(Refusal::NotMe)
    } else if h.from as usize != p.prev() {
        Some(Refusal::NotPrev)
    } else {
        None
    }
}

/// Where dialing the next rank stands.
enum Dial {
    /// Not connected; try again at this instant.
    Idle(Instant),
    /// A nonblocking connect in flight.
    Connecting(Socket),
    /// Hello sent; this much of the answer has arrived.
    Answer(TcpStream, [u8; REPLY], usize),
    Done(TcpStream),
}

/// Connects the ring: returns the links to the next and the previous rank.
pub(crate) fn connect(
    p: &Peers,
    addrs: &[SocketAddr],
    listener: &TcpListener,
    token: u64,
    connect: Duration,
) -> Result<(Link, Link), CollectiveError> {
    let deadline = Instant::now() + connect;
    let next_addr = addrs[p.next()];
    let setup_err = |rank: usize, addr: SocketAddr, e: io::Error| CollectiveError::Io {
        peer: p.name(rank).to_string(),
        addr,
        op: Op::Setup,
        source: e,
    };
    listener.set_nonblocking(true).map_err(|e| setup_err(p.prev(), addrs[p.prev()], e))?;
    let hello = hello_bytes(&Hello {
        version: VERSION,
        world: p.world() as u32,
        from: p.rank() as u32,
        to: p.next() as u32,
        token,
    });
    let mut dial = Dial::Idle(Instant::now());
    let mut last_attempt = String::from("none finished");
    let mut prev: Option<Link> = None;
    let mut pending: Vec<Greeting> = Vec::new();
    let mut refused: Vec<String> = Vec::new();
    loop {
        let now = Instant::now();
        dial = advance(dial, now, p, next_addr, &hello, &mut last_attempt)?;
        if prev.is_none() {
            match listener.accept() {
                Ok((s, from)) => match s.set_nonblocking(true) {
                    Ok(()) => pending.push(Greeting { stream: s, from, hello: [0; HELLO], got: 0, since: now }),
                    Err(e) => refused.push(format!("{from}: {e}")),
                },
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(e) => return Err(setup_err(p.prev(), addrs[p.prev()], e)),
            }
            let mut i = 0;
            while i < pending.len() {
                match pending[i].progress(p, token, now) {
                    Progress::Waiting => i += 1,
                    Progress::Accepted => {
                        let g = pending.swap_remove(i);
                        prev = Some(Link { stream: Wire::Plain(g.stream), peer: p.prev(), addr: addrs[p.prev()] });
                        break;
                    }
                    Progress::Refused(why) => {
                        pending.swap_remove(i);
                        refused.push(why);
                    }
                }
            }
        }
        if let Dial::Done(_) = &dial
            && prev.is_some()
        {
            break;
        }
        if Instant::now() >= deadline {
            return Err(timed_out(p, &dial, prev.is_some(), &refused, listener, (next_addr, &last_attempt), connect));
        }
        thread::sleep(Duration::from_millis(1));
    }
    match (dial, prev) {
        (Dial::Done(s), Some(prev)) => Ok((Link { stream: Wire::Plain(s), peer: p.next(), addr: next_addr }, prev)),
        _ => Err(CollectiveError::Invalid("internal error: setup ended unfinished".into())),
    }
}

/// One step of dialing the next rank: connect, send the hello, read the answer.
fn advance(
    dial: Dial,
    now: Instant,
    p: &Peers,
    next_addr: SocketAddr,
    hello: &[u8; HELLO],
    last_attempt: &mut String,
) -> Result<Dial, CollectiveError> {
    Ok(match dial {
        Dial::Idle(at) if now >= at => match start_connect(next_addr) {
            Ok(s) => Dial::Connecting(s),
            Err(e) => {
                *last_attempt = e.to_string();
                Dial::Idle(now + RETRY)
            }
        },
        Dial::Connecting(s) => match connected(&s) {
            Ok(false) => Dial::Connecting(s),
            Ok(true) => match send_hello(s, hello) {
                Ok(stream) => Dial::Answer(stream, [0; REPLY], 0),
                // It accepted, then closed before taking the hello: not a worker's way.
                Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => {
                    return Err(hung_up(p, next_addr, &[]));
                }
                Err(e) => {
                    *last_attempt = e.to_string();
                    Dial::Idle(now + RETRY)
                }
            },
            Err(e) => {
                *last_attempt = e.to_string();
                Dial::Idle(now + RETRY)
            }
        },
        Dial::Answer(mut s, mut b, got) => match s.read(&mut b[got..]) {
            Ok(0) => return Err(hung_up(p, next_addr, &b[..got])),
            Ok(n) if got + n == REPLY && b[..8] != MAGIC => {
                let what = Answer::of(&more_of(&mut s, &b), false).describe();
                return Err(CollectiveError::Stranger { peer: p.name(p.next()).to_string(), addr: next_addr, what });
            }
            Ok(n) if got + n == REPLY => {
                check_answer(p, &b, next_addr)?;
                Dial::Done(s)
            }
            Ok(n) => Dial::Answer(s, b, got + n),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
                Dial::Answer(s, b, got)
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => {
                return Err(hung_up(p, next_addr, &b[..got]));
            }
            Err(e) => {
                return Err(CollectiveError::Io {
                    peer: p.name(p.next()).to_string(),
                    addr: next_addr,
                    op: Op::Setup,
                    source: e,
                });
            }
        },
        d => d,
    })
}

/// Why setup did not finish in time: who did not connect, accept or answer.
fn timed_out(
    p: &Peers,
    dial: &Dial,
    accepted: bool,
    refused: &[String],
    listener: &TcpListener,
    (next_addr, last_attempt): (SocketAddr, &str),
    connect: Duration,
) -> CollectiveError {
    match (dial, accepted) {
        (Dial::Idle(_) | Dial::Connecting(_), _) => CollectiveError::NotJoined {
            peer: p.name(p.next()).to_string(),
            after: connect,
            detail: format!("nothing accepted a connection at {next_addr} (last attempt: {last_attempt})"),
        },
        (_, false) => CollectiveError::NotJoined {
            peer: p.name(p.prev()).to_string(),
            after: connect,
            detail: if refused.is_empty() {
                format!("it never connected to this rank (listening on {})", addr_of(listener))
            } else {
                format!("it never connected; refused meanwhile: {}", refused.join("; "))
            },
        },
        _ => CollectiveError::Refused {
            peer: p.name(p.next()).to_string(),
            addr: next_addr,
            reason: format!("it did not answer the handshake within {}", Secs(connect)),
        },
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

enum Progress {
    Waiting,
    Accepted,
    /// Why, for the error if the real peer never comes.
    Refused(String),
}

/// Real peers send their hello right after connecting; a stranger that says nothing for this
/// long is dropped.
const GREETING_LIMIT: Duration = Duration::from_secs(2);

impl Greeting {
    /// Reads what arrived; once the hello is complete, answers it.
    fn progress(&mut self, p: &Peers, token: u64, now: Instant) -> Progress {
        let from = self.from;
        match self.stream.read(&mut self.hello[self.got..]) {
            Ok(0) => return Progress::Refused(format!("{from} hung up before greeting")),
            Ok(n) => self.got += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Progress::Refused(format!("{from} failed before greeting ({e})")),
        }
        if self.got < HELLO {
            if self.got >= 8 && self.hello[..8] != MAGIC {
                return Progress::Refused(format!("{from} is not a trainrun worker (wrong greeting)"));
            }
            if now.saturating_duration_since(self.since) > GREETING_LIMIT {
                return Progress::Refused(format!("{from} sent no greeting within {}", Secs(GREETING_LIMIT)));
            }
            return Progress::Waiting;
        }
        let Some(h) = parse_hello(&self.hello) else {
            return Progress::Refused(format!("{from} is not a trainrun worker (wrong greeting)"));
        };
        let verdict = judge(p, &h, token);
        let mut reply = [0u8; REPLY];
        reply[..8].copy_from_slice(&MAGIC);
        reply[8..12].copy_from_slice(&verdict.map_or(0, |v| v as u32).to_le_bytes());
        reply[12..16].copy_from_slice(&(p.rank() as u32).to_le_bytes());
        // 16 bytes into a fresh socket's empty send buffer: written whole or not at all.
        let sent = self.stream.write_all(&reply);
        match (verdict, sent) {
            (None, Ok(())) => Progress::Accepted,
            (None, Err(e)) => Progress::Refused(format!("{from} vanished during the handshake ({e})")),
            (Some(v), _) => Progress::Refused(format!("{from} claiming rank {}: {}", h.from, v.reason())),
        }
    }
}

/// The next rank closed the connection after sending `got` (less than a whole answer).
fn hung_up(p: &Peers, addr: SocketAddr, got: &[u8]) -> CollectiveError {
    let peer = p.name(p.next()).to_string();
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
fn check_answer(p: &Peers, b: &[u8; REPLY], addr: SocketAddr) -> Result<(), CollectiveError> {
    let refused = |reason: String| CollectiveError::Refused { peer: p.name(p.next()).to_string(), addr, reason };
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
        assert_eq!(judge(&p, &back, 9), None);
        assert_eq!(judge(&p, &back, 8), Some(Refusal::Token));
        assert_eq!(judge(&p, &Hello { from: 1, ..back }, 9), Some(Refusal::NotPrev));
        assert_eq!(judge(&p, &Hello { to: 1, from: 2, version: VERSION, world: 3, token: 9 }, 9), Some(Refusal::NotMe));
        assert!(parse_hello(&[0u8; HELLO]).is_none());
        for r in [Refusal::Version, Refusal::Token, Refusal::World, Refusal::NotMe, Refusal::NotPrev] {
            assert_eq!(Refusal::from_code(r as u32), Some(r));
        }
    }
}
