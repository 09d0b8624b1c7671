//! Collectives between real processes: this test binary starts copies of itself as peers
//! (filtered to `peer_entry`, configured through environment variables) and checks what
//! they report. Every test has a hard limit; a dropped group kills its peers.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};
use trainrun::collective::bench::{self, BenchOptions, PeerMode, Wire};
use trainrun::collective::{CollectiveTimeouts, Launcher, PeerGroup, PeerOutcome, PeerSpec};

const HARD_LIMIT: Duration = Duration::from_secs(120);

/// Runs `f` on its own thread; fails the test if it takes longer than the hard limit (the
/// group it owns is dropped with the thread's panic, or killed when the process ends).
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

/// Not a test: the body of every peer process. Without the peer environment it does nothing.
#[test]
fn peer_entry() {
    if let Some(code) = bench::peer_exit_code_from_env() {
        std::process::exit(i32::from(code));
    }
}

fn launcher() -> Launcher {
    Launcher {
        program: std::env::current_exe().expect("the test binary's path"),
        args: ["peer_entry", "--exact", "--nocapture", "--test-threads=1"].map(Into::into).to_vec(),
    }
}

fn spec(
    label: &str,
    mode: PeerMode,
    wire: Wire,
    world: usize,
    sizes: Vec<usize>,
    iters: usize,
    op: Duration,
) -> PeerSpec {
    PeerSpec {
        label: format!("{label}-{}", wire.as_str()),
        mode,
        wire,
        world,
        sizes,
        iters,
        timeouts: CollectiveTimeouts { connect: Duration::from_secs(20), op },
    }
}

#[track_caller]
fn assert_all_ok(outcomes: &[PeerOutcome]) {
    for o in outcomes {
        assert_eq!(o.code, Some(0), "worker:{} failed: {}", o.rank, o.stderr);
    }
}

#[test]
fn every_transport_sums_correctly_between_processes() {
    bounded(|| {
        // 300 001 floats is more than a shared-memory piece (2 MiB staging, 1 MiB pieces).
        let sizes = vec![1, 1000, 300_001];
        for (wire, world) in [(Wire::Shm, 2), (Wire::ShmArena, 2), (Wire::Tcp, 2), (Wire::Shm, 3), (Wire::Tcp, 3)] {
            let spec = spec(
                &format!("verify-{world}"),
                PeerMode::Verify,
                wire,
                world,
                sizes.clone(),
                1,
                Duration::from_secs(20),
            );
            let outcomes = PeerGroup::spawn(&launcher(), &spec).unwrap().finish(Duration::from_secs(60));
            assert_all_ok(&outcomes);
            let sums: Vec<Vec<&String>> =
                outcomes.iter().map(|o| o.lines.iter().filter(|l| l.starts_with("TRAINRUN-SUM")).collect()).collect();
            assert_eq!(sums[0].len(), sizes.len(), "{wire:?}: {:?}", sums[0]);
            for s in &sums {
                assert_eq!(s, &sums[0], "{wire:?}, world {world}: ranks disagree on the bits");
            }
        }
    });
}

/// Kills worker:1 with SIGKILL while both run all-reduces in a loop; worker:0 must fail fast,
/// naming it, long before the 30 s operation timeout. Returns worker:0's error and how long
/// it took to exit after the kill.
fn kill_mid_collective(wire: Wire) -> (String, Duration, u32) {
    let spec = spec("kill", PeerMode::Soak, wire, 2, vec![250_000], 1_000_000, Duration::from_secs(30));
    let mut group = PeerGroup::spawn(&launcher(), &spec).unwrap();
    for rank in 0..2 {
        assert!(
            group.wait_for_line(rank, "TRAINRUN-READY", Duration::from_secs(30)).is_some(),
            "worker:{rank} never got going"
        );
    }
    thread::sleep(Duration::from_millis(50));
    let victim = group.pid(1).unwrap();
    let killed = Instant::now();
    group.kill(1).unwrap();
    let outcomes = group.finish(Duration::from_secs(60));
    let took = killed.elapsed();
    let survivor = &outcomes[0];
    assert_eq!(survivor.code, Some(i32::from(bench::EXIT_COLLECTIVE)), "worker:0: {}", survivor.stderr);
    (survivor.stderr.trim().to_string(), took, victim)
}

#[test]
fn a_peer_killed_mid_collective_is_named_quickly_over_shared_memory() {
    let (err, took, pid) = bounded(|| kill_mid_collective(Wire::Shm));
    assert!(took < Duration::from_secs(3), "took {took:?}");
    // The victim is not reaped until the group finishes: found gone as a zombie.
    assert_eq!(err, format!("worker:0: worker:1 is gone: its process exited (pid {pid})"));
}

#[test]
fn a_peer_killed_mid_collective_is_named_quickly_over_tcp() {
    let (err, took, _) = bounded(|| kill_mid_collective(Wire::Tcp));
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(err.starts_with("worker:0: connection to worker:1 (127.0.0.1:"), "{err}");
    assert!(err.ends_with(") closed during the all-reduce"), "{err}");
}

/// Prints the benchmark table: `cargo test --release --test collective_processes -- --ignored --nocapture bench_table`.
#[test]
#[ignore = "a benchmark, minutes long"]
fn bench_table() {
    let mut opts = BenchOptions::standard(launcher());
    if let Ok(w) = std::env::var("BENCH_WIRES") {
        opts.wires = w.split(',').map(|w| w.parse().unwrap()).collect();
    }
    if let Ok(w) = std::env::var("BENCH_WORLDS") {
        opts.worlds = w.split(',').map(|w| w.parse().unwrap()).collect();
    }
    if let Ok(s) = std::env::var("BENCH_SIZES") {
        opts.sizes = s.split(',').map(|s| s.parse().unwrap()).collect();
    }
    let rows = bench::run(&opts).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", bench::table(&rows));
}

/// Prints whether overlapping reduction with backward pays:
/// `cargo test --release --test collective_processes -- --ignored --nocapture overlap_table`.
#[test]
#[ignore = "a benchmark"]
fn overlap_table() {
    let mut opts = BenchOptions::standard(launcher());
    if let Ok(w) = std::env::var("BENCH_WIRES") {
        opts.wires = w.split(',').map(|w| w.parse().unwrap()).collect();
    }
    opts.worlds = vec![2];
    let rows = bench::run_overlap(&opts, 2_770_000, &[262_144, 1_048_576], 15).unwrap_or_else(|e| panic!("{e}"));
    for (wire, world, label, t) in rows {
        println!("{:<10} {world} {label:<18} {:>8.3} ms", wire.as_str(), t.as_secs_f64() * 1e3);
    }
}
