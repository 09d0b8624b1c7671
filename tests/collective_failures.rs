//! Setup failures, with ranks as threads: a peer that never shows up is named after the
//! connect timeout; a stranger (wrong job token, wrong protocol, silence) is refused with a
//! clear error and does not break the real peers' setup. Error text is part of the contract:
//! the messages are snapshotted, with ports and pids redacted.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use trainrun::collective::{
    Collective, CollectiveError, CollectiveTimeouts, Communicator, Peers, ShmOptions, TcpOptions, Transport,
};

const HARD_LIMIT: Duration = Duration::from_secs(60);
const CONNECT: Duration = Duration::from_secs(1);
const TIMEOUTS: CollectiveTimeouts = CollectiveTimeouts { connect: CONNECT, op: Duration::from_secs(10) };

fn names(world: usize) -> Vec<String> {
    (0..world).map(|r| format!("worker:{r}")).collect()
}

/// Runs `f` on its own thread; fails the test if it takes longer than the hard limit.
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HARD_LIMIT) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("the test hung past its hard limit of {HARD_LIMIT:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the test body panicked (see above)"),
    }
}

/// Replaces `:<digits>` port suffixes, `pid <digits>`, and paths' pid parts with placeholders.
fn redact(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        let tag = if out.ends_with("127.0.0.1:") {
            Some("PORT")
        } else if out.ends_with("pid ") || out.ends_with("shm-") {
            Some("N")
        } else {
            None
        };
        if let Some(tag) = tag
            && chars.peek().is_some_and(|c| c.is_ascii_digit())
        {
            while chars.peek().is_some_and(|c| c.is_ascii_digit()) {
                chars.next();
            }
            out.push_str(tag);
        }
    }
    out
}

fn shm(path: &str, token: u64) -> Transport {
    Transport::SharedMemory(ShmOptions { job_token: token, ..ShmOptions::new(path) })
}

fn shm_path(label: &str) -> String {
    format!("/dev/shm/trainrun-fail-{label}-shm-{}", std::process::id())
}

fn connect_alone(rank: usize, world: usize, t: Transport) -> (CollectiveError, Duration) {
    let start = Instant::now();
    let r = Collective::connect(Peers::new(rank, names(world)).unwrap(), t, TIMEOUTS);
    (r.err().expect("setup should fail"), start.elapsed())
}

#[track_caller]
fn assert_after_connect_timeout(took: Duration) {
    assert!(took >= CONNECT && took < CONNECT + Duration::from_secs(2), "took {took:?}");
}

#[test]
fn shm_rank_0_names_the_peer_that_never_joins_and_removes_the_segment() {
    let path = shm_path("nojoin");
    let p = path.clone();
    let (err, took) = bounded(move || connect_alone(0, 2, shm(&p, 1)));
    assert_after_connect_timeout(took);
    insta::assert_snapshot!(redact(&err.to_string()), @"worker:1 did not join within 1 s: it never opened the shared-memory segment /dev/shm/trainrun-fail-nojoin-shm-N");
    assert!(!Path::new(&path).exists(), "the segment file was left behind");
}

#[test]
fn shm_rank_names_rank_0_when_it_never_creates_the_segment() {
    let p = shm_path("nocreate");
    let (err, took) = bounded(move || connect_alone(1, 2, shm(&p, 1)));
    assert_after_connect_timeout(took);
    insta::assert_snapshot!(redact(&err.to_string()), @"worker:0 did not join within 1 s: it never created the shared-memory segment /dev/shm/trainrun-fail-nocreate-shm-N");
}

#[test]
fn shm_segment_of_another_job_is_refused() {
    let path = shm_path("token");
    let p = path.clone();
    let owner = thread::spawn(move || connect_alone(0, 2, shm(&p, 1)));
    let p = path.clone();
    let (err, took) = bounded(move || {
        // Wait for the segment to exist, so this checks the token and not the timeout.
        let t = Instant::now();
        while !Path::new(&p).exists() && t.elapsed() < Duration::from_secs(5) {
            thread::sleep(Duration::from_millis(1));
        }
        connect_alone(1, 2, shm(&p, 2))
    });
    assert!(took < CONNECT, "the stranger should be refused at once, took {took:?}");
    insta::assert_snapshot!(redact(&err.to_string()), @"shared-memory segment /dev/shm/trainrun-fail-token-shm-N: it belongs to another job (its job token differs; its rank 0 is pid N)");
    let (owner_err, _) = owner.join().unwrap();
    assert!(owner_err.to_string().starts_with("worker:1 did not join within 1 s"), "{owner_err}");
}

/// A port nothing listens on.
fn dead_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn tcp(listener: TcpListener, addrs: Vec<SocketAddr>, token: u64) -> Transport {
    Transport::TcpRing(TcpOptions { job_token: token, ..TcpOptions::new(addrs, listener) })
}

#[test]
fn tcp_names_the_peer_that_never_shows_up_after_the_connect_timeout() {
    let (err, took) = bounded(|| {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addrs = vec![l.local_addr().unwrap(), dead_addr()];
        connect_alone(0, 2, tcp(l, addrs, 1))
    });
    assert_after_connect_timeout(took);
    insta::assert_snapshot!(redact(&err.to_string()), @"worker:1 did not join within 1 s: nothing accepted a connection at 127.0.0.1:PORT (last attempt: Connection refused (os error 111))");
}

#[test]
fn tcp_refuses_another_jobs_worker_at_once_and_keeps_waiting_for_its_own() {
    bounded(|| {
        let ls: Vec<TcpListener> = (0..3).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
        let mut ls = ls.into_iter();
        let (l0, l1, stranger_l) = (ls.next().unwrap(), ls.next().unwrap(), ls.next().unwrap());
        let ours = vec![addrs[0], addrs[1]];
        let a = ours.clone();
        let zero = thread::spawn(move || -> Result<f32, CollectiveError> {
            let t = CollectiveTimeouts { connect: Duration::from_secs(10), ..TIMEOUTS };
            let mut c = Collective::connect(Peers::new(0, names(2))?, tcp(l0, a, 1), t)?;
            let mut v = [1.0f32];
            c.all_reduce_sum(&mut v)?;
            Ok(v[0])
        });
        // Another job's rank 1 (token 2) whose address list names our rank 0 as its rank 0.
        let (err, took) = connect_alone(1, 2, tcp(stranger_l, vec![addrs[0], addrs[2]], 2));
        assert!(took < CONNECT, "a refusal should come back at once, took {took:?}");
        insta::assert_snapshot!(redact(&err.to_string()), @"worker:0 (127.0.0.1:PORT) refused this rank: the job tokens differ (is it another job's worker?)");
        // Our own rank 1 still gets in.
        let one = thread::spawn(move || -> Result<f32, CollectiveError> {
            let t = CollectiveTimeouts { connect: Duration::from_secs(10), ..TIMEOUTS };
            let mut c = Collective::connect(Peers::new(1, names(2))?, tcp(l1, ours, 1), t)?;
            let mut v = [2.0f32];
            c.all_reduce_sum(&mut v)?;
            Ok(v[0])
        });
        assert_eq!(zero.join().unwrap().unwrap(), 3.0);
        assert_eq!(one.join().unwrap().unwrap(), 3.0);
    });
}

#[test]
fn tcp_rank_0_lists_the_refused_stranger_when_its_own_peer_never_comes() {
    let (err, took) = bounded(|| {
        let l0 = TcpListener::bind("127.0.0.1:0").unwrap();
        let zero_addr = l0.local_addr().unwrap();
        // Our rank 1's port is bound but nobody behind it ever accepts or answers.
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let stranger_l = TcpListener::bind("127.0.0.1:0").unwrap();
        let stranger = vec![zero_addr, stranger_l.local_addr().unwrap()];
        thread::spawn(move || connect_alone(1, 2, tcp(stranger_l, stranger, 2)));
        let r = connect_alone(0, 2, tcp(l0, vec![zero_addr, mute.local_addr().unwrap()], 1));
        drop(mute);
        r
    });
    assert_after_connect_timeout(took);
    insta::assert_snapshot!(redact(&err.to_string()), @"worker:1 did not join within 1 s: it never connected; refused meanwhile: 127.0.0.1:PORT claiming rank 1: the job tokens differ (is it another job's worker?)");
}

#[test]
fn strangers_do_not_break_the_real_setup() {
    bounded(|| {
        let ls: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
        // One speaks HTTP, one says nothing at all; both knock on rank 0 before the peers start.
        let mut http = TcpStream::connect(addrs[0]).unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\nmore bytes").unwrap();
        let _silent = TcpStream::connect(addrs[0]).unwrap();
        let handles: Vec<_> = ls
            .into_iter()
            .enumerate()
            .map(|(rank, l)| {
                let addrs = addrs.clone();
                thread::spawn(move || -> Result<Vec<f32>, CollectiveError> {
                    let t = CollectiveTimeouts { connect: Duration::from_secs(10), ..TIMEOUTS };
                    let mut c = Collective::connect(Peers::new(rank, names(2))?, tcp(l, addrs, 5), t)?;
                    let mut v = vec![rank as f32 + 1.0; 10];
                    c.all_reduce_sum(&mut v)?;
                    Ok(v)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap(), vec![3.0; 10]);
        }
    });
}

#[test]
fn a_rank_with_the_wrong_world_or_rank_is_refused_at_setup() {
    bounded(|| {
        let ls: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
        let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
        let mut it = ls.into_iter();
        let (l0, l1) = (it.next().unwrap(), it.next().unwrap());
        // Rank 0's own next is bound but silent, so only the mis-wired rank gets an answer.
        let mute = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = vec![addrs[0], mute.local_addr().unwrap()];
        let zero = thread::spawn(move || connect_alone(0, 2, tcp(l0, a, 1)).0);
        // Thinks the world has three ranks, and dials rank 0 as its next.
        let three = vec![addrs[0], dead_addr(), addrs[1]];
        let two = thread::spawn(move || connect_alone(2, 3, tcp(l1, three, 1)).0);
        let e2 = two.join().unwrap().to_string();
        assert_eq!(redact(&e2), "worker:0 (127.0.0.1:PORT) refused this rank: the world sizes differ");
        let e0 = zero.join().unwrap().to_string();
        assert!(e0.contains("refused meanwhile: 127.0.0.1:"), "{e0}");
        assert!(e0.ends_with("claiming rank 2: the world sizes differ"), "{e0}");
        drop(mute);
    });
}

/// worker:1 connects, then never joins the all-reduce (it is alive, just stuck): worker:0
/// times out naming it, after the operation timeout and not much later.
#[test]
fn a_silent_peer_is_named_after_the_operation_timeout() {
    for kind in ["shm", "tcp"] {
        let (err, took) = bounded(move || {
            let ls: Vec<TcpListener> = (0..2).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
            let addrs: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().unwrap()).collect();
            let path = shm_path("silent");
            let timeouts = CollectiveTimeouts { connect: Duration::from_secs(10), op: Duration::from_millis(500) };
            let transport = move |l: TcpListener| match kind {
                "shm" => shm(&path, 3),
                _ => tcp(l, addrs.clone(), 3),
            };
            let mut ls = ls.into_iter();
            let (t0, t1) = (transport(ls.next().unwrap()), transport(ls.next().unwrap()));
            let (done, wait) = mpsc::channel::<()>();
            let silent = thread::spawn(move || {
                let _c = Collective::connect(Peers::new(1, names(2)).unwrap(), t1, timeouts).unwrap();
                // Stay connected and say nothing until worker:0 has given up.
                let _ = wait.recv_timeout(Duration::from_secs(20));
            });
            let mut c = Collective::connect(Peers::new(0, names(2)).unwrap(), t0, timeouts).unwrap();
            let start = Instant::now();
            let r = c.all_reduce_sum(&mut [1.0f32; 64]);
            let took = start.elapsed();
            let _ = done.send(());
            let _ = silent.join();
            (r.expect_err("should time out"), took)
        });
        assert_eq!(err.to_string(), "worker:1 did not answer the all-reduce within 500 ms", "{kind}");
        assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(2), "{kind}: took {took:?}");
    }
}

/// Serves every connection to a fresh port with `answer` after reading the hello (`None`:
/// closes at once); returns the port's address.
fn stranger_at(answer: Option<&'static [u8]>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            if let Some(bytes) = answer {
                let mut hello = [0u8; 32];
                let _ = std::io::Read::read(&mut s, &mut hello);
                let _ = s.write_all(bytes);
            }
        }
    });
    addr
}

/// A rank whose next rank's address is answered by something that is not trainrun (a web
/// server, a peer that closes at once, another protocol) fails setup at once, naming the
/// address and what answered there.
#[test]
fn tcp_names_what_answers_at_the_next_ranks_address_when_it_is_not_trainrun() {
    let cases: [(Option<&'static [u8]>, &str); 3] = [
        (
            Some(b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/html\r\n\r\n<html>bad</html>"),
            "worker:1's address 127.0.0.1:PORT is answered by an HTTP/1 server (it said `HTTP/1.0 400 Bad Request`), not by a trainrun worker: check that every task has the same cluster addresses",
        ),
        (
            None,
            "worker:1 (127.0.0.1:PORT) refused this rank: it closed the connection without answering the handshake (is it a trainrun worker? did its own setup fail?)",
        ),
        (
            Some(b"SSH-2.0-OpenSSH_9.6\r\n"),
            "worker:1's address 127.0.0.1:PORT is answered by something that sent bytes that are not trainrun's protocol (\"SSH-2.0-OpenSSH_\u{2026}\"), not by a trainrun worker: check that every task has the same cluster addresses",
        ),
    ];
    for (answer, want) in cases {
        let (err, took) = bounded(move || {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addrs = vec![l.local_addr().unwrap(), stranger_at(answer)];
            connect_alone(0, 2, tcp(l, addrs, 1))
        });
        assert!(took < CONNECT, "the stranger should be named at once, took {took:?}");
        assert_eq!(redact(&err.to_string()), want);
    }
}
