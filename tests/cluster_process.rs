//! The control plane across real processes: this test binary re-runs itself as each task (the
//! `child_task` test, which does nothing unless `TRAINRUN_CLUSTER_CHILD` is set), then kills
//! or freezes one and measures how long the others take to fail naming it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use trainrun::cluster::{ClusterConfig, ClusterError, ControlPlane, Failure, JobToken, TaskId, Timeouts};

const CHILD: &str = "TRAINRUN_CLUSTER_CHILD";
const TASKS: [&str; 3] = ["worker:0", "worker:1", "worker:2"];
/// Every child task's spec hash.
const SPEC: &str = "spec";

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// One task, configured by `TRAINRUN_CLUSTER_CHILD=task;chief_address;failure_ms`. Reports on
/// stdout as `@@` lines: its port, its readiness, then the failure it saw and when.
#[test]
fn child_task() {
    let Ok(setup) = std::env::var(CHILD) else {
        return;
    };
    let [task, chief_address, failure_ms] = setup.split(';').collect::<Vec<_>>()[..] else {
        panic!("bad {CHILD}: {setup}");
    };
    let task: TaskId = task.parse().unwrap();
    let mut roster: BTreeMap<TaskId, String> =
        TASKS.iter().map(|t| (t.parse().unwrap(), "127.0.0.1:0".to_owned())).collect();
    roster.insert("worker:0".parse().unwrap(), chief_address.to_owned());
    let config = ClusterConfig {
        task,
        chief: TaskId::chief_of(roster.keys()).unwrap(),
        roster,
        token: JobToken::new("process-test-token-0123456789", "the test").unwrap(),
        spec_hash: SPEC.into(),
        spec_keys: Default::default(),
        version: "0.1.0".into(),
        timeouts: Timeouts {
            startup: Duration::from_secs(20),
            failure: Duration::from_millis(failure_ms.parse().unwrap()),
            heartbeat: Duration::from_millis(100),
        },
        payload: Vec::new(),
        tls: None,
        expendable: Vec::new(),
    };
    let plane = ControlPlane::start(config).unwrap();
    println!("@@listening {}", plane.local_addr().port());
    if let Err(e) = plane.rendezvous() {
        println!("@@refused {e}");
        // As a task does: the plane goes, then the process, at once.
        drop(plane);
        std::process::exit(0);
    }
    println!("@@ready");
    // Orphans end themselves, should the parent test die without killing them.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        match plane.check() {
            Err(ClusterError::Failed(f)) => {
                println!("@@failed {} {f}", now_ms());
                // As the trainer does: the plane goes, then the process, at once.
                drop(plane);
                std::process::exit(0);
            }
            Err(other) => panic!("{other}"),
            Ok(()) => thread::sleep(Duration::from_millis(1)),
        }
    }
    std::process::exit(1);
}

/// A task process, killed when the test ends however it ends.
struct Task {
    child: Child,
}

impl Drop for Task {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Task {
    fn signal(&self, signal: libc::c_int) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) takes plain integers; the child is ours and not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

/// The job's processes, and each one's `@@` lines.
struct Job {
    tasks: Vec<Task>,
    lines: Vec<mpsc::Receiver<String>>,
}

/// Starts `task` as a child process, and a thread passing on its `@@` lines.
fn spawn_task(task: &str, chief_address: &str, failure_ms: u64) -> (Task, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_task", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{task};{chief_address};{failure_ms}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            // libtest's `test child_task ... ` may precede the first line.
            if let Some((_, line)) = line.split_once("@@") {
                let _ = tx.send(line.to_owned());
            }
        }
    });
    (Task { child }, lines)
}

impl Job {
    fn spawn(failure_ms: u64) -> Job {
        let mut job = Job { tasks: Vec::new(), lines: Vec::new() };
        let mut chief_address = "127.0.0.1:0".to_owned();
        for (i, task) in TASKS.iter().enumerate() {
            let (task, lines) = spawn_task(task, &chief_address, failure_ms);
            job.tasks.push(task);
            job.lines.push(lines);
            // Every other task must know the chief's port, which it picks at start.
            if i == 0 {
                let port = job.expect(0, "listening ");
                chief_address = format!("127.0.0.1:{port}");
            }
        }
        for i in 0..TASKS.len() {
            job.expect(i, "ready");
        }
        job
    }

    /// The rest of task `i`'s next line that starts with `prefix`.
    fn expect(&self, i: usize, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line =
                (self.lines[i].recv_timeout(left)).unwrap_or_else(|_| panic!("{} never said `{prefix}`", TASKS[i]));
            if let Some(rest) = line.strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }

    /// Task `i`'s failure message and how many ms after `since_ms` it saw it.
    fn failure(&self, i: usize, since_ms: u128) -> (String, u128) {
        let line = self.expect(i, "failed ");
        let (at, message) = line.split_once(' ').unwrap();
        (message.to_owned(), at.parse::<u128>().unwrap().saturating_sub(since_ms))
    }
}

#[test]
fn a_killed_worker_fails_the_others_at_once() {
    let job = Job::spawn(10_000);
    let killed = now_ms();
    job.tasks[2].signal(libc::SIGKILL);
    for i in [0, 1] {
        let (message, ms) = job.failure(i, killed);
        eprintln!("{}: {ms} ms after the SIGKILL: {message}", TASKS[i]);
        assert!(message.starts_with("worker:2 died: "), "{}: {message}", TASKS[i]);
        // Far below the 10 s failure timeout: the closed connection gives the death away.
        assert!(ms < 1_000, "{ms} ms");
    }
}

#[test]
fn a_killed_chief_fails_the_workers_at_once() {
    let job = Job::spawn(10_000);
    let killed = now_ms();
    job.tasks[0].signal(libc::SIGKILL);
    for i in [1, 2] {
        let (message, ms) = job.failure(i, killed);
        eprintln!("{}: {ms} ms after the SIGKILL: {message}", TASKS[i]);
        assert!(message.starts_with("worker:0 died: "), "{}: {message}", TASKS[i]);
        assert!(ms < 1_000, "{ms} ms");
    }
}

#[test]
fn a_frozen_worker_fails_the_others_at_the_failure_timeout() {
    // Generous, so that a loaded machine cannot starve a healthy task's heartbeats that long.
    let job = Job::spawn(3_000);
    let frozen = now_ms();
    job.tasks[2].signal(libc::SIGSTOP);
    for i in [0, 1] {
        let (message, ms) = job.failure(i, frozen);
        eprintln!("{}: {ms} ms after the SIGSTOP: {message}", TASKS[i]);
        let expected = "worker:2 went silent: no heartbeat for 3 s";
        assert!(message.starts_with(expected), "{}: {message}", TASKS[i]);
        assert!((2_500..5_000).contains(&ms), "{ms} ms");
    }
}

#[test]
fn a_refused_worker_hears_why_although_the_chief_exits_at_once() {
    // The chief refuses worker:1's spec, and its process ends the moment its own rendezvous
    // fails, as a task's does: worker:1 must still read the refusal, not retry a closed port
    // until its startup timeout.
    for round in 0..20 {
        let (chief, lines) = spawn_task("worker:0", "127.0.0.1:0", 10_000);
        let job = Job { tasks: vec![chief], lines: vec![lines] };
        let port = job.expect(0, "listening ");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut roster: BTreeMap<TaskId, String> =
            TASKS.iter().map(|t| (t.parse().unwrap(), "127.0.0.1:0".to_owned())).collect();
        roster.insert("worker:0".parse().unwrap(), format!("127.0.0.1:{port}"));
        roster.insert("worker:1".parse().unwrap(), listener.local_addr().unwrap().to_string());
        let config = ClusterConfig {
            task: "worker:1".parse().unwrap(),
            chief: "worker:0".parse().unwrap(),
            roster,
            token: JobToken::new("process-test-token-0123456789", "the test").unwrap(),
            spec_hash: format!("not-{SPEC}"),
            spec_keys: Default::default(),
            version: "0.1.0".into(),
            timeouts: Timeouts {
                startup: Duration::from_secs(5),
                failure: Duration::from_secs(10),
                heartbeat: Duration::from_millis(100),
            },
            payload: Vec::new(),
            tls: None,
            expendable: Vec::new(),
        };
        let worker = ControlPlane::start_on(config, listener).unwrap();
        let started = Instant::now();
        let e = worker.rendezvous().unwrap_err();
        let took = started.elapsed();
        assert!(matches!(e, ClusterError::Failed(Failure::SpecMismatch { .. })), "round {round}: {e}");
        assert!(took < Duration::from_secs(3), "round {round}: {took:?}");
        let refusal = job.expect(0, "refused ");
        assert!(refusal.starts_with("worker:1 runs spec"), "{refusal}");
    }
}
