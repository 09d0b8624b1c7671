//! The control plane at scale: hundreds of simulated tasks against a real chief. The chief and
//! one task that will hang run as processes of their own (this test binary started again in a
//! helper role); every other task is a real [`ControlPlane`] inside this process, each with its
//! own runtime and its own gRPC connection to the chief, as separate processes would have: a
//! shared channel would multiplex every task's streams over one HTTP/2 connection and hide the
//! per-connection cost the chief pays in a real job.
//!
//! Every task checks in, they heartbeat for a while (the chief's CPU is read from
//! `/proc/<pid>/stat` meanwhile), then the helper task is stopped with SIGSTOP (every task must
//! name it as silent within the failure timeout) or killed with SIGKILL (every task must name
//! it as dead at once). The figures are printed; 256 tasks run in CI, 1,024 are `#[ignore]`d
//! and run by hand (`cargo test --release --test control_plane_scale -- --ignored --nocapture
//! one_thousand`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use trainrun::cluster::{ClusterConfig, ClusterError, ControlPlane, Failure, JobToken, TaskId, Timeouts};

/// Which helper this process is, when the test binary starts itself again.
const ROLE: &str = "TRAINRUN_SCALE_TEST_ROLE";
const ROSTER: &str = "TRAINRUN_SCALE_TEST_ROSTER";
const TASK: &str = "TRAINRUN_SCALE_TEST_TASK";
const TIMEOUTS: &str = "TRAINRUN_SCALE_TEST_TIMEOUTS";

fn token() -> JobToken {
    JobToken::new("scale-test-token-0123456789", "the test").unwrap()
}

fn config(task: TaskId, roster: &BTreeMap<TaskId, String>, timeouts: Timeouts) -> ClusterConfig {
    ClusterConfig {
        task,
        roster: roster.clone(),
        chief: TaskId::chief_of(roster.keys()).unwrap(),
        token: token(),
        spec_hash: "5ca1e5ca1e5ca1e5ca1e".into(),
        spec_keys: BTreeMap::new(),
        version: "0.1.0".into(),
        timeouts,
        payload: format!("data plane of {task}").into_bytes(),
        tls: None,
        expendable: Vec::new(),
    }
}

/// A free port on loopback, for a process that binds it itself.
fn free_address() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// Kills the helper processes however the test ends.
struct Helpers(Vec<Child>);

impl Drop for Helpers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn_helper(role: &str, task: TaskId, roster: &Path, timeouts: Timeouts) -> (Child, BufReader<ChildStdout>) {
    let exe = std::env::current_exe().unwrap();
    let ms = |d: Duration| d.as_millis().to_string();
    let mut child = Command::new(exe)
        .args(["--exact", "helper_process", "--ignored", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, role)
        .env(ROSTER, roster)
        .env(TASK, task.to_string())
        .env(TIMEOUTS, [ms(timeouts.startup), ms(timeouts.failure), ms(timeouts.heartbeat)].join(","))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Reads the helper's lines until one starts with `word`.
fn expect_line(out: &mut BufReader<ChildStdout>, word: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the helper ended before saying `{word}`");
        if line.starts_with(word) {
            return line.trim().to_owned();
        }
    }
}

/// User plus system CPU seconds of process `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces; the fields after its closing parenthesis do not.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split_whitespace().collect();
    let (utime, stime): (f64, f64) = (fields[11].parse().unwrap(), fields[12].parse().unwrap());
    // SAFETY: sysconf only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (utime + stime) / ticks
}

/// Not a test of its own: the chief or the task that will hang, when started by a test below.
#[test]
#[ignore = "a helper process the scale tests start"]
fn helper_process() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let roster: BTreeMap<TaskId, String> = std::fs::read_to_string(std::env::var(ROSTER).unwrap())
        .unwrap()
        .lines()
        .map(|l| {
            let (t, a) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), a.to_owned())
        })
        .collect();
    let task: TaskId = std::env::var(TASK).unwrap().parse().unwrap();
    let ms: Vec<u64> = std::env::var(TIMEOUTS).unwrap().split(',').map(|v| v.parse().unwrap()).collect();
    let timeouts = Timeouts {
        startup: Duration::from_millis(ms[0]),
        failure: Duration::from_millis(ms[1]),
        heartbeat: Duration::from_millis(ms[2]),
    };
    let plane = ControlPlane::start(config(task, &roster, timeouts)).unwrap();
    let say = |s: &str| {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{s}").unwrap();
        out.flush().unwrap();
    };
    say("ready");
    let roster = plane.rendezvous().unwrap();
    say(&format!("joined {}", roster.len()));
    match role.as_str() {
        "chief" => loop {
            match plane.check() {
                Err(e) => {
                    say(&format!("failed {e}"));
                    // Dropping the failed chief waits until the others have heard.
                    drop(plane);
                    return;
                }
                Ok(()) => thread::sleep(Duration::from_millis(5)),
            }
        },
        // Heartbeats until the test stops this process.
        _ => loop {
            thread::sleep(Duration::from_secs(1));
        },
    }
}

/// How the helper task fails.
#[derive(Clone, Copy)]
enum Fault {
    /// SIGSTOP: it hangs, its connections stay open.
    Hang,
    /// SIGKILL: its connections close.
    Death,
}

/// What one run measured.
struct Figures {
    rendezvous: Duration,
    chief_cores: f64,
    named_within: Duration,
}

/// `n` tasks: the chief and the task to hang in helper processes, the rest here.
fn simulate(n: u32, timeouts: Timeouts, heartbeat_for: Duration, fault: Fault) -> Figures {
    let chief: TaskId = "chief:0".parse().unwrap();
    let silent: TaskId = format!("worker:{}", n / 2).parse().unwrap();
    let workers: Vec<TaskId> = (0..n - 1).map(|i| format!("worker:{i}").parse().unwrap()).collect();
    let here: Vec<TaskId> = workers.iter().copied().filter(|&t| t != silent).collect();
    let listeners: Vec<TcpListener> = here.iter().map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let mut roster: BTreeMap<TaskId, String> =
        here.iter().zip(&listeners).map(|(t, l)| (*t, l.local_addr().unwrap().to_string())).collect();
    roster.insert(chief, free_address());
    roster.insert(silent, free_address());
    let dir = tempfile::tempdir().unwrap();
    let roster_file = dir.path().join("roster");
    let lines: Vec<String> = roster.iter().map(|(t, a)| format!("{t} {a}")).collect();
    std::fs::write(&roster_file, lines.join("\n")).unwrap();

    let (chief_process, mut chief_out) = spawn_helper("chief", chief, &roster_file, timeouts);
    let chief_pid = chief_process.id();
    let mut helpers = Helpers(vec![chief_process]);
    expect_line(&mut chief_out, "ready");
    let (silent_process, mut silent_out) = spawn_helper("silent", silent, &roster_file, timeouts);
    let silent_pid = silent_process.id();
    helpers.0.push(silent_process);
    expect_line(&mut silent_out, "ready");

    let planes: Vec<ControlPlane> = (here.iter().zip(listeners))
        .map(|(&t, l)| ControlPlane::start_on(config(t, &roster, timeouts), l).unwrap())
        .collect();
    let begin = Instant::now();
    let chief_at_start = cpu_seconds(chief_pid);
    let rosters: Vec<usize> = thread::scope(|s| {
        let joins: Vec<_> = planes.iter().map(|p| s.spawn(|| p.rendezvous().unwrap().len())).collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let rendezvous = begin.elapsed();
    let rendezvous_cpu = cpu_seconds(chief_pid) - chief_at_start;
    assert!(rosters.iter().all(|&len| len == n as usize), "every task gets the whole roster");
    assert_eq!(expect_line(&mut chief_out, "joined"), format!("joined {n}"));
    expect_line(&mut silent_out, "joined");

    // Heartbeats only: nobody fails while everyone lives.
    let cpu_before = cpu_seconds(chief_pid);
    let window = Instant::now();
    thread::sleep(heartbeat_for);
    let chief_cores = (cpu_seconds(chief_pid) - cpu_before) / window.elapsed().as_secs_f64();
    assert!(planes.iter().all(|p| p.check().is_ok()), "a task failed while all lived");

    let signal = match fault {
        Fault::Hang => libc::SIGSTOP,
        Fault::Death => libc::SIGKILL,
    };
    // SAFETY: kill only sends a signal to the helper process this test started.
    assert_eq!(unsafe { libc::kill(silent_pid as i32, signal) }, 0);
    let stopped = Instant::now();
    let limit = timeouts.failure + Duration::from_secs(5);
    let mut named_within = Duration::ZERO;
    for p in &planes {
        loop {
            match (fault, p.check()) {
                (Fault::Hang, Err(ClusterError::Failed(Failure::Silent { task, .. })))
                | (Fault::Death, Err(ClusterError::Failed(Failure::Died { task, .. })))
                    if task == silent =>
                {
                    break;
                }
                (_, Err(other)) => panic!("{} failed otherwise: {other}", p.task()),
                (_, Ok(())) => {
                    assert!(stopped.elapsed() < limit, "{} did not hear of {silent} within {limit:?}", p.task());
                    thread::sleep(Duration::from_millis(5));
                }
            }
        }
        named_within = stopped.elapsed();
    }
    let said = expect_line(&mut chief_out, "failed");
    assert!(said.contains(&format!("{silent} ")), "{said}");
    println!(
        "{n} tasks: rendezvous {:.2} s (chief CPU {rendezvous_cpu:.2} s); chief CPU {:.3} cores over {:.0} s of heartbeats (configured every {} ms, paced by the plane); \
         {silent} {} and named at every task after {:.2} s (failure timeout {:.1} s)",
        rendezvous.as_secs_f64(),
        chief_cores,
        heartbeat_for.as_secs_f64(),
        timeouts.heartbeat.as_millis(),
        match fault {
            Fault::Hang => "stopped",
            Fault::Death => "killed",
        },
        named_within.as_secs_f64(),
        timeouts.failure.as_secs_f64(),
    );
    drop(planes);
    drop(helpers);
    Figures { rendezvous, chief_cores, named_within }
}

const SMALL: Timeouts = Timeouts {
    startup: Duration::from_secs(60),
    failure: Duration::from_secs(4),
    heartbeat: Duration::from_millis(250),
};

#[test]
fn two_hundred_fifty_six_tasks_check_in_heartbeat_and_name_the_one_that_hangs() {
    let timeouts = SMALL;
    let f = simulate(256, timeouts, Duration::from_secs(4), Fault::Hang);
    assert!(f.rendezvous < Duration::from_secs(30), "rendezvous took {:?}", f.rendezvous);
    assert!(f.chief_cores <= 1.0, "the chief used {:.2} cores", f.chief_cores);
    // The chief notices at the timeout (checked every half heartbeat), then tells everyone.
    assert!(f.named_within <= timeouts.failure + Duration::from_secs(2), "named after {:?}", f.named_within);
}

#[test]
#[ignore = "1,024 tasks take a minute on two cores; run by hand for the figures"]
fn one_thousand_twenty_four_tasks_check_in_heartbeat_and_name_the_one_that_hangs() {
    let timeouts = Timeouts {
        startup: Duration::from_secs(120),
        failure: Duration::from_secs(10),
        heartbeat: Duration::from_millis(250),
    };
    let f = simulate(1024, timeouts, Duration::from_secs(10), Fault::Hang);
    assert!(f.rendezvous <= Duration::from_secs(10), "rendezvous took {:?}", f.rendezvous);
    assert!(f.chief_cores <= 1.0, "the chief used {:.2} cores", f.chief_cores);
    assert!(f.named_within <= timeouts.failure + Duration::from_secs(2), "named after {:?}", f.named_within);
}

#[test]
fn two_hundred_fifty_six_tasks_name_the_one_killed_at_once() {
    let f = simulate(256, SMALL, Duration::from_secs(1), Fault::Death);
    // A closed connection is noticed without waiting for the timeout.
    assert!(f.named_within < Duration::from_secs(2), "named after {:?}", f.named_within);
}
