//! The parameter-server data plane: plain TCP between the chief, the workers and the ps
//! tasks, one connection per pair, requests answered in order. Plain TCP rather than the
//! tonic control plane: a pull or push moves the whole model (hundreds of KiB) every step,
//! and a length-prefixed frame of raw little-endian values costs one copy each way, where
//! gRPC adds protobuf encoding and HTTP/2 flow-control windows (see DEPENDENCIES.md on
//! tonic's window sizes). As the TCP ring (`collective/handshake.rs`), every connection
//! opens with a hello carrying the job token's hash, refused with a reason when it differs,
//! and every read and write has the cluster's timeout, so a dead peer is an error naming it.
//!
//! Under `cluster.tls` each connection is upgraded to mutual TLS before its hello, as the
//! ring's links are: the dialing task checks that the peer's certificate names the host the
//! cluster gives it, and values, gradients and the token's hash travel in TLS 1.3 records.
//!
//! A frame is `tag: u32, ints: u32, floats: u32`, then `ints` little-endian `u64`s and
//! `floats` little-endian `f32`s.

use crate::cluster::TaskId;
use crate::collective::{LinkStream, RingTls};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

const MAGIC: u64 = u64::from_le_bytes(*b"TRAINPS1");
const VERSION: u64 = 1;
/// Frames larger than this are refused (a stranger's bytes, not a model).
const MAX_VALUES: u32 = 1 << 30;

/// What a frame asks or answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Tag {
    /// `[MAGIC, VERSION, token hash]`: the first frame of a connection.
    Hello = 1,
    /// The request was done; what it returns follows in the frame.
    Ok = 2,
    /// The request failed; the floats are the UTF-8 bytes of the reason, one per value.
    Error = 3,
    /// To a ps: its values (and with `ints = [1]` its optimizer slots and iterations).
    Pull = 4,
    /// To a ps: `ints = [version pulled]`, `floats = [lr, gradients…, state…]`.
    Push = 5,
    /// To a ps: `ints = [iterations]`, `floats = [values…, slots…]` (start and resume).
    Set = 6,
    /// To a worker: `ints = [first step, steps]`, `floats = [lr of each step]`.
    Run = 7,
    /// To any task: training is over; leave.
    Stop = 8,
    /// To a ps, from a worker on its host: `ints = [floats per area]`, the floats the UTF-8
    /// bytes of a shared-memory segment's path, which the ps creates (`shared.rs`); later
    /// pulls and pushes of the connection then carry no floats.
    Share = 9,
}

impl Tag {
    fn from_u32(v: u32) -> Option<Tag> {
        [Tag::Hello, Tag::Ok, Tag::Error, Tag::Pull, Tag::Push, Tag::Set, Tag::Run, Tag::Stop, Tag::Share]
            .into_iter()
            .find(|t| *t as u32 == v)
    }
}

/// One message.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub tag: Tag,
    pub ints: Vec<u64>,
    pub floats: Vec<f32>,
}

impl Frame {
    pub fn new(tag: Tag, ints: Vec<u64>, floats: Vec<f32>) -> Self {
        Self { tag, ints, floats }
    }

    /// An error answer carrying `text`.
    pub fn error(text: &str) -> Self {
        Self::with_text(Tag::Error, Vec::new(), text)
    }

    /// A frame whose floats carry `text`, one UTF-8 byte per value.
    pub fn with_text(tag: Tag, ints: Vec<u64>, text: &str) -> Self {
        Self::new(tag, ints, text.bytes().map(f32::from).collect())
    }

    /// The text a frame carries (an error's reason, a segment's path).
    pub fn text(&self) -> String {
        text_of(&self.floats)
    }
}

/// The text `floats` carry, one UTF-8 byte per value.
pub fn text_of(floats: &[f32]) -> String {
    let bytes: Vec<u8> = floats.iter().map(|&f| f as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A frame's tag and integers, read before its floats.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameHead {
    pub tag: Tag,
    pub ints: Vec<u64>,
    /// How many floats follow.
    pub floats: usize,
}

/// The reader's or the writer's end of a connection: the socket itself (plain TCP clones
/// it), or a handle on the TLS link, which needs both ways in one place.
enum Half {
    Plain(TcpStream),
    Sealed(Arc<Mutex<LinkStream>>),
}

impl Half {
    fn tcp<R>(&self, f: impl FnOnce(&TcpStream) -> R) -> R {
        match self {
            Half::Plain(s) => f(s),
            Half::Sealed(w) => f(w.lock().unwrap_or_else(PoisonError::into_inner).tcp()),
        }
    }
}

impl Read for Half {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Half::Plain(s) => s.read(buf),
            Half::Sealed(w) => w.lock().unwrap_or_else(PoisonError::into_inner).read(buf),
        }
    }
}

impl Write for Half {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Half::Plain(s) => s.write(buf),
            Half::Sealed(w) => w.lock().unwrap_or_else(PoisonError::into_inner).write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Half::Plain(s) => s.flush(),
            Half::Sealed(w) => w.lock().unwrap_or_else(PoisonError::into_inner).flush(),
        }
    }
}

/// Mutual TLS for one connection: this task's configuration, how long the handshake may
/// take, and on the dialing side the host the peer's certificate must carry.
#[derive(Clone, Copy)]
pub struct Secure<'a> {
    pub tls: &'a RingTls,
    pub within: Duration,
    /// `Some` where this side dialed (the TLS client).
    pub peer: Option<&'a str>,
}

impl Secure<'_> {
    fn link(&self, stream: TcpStream) -> io::Result<Arc<Mutex<LinkStream>>> {
        let wire = crate::collective::secure_link(self.tls, stream, self.peer, self.within)
            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, format!("TLS: {e}")))?;
        Ok(Arc::new(Mutex::new(wire)))
    }
}

/// One open connection to or from a peer.
pub struct Conn {
    reader: BufReader<Half>,
    writer: BufWriter<Half>,
    bytes: Vec<u8>,
}

impl Conn {
    /// `stream` with its timeouts, upgraded to TLS with `secure`.
    fn new(stream: TcpStream, timeout: Option<Duration>, secure: Option<Secure<'_>>) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        stream.set_read_timeout(timeout)?;
        stream.set_write_timeout(timeout)?;
        let (reader, writer) = match secure {
            None => (Half::Plain(stream.try_clone()?), Half::Plain(stream)),
            Some(secure) => {
                let link = secure.link(stream)?;
                (Half::Sealed(Arc::clone(&link)), Half::Sealed(link))
            }
        };
        let writer = BufWriter::with_capacity(1 << 20, writer);
        Ok(Self { reader: BufReader::with_capacity(1 << 20, reader), writer, bytes: Vec::new() })
    }

    /// Dials `addr` until `within`, over TLS with `secure` (naming the peer's host), then
    /// says hello with `token`; every later read and write fails after `timeout`.
    pub fn dial(
        addr: SocketAddr,
        token: u64,
        within: Duration,
        timeout: Duration,
        secure: Option<Secure<'_>>,
    ) -> io::Result<Self> {
        let deadline = Instant::now() + within;
        let stream = loop {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut conn = Self::new(stream, Some(timeout), secure)?;
        conn.call(&Frame::new(Tag::Hello, vec![MAGIC, VERSION, token], Vec::new()))?;
        Ok(conn)
    }

    /// Takes an accepted stream (over TLS with `secure`): reads the hello and answers it; a
    /// stranger (another job's task, another version) is refused with the reason and `Err` is
    /// returned. Reads wait `timeout` at most (`None`: for ever).
    pub fn accept(
        stream: TcpStream,
        token: u64,
        timeout: Option<Duration>,
        secure: Option<Secure<'_>>,
    ) -> io::Result<Self> {
        let mut conn = Self::new(stream, timeout, secure)?;
        let hello = conn.read()?;
        let refusal = match hello.ints.as_slice() {
            _ if hello.tag != Tag::Hello => Some("the first frame was not a hello"),
            [MAGIC, VERSION, t] if *t == token => None,
            [MAGIC, VERSION, _] => Some("the job tokens differ (is it another job's task?)"),
            [MAGIC, _, _] => Some("it runs another version of the trainrun parameter-server protocol"),
            _ => Some("it does not speak the trainrun parameter-server protocol"),
        };
        match refusal {
            None => {
                conn.write(&Frame::new(Tag::Ok, Vec::new(), Vec::new()))?;
                Ok(conn)
            }
            Some(why) => {
                // The stranger may be gone already; the refusal is ours to report.
                let _ = conn.write(&Frame::error(why));
                Err(io::Error::new(io::ErrorKind::PermissionDenied, why))
            }
        }
    }

    /// Whether both ends of the connection have the same address: the peer runs on this host.
    pub fn same_host(&self) -> bool {
        self.reader.get_ref().tcp(|s| matches!((s.local_addr(), s.peer_addr()), (Ok(a), Ok(b)) if a.ip() == b.ip()))
    }

    /// Sends `frame`.
    pub fn write(&mut self, frame: &Frame) -> io::Result<()> {
        self.send(frame.tag, &frame.ints, &[&frame.floats])
    }

    /// Sends a frame whose floats are `parts` back to back, each written from where it lies
    /// (a shard of the model's buffers): the 11 MB of a pull or push are never gathered into
    /// a frame nor converted value by value first.
    pub fn send(&mut self, tag: Tag, ints: &[u64], parts: &[&[f32]]) -> io::Result<()> {
        let floats: usize = parts.iter().map(|p| p.len()).sum();
        let w = &mut self.writer;
        w.write_all(&(tag as u32).to_le_bytes())?;
        w.write_all(&(ints.len() as u32).to_le_bytes())?;
        w.write_all(&(floats as u32).to_le_bytes())?;
        for i in ints {
            w.write_all(&i.to_le_bytes())?;
        }
        for part in parts {
            if cfg!(target_endian = "little") {
                // The wire's byte order is the memory's: the slice goes out as it is (a
                // write larger than the buffer bypasses it).
                w.write_all(bytemuck::cast_slice(part))?;
            } else {
                self.bytes.clear();
                self.bytes.extend(part.iter().flat_map(|f| f.to_le_bytes()));
                w.write_all(&self.bytes)?;
            }
        }
        w.flush()
    }

    /// Reads the next frame's tag and integers; exactly `floats` values follow, for
    /// [`Conn::read_floats`] to take before the next read.
    pub fn read_head(&mut self) -> io::Result<FrameHead> {
        let mut head = [0u8; 12];
        self.reader.read_exact(&mut head)?;
        let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let (tag, ints, floats) = (word(0), word(4), word(8));
        let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let tag = Tag::from_u32(tag).ok_or_else(|| bad(format!("unknown frame tag {tag}")))?;
        if ints > MAX_VALUES || floats > MAX_VALUES {
            return Err(bad(format!("a frame of {ints} + {floats} values is too large")));
        }
        self.bytes.resize(8 * ints as usize, 0);
        self.reader.read_exact(&mut self.bytes)?;
        let ints = self.bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        Ok(FrameHead { tag, ints, floats: floats as usize })
    }

    /// Reads the next `out.len()` floats of the frame being read straight into `out` (a
    /// shard's place in the model's buffers): no frame buffer, no value-by-value conversion.
    pub fn read_floats(&mut self, out: &mut [f32]) -> io::Result<()> {
        self.reader.read_exact(bytemuck::cast_slice_mut(out))?;
        if cfg!(target_endian = "big") {
            for f in out.iter_mut() {
                *f = f32::from_bits(u32::from_le(f.to_bits()));
            }
        }
        Ok(())
    }

    /// Reads the next frame, its floats into `floats` (resized to them: a buffer kept from
    /// frame to frame is neither allocated nor zeroed again).
    pub fn read_into(&mut self, floats: &mut Vec<f32>) -> io::Result<(Tag, Vec<u64>)> {
        let head = self.read_head()?;
        floats.resize(head.floats, 0.0);
        self.read_floats(floats)?;
        Ok((head.tag, head.ints))
    }

    /// Reads the next frame.
    pub fn read(&mut self) -> io::Result<Frame> {
        let mut floats = Vec::new();
        let (tag, ints) = self.read_into(&mut floats)?;
        Ok(Frame { tag, ints, floats })
    }

    /// Sends `frame` and reads the answer; an error answer becomes `Err` with its text.
    pub fn call(&mut self, frame: &Frame) -> io::Result<Frame> {
        self.write(frame)?;
        let answer = self.read()?;
        match answer.tag {
            Tag::Error => Err(io::Error::other(answer.text())),
            _ => Ok(answer),
        }
    }
}

/// Says what failed talking to `peer`: a timeout as silence, anything else as the peer gone.
pub fn peer_error(peer: TaskId, what: &str, e: &io::Error, timeout: Duration) -> String {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("{peer} did not answer {what} within {:.1} s (cluster timeout)", timeout.as_secs_f64())
        }
        io::ErrorKind::Other | io::ErrorKind::PermissionDenied => format!("{peer} refused {what}: {e}"),
        _ => format!("{peer} is gone ({what}: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A job's TLS configuration for a task on `localhost`, from a new CA.
    fn tls() -> RingTls {
        let dir = tempfile::tempdir().unwrap();
        let files = crate::cluster::certs::write(dir.path(), "ps", &["localhost".to_string()], 1).unwrap();
        let read = |p: &std::path::Path| std::fs::read(p).unwrap();
        RingTls::new(&read(&files.cert), &read(&files.key), &read(&files.ca)).unwrap()
    }

    /// A connection's two ends, over TLS when `tls` gives the server's and the client's
    /// configurations.
    fn pair_over(
        server_token: u64,
        client_token: u64,
        tls: Option<(RingTls, RingTls)>,
    ) -> (io::Result<Conn>, io::Result<Conn>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let within = Duration::from_secs(5);
        let (server_tls, client_tls) = tls.map_or((None, None), |(s, c)| (Some(s), Some(c)));
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let secure = server_tls.as_ref().map(|tls| Secure { tls, within, peer: None });
            Conn::accept(s, server_token, Some(within), secure)
        });
        let secure = client_tls.as_ref().map(|tls| Secure { tls, within, peer: Some("localhost") });
        let client = Conn::dial(addr, client_token, within, within, secure);
        (server.join().unwrap(), client)
    }

    fn pair(server_token: u64, client_token: u64) -> (io::Result<Conn>, io::Result<Conn>) {
        pair_over(server_token, client_token, None)
    }

    #[test]
    fn frames_round_trip_after_a_hello_plain_and_over_tls() {
        let job = tls();
        for secure in [None, Some((job.clone(), job.clone()))] {
            let (server, client) = pair_over(7, 7, secure);
            let (mut server, mut client) = (server.unwrap(), client.unwrap());
            let frame = Frame::new(Tag::Push, vec![3, u64::MAX], vec![0.5, -1.25, f32::MIN_POSITIVE]);
            client.write(&frame).unwrap();
            assert_eq!(server.read().unwrap(), frame);
            // A model-sized frame, many TLS records long, both ways.
            let big = Frame::new(Tag::Ok, vec![1], (0..700_000).map(|i| i as f32).collect());
            server.write(&big).unwrap();
            assert_eq!(client.read().unwrap(), big);
            server.write(&Frame::error("ps:0 is gone")).unwrap();
            assert_eq!(client.read().unwrap().text(), "ps:0 is gone");
        }
    }

    #[test]
    fn a_peer_with_another_cas_certificate_is_refused_before_its_hello() {
        let (server, client) = pair_over(7, 7, Some((tls(), tls())));
        let (server, client) = (server.err().unwrap(), client.err().unwrap());
        assert!(client.to_string().contains("not signed by this task's CA"), "{client}");
        assert!(server.to_string().contains("TLS"), "{server}");
    }

    #[test]
    fn floats_sent_from_several_slices_arrive_in_place() {
        let (server, client) = pair(7, 7);
        let (mut server, mut client) = (server.unwrap(), client.unwrap());
        let (a, b) = (vec![1.5f32, -2.0, 3.25], vec![f32::MAX, -0.0]);
        client.send(Tag::Push, &[9], &[&a, &[], &b]).unwrap();
        let head = server.read_head().unwrap();
        assert_eq!((head.tag, head.ints.as_slice(), head.floats), (Tag::Push, &[9u64][..], 5));
        // Read into two places of a larger buffer, as a pull lands in the model's shards.
        let mut into = vec![0.0f32; 8];
        server.read_floats(&mut into[1..3]).unwrap();
        server.read_floats(&mut into[5..8]).unwrap();
        assert_eq!(into, [0.0, 1.5, -2.0, 0.0, 0.0, 3.25, f32::MAX, -0.0]);
        // The connection is in step: the next frame reads whole, into a kept buffer.
        client.send(Tag::Ok, &[], &[&b]).unwrap();
        let mut kept = vec![7.0f32; 2];
        assert_eq!(server.read_into(&mut kept).unwrap(), (Tag::Ok, Vec::new()));
        assert_eq!(kept, b);
    }

    #[test]
    fn another_jobs_token_is_refused_with_the_reason() {
        let (server, client) = pair(7, 8);
        assert!(server.err().unwrap().to_string().contains("job tokens differ"));
        assert!(client.err().unwrap().to_string().contains("job tokens differ"));
    }
}
