//! A worker whose chief address is answered by something that is not trainrun — a web server,
//! a peer that accepts and closes, one that sends junk — used to die silently of SIGPIPE
//! (exit 141). It must exit 5 with a message naming the address and what answered there.
//! Real sockets: each stranger is a tiny server on a free port of this machine.

mod common;

use common::{assert_exit, text};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

const TOKEN: &str = "abcdefghijklmnop0123456789";

/// Serves every connection to a fresh port with `answer` after reading what the client sent
/// (`None`: closes each connection at once). Returns the port.
fn stranger(answer: Option<&'static [u8]>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = l.local_addr().map(|a| a.port()).unwrap_or_else(|e| panic!("{e}"));
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            if let Some(bytes) = answer {
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut request = [0u8; 512];
                let _ = s.read(&mut request);
                let _ = s.write_all(bytes);
            }
        }
    });
    port
}

/// Starts worker:1 of a two-worker TF_CONFIG cluster whose chief (worker:0) is at `chief`,
/// and returns its output.
fn worker_one(chief: u16) -> std::process::Output {
    let ports = [chief, common::free_port()];
    let child = common::trainrun()
        .args(["specs/mnist_multiworker.toml", "-q", "--set", "cluster.startup_timeout_s=30"])
        .env("TF_CONFIG", common::tf_config(&ports, ("worker", 1)))
        .env("TRAINRUN_JOB_TOKEN", TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start trainrun: {e}"));
    common::wait_within(child, Duration::from_secs(60)).0
}

fn refused_naming(chief: u16, what: &str) {
    let out = worker_one(chief);
    assert_exit(&out, 5);
    let (_, stderr) = text(&out);
    let address = format!("127.0.0.1:{chief}");
    assert!(stderr.contains(&address) && stderr.contains(what), "want {address} and {what:?} in:\n{stderr}");
}

#[test]
fn an_http_server_at_the_chiefs_address_is_named() {
    let answer = b"HTTP/1.0 505 HTTP Version Not Supported\r\nContent-Type: text/html\r\n\r\n<html></html>";
    refused_naming(
        stranger(Some(answer)),
        "is answered by an HTTP/1 server (it said `HTTP/1.0 505 HTTP Version Not Supported`)",
    );
}

#[test]
fn a_peer_that_accepts_and_closes_is_named() {
    refused_naming(
        stranger(None),
        "is answered by something that accepted the connection and closed it without a word",
    );
}

#[test]
fn a_peer_that_sends_junk_is_named() {
    refused_naming(stranger(Some(b"\x00\xffnot a protocol you know\n")), "sent bytes that are not trainrun's protocol");
}

/// The reproduction as written: Python's own web server on the chief's port.
#[test]
fn pythons_http_server_at_the_chiefs_address_is_named() {
    let port = common::free_port();
    let server = std::process::Command::new("python3")
        .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut server) = server else {
        println!("skipped: python3 is not available to serve HTTP");
        return;
    };
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = worker_one(port);
    let _ = server.kill();
    let _ = server.wait();
    assert_exit(&out, 5);
    let (_, stderr) = text(&out);
    assert!(stderr.contains(&format!("127.0.0.1:{port} is answered by an HTTP/1 server")), "{stderr}");
}
