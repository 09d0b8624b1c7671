//! ParameterServerStrategy end to end: a chief (the coordinator), workers and ps tasks as
//! processes on loopback, started by the launcher, training real MNIST asynchronously.

mod common;

use common::{assert_exit, json, run, tempdir, text, wait_within};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

fn out(dir: &Path) -> String {
    format!("run.out_dir={}", dir.display())
}

/// Adam converges in a few hundred asynchronous steps where the tutorial's SGD 0.001 crawls.
const ADAM: [&str; 2] = ["--set", "optimizer={ kind = \"adam\", learning_rate = 0.001 }"];

#[test]
fn two_workers_and_a_ps_train_mnist_to_97_percent() {
    let dir = tempdir();
    let o = out(dir.path());
    let mut args = vec!["specs/mnist_parameter_server.toml", "-q", "--set", &o];
    args.extend(ADAM);
    args.extend(["--set", "train.epochs=2", "--set", "train.steps_per_epoch=350"]);
    let res = run(&args);
    assert_exit(&res, 0);
    let s = json(&dir.path().join("summary.json"));
    let accuracy = s["test_accuracy"].as_f64().unwrap_or(0.0);
    assert!(accuracy >= 0.97, "test accuracy {accuracy}\n{s}\n{}", text(&res).1);
    assert_eq!((s["num_workers"].as_u64(), s["steps"].as_u64()), (Some(2), Some(700)), "{s}");
    let ps = &s["parameter_server"];
    assert_eq!(ps["steps_scheduled"], 700, "{ps}");
    assert_eq!(ps["steps_applied"], 700, "{ps}");
    let per_worker: Vec<u64> =
        ps["steps_applied_per_worker"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    // Both workers took work; together they did every step once.
    assert!(per_worker.len() == 2 && per_worker.iter().all(|&n| n > 0), "{ps}");
    assert_eq!(per_worker.iter().sum::<u64>(), 700);
    let staleness: u64 = ps["staleness_histogram"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(staleness, 700, "one staleness per step: {ps}");
    // Both workers run on the ps's host: their pulls and pushes went through shared memory.
    assert_eq!(ps["shared_memory_workers_per_ps"], serde_json::json!([2]), "{ps}");
    // Every epoch line carries the coordinator's counters so far.
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let applied: Vec<u64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "epoch")
        .filter_map(|v| v["parameter_server"]["steps_applied"].as_u64())
        .collect();
    assert_eq!(applied, vec![350, 700], "{metrics}");
}

/// `train.evaluate_every_steps`: the chief waits for the steps scheduled, pulls the variables
/// from the ps and evaluates them; a target reached there stops training at that step.
#[test]
fn the_chief_evaluates_the_pulled_variables_every_n_steps() {
    let dir = tempdir();
    let o = out(dir.path());
    let mut args = vec!["specs/mnist_parameter_server.toml", "-q", "--set", &o];
    args.extend(ADAM);
    args.extend(["--set", "train.epochs=1", "--set", "train.steps_per_epoch=600"]);
    args.extend(["--set", "train.evaluate_every_steps=50"]);
    args.extend(["--set", "callbacks=[{ kind = \"stop_at_target\", target = 0.95 }]"]);
    let res = run(&args);
    assert_exit(&res, 0);
    let metrics = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let evals: Vec<(u64, f64)> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["event"] == "evaluation")
        .map(|v| (v["step"].as_u64().unwrap(), v["val_accuracy"].as_f64().unwrap()))
        .collect();
    let steps: Vec<u64> = evals.iter().map(|e| e.0).collect();
    assert_eq!(steps, (1..=steps.len() as u64).map(|i| 50 * i).collect::<Vec<_>>(), "{metrics}");
    // The evaluations saw the training: short of the target first, then at it.
    assert!(evals.len() >= 2 && evals[0].1 < 0.95, "{evals:?}");
    let &(last, accuracy) = evals.last().unwrap();
    assert!(accuracy >= 0.95, "{evals:?}");
    let s = json(&dir.path().join("summary.json"));
    assert_eq!(s["steps"].as_u64(), Some(last), "training stopped at the evaluation that reached the target: {s}");
    assert_eq!(s["stopped"], "target_reached", "{s}");
    let ps = &s["parameter_server"];
    assert_eq!((ps["steps_scheduled"].as_u64(), ps["steps_applied"].as_u64()), (Some(last), Some(last)), "{ps}");
}

/// One worker and one ps against the default strategy at the same batch: the same weights,
/// bit for bit, with optimizer state (momentum, Adam's moments) living on the ps, whether
/// pulls and pushes go through shared memory (the default on one host) or TCP.
#[test]
fn one_worker_and_one_ps_equal_the_default_strategy_bit_for_bit_also_over_tls() {
    let steps = ["--set", "train.epochs=2", "--set", "train.steps_per_epoch=15"];
    for optimizer in [
        "optimizer={ kind = \"sgd\", learning_rate = 0.05, momentum = 0.9 }",
        "optimizer={ kind = \"adam\", learning_rate = 0.001, clip_norm = 1.0 }",
    ] {
        let one = tempdir();
        let o_one = out(one.path());
        let mut b = vec!["specs/mnist_single.toml", "-q", "--set", &o_one, "--set", optimizer];
        b.extend(["--set", "batch.global=64"]);
        b.extend(steps);
        assert_exit(&run(&b), 0);
        let s_one = json(&one.path().join("summary.json"));
        // Under cluster.tls every data-plane connection is sealed too: the same bits.
        let certs = tempdir();
        let tls_dir = certs.path().join("tls");
        assert_exit(&run(&["certs", "specs/mnist_parameter_server.toml", "--out", &tls_dir.display().to_string()]), 0);
        let file = |f: &str| tls_dir.join(f).display().to_string();
        let tls = format!(
            "cluster.tls={{ cert_file = {:?}, key_file = {:?}, ca_file = {:?} }}",
            file("tls.crt"),
            file("tls.key"),
            file("ca.crt")
        );
        for (transport, shared, sealed) in [("auto", 1, false), ("tcp", 0, false), ("tcp", 0, true)] {
            let ps = tempdir();
            let (o_ps, t) = (out(ps.path()), format!("strategy.transport=\"{transport}\""));
            let mut a = vec!["specs/mnist_parameter_server.toml", "-q", "--set", &o_ps, "--set", optimizer];
            a.extend(["--set", "cluster={ chief = 1, worker = 1, ps = 1 }", "--set", &t]);
            if sealed {
                a.extend(["--set", &tls]);
            }
            a.extend(steps);
            assert_exit(&run(&a), 0);
            let s_ps = json(&ps.path().join("summary.json"));
            assert_eq!(s_ps["steps"], 30);
            assert_eq!(s_ps["transport"], if sealed { "tcp_tls" } else { "tcp" });
            assert_eq!(s_ps["parameter_server"]["shared_memory_workers_per_ps"], serde_json::json!([shared]), "{s_ps}");
            assert_eq!(s_ps["weights_sha256"], s_one["weights_sha256"], "{optimizer} {transport}\n{s_ps}\n{s_one}");
        }
    }
}

/// After a restart from a backup each worker resumes its own shuffle where it was: one worker
/// and one ps trained 15 steps, backed up, then resumed for 15 more, end bit for bit where 30
/// steps at once do. A worker starting its shuffle again would see other batches.
#[test]
fn a_resumed_worker_goes_on_with_its_own_shuffle() {
    let (split, whole) = (tempdir(), tempdir());
    let (o_split, o_whole) = (out(split.path()), out(whole.path()));
    let args = |o: &'static str, epochs: &'static str| {
        let mut a = vec!["specs/mnist_parameter_server.toml", "-q", "--set", o, "--set", epochs];
        a.extend(["--set", "optimizer={ kind = \"sgd\", learning_rate = 0.05, momentum = 0.9 }"]);
        a.extend(["--set", "cluster={ chief = 1, worker = 1, ps = 1 }", "--set", "train.steps_per_epoch=15"]);
        a.extend(["--set", "callbacks=[{ kind = \"backup_and_restore\", delete_checkpoint = false }]"]);
        a
    };
    let (o_split, o_whole): (&'static str, &'static str) = (o_split.leak(), o_whole.leak());
    assert_exit(&run(&args(o_split, "train.epochs=1")), 0);
    assert_exit(&run(&args(o_split, "train.epochs=2")), 0);
    assert_exit(&run(&args(o_whole, "train.epochs=2")), 0);
    let (resumed, at_once) = (json(&split.path().join("summary.json")), json(&whole.path().join("summary.json")));
    assert_eq!((resumed["resumed_from_step"].as_u64(), resumed["steps"].as_u64()), (Some(15), Some(30)), "{resumed}");
    assert_eq!(resumed["weights_sha256"], at_once["weights_sha256"], "{resumed}\n{at_once}");
    let manifest = json(&split.path().join("backup/ckpt-0000000030/manifest.json"));
    assert_eq!(manifest["manifest"]["loop"]["worker_steps"], serde_json::json!([30]), "{manifest}");
}

/// Long enough for any run here on a loaded machine.
const LIMIT: Duration = Duration::from_secs(240);

/// Waits for the launcher `parent`'s task `task`, then until the job has trained a while.
fn task_pid(parent: &Child, task: (&str, usize)) -> u32 {
    let pid = common::launched_task(parent.id(), task, LIMIT).expect("the launcher started the task");
    std::thread::sleep(Duration::from_secs(4));
    pid
}

#[test]
fn a_killed_ps_fails_the_job_naming_it_within_the_timeout() {
    let dir = tempdir();
    let o = out(dir.path());
    let job = common::spawn(&[
        "specs/mnist_parameter_server.toml",
        "-q",
        "--set",
        &o,
        "--set",
        "strategy.timeout_s=5",
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=5000",
    ]);
    let ps = task_pid(&job, ("ps", 0));
    let killed = Instant::now();
    common::signal(ps, libc::SIGKILL);
    let (res, _) = wait_within(job, LIMIT);
    let took = killed.elapsed();
    let stderr = text(&res).1;
    assert_ne!(res.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("ps:0"), "{stderr}");
    // The timeout, and the launcher's grace for the others to notice and leave.
    assert!(took < Duration::from_secs(5 + 2 + 5), "{took:?}\n{stderr}");
}

#[test]
fn with_restarts_a_killed_ps_resumes_from_the_chiefs_backup() {
    let dir = tempdir();
    let o = out(dir.path());
    let mut job = common::spawn(&[
        "specs/mnist_parameter_server.toml",
        "-q",
        "--set",
        &o,
        "--set",
        "strategy.timeout_s=5",
        "--set",
        "cluster.max_restarts=1",
        "--set",
        "callbacks=[{ kind = \"backup_and_restore\", delete_checkpoint = false }]",
        "--set",
        "train.epochs=3",
        "--set",
        "train.steps_per_epoch=40",
    ]);
    let backup = dir.path().join("backup/ckpt-0000000040/manifest.json");
    common::wait_for_file(&backup, LIMIT, &mut [&mut job]);
    let ps = common::launched_task(job.id(), ("ps", 0), LIMIT).expect("the ps runs");
    common::signal(ps, libc::SIGKILL);
    let (res, _) = wait_within(job, LIMIT);
    assert_exit(&res, 0);
    let s = json(&dir.path().join("summary.json"));
    let resumed = s["resumed_from_step"].as_u64().unwrap_or(0);
    assert!(resumed >= 40, "{s}");
    assert_eq!(s["steps"], 120, "{s}");
    assert!(text(&res).1.contains("ps:0"), "the launcher names the task it restarted for");
}

/// `kill -9` of a worker mid-run: the launcher starts it again at once, it rejoins the running
/// job (chief and ps go on), and the coordinator gives it work again.
#[test]
fn a_killed_worker_is_restarted_and_rejoins_the_job() {
    let dir = tempdir();
    let o = out(dir.path());
    let job = common::spawn(&[
        "specs/mnist_parameter_server.toml",
        "-q",
        "--set",
        &o,
        "--set",
        "strategy.timeout_s=5",
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=700",
    ]);
    let worker = task_pid(&job, ("worker", 1));
    common::signal(worker, libc::SIGKILL);
    let (res, _) = wait_within(job, LIMIT);
    let stderr = text(&res).1;
    assert_exit(&res, 0);
    assert!(
        stderr.contains("worker:1 ended (killed by signal 9); restarting it in 0.0 s to rejoin the job"),
        "{stderr}"
    );
    let s = json(&dir.path().join("summary.json"));
    let ps = &s["parameter_server"];
    assert_eq!(ps["steps_scheduled"], 700, "{ps}");
    assert_eq!(ps["steps_applied"], 700, "scheduled steps are all applied: {ps}");
    assert_eq!(s["steps"], 700);
    // The step in flight on the killed worker ran again.
    assert_eq!(ps["closures_rescheduled"], 1, "{ps}");
    assert_eq!(ps["rejoins_per_worker"], serde_json::json!([0, 1]), "{ps}");
    // The restarted worker set up shared memory with the ps again; its predecessor's is gone.
    assert_eq!(ps["shared_memory_workers_per_ps"], serde_json::json!([2]), "{ps}");
    let since = ps["steps_applied_since_rejoin"][1].as_u64().unwrap_or(0);
    assert!(since > 0, "the restarted worker applied steps after its restart: {ps}");
    assert!(since < ps["steps_applied_per_worker"][1].as_u64().unwrap_or(0), "and some before: {ps}");
    let absent = ps["absent_ms_per_worker"][1].as_u64().unwrap_or(0);
    assert!(absent > 0 && absent < LIMIT.as_millis() as u64, "{ps}");
    eprintln!("worker:1 was absent {absent} ms");
}

#[test]
fn a_parameter_server_backup_resumes_under_mirrored() {
    let dir = tempdir();
    let o = out(dir.path());
    let backups = "callbacks=[{ kind = \"backup_and_restore\", delete_checkpoint = false }]";
    let steps = ["--set", "train.steps_per_epoch=20", "--set", backups, "--set", &o];
    let mut a = vec!["specs/mnist_parameter_server.toml", "-q", "--set", "train.epochs=1"];
    a.extend(ADAM.iter().chain(&steps));
    assert_exit(&run(&a), 0);
    let mut b = vec!["specs/mnist_mirrored.toml", "-q", "--set", "train.epochs=2", "--set", "batch.global=64"];
    b.extend(ADAM.iter().chain(&steps));
    assert_exit(&run(&b), 0);
    let s = json(&dir.path().join("summary.json"));
    assert_eq!((s["resumed_from_step"].as_u64(), s["steps"].as_u64()), (Some(20), Some(40)), "{s}");
    // Adam's moments came back from the ps too: training went on rather than restarting.
    assert!(s["test_accuracy"].as_f64().unwrap_or(0.0) > 0.8, "{s}");
}

/// The spec errors of the strategy: each exits 2 naming the key and a fix.
#[test]
fn parameter_server_spec_errors_name_the_key_and_a_fix() {
    let check = |args: &[&str], wanted: &[&str]| {
        let res = run(args);
        assert_exit(&res, 2);
        let (stdout, stderr) = text(&res);
        for w in wanted {
            assert!(stderr.contains(w) || stdout.contains(w), "no `{w}` in\n{stdout}\n{stderr}");
        }
    };
    check(
        &["check", "specs/mnist_multiworker.toml", "--set", "cluster.ps=1"],
        &["lists 1 parameter server, but strategy.kind = \"multi_worker_mirrored\"", "remove cluster.ps"],
    );
    // The base specs set steps_per_epoch and ps; these do not.
    let dir = tempdir();
    let spec = |name: &str, train: &str, cluster: &str| {
        let path = dir.path().join(name);
        let text = format!(
            "[data]\ndataset = \"mnist\"\n[model]\n[[model.layers]]\ntype = \"flatten\"\n[[model.layers]]\n\
             type = \"dense\"\nunits = 10\n[train]\nepochs = 1\nloss = \"sparse_categorical_crossentropy\"\n\
             from_logits = true\n{train}\n[strategy]\nkind = \"parameter_server\"\n[cluster]\n{cluster}\n"
        );
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let no_ps = spec("no_ps.toml", "steps_per_epoch = 10", "chief = 1\nworker = 2");
    check(&["check", &no_ps], &["needs ps and worker tasks", "has 0 ps and 2 workers", "add e.g. ps = 1"]);
    let endless = spec("endless.toml", "", "chief = 1\nworker = 1\nps = 1");
    check(&["check", &endless], &["train.steps_per_epoch", "needs train.steps_per_epoch", "steps_per_epoch = 100"]);
    check(&[&endless, "-q"], &["needs train.steps_per_epoch"]);
}

/// `trainrun check` says how the workers reach the ps and how many threads the chief
/// evaluates with (every core unless `run.threads` says otherwise).
#[test]
fn check_shows_the_data_plane_and_the_chiefs_evaluation_threads() {
    let res = run(&["check", "specs/mnist_parameter_server.toml", "--set", "run.threads=1"]);
    assert_exit(&res, 0);
    let out = text(&res).0;
    assert!(out.contains("pulls and pushes through shared memory between a worker and a ps on one host"), "{out}");
    assert!(out.contains("the chief evaluates with 1 thread while the workers wait"), "{out}");
    let res = run(&["check", "specs/mnist_parameter_server.toml", "--set", "strategy.transport=\"tcp\""]);
    assert_exit(&res, 0);
    let out = text(&res).0;
    assert!(out.contains("pulls and pushes through TCP; requests over TCP"), "{out}");
}

/// SIGTERM to the launcher of a parameter-server job. Before training, every task ends at
/// once. During training the chief stops scheduling, drops the closures not started, lets
/// those in flight finish, saves, and tells every worker and ps to leave: every task stops
/// cleanly (no "the chief is gone"), the launcher says what the next run starts from, and the
/// same command resumes from the backup.
#[test]
fn sigterm_stops_a_parameter_server_job_cleanly_and_the_same_command_resumes() {
    let dir = tempdir();
    let o = out(dir.path());
    let backups = "callbacks=[{ kind = \"backup_and_restore\", save_freq = \"epoch\" }]";
    let args = ["specs/mnist_parameter_server.toml", "--set", &o, "--set", backups, "--set", "train.epochs=20"];
    for began in [false, true] {
        let mut job = common::spawn(&args);
        if began {
            common::wait_for_file(&dir.path().join("backup/ckpt-0000000070/manifest.json"), LIMIT, &mut [&mut job]);
        } else {
            // Chief, two workers and a ps started: they decode MNIST before joining.
            common::wait_for_children(job.id(), 4, LIMIT);
        }
        let asked = Instant::now();
        common::signal(job.id(), libc::SIGTERM);
        let (res, _) = wait_within(job, LIMIT);
        let took = asked.elapsed();
        let stderr = text(&res).1;
        assert_exit(&res, 6);
        assert!(took < Duration::from_secs(5), "began {began}: took {took:?}\n{stderr}");
        assert!(!stderr.contains("the chief is gone") && !stderr.contains("failed"), "began {began}: {stderr}");
        let said = if began {
            "every task stopped on SIGTERM; run the same command again to resume from the chief's last backup"
        } else {
            "every task stopped on SIGTERM before training began; nothing was saved"
        };
        assert!(stderr.contains(said), "began {began}: {stderr}");
    }
    assert_eq!(json(&dir.path().join("run.json"))["status"], "preempted");
    let mut resumed = args.to_vec();
    resumed.extend(["--set", "train.epochs=2"]);
    let res = run(&resumed);
    assert_exit(&res, 0);
    assert!(text(&res).1.contains("resuming from"), "{}", text(&res).1);
}

/// A stop within a long epoch (issue 29): the chief queues the whole epoch at once (the queue
/// holds 256 Ki closures, as TensorFlow's), so the stop must drop the queued closures while it
/// joins, not wait for the epoch's end. SIGTERM (exit 6) and Ctrl-C (exit 130) each end the
/// job within seconds, with a backup of the step reached and a truthful `run.json`.
#[test]
fn a_stop_within_a_long_epoch_takes_effect_at_once() {
    for (signal, code, status) in [(libc::SIGTERM, 6, "preempted"), (libc::SIGINT, 130, "interrupted")] {
        let dir = tempdir();
        let o = out(dir.path());
        let backups = "callbacks=[{ kind = \"backup_and_restore\", save_freq = \"epoch\" }]";
        let long = ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=60000"];
        let args = [&["specs/mnist_parameter_server.toml", "--set", &o, "--set", backups][..], &long[..]].concat();
        let mut job = common::spawn(&args);
        // The chief writes run.json once the job is joined and training is about to begin.
        common::wait_for_file(&dir.path().join("run.json"), LIMIT, &mut [&mut job]);
        std::thread::sleep(Duration::from_secs(2));
        let asked = Instant::now();
        common::signal(job.id(), signal);
        let (res, _) = wait_within(job, LIMIT);
        let took = asked.elapsed();
        assert_exit(&res, code);
        assert!(took < Duration::from_secs(5), "took {took:?}\n{}", text(&res).1);
        assert_eq!(json(&dir.path().join("run.json"))["status"], status);
        assert!(!dir.path().join("summary.json").exists(), "a stopped run writes no summary");
        let backups: Vec<_> = std::fs::read_dir(dir.path().join("backup")).unwrap().flatten().collect();
        let [backup] = backups.as_slice() else { panic!("one backup, not {backups:?}") };
        let step = json(&backup.path().join("manifest.json"))["manifest"]["step"].as_u64().unwrap_or(0);
        assert!(step > 0 && step < 60_000, "the backup of step {step}");
    }
}

/// `kill -9` of the chief (issue 29): the ps tasks and workers wait for the chief's word,
/// which never comes, so the launcher no longer gives them the whole failure timeout (31 s
/// before) nor says the job goes on without a worker that lost its chief: it reports the
/// chief within seconds.
#[test]
fn a_killed_chief_is_reported_at_once() {
    let dir = tempdir();
    let o = out(dir.path());
    let mut job = common::spawn(&["specs/mnist_parameter_server.toml", "--set", &o, "--set", "train.epochs=20"]);
    common::wait_for_file(&dir.path().join("run.json"), LIMIT, &mut [&mut job]);
    std::thread::sleep(Duration::from_secs(1));
    let chief = common::launched_task(job.id(), ("chief", 0), LIMIT).expect("no chief task");
    let killed = Instant::now();
    common::signal(chief, libc::SIGKILL);
    let (res, _) = wait_within(job, LIMIT);
    let took = killed.elapsed();
    let stderr = text(&res).1;
    assert!(!res.status.success(), "{stderr}");
    assert!(took < Duration::from_secs(5), "took {took:?}\n{stderr}");
    assert!(stderr.contains("chief:0 failed (killed by signal 9)"), "{stderr}");
    assert!(!stderr.contains("goes on without it"), "{stderr}");
}
