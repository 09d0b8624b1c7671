//! Mutual TLS (`cluster.tls`) end to end, with certificates made here by rcgen: the control
//! plane and the TCP ring work over TLS, the token is still required, and a task whose
//! certificate comes from another CA is refused with a message that says so, on either plane.
//! Last, a whole two-worker job over TLS ends with the same weights as over plain TCP.

mod common;

use common::certs::{Ca, TaskFiles};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;
use trainrun::cluster::tls::{TlsFiles, TlsMaterial};
use trainrun::cluster::{ClusterConfig, ClusterError, ControlPlane, JobToken, TaskId, Timeouts};
use trainrun::collective::reduce::sequential_sum;
use trainrun::collective::{Collective, CollectiveError, Communicator, Peers, TcpOptions, TlsPeers, Transport};

const LIMIT: Duration = Duration::from_secs(60);

fn material(files: &TaskFiles) -> Arc<TlsMaterial> {
    let files = TlsFiles { cert: files.cert.clone(), key: files.key.clone(), ca: files.ca.clone() };
    Arc::new(TlsMaterial::load(files).unwrap())
}

fn token(t: &str) -> JobToken {
    JobToken::new(t, "the test").unwrap()
}

/// One config per task on loopback, each with its TLS material and token.
fn job(tasks: Vec<(Arc<TlsMaterial>, JobToken)>, startup_ms: u64) -> Vec<(ClusterConfig, TcpListener)> {
    let listeners: Vec<TcpListener> = tasks.iter().map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let roster: BTreeMap<TaskId, String> = listeners
        .iter()
        .enumerate()
        .map(|(i, l)| (format!("worker:{i}").parse().unwrap(), l.local_addr().unwrap().to_string()))
        .collect();
    let chief = TaskId::chief_of(roster.keys()).unwrap();
    tasks
        .into_iter()
        .zip(listeners)
        .enumerate()
        .map(|(i, ((tls, token), listener))| {
            let config = ClusterConfig {
                task: format!("worker:{i}").parse().unwrap(),
                roster: roster.clone(),
                chief,
                token,
                spec_hash: "spec".into(),
                spec_keys: BTreeMap::new(),
                version: "0.1.0".into(),
                timeouts: Timeouts {
                    startup: Duration::from_millis(startup_ms),
                    failure: Duration::from_secs(2),
                    heartbeat: Duration::from_millis(100),
                },
                payload: Vec::new(),
                tls: Some(tls),
                expendable: Vec::new(),
            };
            (config, listener)
        })
        .collect()
}

/// Every task's rendezvous, run at once; panics past the limit.
fn rendezvous(job: Vec<(ClusterConfig, TcpListener)>) -> Vec<Result<usize, String>> {
    let (tx, rx) = mpsc::channel();
    let n = job.len();
    for (i, (config, listener)) in job.into_iter().enumerate() {
        let tx = tx.clone();
        thread::spawn(move || {
            let plane = ControlPlane::start_on(config, listener).unwrap();
            let out = plane.rendezvous().map(|r| r.len()).map_err(|e: ClusterError| e.to_string());
            let _ = tx.send((i, out));
            // Hold the plane until every task has its answer.
            thread::sleep(Duration::from_secs(1));
            plane.shutdown();
        });
    }
    let mut out: Vec<Option<Result<usize, String>>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (i, r) = rx.recv_timeout(LIMIT).expect("a task hung");
        out[i] = Some(r);
    }
    out.into_iter().map(Option::unwrap).collect()
}

const TOKEN: &str = "tls-test-token-0123456789";

#[test]
fn the_control_plane_runs_over_mutual_tls() {
    let dir = common::tempdir();
    let ca = Ca::new(dir.path(), "job-ca");
    let tasks = (0..3).map(|i| (material(&ca.task(dir.path(), &format!("w{i}"), &["127.0.0.1"])), token(TOKEN)));
    let outcomes = rendezvous(job(tasks.collect(), 20_000));
    assert!(outcomes.iter().all(|o| *o == Ok(3)), "{outcomes:?}");
}

#[test]
fn a_task_with_another_cas_certificate_is_refused_clearly() {
    let dir = common::tempdir();
    let ca = Ca::new(dir.path(), "job-ca");
    let other = Ca::new(dir.path(), "other-ca");
    let chief = material(&ca.task(dir.path(), "chief", &["127.0.0.1"]));
    // Everything from another CA: it does not trust the chief.
    let stranger = material(&other.task(dir.path(), "stranger", &["127.0.0.1"]));
    let outcomes = rendezvous(job(vec![(chief.clone(), token(TOKEN)), (stranger, token(TOKEN))], 3_000));
    let e = outcomes[1].as_ref().unwrap_err();
    assert!(
        e.contains("TLS with the chief worker:0") && e.contains("not signed by this task's CA"),
        "the stranger says why: {e}"
    );
    // Trusting the job's CA but holding another CA's certificate: the chief refuses it.
    let mut impostor = other.task(dir.path(), "impostor", &["127.0.0.1"]);
    impostor.ca = ca.pem.clone();
    let outcomes = rendezvous(job(vec![(chief, token(TOKEN)), (material(&impostor), token(TOKEN))], 3_000));
    let e = outcomes[1].as_ref().unwrap_err();
    assert!(e.contains("refused this task's certificate"), "the impostor says why: {e}");
    assert!(outcomes[0].as_ref().unwrap_err().contains("worker:1 never checked in"), "{:?}", outcomes[0]);
}

#[test]
fn the_token_is_still_required_over_tls() {
    let dir = common::tempdir();
    let ca = Ca::new(dir.path(), "job-ca");
    let a = material(&ca.task(dir.path(), "a", &["127.0.0.1"]));
    let b = material(&ca.task(dir.path(), "b", &["127.0.0.1"]));
    let outcomes = rendezvous(job(vec![(a, token(TOKEN)), (b, token("another-jobs-token-0000"))], 3_000));
    assert!(outcomes[1].as_ref().unwrap_err().contains("refused this task's job token"), "{outcomes:?}");
}

/// The ring over TLS with `world` ranks, each rank's files from `files(rank)`.
fn ring(world: usize, files: impl Fn(usize) -> Arc<TlsMaterial>, data: Vec<Vec<f32>>) -> Vec<Result<Vec<f32>, String>> {
    let listeners: Vec<TcpListener> = (0..world).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let names: Vec<String> = (0..world).map(|r| format!("worker:{r}")).collect();
    let (tx, rx) = mpsc::channel();
    for ((rank, listener), mut mine) in listeners.into_iter().enumerate().zip(data) {
        let tls = TlsPeers { config: files(rank).ring().clone(), names: vec!["127.0.0.1".into(); world] };
        let (tx, names, addrs) = (tx.clone(), names.clone(), addrs.clone());
        thread::spawn(move || {
            let peers = Peers::new(rank, names).unwrap();
            let options =
                TcpOptions { job_token: 7, segment_bytes: 4096, tls: Some(tls), ..TcpOptions::new(addrs, listener) };
            let timeouts = trainrun::collective::CollectiveTimeouts {
                connect: Duration::from_secs(5),
                op: Duration::from_secs(20),
            };
            let out = Collective::connect(peers, Transport::TcpRing(options), timeouts)
                .and_then(|mut c| c.all_reduce_sum(&mut mine).map(|()| mine))
                .map_err(|e: CollectiveError| e.to_string());
            let _ = tx.send((rank, out));
        });
    }
    let mut out: Vec<Option<Result<Vec<f32>, String>>> = (0..world).map(|_| None).collect();
    for _ in 0..world {
        let (rank, r) = rx.recv_timeout(LIMIT).expect("a rank hung");
        out[rank] = Some(r);
    }
    out.into_iter().map(Option::unwrap).collect()
}

#[test]
fn the_ring_sums_over_tls_and_refuses_another_ca() {
    let dir = common::tempdir();
    let ca = Ca::new(dir.path(), "job-ca");
    let other = Ca::new(dir.path(), "other-ca");
    let good: Vec<Arc<TlsMaterial>> =
        (0..3).map(|i| material(&ca.task(dir.path(), &format!("r{i}"), &["127.0.0.1"]))).collect();
    // 100,003 floats: many TLS records, segments and a ragged end.
    let data: Vec<Vec<f32>> =
        (0..3).map(|r| (0..100_003).map(|i| ((i * 7 + r * 13) % 101) as f32 * 0.25).collect()).collect();
    let expected = sequential_sum(&data);
    for out in ring(3, |r| good[r].clone(), data.clone()) {
        assert_eq!(out.unwrap(), expected);
    }
    let stranger = material(&other.task(dir.path(), "stranger", &["127.0.0.1"]));
    let outcomes = ring(2, |r| if r == 1 { stranger.clone() } else { good[0].clone() }, data[..2].to_vec());
    let all: Vec<String> = outcomes.into_iter().filter_map(Result::err).collect();
    assert!(all.iter().any(|e| e.contains("not signed by this task's CA")), "{all:?}");
}

#[test]
fn a_two_worker_job_over_tls_trains_the_same_weights_as_plain_tcp() {
    let dir = common::tempdir();
    let ca = Ca::new(dir.path(), "job-ca");
    let files = ca.task(dir.path(), "task", &["127.0.0.1", "localhost"]);
    let spec = "specs/mnist_multiworker.toml";
    let mut weights = Vec::new();
    for tls in [false, true] {
        let out_dir = dir.path().join(if tls { "tls" } else { "plain" });
        let mut args = vec![
            spec.to_owned(),
            "--quiet".into(),
            "--set".into(),
            "strategy.communication.transport=\"tcp\"".into(),
            "--set".into(),
            "train.epochs=1".into(),
            "--set".into(),
            "train.steps_per_epoch=20".into(),
            "--set".into(),
            format!("run.out_dir=\"{}\"", out_dir.display()),
        ];
        if tls {
            args.extend(["--set".into(), files.set()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::assert_exit(&common::run(&args), 0);
        let summary: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap()).unwrap();
        assert_eq!(summary["transport"], if tls { "tcp_tls" } else { "tcp" }, "the run folder says how gradients went");
        weights.push(common::weights(&out_dir.join("model.safetensors")));
    }
    assert_eq!(weights[0], weights[1], "TLS changes how gradients travel, not what they sum to");
}

/// `trainrun certs` makes files for the spec's own cluster (this host) that a two-worker job
/// runs over, and will not overwrite them.
#[test]
fn certs_from_trainrun_carry_the_two_worker_job() {
    let dir = common::tempdir();
    let tls = dir.path().join("tls");
    let spec = "specs/mnist_multiworker.toml";
    let out = common::run(&["certs", spec, "--out", &tls.display().to_string(), "--days", "2"]);
    common::assert_exit(&out, 0);
    let (said, _) = common::text(&out);
    assert!(said.contains("  localhost\n  127.0.0.1\n") && said.contains("cluster.tls = {"), "{said}");
    let files = TaskFiles { cert: tls.join("tls.crt"), key: tls.join("tls.key"), ca: tls.join("ca.crt") };
    let out_dir = dir.path().join("run");
    let out = common::run(&[
        spec,
        "--quiet",
        "--set",
        "strategy.communication.transport=\"tcp\"",
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=5",
        "--set",
        &files.set(),
        "--set",
        &format!("run.out_dir=\"{}\"", out_dir.display()),
    ]);
    common::assert_exit(&out, 0);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["transport"], "tcp_tls");
    let key = std::fs::read(&files.key).unwrap();
    let again = common::run(&["certs", spec, "--out", &tls.display().to_string()]);
    common::assert_exit(&again, 1);
    assert!(common::text(&again).1.contains("exists already; nothing was overwritten"), "{:?}", common::text(&again));
    assert_eq!(std::fs::read(&files.key).unwrap(), key);
}
