//! The all-reduce algorithms for many ranks, between real processes (this test binary started
//! as peers, filtered to `peer_entry`): `halving_doubling` and `hierarchical` over TCP at 2, 3,
//! 4 and 8 ranks, and `hierarchical` over shared memory inside "hosts" and TCP across them
//! (peers told their host) with 2 and 3 hosts, the flat ones too (over TCP throughout, as
//! `auto` runs them there). Each rank checks its sum against the f64 sum,
//! every rank reports the same bits, and a second run of fresh processes the same bits again.
//! An ignored test does the same at 16, 24, 48, 63 and 64 ranks. Also `trainrun check` of a
//! cluster on several hosts: the hosts, the groups, the cost model and its choice.

mod common;

use common::{assert_exit, run, text, trainrun};
use std::time::Duration;
use trainrun::collective::bench::{self, PeerMode, Wire};
use trainrun::collective::{Algorithm, CollectiveTimeouts, Launcher, PeerGroup, PeerSpec};

/// Not a test: the body of every peer process. Without the peer environment it does nothing.
#[test]
fn peer_entry() {
    if let Some(code) = bench::peer_exit_code_from_env() {
        std::process::exit(i32::from(code));
    }
}

/// Floats per all-reduce: one, fewer than the ranks, uneven, and more than one 512 KiB
/// segment, so the pipelines run.
const SIZES: [usize; 4] = [1, 3, 1000, 300_001];

/// Each rank's `TRAINRUN-SUM` lines after a verify run of `algorithm` over `wire`, rank r on
/// host `hosts[r]`.
fn sums(algorithm: Algorithm, wire: Wire, hosts: &[usize], run: usize) -> Vec<Vec<String>> {
    let world = hosts.len();
    let spec = PeerSpec {
        label: format!("topology-{}-{}-{world}-{run}", algorithm.name(), wire.as_str().replace('+', "-")),
        mode: PeerMode::Verify,
        wire,
        world,
        sizes: SIZES.to_vec(),
        iters: 1,
        timeouts: CollectiveTimeouts { connect: Duration::from_secs(60), op: Duration::from_secs(60) },
    };
    let case = format!("{} over {}, hosts {hosts:?}", algorithm.name(), wire.as_str());
    let launcher = Launcher::test_entry("peer_entry").expect("the test binary's path");
    let group = PeerGroup::spawn_on_hosts(&launcher, &spec, algorithm, hosts).unwrap_or_else(|e| panic!("{case}: {e}"));
    let outcomes = group.finish(Duration::from_secs(180));
    for o in &outcomes {
        assert_eq!(o.code, Some(0), "{case}: worker:{} failed: {}", o.rank, o.stderr);
    }
    outcomes.into_iter().map(|o| o.lines.into_iter().filter(|l| l.starts_with("TRAINRUN-SUM")).collect()).collect()
}

/// Two runs agree with each other and every rank with rank 0.
fn same_bits_everywhere_and_again(algorithm: Algorithm, wire: Wire, hosts: &[usize]) {
    let case = format!("{} over {}, hosts {hosts:?}", algorithm.name(), wire.as_str());
    let first = sums(algorithm, wire, hosts, 1);
    assert_eq!(first[0].len(), SIZES.len(), "{case}: {:?}", first[0]);
    for (rank, s) in first.iter().enumerate() {
        assert_eq!(s, &first[0], "{case}: worker:{rank} and worker:0 disagree on the bits");
    }
    assert_eq!(sums(algorithm, wire, hosts, 2)[0], first[0], "{case}: a second run gave other bits");
}

#[test]
fn halving_doubling_and_hierarchical_over_tcp_match_the_f64_sum() {
    for world in [2, 3, 4, 8] {
        same_bits_everywhere_and_again(Algorithm::HalvingDoubling, Wire::Tcp, &vec![0; world]);
        // Over TCP alone, hosts still shape the steps: two ranks a host.
        let hosts: Vec<usize> = (0..world).map(|r| r / 2).collect();
        same_bits_everywhere_and_again(Algorithm::Hierarchical, Wire::Tcp, &hosts);
    }
}

#[test]
fn hierarchical_runs_over_shared_memory_inside_hosts_and_tcp_across() {
    for hosts in [vec![0, 0, 1, 1], vec![0, 0, 0, 1, 1, 2], vec![0, 1, 0, 1, 2]] {
        same_bits_everywhere_and_again(Algorithm::Hierarchical, Wire::Routed, &hosts);
    }
}

/// The flat algorithms over shared memory inside hosts and TCP across, as `auto` runs them
/// when a pack size takes one: every exchange over TCP, to ranks of the same host too (the
/// ring's exchange at a host boundary sends inside while it receives from across).
#[test]
fn flat_algorithms_over_the_routed_transport_match_the_f64_sum() {
    for hosts in [vec![0, 0, 1, 1], vec![0, 0, 0, 1, 1, 2]] {
        same_bits_everywhere_and_again(Algorithm::Ring, Wire::Routed, &hosts);
        same_bits_everywhere_and_again(Algorithm::HalvingDoubling, Wire::Routed, &hosts);
    }
}

/// 16 to 64 processes on a 2-core machine take a while: run with `--ignored`.
#[test]
#[ignore = "16–64 processes; run by hand and report"]
fn large_worlds_match_the_f64_sum() {
    for world in [16, 24, 48, 63, 64] {
        same_bits_everywhere_and_again(Algorithm::HalvingDoubling, Wire::Tcp, &vec![0; world]);
        same_bits_everywhere_and_again(Algorithm::Ring, Wire::Tcp, &vec![0; world]);
        let hosts: Vec<usize> = (0..world).map(|r| r / 8).collect();
        same_bits_everywhere_and_again(Algorithm::Hierarchical, Wire::Routed, &hosts);
    }
}

/// The rows `trainrun check` prints about the data plane of a 5-worker cluster on 3 hosts.
fn data_plane_rows(sets: &[&str]) -> String {
    let cluster = "cluster.worker=[\"10.0.0.1:2222\", \"10.0.0.1:2223\", \"10.0.0.2:2222\", \"10.0.0.2:2223\", \"10.0.0.3:2222\"]";
    let mut args = vec!["check", "specs/mnist_multiworker.toml", "--set", cluster];
    for s in sets {
        args.extend(["--set", s]);
    }
    // A cluster across hosts needs to be told which task this is.
    let out = trainrun().env("TRAINRUN_TASK", "worker:0").args(&args).output().expect("trainrun runs");
    let (stdout, stderr) = text(&out);
    assert_exit(&out, 0);
    let rows: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("all-reduce"))
        .take_while(|l| {
            ["all-reduce", "hosts", "groups", "cost model", "estimates"].iter().any(|k| l.trim_start().starts_with(k))
        })
        .collect();
    assert!(!rows.is_empty(), "{stdout}{stderr}");
    rows.join("\n")
}

#[test]
fn check_prints_the_hosts_the_groups_and_the_cost_models_choice() {
    let small = data_plane_rows(&["strategy.communication.bytes_per_pack=16384"]);
    insta::assert_snapshot!("check_several_hosts", format!("{}\n\n{small}", data_plane_rows(&[])));
    let ring = data_plane_rows(&["strategy.communication.implementation=\"ring\""]);
    assert!(ring.contains("ring: reduce-scatter, then all-gather over TCP"), "{ring}");
}

#[test]
fn check_refuses_a_cost_model_without_a_rate() {
    let out = run(&[
        "check",
        "specs/mnist_multiworker.toml",
        "--set",
        "strategy.communication.cost_model.network={ latency_us = 50, gigabytes_per_s = 0 }",
    ]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("strategy.communication.cost_model.network.gigabytes_per_s"), "{stderr}");
    assert!(stderr.contains("network.gigabytes_per_s = 0 is not a rate"), "{stderr}");
    assert!(stderr.contains("use a positive number of gigabytes per second"), "{stderr}");
}

/// Prints every algorithm's all-reduce time over TCP (and `hierarchical` over shared memory
/// inside hosts of `BENCH_PER_HOST` ranks, default 4) at 1 KB, 1 MB and 16 MB between 2, 4, 8
/// and 16 processes (`BENCH_WORLDS`, `BENCH_SIZES` in floats, `BENCH_ALGORITHMS` override;
/// `TRAINRUN_COLLECTIVE_AUTO=1` runs each as `auto` does, starting from that algorithm):
/// `cargo test --release --test collective_topology -- --ignored --nocapture algorithm_table`.
#[test]
#[ignore = "a benchmark, minutes long"]
fn algorithm_table() {
    let list = |key: &str, default: &[usize]| match std::env::var(key) {
        Ok(v) => v.split(',').map(|x| x.trim().parse().expect("a number")).collect(),
        Err(_) => default.to_vec(),
    };
    let launcher = Launcher::test_entry("peer_entry").expect("the test binary's path");
    let mut opts = bench::BenchOptions::scaling(launcher);
    opts.worlds = list("BENCH_WORLDS", &[2, 4, 8, 16]);
    opts.sizes = list("BENCH_SIZES", &[256, 250_000, 4_000_000]);
    opts.per_host = list("BENCH_PER_HOST", &[4])[0];
    if let Ok(w) = std::env::var("BENCH_WIRES") {
        opts.wires = w.split(',').map(|w| w.parse().expect("a wire")).collect();
    }
    if let Ok(a) = std::env::var("BENCH_ALGORITHMS") {
        opts.algorithms = a.split(',').map(|a| Algorithm::from_name(a.trim()).expect("an algorithm")).collect();
    }
    let rows = bench::run(&opts).unwrap_or_else(|e| panic!("{e}"));
    println!("{}", bench::table(&rows));
}
