//! Shared helpers for the end-to-end tests: the built binary, pointed at the real MNIST files
//! and forbidden to download.

#![allow(dead_code)]

use std::io::Read;
pub mod certs;
pub mod lm;
pub mod predict;
pub mod sources;
pub mod sweep;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::sync::OnceLock;

/// One test of the calling binary at a time, for tests that measure time or load: run side by
/// side on 2 cores, a sibling's processes skew what they measure. A panicked holder does not
/// stop the rest.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The MNIST folder, resolved once and absolute: `TRAINRUN_DATA_DIR` when set (the README's
/// test command sets `../shared/data/mnist`, relative to the package root, where cargo runs
/// tests), else the shared copy next to the checkout. Absolute, so tasks a test starts in
/// another working directory find it too.
pub fn data_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let given = std::env::var_os("TRAINRUN_DATA_DIR").filter(|v| !v.is_empty()).map(PathBuf::from);
        let dir = root.join(given.as_deref().unwrap_or(Path::new("../shared/data/mnist")));
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        assert!(
            dir.join("train-images-idx3-ubyte.gz").exists() || dir.join("train-images-idx3-ubyte").exists(),
            "MNIST is not in {} (TRAINRUN_DATA_DIR={:?}): point TRAINRUN_DATA_DIR at the folder holding the four MNIST files",
            dir.display(),
            given
        );
        dir
    })
    .clone()
}

/// `trainrun` run from the package root, offline, on the real data.
pub fn trainrun() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_trainrun"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("TRAINRUN_DATA_DIR", data_dir())
        .env("TRAINRUN_OFFLINE", "1")
        .env_remove("TF_CONFIG")
        .env_remove("TRAINRUN_TASK");
    cmd
}

/// Overrides under which `specs/mnist_single.toml` diverges within a few steps: mean squared
/// error on logits with a huge learning rate.
pub const DIVERGING: [&str; 8] = [
    "--set",
    "train.epochs=1",
    "--set",
    "train.steps_per_epoch=50",
    "--set",
    "train.loss=\"mean_squared_error\"",
    "--set",
    "optimizer.learning_rate=1000",
];

/// Runs `specs/mnist_single.toml` into `out_dir` under [`DIVERGING`] and `extra` overrides.
pub fn run_diverging(out_dir: &Path, extra: &[&str]) -> Output {
    let out = format!("run.out_dir={}", out_dir.display());
    let args: Vec<&str> = ["specs/mnist_single.toml", "-q", "--set", &out]
        .into_iter()
        .chain(DIVERGING)
        .chain(extra.iter().copied())
        .collect();
    run(&args)
}

/// Runs `trainrun` with `args`.
/// Starts `trainrun args` with its output piped (read it with [`wait_within`]).
pub fn spawn(args: &[&str]) -> Child {
    trainrun()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start trainrun: {e}"))
}

pub fn run(args: &[&str]) -> Output {
    match trainrun().args(args).output() {
        Ok(out) => out,
        Err(e) => panic!("cannot run trainrun: {e}"),
    }
}

/// stdout and stderr as text.
pub fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Fails with the command's output unless it exited with `code`.
pub fn assert_exit(out: &Output, code: i32) {
    let (stdout, stderr) = text(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "exit {:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status.code()
    );
    assert!(!stderr.contains("panicked"), "a panic:\n{stderr}");
}

/// A fresh temporary folder.
pub fn tempdir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("no temp dir: {e}"),
    }
}

/// Reads and parses a JSON file.
pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` free ports on 127.0.0.1, all different: each is held until all are chosen, since a
/// released port can be handed out again at once.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("no free port: {e}")))
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap_or_else(|e| panic!("no free port: {e}")).port())
}

/// TF_CONFIG for `task` (`("worker", 1)`) of a cluster of local workers on `ports`.
pub fn tf_config(ports: &[u16], task: (&str, usize)) -> String {
    let workers: Vec<String> = ports.iter().map(|p| format!("\"127.0.0.1:{p}\"")).collect();
    format!(
        r#"{{"cluster": {{"worker": [{}]}}, "task": {{"type": "{}", "index": {}}}}}"#,
        workers.join(", "),
        task.0,
        task.1
    )
}

/// Starts one task of a manual cluster, as an operator would on each host.
pub fn spawn_task(tf_config: &str, token: &str, args: &[&str]) -> std::process::Child {
    let mut cmd = trainrun();
    cmd.args(args)
        .env("TF_CONFIG", tf_config)
        .env("TRAINRUN_JOB_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    match cmd.spawn() {
        Ok(c) => c,
        Err(e) => panic!("cannot start trainrun: {e}"),
    }
}

/// Waits for `child` at most `limit`; kills it and fails if it takes longer. Returns its
/// output and how long it took.
pub fn wait_within(mut child: std::process::Child, limit: std::time::Duration) -> (Output, std::time::Duration) {
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let out = child.wait_with_output().ok();
                panic!("still running after {limit:?}: {:?}", out.map(|o| text(&o)));
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
    let took = start.elapsed();
    match child.wait_with_output() {
        Ok(out) => (out, took),
        Err(e) => panic!("{e}"),
    }
}

/// Reads a safetensors file into `(name, values)`, sorted by name.
pub fn weights(path: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let mut out: Vec<(String, Vec<f32>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = view.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (name, values)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// ‖a − b‖ / ‖b‖ over all tensors.
pub fn relative_difference(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f64 {
    assert_eq!(a.iter().map(|t| &t.0).collect::<Vec<_>>(), b.iter().map(|t| &t.0).collect::<Vec<_>>());
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for ((_, x), (_, y)) in a.iter().zip(b) {
        for (p, q) in x.iter().zip(y) {
            diff += f64::from(p - q).powi(2);
            norm += f64::from(*q).powi(2);
        }
    }
    (diff / norm).sqrt()
}

/// The pid of the launcher `parent`'s child task whose TF_CONFIG names `task`
/// (`("worker", 1)`), waiting for it at most `limit`.
pub fn launched_task(parent: u32, task: (&str, usize), limit: std::time::Duration) -> Option<u32> {
    let needle = format!("\"task\":{{\"index\":{},\"type\":\"{}\"}}", task.1, task.0);
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).unwrap_or_default();
        for c in children.split_whitespace() {
            let env = std::fs::read(format!("/proc/{c}/environ")).unwrap_or_default();
            if String::from_utf8_lossy(&env).contains(&needle) {
                return c.parse().ok();
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

/// The pids of every task the launcher `parent` started.
pub fn children(parent: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// Waits until the launcher `parent` has started `n` tasks, at most `limit`.
pub fn wait_for_children(parent: u32, n: usize, limit: std::time::Duration) {
    let until = std::time::Instant::now() + limit;
    while children(parent).len() < n && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a pid this test started (or its launcher did); ESRCH at worst.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// Waits until `path` exists, at most `limit`, while every one of `tasks` runs. A task that
/// exits first fails the test with its exit status and stderr: a task that failed at once
/// (bad data folder, bad spec) must not cost the whole limit and say nothing.
pub fn wait_for_file(path: &Path, limit: std::time::Duration, tasks: &mut [&mut Child]) {
    let t = std::time::Instant::now();
    while !path.exists() {
        for task in tasks.iter_mut() {
            if let Ok(Some(status)) = task.try_wait() {
                let mut stderr = String::new();
                if let Some(mut e) = task.stderr.take() {
                    let _ = e.read_to_string(&mut stderr);
                }
                panic!("a task ended ({status}) before {} appeared; its stderr:\n{stderr}", path.display());
            }
        }
        assert!(t.elapsed() < limit, "{} did not appear within {limit:?}", path.display());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Waits until `path` exists, at most `limit`.
pub fn wait_for(path: &Path, limit: std::time::Duration) -> bool {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if path.exists() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

/// Waits, at most `limit`, until the backup folder `dir` holds a complete backup, while
/// `child` runs. Backups replace each other every few steps, so no one step's backup can be
/// waited for; one being written is `ckpt-N.partial` until it is renamed, complete.
pub fn wait_for_any_backup(dir: &Path, limit: std::time::Duration, child: &mut Child) {
    let started = std::time::Instant::now();
    loop {
        let complete = std::fs::read_dir(dir)
            .map(|entries| {
                entries.flatten().any(|e| e.path().extension().is_none() && e.path().join("manifest.json").exists())
            })
            .unwrap_or(false);
        if complete {
            return;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first backup");
        assert!(started.elapsed() < limit, "no backup in {} within {limit:?}", dir.display());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Runs `script` with `python3 -c` and the folder as `sys.argv[1]`; `false` (after saying so
/// loudly) when `module` (`numpy`, `PIL`) cannot be imported, so the test skips.
pub fn with_python(module: &str, script: &str, dir: &Path) -> bool {
    let python = |args: &[&str]| Command::new("python3").args(args).output();
    if !python(&["-c", &format!("import {module}")]).is_ok_and(|o| o.status.success()) {
        let why = format!("skipped: python3 cannot import {module} (python3 -m pip install it); not cross-checked");
        println!("{why}");
        eprintln!("\n*** {why} ***\n");
        return false;
    }
    let out = python(&["-c", script, dir.to_str().unwrap()]).unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    true
}

/// Trains `specs/mnist_single.toml` for one epoch of `steps` steps into `dir` (a run folder whose
/// `model.safetensors` the predict, warm-start and export tests start from).
pub fn short_mnist_run(dir: &Path, steps: u32) {
    let out = run(&[
        "specs/mnist_single.toml",
        "-q",
        "--set",
        &format!("run.out_dir={}", dir.display()),
        "--set",
        &format!("train.steps_per_epoch={steps}"),
        "--set",
        "train.epochs=1",
    ]);
    assert_exit(&out, 0);
}
