//! What answered at an address that should be a trainrun task, in words for the error: an
//! HTTP/1 server (a task's address pointing at a web server), something that closed the
//! connection without a word, or something sending bytes of another protocol. Both planes use
//! it: the control plane's client probes the chief's address when a check-in fails, and the
//! ring's handshake judges the answer it read.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The first bytes an HTTP/2 client sends (RFC 9113 §3.4), then an empty SETTINGS frame: what
/// the control plane's gRPC client says first, so a probe sees what the client saw.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// What answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// An HTTP/1 server; its status line.
    Http1(String),
    /// It accepted the connection and closed it without sending anything.
    Closed,
    /// It accepted the connection and sent nothing within the probe's wait.
    Silent,
    /// Bytes of some other protocol; the first few.
    Junk(Vec<u8>),
    /// An HTTP/2 server (a SETTINGS frame first): possibly a trainrun chief, so not a stranger.
    Http2,
    /// A TLS server (a TLS record first, typically the alert a plain-text probe earns):
    /// possibly a chief using `cluster.tls`.
    Tls,
}

impl Answer {
    /// Judges the bytes that came back; `closed` when the peer then closed the connection.
    pub(crate) fn of(bytes: &[u8], closed: bool) -> Answer {
        if bytes.is_empty() {
            return if closed { Answer::Closed } else { Answer::Silent };
        }
        if bytes.starts_with(b"HTTP/") {
            let line = bytes.split(|&b| b == b'\r' || b == b'\n').next().unwrap_or_default();
            return Answer::Http1(String::from_utf8_lossy(line).into_owned());
        }
        // An HTTP/1 server refusing the HTTP/2 preface may answer HTTP/0.9-style, with the
        // page alone (Python's `http.server` does).
        let start = String::from_utf8_lossy(&bytes[..bytes.len().min(16)]).trim_start().to_ascii_lowercase();
        if start.starts_with("<!doctype html") || start.starts_with("<html") {
            return Answer::Http1("an HTML page".into());
        }
        // An HTTP/2 frame header: 24-bit length, type 4 (SETTINGS), stream 0.
        if bytes.len() >= 9 && bytes[3] == 0x04 && bytes[5..9] == [0, 0, 0, 0] {
            return Answer::Http2;
        }
        // A TLS record header: content type 20–23, protocol major version 3.
        if bytes.len() >= 3 && (0x14..=0x17).contains(&bytes[0]) && bytes[1] == 3 && bytes[2] <= 4 {
            return Answer::Tls;
        }
        Answer::Junk(bytes.iter().copied().take(16).collect())
    }

    /// What answered, as the end of "… is answered by …".
    pub(crate) fn describe(&self) -> String {
        match self {
            Answer::Http1(line) if line == "an HTML page" => "an HTTP/1 server (it answered with an HTML page)".into(),
            Answer::Http1(line) => format!("an HTTP/1 server (it said `{line}`)"),
            Answer::Closed => "something that accepted the connection and closed it without a word".into(),
            Answer::Silent => "something that accepted the connection but never answered".into(),
            Answer::Junk(bytes) => {
                format!("something that sent bytes that are not trainrun's protocol ({})", preview(bytes))
            }
            Answer::Http2 => "an HTTP/2 server".into(),
            Answer::Tls => "a TLS server (a chief with cluster.tls while this task has none, or an HTTPS server): give every task the same cluster.tls".into(),
        }
    }
}

/// The first bytes, printable ones as text: `"\x16\x03\x01…"`.
fn preview(bytes: &[u8]) -> String {
    let text: String = bytes.iter().flat_map(|&b| std::ascii::escape_default(b)).map(char::from).collect();
    format!("\"{text}…\"")
}

/// Dials `address` (`host:port`), sends what the control plane's client sends first, and
/// reads the answer for at most `wait`. `None` when nothing accepts the connection there (the
/// task is not up yet: not a stranger).
pub(crate) fn probe(address: &str, wait: Duration) -> Option<Answer> {
    let target: SocketAddr = address.to_socket_addrs().ok()?.next()?;
    let mut stream = TcpStream::connect_timeout(&target, wait).ok()?;
    // A peer that closes at once makes the write fail: that is an answer too.
    if stream.write_all(HTTP2_PREFACE).is_err() {
        return Some(Answer::Closed);
    }
    let deadline = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buf = [0u8; 64];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || got.len() >= 9 {
            return Some(Answer::of(&got, false));
        }
        if stream.set_read_timeout(Some(left)).is_err() {
            return Some(Answer::of(&got, false));
        }
        match stream.read(&mut buf) {
            Ok(0) => return Some(Answer::of(&got, true)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Some(Answer::of(&got, false));
            }
            // A reset after bytes or without: the peer is gone either way.
            Err(_) => return Some(Answer::of(&got, true)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn answers_are_told_apart() {
        assert_eq!(
            Answer::of(b"HTTP/1.0 505 Invalid\r\nServer: x", true),
            Answer::Http1("HTTP/1.0 505 Invalid".into())
        );
        assert_eq!(Answer::of(b"", true), Answer::Closed);
        let page = Answer::of(b"<!DOCTYPE HTML>\n<html lang=\"en\">", true);
        assert_eq!(page.describe(), "an HTTP/1 server (it answered with an HTML page)");
        assert_eq!(Answer::of(b"", false), Answer::Silent);
        assert_eq!(Answer::of(&[0, 0, 6, 4, 0, 0, 0, 0, 0, 1], false), Answer::Http2);
        let junk = Answer::of(b"\x16\x04\x01hello there, general", true);
        assert_eq!(
            junk.describe(),
            "something that sent bytes that are not trainrun's protocol (\"\\x16\\x04\\x01hello there, …\")"
        );
        // The alert a TLS server sends back to a plain-text HTTP/2 preface.
        assert_eq!(Answer::of(b"\x15\x03\x03\x00\x02\x02\x32", true), Answer::Tls);
    }

    /// Serves one connection with `answer`: `None` closes at once.
    fn server(answer: Option<&'static [u8]>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                if let Some(bytes) = answer {
                    let mut first = [0u8; 8];
                    let _ = s.read(&mut first);
                    let _ = s.write_all(bytes);
                }
            }
        });
        address
    }

    #[test]
    fn probes_real_sockets() {
        let http = probe(&server(Some(b"HTTP/1.0 505 Invalid HTTP version\r\n\r\n")), Duration::from_secs(5));
        assert_eq!(http, Some(Answer::Http1("HTTP/1.0 505 Invalid HTTP version".into())));
        assert_eq!(probe(&server(None), Duration::from_secs(5)), Some(Answer::Closed));
        let junk = probe(&server(Some(b"SSH-2.0-OpenSSH_9.6\r\n")), Duration::from_secs(5));
        assert!(matches!(junk, Some(Answer::Junk(_))), "{junk:?}");
        let nobody = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
        assert_eq!(probe(&nobody, Duration::from_secs(1)), None);
    }
}
