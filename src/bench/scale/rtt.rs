//! The round trip between two namespace hosts over TCP, as the all-reduce's messages see it:
//! one byte there and back on a connection with `TCP_NODELAY`, the median of many. The two
//! sockets are made inside the hosts' namespaces by threads that enter them
//! ([`super::link::in_namespace`]); the harness itself runs both ends, so no process is
//! started and nothing is left behind.

use super::link::in_namespace;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Round trips timed; the first few, which warm up the connection, are left out.
const ROUNDS: usize = 400;
const WARM_UP: usize = 20;

/// The median round trip from host namespace `from` to host namespace `to` at address `at`.
pub fn tcp_round_trip(from: &str, to: &str, at: Ipv4Addr) -> io::Result<Duration> {
    let listener = in_namespace(to, move || TcpListener::bind(SocketAddr::from((at, 0))))?;
    let target = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut b = [0u8; 1];
        while s.read(&mut b)? == 1 {
            s.write_all(&b)?;
        }
        Ok(())
    });
    let mut client = in_namespace(from, move || TcpStream::connect_timeout(&target, Duration::from_secs(5)))?;
    client.set_nodelay(true)?;
    client.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut times = Vec::with_capacity(ROUNDS);
    let mut b = [7u8; 1];
    for _ in 0..ROUNDS + WARM_UP {
        let start = Instant::now();
        client.write_all(&b)?;
        client.read_exact(&mut b)?;
        times.push(start.elapsed());
    }
    drop(client);
    echo.join().map_err(|_| io::Error::other("the echo thread panicked"))??;
    let mut times = times.split_off(WARM_UP);
    times.sort();
    Ok(times[times.len() / 2])
}
