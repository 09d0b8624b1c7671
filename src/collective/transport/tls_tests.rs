//! The ring's TLS records against rustls's own record layer: what [`Sealed`] writes, a rustls
//! peer reads, and the other way round, so the link speaks real TLS 1.3.

use super::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpListener;
use std::thread;

/// A CA and a certificate it signed for `localhost`, as PEM: (cert, key, CA).
fn pems() -> (String, String, String) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()]).unwrap().signed_by(&key, &issuer).unwrap();
    (cert.pem(), key.serialize_pem(), issuer.pem())
}

/// This side's sealed link (the ring's TLS client) and a rustls server on the other end, once
/// the handshake and the confirmation are through.
fn connect() -> (LinkStream, ServerConnection, TcpStream) {
    let (cert, key, ca) = pems();
    let tls = RingTls::new(cert.as_bytes(), key.as_bytes(), ca.as_bytes()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server_config = tls.server.clone();
    let server = thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        let mut conn = ServerConnection::new(server_config).unwrap();
        while conn.is_handshaking() {
            conn.complete_io(&mut sock).unwrap();
        }
        conn.writer().write_all(&[ACCEPTED]).unwrap();
        while conn.wants_write() {
            conn.write_tls(&mut sock).unwrap();
        }
        (conn, sock)
    });
    let sock = TcpStream::connect(addr).unwrap();
    sock.set_nonblocking(true).unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let conn = ClientConnection::new(tls.client.clone(), name).unwrap();
    let mut ours = Handshake { conn: conn.into(), sock, confirmed: false };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ours.progress().unwrap() {
        assert!(Instant::now() < deadline, "the handshake did not finish");
        wait_any(&[&ours.sock], Duration::from_millis(10));
    }
    let (conn, sock) = server.join().unwrap();
    (ours.into_wire().unwrap(), conn, sock)
}

fn pattern(len: usize, step: usize) -> Vec<u8> {
    (0..len).map(|i| (i * step % 251) as u8).collect()
}

/// Reads from the nonblocking `wire` in pieces of `piece` bytes until the end of the stream or
/// an error.
fn read_all(wire: &mut LinkStream, piece: usize) -> Result<Vec<u8>, io::Error> {
    let (mut got, mut buf) = (Vec::new(), vec![0u8; piece]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match wire.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "nothing arrived");
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
    }
}

#[test]
fn a_rustls_peer_reads_the_ring_records_and_writes_ones_it_reads() {
    let (mut wire, mut conn, mut sock) = connect();
    // More than a seal batch, ending in a short record.
    let up = pattern(crate::collective::transport::record::SEAL_BATCH_BYTES + 100_003, 7);
    let mut sent = 0;
    while sent < up.len() || !wire.flush_pending().unwrap() {
        match wire.write(&up[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("{e}"),
        }
    }
    let mut got = vec![0u8; up.len()];
    rustls::Stream::new(&mut conn, &mut sock).read_exact(&mut got).unwrap();
    assert!(got == up, "rustls read other bytes than the ring sealed");

    // rustls cuts these into 16 KiB records: read in 1000-byte pieces (through the spill) and
    // in one big buffer (straight into it), then rustls's close_notify ends the stream.
    let down = pattern(70_000, 13);
    let mut stream = rustls::Stream::new(&mut conn, &mut sock);
    stream.write_all(&down).unwrap();
    stream.write_all(&down).unwrap();
    conn.send_close_notify();
    while conn.wants_write() {
        conn.write_tls(&mut sock).unwrap();
    }
    let mut first = vec![0u8; down.len()];
    let mut at = 0;
    while at < first.len() {
        let end = (at + 1000).min(first.len());
        match wire.read(&mut first[at..end]) {
            Ok(0) => panic!("the stream ended early"),
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
            Err(e) => panic!("{e}"),
        }
    }
    assert!(first == down, "1000-byte reads gave other bytes than rustls sealed");
    let rest = read_all(&mut wire, 1 << 20).unwrap();
    assert!(rest == down, "big reads gave other bytes than rustls sealed");
}

#[test]
fn a_record_altered_on_the_way_is_refused() {
    let (mut wire, mut conn, mut sock) = connect();
    conn.writer().write_all(&pattern(5000, 3)).unwrap();
    let mut records = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut records).unwrap();
    }
    records[2000] ^= 1;
    sock.write_all(&records).unwrap();
    let err = read_all(&mut wire, 1 << 16).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData);
    assert!(err.to_string().contains("failed authentication"), "{err}");
}

/// Two of the ring's own ends, handshaken with each other: (the TLS client's, the server's).
fn own_pair() -> (LinkStream, LinkStream) {
    let (cert, key, ca) = pems();
    let tls = RingTls::new(cert.as_bytes(), key.as_bytes(), ca.as_bytes()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let next = TcpStream::connect(addr).unwrap();
    let (prev, _) = listener.accept().unwrap();
    for s in [&next, &prev] {
        s.set_nonblocking(true).unwrap();
    }
    let peers = Peers::new(0, vec!["worker:0".into()]).unwrap();
    let t = TlsPeers { config: tls, names: vec!["localhost".into()] };
    let link = |s| PeerLink { stream: LinkStream::Plain(s), peer: 0, addr };
    let (mut outs, mut ins) = secure(&peers, &t, vec![link(next)], vec![link(prev)], Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("{e}"));
    (outs.remove(0).stream, ins.remove(0).stream)
}

/// Writes all of `bytes` into `to` while reading them from `from`.
fn send(to: &mut LinkStream, from: &mut LinkStream, bytes: &[u8]) -> io::Result<Vec<u8>> {
    let (mut sent, mut got, mut buf) = (0, Vec::new(), vec![0u8; 1 << 16]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < bytes.len() {
        assert!(Instant::now() < deadline, "the bytes did not arrive");
        if sent < bytes.len() {
            match to.write(&bytes[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        } else {
            to.flush_pending()?;
        }
        match from.read(&mut buf) {
            Ok(0) => panic!("the stream ended early"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

fn sealed(wire: &mut LinkStream) -> &mut Sealed {
    match wire {
        LinkStream::Sealed(s) => s,
        LinkStream::Plain(_) => panic!("a plain link"),
    }
}

#[test]
fn both_ends_move_to_new_keys_after_the_same_count_of_records() {
    // 40 records each way, a new key every 3: thirteen key changes in each direction.
    let bytes = pattern(40 * (1 << 14) - 7, 11);
    let (mut client, mut server) = own_pair();
    sealed(&mut client).rekey_every(3, 3);
    sealed(&mut server).rekey_every(3, 3);
    assert!(send(&mut client, &mut server, &bytes).unwrap() == bytes, "client to server");
    assert!(send(&mut server, &mut client, &bytes).unwrap() == bytes, "server to client");

    // The keys really change: an end that moves one record later cannot open the fourth.
    let (mut client, mut server) = own_pair();
    sealed(&mut client).rekey_every(3, 3);
    sealed(&mut server).rekey_every(3, 4);
    let err = send(&mut client, &mut server, &bytes).unwrap_err();
    assert!(err.to_string().contains("failed authentication"), "{err}");
}

/// Bytes per second of `f(call)`, which handles `per_call` bytes, at its best of five rounds.
fn rate(per_call: usize, calls: u64, mut f: impl FnMut(u64)) -> f64 {
    (0..calls.min(64)).for_each(&mut f);
    let best = (0..5)
        .map(|_| {
            let t = Instant::now();
            (0..calls).for_each(&mut f);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min);
    per_call as f64 * calls as f64 / best
}

/// AES-128-GCM per core in the call shapes `record.rs` uses (the content type sealed as the
/// scatter's extra input, opening into a separate buffer) against sealing in place, at TLS
/// 1.3's 16 KiB records and at sizes TLS does not allow, over 512 KiB that stay in cache: the
/// figures of docs/benchmarks.md, "Mutual TLS". Both shapes must give the same record.
/// `cargo test --release --lib aes_gcm_speed -- --ignored --nocapture`
#[test]
#[ignore = "a measurement; run on an idle machine"]
fn aes_gcm_speed_by_call_shape() {
    use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    const REC: usize = 1 << 14;
    const SPAN: usize = 512 << 10;
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[1; 16]).unwrap());
    let nonce = |i: u64| {
        let mut n = [7u8; 12];
        n[4..].copy_from_slice(&i.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    };
    let header = [23u8, 3, 3, 0x40, 0x11];
    let src = pattern(SPAN, 7);

    let mut scattered = vec![0u8; REC + 17];
    let (body, type_and_tag) = scattered.split_at_mut(REC);
    key.seal_out_of_place_scatter(nonce(0), Aad::from(header), &src[..REC], body, &[23], type_and_tag).unwrap();
    let mut in_place = src[..REC].to_vec();
    in_place.push(23);
    let tag = key.seal_in_place_separate_tag(nonce(0), Aad::from(header), &mut in_place).unwrap();
    in_place.extend_from_slice(tag.as_ref());
    assert_eq!(scattered, in_place, "the scatter seal and the in-place seal made different records");
    let mut opened = vec![0u8; REC + 1];
    let (sealed, tag) = scattered.split_at(REC + 1);
    key.open_separate_gather(nonce(0), Aad::from(header), sealed, tag, &mut opened).unwrap();
    assert_eq!((&opened[..REC], opened[REC]), (&src[..REC], 23));

    let mut out = vec![0u8; 2 * SPAN];
    let calls = |len: usize| ((256 << 20) / len) as u64;
    for len in [1 << 10, REC, 1 << 16, 1 << 18] {
        let per = (SPAN / len) as u64;
        let r = rate(len, calls(len), |i| {
            let at = (i % per) as usize;
            let (body, type_and_tag) = out[at * (len + 32)..][..len + 17].split_at_mut(len);
            let bytes = &src[at * len..][..len];
            key.seal_out_of_place_scatter(nonce(i), Aad::from(header), bytes, body, &[23], type_and_tag).unwrap();
        });
        println!("seal, scatter  {len:>6} B: {:5.2} GB/s, {:6.3} us a call", r / 1e9, len as f64 / r * 1e6);
    }
    let per = (SPAN / REC) as u64;
    let r = rate(REC, calls(REC), |i| {
        let rec = &mut out[(i % per) as usize * (REC + 32)..][..REC + 17];
        let tag = key.seal_in_place_separate_tag(nonce(i % per), Aad::from(header), &mut rec[..REC + 1]).unwrap();
        rec[REC + 1..].copy_from_slice(tag.as_ref());
    });
    println!("seal, in place {REC:>6} B: {:5.2} GB/s", r / 1e9);
    // `out` holds the records just sealed in place, record j under nonce j.
    let mut into = vec![0u8; SPAN + REC];
    let r = rate(REC, calls(REC), |i| {
        let at = (i % per) as usize;
        let (sealed, tag) = out[at * (REC + 32)..][..REC + 17].split_at(REC + 1);
        key.open_separate_gather(nonce(i % per), Aad::from(header), sealed, tag, &mut into[at * REC..][..REC + 1])
            .unwrap();
    });
    println!("open, gather   {REC:>6} B: {:5.2} GB/s", r / 1e9);
}
