//! The scale harness (`trainrun bench --only scale`) end to end: real `trainrun` tasks in
//! network namespaces made on this machine, one namespace a host, train to completion over
//! TCP between hosts; the harness leaves nothing behind (namespaces, links, processes, its
//! folder), also when SIGINT or SIGTERM stops it mid-run. The 64-task run (8 hosts × 8) is
//! `#[ignore]`d: `cargo test --release --test scale -- --ignored`.
//!
//! Needs root (network namespaces); without it each test says loudly that it skipped.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use trainrun::bench::scale::hosts::{Delay, HostsError, NamespaceHosts, Profile, Shaping, leftovers};
use trainrun::bench::scale::train::{TaskLayout, TrainResult, TrainSettings, train};
use trainrun::bench::scale::{self, allreduce};

static NEVER: AtomicBool = AtomicBool::new(false);

// One test of this file at a time: two measure (the start-up cost model's pick, the link
// emulator's delay), and a sibling's cluster on the same 2 cores skews what they measure (a
// probe once read shared memory at 0.31 GB/s and picked halving-doubling over hierarchical).
use common::serial;

/// A cluster for `p`, or `None` after saying loudly why the test cannot run here.
fn cluster(p: TaskLayout) -> Option<NamespaceHosts> {
    match NamespaceHosts::new(p.hosts, Profile::FAST, &NEVER) {
        Ok(c) => Some(c),
        Err(e @ HostsError::NoNamespaces(_)) => {
            eprintln!("\n*** SKIPPED: {e} ***\n");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Processes of cluster `tag`, which process `owner` made: tasks, whose command line names the
/// cluster's folder, and all-reduce peers, whose shared-memory name ends in the owner's pid.
fn processes_of(tag: &str, owner: u32) -> Vec<String> {
    let peer = format!("-{owner}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        let is_peer = environ.split('\0').any(|v| v.starts_with("TRAINRUN_COLLECTIVE_SHM_PATH=") && v.ends_with(&peer));
        if text.contains(tag) || is_peer {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// Folders in the temporary folder that cluster `tag` made.
fn folders_of(tag: &str) -> Vec<String> {
    let prefix = format!("trainrun-scale-{tag}-");
    let entries = std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten();
    entries.map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(&prefix)).collect()
}

/// Fails unless nothing that cluster `tag` made is left, within a few seconds (a killed
/// process leaves `/proc` when its parent reaps it).
fn assert_nothing_left(tag: &str, owner: u32) {
    let start = Instant::now();
    loop {
        let (namespaces, procs, folders) = (leftovers(tag), processes_of(tag, owner), folders_of(tag));
        let links = std::process::Command::new("ip").args(["-o", "link"]).output().unwrap();
        let links: Vec<String> =
            String::from_utf8_lossy(&links.stdout).lines().filter(|l| l.contains(tag)).map(str::to_owned).collect();
        if namespaces.is_empty() && procs.is_empty() && folders.is_empty() && links.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "left behind: namespaces {namespaces:?}, links {links:?}, processes {procs:?}, folders {folders:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_trainrun"))
}

/// `tasks` tasks on their hosts train `steps` steps to completion, within `limit`; the
/// cluster's settings, what the job measured and the cluster's folder (gone by then), after
/// checking the cluster left nothing.
fn train_and_clean_up(tasks: usize, steps: u64, limit: Duration) -> Option<(String, TrainResult, PathBuf)> {
    let p = TaskLayout::for_tasks(tasks);
    let cluster = cluster(p)?;
    let (tag, work) = (cluster.tag.clone(), cluster.work().to_path_buf());
    let settings = TrainSettings { steps, per_replica_batch: 16, implementation: "auto".into(), deadline: limit };
    let result = train(exe(), &cluster, p, &settings, &NEVER).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(result.steps, steps);
    let routed = if p.per_host() > 1 { "shared_memory_and_tcp" } else { "tcp" };
    assert_eq!(result.transport, routed, "`auto` between hosts: shared memory inside each host with several");
    assert_eq!(result.step_ms.len() as u64, steps - 1, "one time per step after the first");
    assert!(!leftovers(&tag).is_empty(), "the namespaces exist while the cluster does");
    let settings = cluster.settings();
    drop(cluster);
    assert_nothing_left(&tag, std::process::id());
    Some((settings, result, work))
}

#[test]
fn four_tasks_on_two_hosts_train_to_completion_and_leave_nothing() {
    let _serial = serial();
    let p = TaskLayout::for_tasks(4);
    assert_eq!((p.hosts, p.per_host()), (2, 2));
    let Some((_, result, work)) = train_and_clean_up(4, 20, Duration::from_secs(60)) else {
        return;
    };
    assert!(result.rendezvous_s > 0.0 && result.rendezvous_s < 30.0, "{result:?}");
    // `auto` across transports: the gradient's one small pack (25,450 floats) crosses the
    // network twice under `hierarchical` and four or six times under the flat algorithms, which
    // the start-up model weighs against its measured links; the chief logs the figures and the
    // pick.
    let choice = result.all_reduce_choice.unwrap_or_else(|| panic!("the chief logged no choice"));
    // Measured now, and kept in the job's own cache folder inside the cluster's (removed with
    // it: checked above), never in the user's ~/.cache.
    assert!(choice.contains("all-reduce cost model measured at start-up ("), "{choice}");
    assert!(choice.contains(&format!("kept in {}/", work.display())), "{choice}");
    assert!(!work.exists(), "{} is left", work.display());
    assert!(choice.contains("inside hosts (shared memory) α"), "{choice}");
    // Which algorithm the measured model picks for this pack is not asserted: on 2 cores shared
    // by 4 tasks the probe's figures vary from run to run, and 20 runs of this test alone picked
    // hierarchical mostly, but also halving-doubling (its "among leaders" link, the whole less
    // the inside part, read at 0.37 GB/s) and once the ring. What the model picks from given
    // figures is checked by `collective_topology`'s `check` snapshot; here, that it measured,
    // logged its figures and picked for the job's pack.
    let pick = choice.split("by pack size: 99.4 KiB → ").nth(1).unwrap_or_default();
    assert!(
        ["ring", "halving_doubling", "hierarchical"].iter().any(|a| pick.starts_with(a)),
        "no pick for the 99.4 KiB pack: {choice}"
    );
}

/// Item 2 of the scale-out: `hierarchical` between namespace hosts, end to end: 6 tasks as
/// 3 hosts × 2 sum over shared memory inside each host and TCP across (the routed transport),
/// train to completion, and a second job of fresh processes ends with the same weights bit for
/// bit; nothing is left behind.
#[test]
fn hierarchical_between_namespace_hosts_trains_with_the_same_bits_run_after_run() {
    let _serial = serial();
    let p = TaskLayout { tasks: 6, hosts: 3 };
    let mut hashes = Vec::new();
    for _ in 0..2 {
        let Some(cluster) = cluster(p) else { return };
        let tag = cluster.tag.clone();
        let settings = TrainSettings {
            steps: 12,
            per_replica_batch: 16,
            implementation: "hierarchical".into(),
            deadline: Duration::from_secs(90),
        };
        let result = train(exe(), &cluster, p, &settings, &NEVER).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(result.steps, 12);
        assert_eq!(result.transport, "shared_memory_and_tcp", "shared memory inside hosts, TCP across");
        drop(cluster);
        assert_nothing_left(&tag, std::process::id());
        hashes.push(result.weights_sha256);
    }
    assert!(hashes[0].len() == 64, "{hashes:?}");
    assert_eq!(hashes[0], hashes[1], "two jobs of fresh processes, the same bits");
}

/// The link emulator, used where the kernel has no `sch_netem`: two hosts on TAP links that
/// the harness's forwarding thread switches; the TCP round trip between them rises by about
/// twice the one-way delay, and nothing (namespaces, TAP devices) is left behind.
///
/// The slow profile's 200 µs: the forwarding thread's wake-ups (tens of µs, more on a busy CI
/// host) are in both round trips but need not cancel exactly, and against the fast profile's
/// 2 × 50 µs they once made the added delay look 20 % short (+80 µs for 100).
#[test]
fn the_link_emulator_adds_its_delay_between_two_hosts_and_leaves_nothing() {
    let _serial = serial();
    let profile = Profile::SLOW;
    let c = match NamespaceHosts::shaped(2, profile, Shaping::Emulator, &NEVER) {
        Ok(c) => c,
        Err(e @ HostsError::NoNamespaces(_)) => {
            eprintln!("\n*** SKIPPED: {e} ***\n");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let (tag, settings) = (c.tag.clone(), c.settings());
    println!("{settings}");
    let Delay::Emulated { round_trip: Some((without, with)) } = c.delay.clone() else {
        panic!("not emulated: {settings}");
    };
    let (added, twice) = (with.saturating_sub(without), Duration::from_micros(2 * u64::from(profile.delay_us)));
    assert!(added >= twice.mul_f64(0.8) && added <= twice + Duration::from_micros(250), "{settings}");
    assert!(settings.contains("link emulator") && settings.contains("without the delay"), "{settings}");
    drop(c);
    assert_nothing_left(&tag, std::process::id());
}

/// The peers the all-reduce measurements start: this build's binary, or `TRAINRUN_SCALE_PEER`
/// (an older build, to compare the two in one sitting).
fn peer_exe() -> std::path::PathBuf {
    std::env::var_os("TRAINRUN_SCALE_PEER").map_or_else(|| exe().to_path_buf(), Into::into)
}

/// The latency target, reported: 1 KB all-reduce among 64 tasks on 8 hosts with 50 µs
/// between hosts, the best of `halving_doubling` and `hierarchical` (over TCP, and over shared
/// memory inside each host) against the ring (target ≤ 0.25×; on 2 cores the 64 processes'
/// turns on them, not the links, set much of the time, so the figure goes to
/// `docs/cost-model.md` rather than into an assertion). `BENCH_ROUNDS` repeats it.
#[test]
#[ignore = "64 processes: run with --ignored --nocapture"]
fn one_kilobyte_among_sixty_four_tasks_leaves_the_ring_behind() {
    let p = TaskLayout::for_tasks(64);
    let Some(c) = cluster(p) else { return };
    println!("64 tasks (8 × 8), {}", c.settings());
    let rounds = std::env::var("BENCH_ROUNDS").map_or(1, |v| v.parse().expect("a count"));
    for _ in 0..rounds {
        let rows = allreduce::measure_sizes(&peer_exe(), &c, p, &allreduce::algorithms(), &[256]).unwrap();
        let ms = |r: &trainrun::collective::bench::BenchRow| r.median.as_secs_f64() * 1e3;
        for r in &rows {
            println!("{:<30} 1 KB  median {:.3} ms  min {:.3} ms", r.label(), ms(r), r.min.as_secs_f64() * 1e3);
        }
        let ring = rows.iter().find(|r| r.algorithm.name() == "ring").map(ms).unwrap();
        let best = rows.iter().filter(|r| r.algorithm.name() != "ring").map(ms).fold(f64::INFINITY, f64::min);
        assert!(best.is_finite() && ring > 0.0, "{rows:?}");
        println!("best non-ring ÷ ring: {:.3} (target ≤ 0.25)", best / ring);
    }
}

/// The all-reduce part of `trainrun bench --only scale` for the worlds in `BENCH_WORLDS`
/// (default 16, 32, 64) at the sizes in `BENCH_SIZES` (floats; default 1 KB, 1 MB, 16 MB) on
/// the link profiles in `BENCH_PROFILES` (`fast`, `slow`; default `fast`): every algorithm,
/// then `auto`, `BENCH_ROUNDS` times (default `allreduce::ROUNDS`) in one cluster, and how close `auto` came to
/// the fastest in each round and over the rounds' medians, with each row's spread over the
/// rounds and whether a miss was `auto`'s pick or the spread between process groups:
/// `cargo test --release --test scale -- --ignored --nocapture allreduce_table`.
#[test]
#[ignore = "up to 64 processes for minutes"]
fn allreduce_table() {
    let list = |key: &str, default: &[usize]| match std::env::var(key) {
        Ok(v) => v.split(',').map(|x| x.trim().parse().expect("a number")).collect(),
        Err(_) => default.to_vec(),
    };
    let profiles: Vec<Profile> = match std::env::var("BENCH_PROFILES") {
        Ok(v) => v
            .split(',')
            .map(|p| match p.trim() {
                "fast" => Profile::FAST,
                "slow" => Profile::SLOW,
                other => panic!("BENCH_PROFILES: {other:?} is not a profile; use fast, slow or both"),
            })
            .collect(),
        Err(_) => vec![Profile::FAST],
    };
    let rounds = std::env::var("BENCH_ROUNDS").map_or(allreduce::ROUNDS, |v| v.parse().expect("a count"));
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut summary = Vec::new();
    for profile in profiles {
        let (mut verdicts, mut per_round) = (Vec::new(), vec![0usize; rounds]);
        for n in list("BENCH_WORLDS", &[16, 32, 64]) {
            let p = TaskLayout::for_tasks(n);
            let c = match NamespaceHosts::new(p.hosts, profile, &NEVER) {
                Ok(c) => c,
                Err(e @ HostsError::NoNamespaces(_)) => return eprintln!("\n*** SKIPPED: {e} ***\n"),
                Err(e) => panic!("{e}"),
            };
            println!("\nN = {n} ({} × {}), {}", p.hosts, p.per_host(), c.settings());
            let sizes = list("BENCH_SIZES", &allreduce::SIZES);
            let all = allreduce::measure_rounds(&peer_exe(), &c, p, &sizes, rounds).unwrap();
            for (round, (rows, within)) in all.iter().zip(per_round.iter_mut()).enumerate() {
                for v in allreduce::verdicts(rows) {
                    println!("round {}: {}", round + 1, v.line());
                    *within += usize::from(v.within());
                }
            }
            let rows = allreduce::combine_rounds(&all);
            for r in &rows {
                let (least, most, picks) = allreduce::spread(&all, r);
                let picks = match r.picked {
                    Some(_) => {
                        format!("  picks {:?}", picks.iter().map(|a| a.map_or("-", |a| a.name())).collect::<Vec<_>>())
                    }
                    None => String::new(),
                };
                println!(
                    "{:<40} {:>9} B  median {:>9.3} ms  rounds {:.3}–{:.3} ms  min {:>9.3} ms{picks}",
                    r.label(),
                    r.bytes,
                    ms(r.median),
                    ms(least),
                    ms(most),
                    ms(r.min)
                );
            }
            for v in allreduce::verdicts(&rows) {
                println!("over the rounds' medians: {}", v.line());
                verdicts.push(v);
            }
            for b in allreduce::bandwidth_bounds(&rows, p) {
                println!("{}", b.line());
            }
        }
        summary
            .push(format!("{}; per round, cells within 10 %: {per_round:?}", scale::verdict_line(profile, &verdicts)));
    }
    println!();
    for line in summary {
        println!("{line}");
    }
}

/// The rendezvous of a first `auto` job (a fresh cache folder: the start-up probe measures)
/// for the worlds in `BENCH_WORLDS` (default 16, 32, 64), 10 Gbit/s and 50 µs links, 5 steps;
/// the tasks are each binary of `BENCH_EXES` (comma-separated paths; default this build's) in
/// turn, `BENCH_ROUNDS` times (default 1), to compare two builds alternately in one sitting:
/// `cargo test --release --test scale -- --ignored --nocapture auto_rendezvous_table`.
#[test]
#[ignore = "up to 64 processes, a job a world and binary"]
fn auto_rendezvous_table() {
    let worlds = std::env::var("BENCH_WORLDS")
        .map_or(vec![16, 32, 64], |v| v.split(',').map(|x| x.trim().parse().expect("a number")).collect());
    let exes: Vec<PathBuf> = std::env::var("BENCH_EXES")
        .map_or(vec![exe().to_path_buf()], |v| v.split(',').map(|x| PathBuf::from(x.trim())).collect());
    let rounds = std::env::var("BENCH_ROUNDS").map_or(1, |v| v.parse().expect("a count"));
    for n in worlds {
        let p = TaskLayout::for_tasks(n);
        let Some(c) = cluster(p) else { return };
        println!("\nN = {n} ({} × {}), {}", p.hosts, p.per_host(), c.settings());
        for round in 1..=rounds {
            for exe in &exes {
                let settings = TrainSettings {
                    steps: 5,
                    per_replica_batch: 16,
                    implementation: "auto".into(),
                    deadline: scale::deadline(n),
                };
                // Each job its own folder, so its own empty cache (`train`).
                let r = train(exe, &c, p, &settings, &NEVER).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(r.steps, 5);
                println!(
                    "round {round} {}: rendezvous {:.3} s\n    {}",
                    exe.display(),
                    r.rendezvous_s,
                    r.all_reduce_choice.unwrap_or_default()
                );
            }
        }
    }
}

/// The training part of `trainrun bench --only scale-full` for the worlds in `BENCH_WORLDS`
/// (default 16, 32, 64) on the 10 Gbit/s, 50 µs links: the tiny MLP, 100 steps, with `auto`
/// and every algorithm; per job the rendezvous and step time p50 / p90 / p99. Every job must
/// train to completion (`cargo test --release --test scale -- --ignored --nocapture
/// training_table`).
#[test]
#[ignore = "up to 64 processes, 4 jobs a world"]
fn training_table() {
    let worlds = std::env::var("BENCH_WORLDS")
        .map_or(vec![16, 32, 64], |v| v.split(',').map(|x| x.trim().parse().expect("a number")).collect());
    for n in worlds {
        let p = TaskLayout::for_tasks(n);
        let Some(c) = cluster(p) else { return };
        println!("\nN = {n} ({} × {}), {}", p.hosts, p.per_host(), c.settings());
        for implementation in scale::implementations() {
            let settings =
                TrainSettings { steps: 100, per_replica_batch: 16, implementation, deadline: scale::deadline(n) };
            let r = train(exe(), &c, p, &settings, &NEVER).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.steps, 100, "{} at N = {n}", settings.implementation);
            println!(
                "{:<18} {:<22} rendezvous {:.3} s  step ms p50 {:.3}  p90 {:.3}  p99 {:.3}{}",
                settings.implementation,
                r.transport,
                r.rendezvous_s,
                r.step_median_ms(),
                r.step_p90_ms(),
                r.step_p99_ms(),
                r.all_reduce_choice.map(|c| format!("\n    {c}")).unwrap_or_default()
            );
        }
    }
}

/// `trainrun bench --only scale` started, once its first cluster is up: the bench and that
/// cluster's tag; `None` (having said why) where clusters cannot be made.
fn bench_with_a_cluster() -> Option<(std::process::Child, String)> {
    drop(cluster(TaskLayout::for_tasks(2))?);
    let mut bench = common::trainrun()
        .args(["bench", "--only", "scale"])
        .env("TRAINRUN_BENCH_PYTHON", "/nonexistent/python")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(bench.stdout.take().unwrap()).lines();
    // `-- N = 2 (2 × 1), cluster <tag>: …` once the namespaces exist.
    let tag = loop {
        let line = lines.next().expect("the bench ended before making a cluster").unwrap();
        if let Some(rest) = line.split(", cluster ").nth(1) {
            break rest.split(':').next().unwrap().to_owned();
        }
    };
    Some((bench, tag))
}

/// The bench stopped by `signal` mid-run removes everything itself.
fn stopped_mid_run(signal: libc::c_int) {
    let Some((bench, tag)) = bench_with_a_cluster() else {
        return;
    };
    let owner = bench.id();
    std::thread::sleep(Duration::from_millis(300));
    common::signal(owner, signal);
    let (out, took) = common::wait_within(bench, Duration::from_secs(30));
    let (_, stderr) = common::text(&out);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("stopped on request"), "{stderr}");
    assert!(took < Duration::from_secs(10), "the stop took {took:?}");
    assert_nothing_left(&tag, owner);
}

#[test]
fn a_harness_stopped_by_sigterm_leaves_nothing() {
    let _serial = serial();
    stopped_mid_run(libc::SIGTERM);
}

#[test]
fn a_harness_stopped_by_ctrl_c_leaves_nothing() {
    let _serial = serial();
    stopped_mid_run(libc::SIGINT);
}

/// SIGKILL gives the bench no chance to clean up: the next cluster removes what it left.
#[test]
fn what_a_harness_killed_by_sigkill_left_the_next_one_removes() {
    let _serial = serial();
    let Some((mut bench, tag)) = bench_with_a_cluster() else {
        return;
    };
    let owner = bench.id();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!leftovers(&tag).is_empty(), "the bench's namespaces exist while it runs");
    bench.kill().unwrap();
    bench.wait().unwrap();
    // (Another test's cluster, made meanwhile, may have removed them already.)
    drop(cluster(TaskLayout::for_tasks(2)));
    assert_nothing_left(&tag, owner);
}

/// Target: 64 tasks train to completion; rendezvous ≤ 3 s.
#[test]
#[ignore = "64 processes for about a minute: run with --ignored"]
fn sixty_four_tasks_on_eight_hosts_train_to_completion() {
    let p = TaskLayout::for_tasks(64);
    assert_eq!((p.hosts, p.per_host()), (8, 8));
    let Some((settings, result, _)) = train_and_clean_up(64, 40, Duration::from_secs(300)) else {
        return;
    };
    println!(
        "64 tasks (8 × 8), {settings}: rendezvous {:.3} s, step p50 {:.3} ms, p90 {:.3} ms",
        result.rendezvous_s,
        result.step_median_ms(),
        result.step_p90_ms()
    );
    assert!(result.rendezvous_s <= 3.0, "rendezvous of 64 tasks took {:.3} s (target ≤ 3 s)", result.rendezvous_s);
}
