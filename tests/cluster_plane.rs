//! The control plane end to end, several tasks in one process on loopback: rendezvous,
//! refusals, timeouts, death detection, barriers, commands and metrics. Every test runs under a
//! hard time limit and on its own ephemeral ports, so tests run in parallel and never hang.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use trainrun::cluster::{
    ClusterConfig, ClusterError, Command, ControlPlane, Failure, JobToken, Roster, TaskId, Timeouts,
};

const SPEC: &str = "9f8e7d6c5b4a39281706";

/// Runs `f` on its own thread and fails the test if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(t) => t,
        Err(mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the thread sent nothing yet returned"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test ran past its limit of {limit:?}"),
    }
}

fn token() -> JobToken {
    JobToken::new("test-token-0123456789abcdef", "the test").unwrap()
}

fn timeouts(startup_ms: u64, failure_ms: u64) -> Timeouts {
    Timeouts {
        startup: Duration::from_millis(startup_ms),
        failure: Duration::from_millis(failure_ms),
        heartbeat: Duration::from_millis(100),
    }
}

fn id(s: &str) -> TaskId {
    s.parse().unwrap()
}

/// A config per task and a listener already bound for it on loopback.
fn job(tasks: &[&str], timeouts: Timeouts) -> Vec<(ClusterConfig, TcpListener)> {
    let listeners: Vec<TcpListener> = (tasks.iter()).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let roster: BTreeMap<TaskId, String> =
        (tasks.iter().zip(&listeners)).map(|(t, l)| (id(t), l.local_addr().unwrap().to_string())).collect();
    let chief = TaskId::chief_of(roster.keys()).unwrap();
    (tasks.iter().zip(listeners))
        .map(|(t, listener)| {
            let config = ClusterConfig {
                task: id(t),
                roster: roster.clone(),
                chief,
                token: token(),
                spec_hash: SPEC.into(),
                spec_keys: [("optimizer.learning_rate", "aa"), ("train.epochs", "bb")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
                version: "0.1.0".into(),
                timeouts,
                payload: format!("payload of {t}").into_bytes(),
                tls: None,
                expendable: Vec::new(),
            };
            (config, listener)
        })
        .collect()
}

fn start(job: Vec<(ClusterConfig, TcpListener)>) -> Vec<ControlPlane> {
    (job.into_iter()).map(|(config, listener)| ControlPlane::start_on(config, listener).unwrap()).collect()
}

/// Calls `f` on every plane at once, as separate processes would.
fn each<T: Send>(planes: &[ControlPlane], f: impl Fn(&ControlPlane) -> T + Sync) -> Vec<T> {
    thread::scope(|s| {
        let handles: Vec<_> = planes.iter().map(|p| s.spawn(|| f(p))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn rendezvous(planes: &[ControlPlane]) -> Vec<Roster> {
    each(planes, |p| p.rendezvous().unwrap())
}

/// Polls `plane` until the job fails; the failure and how long it took.
fn failure_of(plane: &ControlPlane, limit: Duration) -> (Failure, Duration) {
    let start = Instant::now();
    while start.elapsed() < limit {
        match plane.check() {
            Err(ClusterError::Failed(f)) => return (f, start.elapsed()),
            Err(other) => panic!("{}: {other}", plane.task()),
            Ok(()) => thread::sleep(Duration::from_millis(1)),
        }
    }
    panic!("{} saw no failure within {limit:?}", plane.task());
}

fn failed(result: Result<impl std::fmt::Debug, ClusterError>) -> Failure {
    match result {
        Err(ClusterError::Failed(f)) => f,
        other => panic!("expected the job to fail, got {other:?}"),
    }
}

#[test]
fn three_tasks_get_the_same_roster_in_rank_order() {
    within(Duration::from_secs(20), || {
        let mut tasks = job(&["worker:1", "chief:0", "worker:0"], timeouts(10_000, 3_000));
        // The chief starts last, on an address nobody listens on yet: the others retry.
        let (chief, listener) = tasks.remove(1);
        drop(listener);
        let planes = start(tasks);
        let chief = thread::spawn(move || {
            thread::sleep(Duration::from_millis(400));
            let plane = ControlPlane::start(chief).unwrap();
            let roster = plane.rendezvous().unwrap();
            (plane, roster)
        });
        let rosters = rendezvous(&planes);
        let (chief, chief_roster) = chief.join().unwrap();
        let order: Vec<String> = chief_roster.members.iter().map(|m| m.task.to_string()).collect();
        assert_eq!(order, ["chief:0", "worker:0", "worker:1"]);
        for (rank, m) in chief_roster.members.iter().enumerate() {
            assert_eq!(m.rank, rank);
            assert_eq!(m.payload, format!("payload of {}", m.task).into_bytes());
            assert_eq!(m.pid, std::process::id());
        }
        assert!(rosters.iter().all(|r| *r == chief_roster));
        // Heartbeats flow and nobody fails while everyone lives.
        thread::sleep(Duration::from_millis(500));
        assert!(planes.iter().chain([&chief]).all(|p| p.check().is_ok()));
        let begin = Instant::now();
        let chief = thread::spawn(move || chief.shutdown());
        planes.into_iter().for_each(ControlPlane::shutdown);
        chief.join().unwrap();
        assert!(begin.elapsed() < Duration::from_secs(2), "{:?}", begin.elapsed());
    });
}

#[test]
fn a_task_on_another_spec_or_version_is_refused_naming_both() {
    for (spec, version) in [("a1b2c3d4", "0.1.0"), (SPEC, "0.2.0")] {
        within(Duration::from_secs(10), move || {
            let mut tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(5_000, 2_000));
            tasks[1].0.spec_hash = spec.into();
            if spec != SPEC {
                tasks[1].0.spec_keys.insert("optimizer.learning_rate".into(), "cc".into());
            }
            tasks[1].0.version = version.into();
            let planes = start(tasks);
            let outcomes = each(&planes, |p| failed(p.rendezvous()));
            let message = outcomes[1].to_string();
            assert_eq!(
                message,
                format!(
                    "worker:1 runs spec {} (trainrun {version}) but the chief worker:0 runs spec \
                     9f8e7d6c5b4a… (trainrun 0.1.0){}: start every task with the same spec and trainrun",
                    if spec == SPEC { "9f8e7d6c5b4a…" } else { spec },
                    if spec == SPEC { "" } else { "; they differ in optimizer.learning_rate" }
                )
            );
            // A launch mistake fails the whole job at once rather than at the startup timeout.
            assert!(outcomes.iter().all(|f| *f == outcomes[1]), "{outcomes:?}");
        });
    }
}

#[test]
fn a_wrong_token_is_refused() {
    within(Duration::from_secs(10), || {
        let mut tasks = job(&["worker:0", "worker:1"], timeouts(1_500, 1_000));
        tasks[1].0.token = JobToken::new("some-other-jobs-token-000", "the test").unwrap();
        let planes = start(tasks);
        let begin = Instant::now();
        let mut outcomes = each(&planes, ControlPlane::rendezvous).into_iter();
        let (chief, worker) = (outcomes.next().unwrap(), outcomes.next().unwrap());
        match &worker {
            Err(e @ ClusterError::Unauthenticated { chief, .. }) => {
                assert_eq!(*chief, id("worker:0"));
                assert!(e.to_string().contains("refused this task's job token"), "{e}");
            }
            other => panic!("{other:?}"),
        }
        let missing = failed(chief);
        assert_eq!(missing.to_string(), "rendezvous timed out after 1.5 s: worker:1 never checked in");
        assert!(begin.elapsed() < Duration::from_secs(3));
    });
}

#[test]
fn a_task_that_never_starts_fails_the_rendezvous_at_the_startup_timeout() {
    within(Duration::from_secs(10), || {
        let mut tasks = job(&["worker:0", "worker:1", "worker:2", "worker:3"], timeouts(1_000, 1_000));
        tasks.truncate(2);
        let begin = Instant::now();
        let planes = start(tasks);
        let outcomes = each(&planes, |p| (failed(p.rendezvous()), begin.elapsed()));
        for (failure, elapsed) in outcomes {
            assert_eq!(failure.to_string(), "rendezvous timed out after 1 s: worker:2, worker:3 never checked in");
            assert!(elapsed >= Duration::from_millis(950), "{elapsed:?}");
            assert!(elapsed < Duration::from_millis(2_000), "{elapsed:?}");
        }
    });
}

#[test]
fn a_task_started_twice_or_outside_the_cluster_fails_everyone() {
    within(Duration::from_secs(10), || {
        let tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(5_000, 1_000));
        let twin = {
            let (config, _) = &tasks[1];
            (config.clone(), TcpListener::bind("127.0.0.1:0").unwrap())
        };
        let planes = start(tasks.into_iter().take(2).collect());
        thread::scope(|s| {
            let waiting = s.spawn(|| each(&planes, |p| failed(p.rendezvous())));
            thread::sleep(Duration::from_millis(300));
            let twin = start(vec![twin]);
            let refused = failed(twin[0].rendezvous());
            let message = refused.to_string();
            assert!(message.starts_with("worker:1 checked in twice, from pid "), "{message}");
            assert!(message.ends_with(": start one process per task"), "{message}");
            assert!(waiting.join().unwrap().iter().all(|f| *f == refused));
        });

        let mut tasks = job(&["worker:0", "worker:1"], timeouts(5_000, 1_000));
        tasks[1].0.task = id("worker:5");
        let roster = &mut tasks[1].0.roster;
        let address = roster.remove(&id("worker:1")).unwrap();
        roster.insert(id("worker:5"), address);
        let planes = start(tasks);
        let outcomes = each(&planes, |p| failed(p.rendezvous()));
        assert_eq!(
            outcomes[1].to_string(),
            "worker:5 checked in, but the chief's cluster has no such task (it has worker:0, \
             worker:1): start every task with the same cluster"
        );
        assert_eq!(outcomes[0], outcomes[1]);
    });
}

#[test]
fn a_task_pointed_at_a_worker_instead_of_the_chief_is_told_so() {
    within(Duration::from_secs(10), || {
        let mut tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(2_000, 1_000));
        let worker2 = tasks[0].0.roster[&id("worker:2")].clone();
        tasks[1].0.roster.insert(id("worker:0"), worker2.clone());
        let planes = start(tasks);
        let e = planes[1].rendezvous().unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the chief worker:0 at {worker2} answered: worker:2 is not the chief; the chief is \
                 worker:0 at {}: check the cluster's addresses",
                planes[0].local_addr()
            )
        );
    });
}

/// Each plane's failure, and how long after `begin` it was noticed.
fn failures(planes: &[ControlPlane], limit: Duration) -> Vec<(Failure, Duration)> {
    each(planes, |p| failure_of(p, limit))
}

#[test]
fn a_task_that_dies_fails_every_other_task_naming_it() {
    within(Duration::from_secs(20), || {
        let tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(5_000, 3_000));
        let mut planes = start(tasks);
        rendezvous(&planes);
        drop(planes.pop());
        for (failure, after) in failures(&planes, Duration::from_secs(5)) {
            assert!(matches!(&failure, Failure::Died { task, .. } if *task == id("worker:2")), "{failure}");
            assert!(failure.to_string().starts_with("worker:2 died: "), "{failure}");
            // A closed connection is noticed at once, well within the failure timeout.
            assert!(after < Duration::from_millis(1_000), "{after:?}");
        }
    });
}

/// Workers under `parameter_server`: one that dies fails nobody, its restarted process checks
/// in again and gets the job's roster; a ps that dies still fails the job.
#[test]
fn an_expendable_worker_dies_and_rejoins_without_failing_the_job() {
    within(Duration::from_secs(30), || {
        let mut tasks = job(&["chief:0", "ps:0", "worker:0", "worker:1"], timeouts(5_000, 3_000));
        for (config, _) in &mut tasks {
            config.expendable = vec![trainrun::cluster::Role::Worker];
        }
        let again = tasks[3].0.clone();
        let mut planes = start(tasks);
        let roster = rendezvous(&planes).remove(0);
        drop(planes.pop());
        thread::sleep(Duration::from_millis(600));
        assert!(planes.iter().all(|p| p.check().is_ok()), "a dead worker fails nobody");
        let back = ControlPlane::start(again).unwrap();
        assert_eq!(back.rendezvous().unwrap(), roster, "the restarted worker gets the job's roster");
        // Its heartbeats are accepted: the job stays healthy past the failure timeout.
        planes.push(back);
        thread::sleep(Duration::from_millis(3_500));
        assert!(planes.iter().all(|p| p.check().is_ok()));
        let ps = planes.remove(1);
        drop(ps);
        for (failure, _) in failures(&planes, Duration::from_secs(5)) {
            assert!(failure.to_string().starts_with("ps:0 died: "), "{failure}");
        }
    });
}

#[test]
fn a_chief_that_dies_fails_every_worker_naming_it() {
    within(Duration::from_secs(20), || {
        let tasks = job(&["chief:0", "worker:0", "worker:1"], timeouts(5_000, 3_000));
        let mut planes = start(tasks);
        rendezvous(&planes);
        drop(planes.remove(0));
        for (failure, after) in failures(&planes, Duration::from_secs(5)) {
            assert!(failure.to_string().starts_with("chief:0 died: "), "{failure}");
            assert!(after < Duration::from_millis(1_000), "{after:?}");
        }
    });
}

#[test]
fn barriers_pass_when_all_arrive_and_name_the_missing_task_otherwise() {
    within(Duration::from_secs(20), || {
        let tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(5_000, 1_500));
        let planes = start(tasks);
        rendezvous(&planes);
        for _ in 0..3 {
            each(&planes, |p| p.barrier("epoch").unwrap());
        }
        let begin = Instant::now();
        let outcomes = each(&planes[..2], |p| (failed(p.barrier("end")), begin.elapsed()));
        let expected = "barrier `end` timed out after 1.5 s: worker:2 never arrived";
        for (failure, elapsed) in outcomes {
            assert_eq!(failure.to_string(), expected);
            assert!(elapsed >= Duration::from_millis(1_450), "{elapsed:?}");
            assert!(elapsed < Duration::from_millis(2_500), "{elapsed:?}");
        }
        // The straggler hears it too, from its next heartbeat.
        let (failure, _) = failure_of(&planes[2], Duration::from_secs(1));
        assert_eq!(failure.to_string(), expected);
    });
}

#[test]
fn commands_reach_every_task_in_order_and_metrics_reach_the_chief() {
    within(Duration::from_secs(20), || {
        let tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(5_000, 2_000));
        let planes = start(tasks);
        rendezvous(&planes);
        assert!(planes[1].broadcast(Command::Save { step: 1 }).is_err());
        planes[0].broadcast(Command::Save { step: 7 }).unwrap();
        let stop = Command::Stop { reason: "target accuracy reached".into() };
        planes[0].broadcast(stop.clone()).unwrap();
        let received = each(&planes, |p| {
            let mut got = Vec::new();
            while got.len() < 2 {
                match p.poll_command().unwrap() {
                    Some(c) => got.push(c),
                    None => thread::sleep(Duration::from_millis(1)),
                }
            }
            got
        });
        for got in received {
            assert_eq!(got, [Command::Save { step: 7 }, stop.clone()]);
        }
        each(&planes, |p| p.send_metrics(&format!(r#"{{"task":"{}","loss":0.5}}"#, p.task())).unwrap());
        let mut records = planes[0].take_metrics().unwrap();
        records.sort_by_key(|r| r.task);
        let tasks: Vec<String> = records.iter().map(|r| r.task.to_string()).collect();
        assert_eq!(tasks, ["worker:0", "worker:1", "worker:2"]);
        assert_eq!(records[2].json, r#"{"task":"worker:2","loss":0.5}"#);
        assert!(planes[0].take_metrics().unwrap().is_empty());
    });
}

#[test]
fn a_chief_that_finishes_tells_the_workers_to_stop() {
    within(Duration::from_secs(20), || {
        let tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(5_000, 3_000));
        let mut planes = start(tasks);
        rendezvous(&planes);
        let chief = planes.remove(0);
        let begin = Instant::now();
        let chief = thread::spawn(move || chief.shutdown());
        let stops = each(&planes, |p| {
            loop {
                if let Some(c) = p.poll_command().unwrap() {
                    break c;
                }
                thread::sleep(Duration::from_millis(1));
            }
        });
        for stop in stops {
            let reason = "the chief worker:0 finished the job".to_owned();
            assert_eq!(stop, Command::Stop { reason });
        }
        planes.into_iter().for_each(ControlPlane::shutdown);
        chief.join().unwrap();
        assert!(begin.elapsed() < Duration::from_secs(2), "{:?}", begin.elapsed());
    });
}

#[test]
fn a_task_that_aborts_fails_the_job_with_its_reason() {
    within(Duration::from_secs(20), || {
        let tasks = job(&["worker:0", "worker:1", "worker:2"], timeouts(5_000, 3_000));
        let planes = start(tasks);
        rendezvous(&planes);
        planes[1].abort("the loss is NaN at step 12");
        for (failure, _) in failures(&planes, Duration::from_secs(2)) {
            assert_eq!(failure.to_string(), "worker:1 failed: the loss is NaN at step 12");
        }
    });
}
