//! MLflow tracking end to end against a real `mlflow server` (PyPI's `mlflow`, SQLite backend,
//! a local artifact folder, loopback, a free port), read back through MLflow's own Python
//! client: params, metric history per step, tags, artifacts, status; a sweep's parent run and
//! its children; an unreachable server (a warning, a normally trained run); a server killed
//! mid-run (the run folder keeps everything, the end says what was not delivered); a run
//! killed outright (SIGKILL) ended `KILLED` by what next looks at its folder (its resumed
//! launch, `trainrun sweep --collect`); an `MLFLOW_TRACKING_URI` that names no server refused.
//!
//! The tests share one server (its start takes ~10 s) and one Python reading back (importing
//! `mlflow` takes seconds), each test in an experiment of its own; the test that kills its
//! server has a private one. A keeper process ends a server once the test process exits.
//!
//! The Python with `mlflow` is `MLFLOW_TEST_PYTHON` (`.ci/run` makes a venv and sets
//! it), else `python3`. Without it each test says so loudly and skips.

mod common;

use common::{assert_exit, free_port, json, tempdir, text, trainrun, wait_within};
use serde_json::Value;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The longest any one run, sweep or server start may take here.
const LIMIT: Duration = Duration::from_secs(240);

fn python() -> String {
    std::env::var("MLFLOW_TEST_PYTHON").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "python3".into())
}

/// Whether MLflow can be imported (asked once per file); says loudly when not, every time.
fn mlflow_available() -> bool {
    static IMPORTS: LazyLock<bool> = LazyLock::new(|| {
        Command::new(python()).args(["-c", "import mlflow"]).output().is_ok_and(|o| o.status.success())
    });
    if !*IMPORTS {
        let _ = writeln!(
            std::io::stderr(),
            "\n*** SKIPPED: {} cannot import mlflow (set MLFLOW_TEST_PYTHON to a Python with \
             `pip install mlflow`; .ci/run does); MLflow tracking was not checked ***\n",
            python()
        );
    }
    *IMPORTS
}

/// Runs `mlflow server` (the arguments after the folder) in a process group of its own and
/// kills that group, then removes the folder, once its standard input closes: when the test
/// drops the server, or when the test process exits, even killed (the kernel closes the
/// pipe). The shared server lives in a static, which never drops, so this is what ends it.
const KEEPER: &str = r#"
import os, shutil, signal, subprocess, sys
server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", *sys.argv[2:]], process_group=0)
sys.stdin.buffer.read()
os.killpg(server.pid, signal.SIGKILL)
server.wait()
shutil.rmtree(sys.argv[1], ignore_errors=True)
"#;

/// A running `mlflow server`, killed when dropped or when the test process exits.
struct Server {
    keeper: Option<(Child, ChildStdin)>,
    uri: String,
    dir: PathBuf,
}

impl Server {
    /// The server the tests share: one start (about 10 s) for the whole file. Each test logs
    /// into an experiment of its own name, so they stay independent.
    fn shared() -> &'static Server {
        static SHARED: LazyLock<Server> = LazyLock::new(Server::start);
        &SHARED
    }

    /// A server of the caller's own, for a test that kills it.
    fn start() -> Server {
        let dir = tempdir().keep();
        let port = free_port();
        let db = format!("sqlite:///{}", dir.join("mlflow.db").display());
        let artifacts = dir.join("artifacts");
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let mut keeper = Command::new(python())
            .args(["-c", KEEPER])
            .arg(&dir)
            .args(["--backend-store-uri", &db, "--artifacts-destination"])
            .arg(&artifacts)
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--workers", "1"])
            .stdin(Stdio::piped())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start mlflow server: {e}"));
        let stdin = keeper.stdin.take().unwrap();
        let uri = format!("http://127.0.0.1:{port}");
        let server = Server { keeper: Some((keeper, stdin)), uri, dir };
        let started = Instant::now();
        while !server.healthy() {
            let log = std::fs::read_to_string(server.dir.join("server.log")).unwrap_or_default();
            assert!(started.elapsed() < LIMIT, "mlflow server did not answer within {LIMIT:?}:\n{log}");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn healthy(&self) -> bool {
        let addr = self.uri.trim_start_matches("http://");
        let Ok(mut s) = std::net::TcpStream::connect(addr) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        if s.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut answer);
        answer.starts_with("HTTP/1.") && answer.contains(" 200 ")
    }

    /// Kills the server and every process it started, and waits until they are gone.
    fn kill(&mut self) {
        if let Some((mut keeper, stdin)) = self.keeper.take() {
            drop(stdin);
            let _ = keeper.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads every run of an experiment back through MLflow's Python client: one Python for the
/// whole file (importing `mlflow` takes seconds), one JSON line `[uri, experiment]` in, one
/// JSON line out.
const READER: &str = r#"
import json, sys, traceback
import mlflow
from mlflow.tracking import MlflowClient
def read(uri, name):
    c = MlflowClient(tracking_uri=uri)
    exp = c.get_experiment_by_name(name)
    runs = c.search_runs([exp.experiment_id]) if exp else []
    out = []
    def listed(run_id, path=None):
        files = []
        for f in c.list_artifacts(run_id, path):
            files.extend(listed(run_id, f.path) if f.is_dir else [f.path])
        return files
    for r in runs:
        rid = r.info.run_id
        out.append({
            "run_id": rid,
            "name": r.info.run_name,
            "status": r.info.status,
            "start_time": r.info.start_time,
            "end_time": r.info.end_time,
            "params": r.data.params,
            "tags": r.data.tags,
            "metrics": {k: [[m.step, m.value] for m in c.get_metric_history(rid, k)] for k in r.data.metrics},
            "artifacts": sorted(listed(rid)),
        })
    return out
for line in sys.stdin:
    try:
        answer = {"runs": read(*json.loads(line))}
    except Exception:
        answer = {"error": traceback.format_exc()}
    print(json.dumps(answer), flush=True)
"#;

/// The reader and its pipes; it exits when its input closes, with the test process (the
/// static is never dropped, and the process reaps nothing after its exit).
struct Reader {
    _process: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

fn read_back(uri: &str, experiment: &str) -> Vec<Value> {
    static READER_PROCESS: LazyLock<Mutex<Reader>> = LazyLock::new(|| {
        let mut child = Command::new(python())
            .args(["-c", READER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the MLflow client: {e}"));
        let (input, output) = (child.stdin.take().unwrap(), BufReader::new(child.stdout.take().unwrap()));
        Mutex::new(Reader { _process: child, input, output })
    });
    let mut reader = READER_PROCESS.lock().unwrap_or_else(PoisonError::into_inner);
    let request = serde_json::to_string(&[uri, experiment]).unwrap();
    writeln!(reader.input, "{request}").unwrap();
    let mut line = String::new();
    reader.output.read_line(&mut line).unwrap();
    drop(reader);
    let answer: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("the MLflow client said {line:?}: {e}"));
    assert!(answer["error"].is_null(), "the MLflow client failed:\n{}", answer["error"].as_str().unwrap_or_default());
    answer["runs"].as_array().cloned().unwrap_or_default()
}

/// Arguments of a short tutorial run into `dir`, tracked to `uri` under `experiment`.
fn short_run(dir: &Path, uri: &str, experiment: &str, steps: u32) -> Vec<String> {
    [
        "specs/mnist_single.toml".to_string(),
        "-q".into(),
        "--set".into(),
        format!("run.out_dir={}", dir.display()),
        "--set".into(),
        format!("train.steps_per_epoch={steps}"),
        "--set".into(),
        "train.epochs=1".into(),
        "--set".into(),
        "run.log_every_steps=10".into(),
        "--set".into(),
        format!("run.tracking={{ mlflow = \"{uri}\", experiment = \"{experiment}\" }}"),
    ]
    .to_vec()
}

/// `trainrun args`, its output piped.
fn spawn(args: &[String]) -> Child {
    trainrun().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

fn run_bounded(args: &[String]) -> Output {
    let child = spawn(args);
    let (out, took) = wait_within(child, LIMIT);
    assert!(took < LIMIT, "trainrun {args:?} ran past {LIMIT:?}");
    out
}

fn steps_of(history: &Value) -> Vec<u64> {
    history.as_array().map(|a| a.iter().filter_map(|p| p[0].as_u64()).collect()).unwrap_or_default()
}

#[test]
fn a_run_logs_its_params_metrics_tags_artifacts_and_status() {
    if !mlflow_available() {
        return;
    }
    let server = Server::shared();
    let dir = tempdir();
    let out = run_bounded(&short_run(dir.path(), &server.uri, "single", 30));
    assert_exit(&out, 0);
    assert!(!text(&out).1.contains("warning"), "nothing went wrong: {}", text(&out).1);
    let runs = read_back(&server.uri, "single");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(run["status"], "FINISHED");
    let summary = json(&dir.path().join("summary.json"));
    assert_eq!(run["tags"]["trainrun.spec_sha256"], summary["spec_sha256"]);
    assert_eq!(run["tags"]["trainrun.version"], env!("CARGO_PKG_VERSION"));
    assert!(run["tags"]["mlflow.source.git.commit"].is_string(), "{}", run["tags"]);
    assert_eq!(run["params"]["train.steps_per_epoch"], "30");
    assert_eq!(run["params"]["run.log_every_steps"], "10");
    assert!(run["params"]["optimizer.learning_rate"].is_string(), "{}", run["params"]);
    assert!(run["params"].as_object().unwrap().keys().all(|k| !k.starts_with("run.tracking")));
    // One `loss` per `step` line of metrics.jsonl, at its step, with its value.
    let lines: Vec<Value> = std::fs::read_to_string(dir.path().join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let step_lines: Vec<&Value> = lines.iter().filter(|l| l["event"] == "step").collect();
    assert_eq!(steps_of(&run["metrics"]["loss"]), vec![10, 20, 30]);
    for (point, line) in run["metrics"]["loss"].as_array().unwrap().iter().zip(&step_lines) {
        let (logged, written) = (point[1].as_f64().unwrap(), line["loss"].as_f64().unwrap());
        assert!((logged - written).abs() <= 1e-9 * written.abs().max(1.0), "{logged} vs {written}");
    }
    assert_eq!(steps_of(&run["metrics"]["epoch_loss"]), vec![30]);
    assert_eq!(steps_of(&run["metrics"]["val_loss"]), vec![30], "the final evaluation, once");
    let artifacts: Vec<&str> = run["artifacts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for file in ["model.safetensors", "summary.json", "spec.toml", "loss.png", "report.html"] {
        assert!(artifacts.contains(&file), "{file} not in {artifacts:?}");
    }
    let remembered = json(&dir.path().join("mlflow.json"));
    assert_eq!(remembered["run_id"], run["run_id"], "the run folder names its MLflow run");
    let stored = server.dir.join("artifacts").join(remembered["experiment_id"].as_str().unwrap());
    let uploaded = std::fs::read(stored.join(run["run_id"].as_str().unwrap()).join("artifacts/summary.json"));
    assert_eq!(uploaded.ok(), std::fs::read(dir.path().join("summary.json")).ok(), "the same bytes");
}

#[test]
fn a_sweep_is_a_parent_run_with_one_child_per_trial() {
    if !mlflow_available() {
        return;
    }
    let server = Server::shared();
    let dir = tempdir();
    let (spec, _) = write_sweep(
        dir.path(),
        &server.uri,
        "sweeps",
        "name = \"tracked_sweep\"",
        "[train]\nepochs = 1\nsteps_per_epoch = 20\nevaluate_every_steps = 10\nvalidation_steps = 5",
    );
    let out = run_bounded(&["sweep".to_string(), spec.display().to_string(), "-q".into()]);
    assert_exit(&out, 0);
    let runs = read_back(&server.uri, "sweeps");
    assert_eq!(runs.len(), 3, "a parent and two trials: {runs:#?}");
    let parents: Vec<&Value> = runs.iter().filter(|r| r["tags"]["mlflow.parentRunId"].is_null()).collect();
    assert_eq!(parents.len(), 1, "{runs:#?}");
    let parent = parents[0];
    assert_eq!(parent["name"], "tracked_sweep");
    assert_eq!(parent["status"], "FINISHED");
    let artifacts: Vec<&str> = parent["artifacts"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(artifacts.contains(&"results.csv") && artifacts.contains(&"sweep.json"), "{artifacts:?}");
    // The sweep's report, drawn as it ended: the page, the trials' curves, the parameters.
    for file in ["report.html", "loss.png", "parallel.png", "parallel.svg"] {
        assert!(artifacts.contains(&file), "{file} not in {artifacts:?}");
    }
    let mut children: Vec<&Value> =
        runs.iter().filter(|r| r["tags"]["mlflow.parentRunId"] == parent["run_id"]).collect();
    children.sort_by_key(|r| r["name"].as_str().unwrap_or_default().to_string());
    assert_eq!(children.len(), 2, "{runs:#?}");
    for (child, lr) in children.iter().zip(["0.01", "0.05"]) {
        assert_eq!(child["status"], "FINISHED");
        assert_eq!(child["params"]["optimizer.learning_rate"], lr);
        assert!(child["name"].as_str().unwrap().starts_with("trial-00"), "{}", child["name"]);
        assert_eq!(steps_of(&child["metrics"]["val_accuracy"]), vec![10, 20]);
    }
}

#[test]
fn an_unreachable_server_is_one_warning_and_the_run_trains_normally() {
    let dir = tempdir();
    let uri = format!("http://127.0.0.1:{}", free_port());
    let started = Instant::now();
    let out = run_bounded(&short_run(dir.path(), &uri, "nowhere", 20));
    assert_exit(&out, 0);
    assert!(started.elapsed() < Duration::from_secs(90), "an absent server held the run up: {:?}", started.elapsed());
    let stderr = text(&out).1;
    let warning = format!("warning: the MLflow server {uri} is unreachable");
    assert_eq!(stderr.matches(&warning).count(), 1, "one warning at the start:\n{stderr}");
    assert!(
        stderr.contains(&format!("the MLflow server {uri} did not receive the run itself")),
        "the end says what was not delivered:\n{stderr}"
    );
    assert_eq!(json(&dir.path().join("run.json"))["status"], "completed");
    assert!(dir.path().join("summary.json").is_file() && dir.path().join("model.safetensors").is_file());
}

#[test]
fn a_server_killed_mid_run_loses_nothing_of_the_run_folder_and_the_end_says_what_was_not_delivered() {
    if !mlflow_available() {
        return;
    }
    let mut server = Server::start();
    let dir = tempdir();
    let child = spawn(&short_run(dir.path(), &server.uri, "killed", 100));
    // The run exists on the server once its folder names it; training has not begun.
    assert!(common::wait_for(&dir.path().join("mlflow.json"), LIMIT), "the run never reached the server");
    server.kill();
    let (out, took) = wait_within(child, LIMIT);
    assert!(took < LIMIT);
    assert_exit(&out, 0);
    let stderr = text(&out).1;
    assert!(stderr.contains(&format!("the MLflow server {} did not receive", server.uri)), "{stderr}");
    assert!(stderr.contains("its end (FINISHED)"), "{stderr}");
    let lines = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().filter(|l| l.contains(r#""event":"step""#)).count(), 10, "every step line is local");
    assert_eq!(json(&dir.path().join("run.json"))["status"], "completed");
    assert!(dir.path().join("summary.json").is_file() && dir.path().join("model.safetensors").is_file());
}

#[test]
fn sigterm_ends_the_mlflow_run_killed_and_the_resumed_launch_finishes_the_same_run() {
    if !mlflow_available() {
        return;
    }
    let server = Server::shared();
    let dir = tempdir();
    let mut args = short_run(dir.path(), &server.uri, "preempted", 300);
    args.extend(["--set".to_string(), "callbacks=[{ kind = \"backup_and_restore\", save_freq = 50 }]".to_string()]);
    let mut child = spawn(&args);
    let backup = dir.path().join("backup");
    let started = Instant::now();
    while std::fs::read_dir(&backup).map_or(0, |d| d.count()) == 0 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first backup");
        assert!(started.elapsed() < LIMIT, "no backup within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    common::signal(child.id(), libc::SIGTERM);
    let (out, _) = wait_within(child, LIMIT);
    assert_exit(&out, 6);
    let runs = read_back(&server.uri, "preempted");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["status"], "KILLED", "a stopped run is no finished one");
    let out = run_bounded(&args);
    assert_exit(&out, 0);
    let again = read_back(&server.uri, "preempted");
    assert_eq!(again.len(), 1, "the resumed launch logs into the same run: {again:#?}");
    assert_eq!(again[0]["run_id"], runs[0]["run_id"]);
    assert_eq!(again[0]["status"], "FINISHED");
    assert_eq!(steps_of(&again[0]["metrics"]["epoch_loss"]), vec![300]);
}

/// Writes `dir/sweep.toml`, a two-trial learning-rate grid on the tutorial model tracked into
/// `experiment` on the server at `uri` (`run` holds the run's other keys, `rest` the spec's
/// other tables), and returns it with the sweep's folder.
fn write_sweep(dir: &Path, uri: &str, experiment: &str, run: &str, rest: &str) -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (spec, out_dir) = (dir.join("sweep.toml"), dir.join("sweep"));
    std::fs::write(
        &spec,
        format!(
            r#"extends = "{base}"

[run]
out_dir = "{out}"
tracking = {{ mlflow = "{uri}", experiment = "{experiment}" }}
{run}

{rest}

[sweep]
metric = "test_accuracy"

[sweep.grid]
"optimizer.learning_rate" = [0.01, 0.05]
"#,
            base = root.join("specs/base/mnist_tutorial.toml").display(),
            out = out_dir.display(),
        ),
    )
    .unwrap();
    (spec, out_dir)
}

/// The run of `runs` whose name starts with `name`.
fn named<'r>(runs: &'r [Value], name: &str) -> &'r Value {
    runs.iter().find(|r| r["name"].as_str().is_some_and(|n| n.starts_with(name))).unwrap_or_else(|| {
        panic!("no run named {name}*: {runs:#?}");
    })
}

/// The `step` of the last `step` line of `metrics.jsonl` in `dir`, 0 before the first.
fn logged_step(dir: &Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap_or_default();
    let steps = text.lines().filter(|l| l.contains(r#""event":"step""#));
    steps.filter_map(|l| serde_json::from_str::<Value>(l).ok()?["step"].as_u64()).max().unwrap_or(0)
}

#[test]
fn a_sigkilled_run_is_ended_killed_by_its_resumed_launch_which_finishes_the_same_run() {
    if !mlflow_available() {
        return;
    }
    let server = Server::shared();
    let dir = tempdir();
    let mut args = short_run(dir.path(), &server.uri, "sigkilled", 300);
    args.extend(["--set".to_string(), "callbacks=[{ kind = \"backup_and_restore\", save_freq = 50 }]".to_string()]);
    let mut child = spawn(&args);
    // Once a backup is written whole (not `.partial`: it is written in the background), so the
    // next launch resumes it.
    let backed_up = |d: &Path| {
        let entries = std::fs::read_dir(d.join("backup")).into_iter().flatten().flatten();
        entries.map(|e| e.file_name().to_string_lossy().into_owned()).any(|n| !n.ends_with(".partial"))
    };
    let started = Instant::now();
    while !backed_up(dir.path()) || logged_step(dir.path()) == 0 || !dir.path().join("mlflow.json").is_file() {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it could be killed");
        assert!(started.elapsed() < LIMIT, "no backup within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let runs = read_back(&server.uri, "sigkilled");
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["status"], "RUNNING", "a process killed outright cannot end its run");

    let out = run_bounded(&args);
    assert_exit(&out, 0);
    let again = read_back(&server.uri, "sigkilled");
    assert_eq!(again.len(), 1, "the resumed launch logs into the same run: {again:#?}");
    let run = &again[0];
    assert_eq!(run["run_id"], runs[0]["run_id"]);
    assert_eq!(run["status"], "FINISHED");
    let why = run["tags"]["trainrun.killed"].as_str().unwrap_or_default();
    assert!(why.contains("killed outright") && why.contains("marked KILLED"), "{}", run["tags"]);
    assert!(why.contains(&format!("a later launch in {}", dir.path().display())), "{why}");
    assert!(why.contains("continues it"), "{why}");
    assert_eq!(steps_of(&run["metrics"]["epoch_loss"]), vec![300]);
}

#[test]
fn collect_ends_the_run_of_a_sigkilled_trial_killed_and_leaves_a_live_one_running() {
    if !mlflow_available() {
        return;
    }
    let server = Server::shared();
    let dir = tempdir();
    let (spec, out_dir) = write_sweep(
        dir.path(),
        &server.uri,
        "collected",
        "name = \"killed_trials\"\nlog_every_steps = 10",
        "[batch]\nglobal = 32\n\n[train]\nepochs = 1000\nsteps_per_epoch = 20",
    );
    // Each trial by hand, as a job-array index runs it: trainrun SPEC as trial n.
    let trial = |n: &str| {
        trainrun()
            .args([spec.display().to_string().as_str(), "-q"])
            .env("TRAINRUN_SWEEP_TRIAL", n)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let (mut killed, mut live) = (trial("1"), trial("2"));
    let folder = |prefix: &str| {
        let entries = std::fs::read_dir(&out_dir).into_iter().flatten().flatten();
        entries.map(|e| e.path()).find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
    };
    let started = Instant::now();
    let logging = |prefix: &str| folder(prefix).is_some_and(|d| d.join("mlflow.json").is_file() && logged_step(&d) > 0);
    while !(logging("trial-001") && logging("trial-002")) {
        assert!(killed.try_wait().unwrap().is_none() && live.try_wait().unwrap().is_none(), "a trial ended");
        assert!(started.elapsed() < LIMIT, "the trials did not reach the server within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    killed.kill().unwrap();
    let _ = killed.wait();
    assert_eq!(named(&read_back(&server.uri, "collected"), "trial-001")["status"], "RUNNING");

    let out = run_bounded(&["sweep".to_string(), spec.display().to_string(), "--collect".into()]);
    live.kill().unwrap();
    let _ = live.wait();
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    let runs = read_back(&server.uri, "collected");
    let (first, second) = (named(&runs, "trial-001"), named(&runs, "trial-002"));
    let said = format!("its MLflow run {} was left RUNNING", first["run_id"].as_str().unwrap_or_default());
    assert!(stdout.contains("trial-001") && stdout.contains(&said), "{stdout}");
    assert_eq!(first["status"], "KILLED", "{first:#}");
    let (start, end) = (first["start_time"].as_u64().unwrap_or(0), first["end_time"].as_u64().unwrap_or(0));
    assert!(start > 0 && end >= start, "ended at its last logged value: {first:#}");
    let why = first["tags"]["trainrun.killed"].as_str().unwrap_or_default();
    assert!(why.contains("killed outright") && why.contains("`trainrun sweep --collect` found it so"), "{why}");
    assert_eq!(second["status"], "RUNNING", "a trial still training (it holds its folder) is left alone");
    assert!(second["tags"]["trainrun.killed"].is_null(), "{second:#}");
}

#[test]
fn a_tracking_uri_variable_that_names_no_server_is_refused_naming_the_variable() {
    let dir = tempdir();
    let o = format!("run.out_dir={}", dir.path().join("run").display());
    let with_uri = |uri: &str, args: &[&str]| trainrun().args(args).env("MLFLOW_TRACKING_URI", uri).output().unwrap();
    let check = with_uri("file:./mlruns", &["check", "specs/mnist_single.toml"]);
    assert_exit(&check, 2);
    insta::assert_snapshot!("mlflow_tracking_uri_not_a_server", text(&check).1);
    // Training is refused the same way, before anything is written.
    for uri in ["sqlite:///mlflow.db", "databricks"] {
        let out = with_uri(uri, &["specs/mnist_single.toml", "-q", "--set", &o]);
        assert_exit(&out, 2);
        let stderr = text(&out).1;
        assert!(stderr.contains(&format!("the environment variable MLFLOW_TRACKING_URI = {uri:?}")), "{stderr}");
        assert!(stderr.contains("env -u MLFLOW_TRACKING_URI"), "{stderr}");
    }
    assert!(!dir.path().join("run").exists(), "nothing trained");
    let out = with_uri("localhost:5000", &["check", "specs/mnist_single.toml"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("`MLFLOW_TRACKING_URI=http://localhost:5000`"), "{}", text(&out).1);
    // A server address passes, and so does any value when the spec names the server itself.
    assert_exit(&with_uri("http://127.0.0.1:5000", &["check", "specs/mnist_single.toml"]), 0);
    let spec_key = "run.tracking={ mlflow = \"http://127.0.0.1:5000\" }";
    assert_exit(&with_uri("file:./mlruns", &["check", "specs/mnist_single.toml", "--set", spec_key]), 0);
}
