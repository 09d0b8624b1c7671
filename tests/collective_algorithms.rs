//! Every all-reduce algorithm over every transport the plan lets it run on, between real
//! processes (this test binary started as peers, filtered to `peer_entry`), at 2, 3 and 4
//! ranks: each rank checks its sum against the sum in f64 (and, for algorithms that sum in
//! rank order, against the plain sequential sum bit for bit), every rank reports the same
//! bits, and a second run of fresh processes the same bits again. Also `trainrun check`: the
//! plan says which algorithm runs over which transport, and refuses what cannot run.

mod common;

use common::{assert_exit, run, text};
use std::time::{Duration, Instant};
use trainrun::collective::bench::{self, PeerMode, Wire};
use trainrun::collective::{Algorithm, CollectiveTimeouts, Launcher, PeerGroup, PeerSpec};

/// Not a test: the body of every peer process. Without the peer environment it does nothing.
#[test]
fn peer_entry() {
    if let Some(code) = bench::peer_exit_code_from_env() {
        std::process::exit(i32::from(code));
    }
}

fn launcher() -> Launcher {
    Launcher::test_entry("peer_entry").expect("the test binary's path")
}

/// Floats per all-reduce: one, fewer than the ranks, uneven, and more than one segment of
/// every transport (512 KiB), so the pipelines run.
const SIZES: [usize; 4] = [1, 3, 1000, 300_001];

/// Each rank's `TRAINRUN-SUM` lines (size and hash of the result's bits) after a verify run.
fn sums(algorithm: Algorithm, wire: Wire, world: usize, run: usize) -> Vec<Vec<String>> {
    let spec = PeerSpec {
        label: format!("algorithms-{}-{}-{world}-{run}", algorithm.name(), wire.as_str()),
        mode: PeerMode::Verify,
        wire,
        world,
        sizes: SIZES.to_vec(),
        iters: 1,
        timeouts: CollectiveTimeouts { connect: Duration::from_secs(20), op: Duration::from_secs(20) },
    };
    let case = format!("{} over {}, {world} ranks", algorithm.name(), wire.as_str());
    let group = PeerGroup::spawn_with(&launcher(), &spec, algorithm).unwrap_or_else(|e| panic!("{case}: {e}"));
    let outcomes = group.finish(Duration::from_secs(90));
    for o in &outcomes {
        assert_eq!(o.code, Some(0), "{case}: worker:{} failed: {}", o.rank, o.stderr);
    }
    outcomes.into_iter().map(|o| o.lines.into_iter().filter(|l| l.starts_with("TRAINRUN-SUM")).collect()).collect()
}

#[test]
fn every_algorithm_matches_the_f64_sum_over_every_transport_it_runs_on() {
    let wires = [Wire::Shm, Wire::ShmArena, Wire::Tcp, Wire::TcpTls];
    for algorithm in Algorithm::ALL {
        let carriers: Vec<Wire> = wires.into_iter().filter(|w| w.carries(algorithm)).collect();
        assert!(!carriers.is_empty(), "{} runs over no transport", algorithm.name());
        for wire in carriers {
            for world in 2..=4 {
                let case = format!("{} over {}, {world} ranks", algorithm.name(), wire.as_str());
                let first = sums(algorithm, wire, world, 1);
                assert_eq!(first[0].len(), SIZES.len(), "{case}: {:?}", first[0]);
                for (rank, s) in first.iter().enumerate() {
                    assert_eq!(s, &first[0], "{case}: worker:{rank} and worker:0 disagree on the bits");
                }
                assert_eq!(sums(algorithm, wire, world, 2)[0], first[0], "{case}: a second run gave other bits");
            }
        }
    }
}

/// The ring over shared memory waits on one peer at a time, point to point: a peer that dies
/// while the other waits on it is named within milliseconds, not at the 30 s timeout.
#[test]
fn a_peer_killed_mid_ring_over_shared_memory_is_named_quickly() {
    let spec = PeerSpec {
        label: "algorithms-kill".into(),
        mode: PeerMode::Soak,
        wire: Wire::Shm,
        world: 2,
        sizes: vec![250_000],
        iters: 1_000_000,
        timeouts: CollectiveTimeouts { connect: Duration::from_secs(20), op: Duration::from_secs(30) },
    };
    let mut group = PeerGroup::spawn_with(&launcher(), &spec, Algorithm::Ring).unwrap_or_else(|e| panic!("{e}"));
    for rank in 0..2 {
        let ready = group.wait_for_line(rank, "TRAINRUN-READY", Duration::from_secs(30));
        assert!(ready.is_some(), "worker:{rank} never got going");
    }
    let victim = group.pid(1).expect("worker:1's pid");
    let killed = Instant::now();
    group.kill(1).unwrap_or_else(|e| panic!("{e}"));
    let outcomes = group.finish(Duration::from_secs(60));
    assert!(killed.elapsed() < Duration::from_secs(3), "took {:?}", killed.elapsed());
    assert_eq!(outcomes[0].code, Some(i32::from(bench::EXIT_COLLECTIVE)), "{}", outcomes[0].stderr);
    assert_eq!(outcomes[0].stderr.trim(), format!("worker:0: worker:1 is gone: its process exited (pid {victim})"));
}

/// `trainrun check`'s all-reduce line for the multi-worker tutorial job with `sets`.
fn all_reduce_line(sets: &[&str]) -> String {
    let mut args = vec!["check", "specs/mnist_multiworker.toml"];
    for s in sets {
        args.extend(["--set", s]);
    }
    let out = run(&args);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    stdout.lines().find(|l| l.trim_start().starts_with("all-reduce")).unwrap_or_default().to_string()
}

#[test]
fn the_plan_says_which_algorithm_runs_over_which_transport() {
    let line = all_reduce_line(&[]);
    assert!(line.contains("direct: every worker sums its share"), "{line}");
    assert!(line.contains("over shared memory (every worker on this host); both chosen by auto"), "{line}");
    let line = all_reduce_line(&["strategy.communication.transport=\"tcp\""]);
    assert!(line.contains("ring: reduce-scatter, then all-gather over TCP; the algorithm chosen by auto"), "{line}");
    let line = all_reduce_line(&["strategy.communication.implementation=\"ring\""]);
    assert!(line.contains("ring: reduce-scatter, then all-gather over shared memory"), "{line}");
    assert!(line.contains("the transport chosen by auto"), "{line}");
    // `cluster.tls` makes TCP a transport of its own (the files are read when the job starts).
    let tls = "cluster.tls={ cert_file = \"c.pem\", key_file = \"k.pem\", ca_file = \"ca.pem\" }";
    let line = all_reduce_line(&["strategy.communication.transport=\"tcp\"", tls]);
    assert!(line.contains("ring: reduce-scatter, then all-gather over TCP under mutual TLS (cluster.tls)"), "{line}");
}

#[test]
fn the_plan_refuses_nccl_between_worker_processes() {
    let out =
        run(&["check", "specs/mnist_multiworker.toml", "--set", "strategy.communication.implementation=\"nccl\""]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("implementation = \"nccl\" needs GPU devices, but the workers' devices are CPUs"),
        "{stderr}"
    );
    assert!(stderr.contains("use implementation = \"ring\" (or \"auto\") between worker processes"), "{stderr}");
}
