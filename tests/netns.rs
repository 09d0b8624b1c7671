//! A Kubernetes Indexed Job from `trainrun manifest`, run with real networking and no cluster:
//! each pod gets its own network namespace, with its own address on a bridge (in a namespace of
//! its own too) and a hosts file (`/etc/netns/<ns>/hosts`) mapping the Job's pod host names
//! `<job>-<i>.<service>` to those addresses, as cluster DNS would. Each pod runs the command of
//! the rendered Job with the environment the kubelet would give it (`JOB_COMPLETION_INDEX`,
//! `HOSTNAME`, the container's env with the token from the rendered Secret, the pod's host
//! name in its own UTS namespace) and the rendered volumes as folders.
//!
//! Checked: the pods (over mutual TLS, with the Secret's files) train the weights the local
//! launcher does; then one pod is killed mid-run, the chief fails as the job should, both are
//! recreated with their index, as the Job controller would, and the job resumes from the
//! chief's backup to the same weights.
//!
//! Needs root (network namespaces); without it the test says loudly that it skipped. Only
//! addresses the test assigns inside namespaces it creates are used, and a guard removes the
//! namespaces and hosts files, also when the test fails.

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SPEC: &str = "tests/fixtures/deploy/netns.toml";
const RUN_LIMIT: Duration = Duration::from_secs(240);

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
    }
}

/// The namespaces of one simulated cluster; dropping it removes them and their hosts files.
struct Cluster {
    switch: String,
    pods: Vec<String>,
}

impl Cluster {
    /// `n` pod namespaces on a bridge, pod `i` at 10.231.0.(10 + i)/24, each with a hosts file
    /// naming every pod.
    fn new(n: usize, names: &[String]) -> Result<Cluster, String> {
        let tag = format!("tr{}-{}", std::process::id(), n);
        let mut cluster = Cluster { switch: format!("{tag}-sw"), pods: Vec::new() };
        ip(&["netns", "add", &cluster.switch])?;
        ip(&["-n", &cluster.switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &cluster.switch, "link", "set", "br0", "up"])?;
        let mut hosts = String::from("127.0.0.1 localhost\n");
        for (i, name) in names.iter().enumerate() {
            hosts.push_str(&format!("{} {name}\n", address(i)));
        }
        for i in 0..n {
            let ns = format!("{tag}-p{i}");
            ip(&["netns", "add", &ns])?;
            cluster.pods.push(ns.clone());
            let port = format!("eth{i}");
            ip(&["-n", &cluster.switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            ip(&["-n", &cluster.switch, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", address(i)), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let etc = PathBuf::from("/etc/netns").join(&ns);
            std::fs::create_dir_all(&etc).map_err(|e| e.to_string())?;
            // The kubelet's own line for the pod comes first, then what cluster DNS answers.
            let own = format!("{} {}\n", address(i), names[i].split('.').next().unwrap_or_default());
            std::fs::write(etc.join("hosts"), format!("{own}{hosts}")).map_err(|e| e.to_string())?;
        }
        Ok(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for ns in self.pods.iter().chain([&self.switch]) {
            let _ = ip(&["netns", "del", ns]);
            let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(ns));
        }
    }
}

fn address(i: usize) -> String {
    format!("10.231.0.{}", 10 + i)
}

/// The rendered manifest's objects by kind.
fn objects(yaml: &str) -> BTreeMap<String, Value> {
    yaml.split("\n---\n")
        .map(|doc| serde_norway::from_str::<Value>(doc).unwrap())
        .map(|v| (v["kind"].as_str().unwrap().to_owned(), v))
        .collect()
}

/// What the kubelet would set up for the Job's pods: the volumes as folders, the container's
/// command and environment, with mount paths replaced by those folders.
struct Pods {
    job: String,
    completions: usize,
    command: Vec<String>,
    env: Vec<(String, String)>,
    mounts: Vec<(String, PathBuf)>,
}

impl Pods {
    fn from_manifest(yaml: &str, root: &Path, tls: &Path) -> Pods {
        let o = objects(yaml);
        let job = &o["Job"];
        let pod = &job["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let volumes: BTreeMap<&str, &Value> =
            pod["volumes"].as_array().unwrap().iter().map(|v| (v["name"].as_str().unwrap(), v)).collect();
        let mut mounts = Vec::new();
        for m in c["volumeMounts"].as_array().unwrap() {
            let (name, path) = (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap());
            let dir = root.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let v = volumes[name];
            if v.get("configMap").is_some() {
                for (file, text) in o["ConfigMap"]["data"].as_object().unwrap() {
                    std::fs::write(dir.join(file), text.as_str().unwrap()).unwrap();
                }
            } else if v.get("secret").is_some() {
                for file in ["tls.crt", "tls.key", "ca.crt"] {
                    std::fs::copy(tls.join(file), dir.join(file)).unwrap();
                }
            }
            mounts.push((path.to_owned(), dir));
        }
        let token = o["Secret"]["stringData"]["token"].as_str().unwrap().to_owned();
        let env = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let value = e.get("value").and_then(Value::as_str).map_or_else(|| token.clone(), str::to_owned);
                (e["name"].as_str().unwrap().to_owned(), value)
            })
            .collect();
        let command = c["command"].as_array().unwrap().iter().chain(c["args"].as_array().unwrap());
        let pods = Pods {
            job: job["metadata"]["name"].as_str().unwrap().to_owned(),
            completions: job["spec"]["completions"].as_u64().unwrap() as usize,
            command: command.map(|v| v.as_str().unwrap().to_owned()).collect(),
            env,
            mounts,
        };
        // The spec in the ConfigMap names paths under the mounts too.
        let spec = pods.local(&format!("{}/spec.toml", pods.mounts[0].0));
        let text = std::fs::read_to_string(&spec).unwrap();
        std::fs::write(&spec, pods.local(&text)).unwrap();
        pods
    }

    /// `text` with every mount path replaced by its folder.
    fn local(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (path, dir) in &self.mounts {
            out = out.replace(path.as_str(), &dir.display().to_string());
        }
        out
    }

    /// Starts the pod of `index` in namespace `ns`, under its host name, with its output to
    /// `log`.
    fn start(&self, ns: &str, index: usize, log: &Path) -> Child {
        let hostname = format!("{}-{index}", self.job);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, "unshare", "--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"", &hostname]);
        for (i, word) in self.command.iter().enumerate() {
            match i {
                0 => cmd.arg(env!("CARGO_BIN_EXE_trainrun")),
                _ => cmd.arg(self.local(word)),
            };
        }
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("JOB_COMPLETION_INDEX", index.to_string())
            .env("HOSTNAME", &hostname)
            // Not the kubelet's: the tests read the shared MNIST copy and never download.
            .env("TRAINRUN_DATA_DIR", common::data_dir())
            .env("TRAINRUN_OFFLINE", "1")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap());
        for (k, v) in &self.env {
            cmd.env(k, self.local(v));
        }
        cmd.spawn().unwrap()
    }

    fn runs(&self) -> PathBuf {
        self.mounts.iter().find(|(p, _)| p == "/runs").map(|(_, d)| d.join(&self.job)).unwrap()
    }
}

fn wait(child: Child, limit: Duration, log: &Path) -> i32 {
    let start = Instant::now();
    let mut child = child;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!(
                "a pod ran past {limit:?}: {}",
                std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn log_of(log: &Path) -> String {
    std::fs::read_to_string(log.with_extension("err")).unwrap_or_default()
}

/// Network namespaces work here (root, `ip`, `unshare`), or why not.
fn namespaces_available() -> Result<(), String> {
    let probe = format!("tr{}-probe", std::process::id());
    ip(&["netns", "add", &probe])?;
    let unshare = Command::new("ip").args(["netns", "exec", &probe, "unshare", "--uts", "true"]).status();
    let _ = ip(&["netns", "del", &probe]);
    match unshare {
        Ok(s) if s.success() => Ok(()),
        other => Err(format!("`unshare --uts` inside a namespace failed: {other:?}")),
    }
}

fn manifest(extra: &[&str]) -> String {
    let mut args = vec!["manifest", SPEC];
    args.extend(extra);
    let out = common::run(&args);
    common::assert_exit(&out, 0);
    common::text(&out).0
}

#[test]
fn an_indexed_job_in_network_namespaces_trains_like_the_local_launcher_and_survives_a_killed_pod() {
    if let Err(why) = namespaces_available() {
        println!("skipped: network namespaces are not available here ({why})");
        eprintln!("skipped: network namespaces are not available here ({why})");
        return;
    }
    let dir = common::tempdir();
    // The reference: the same spec under the local launcher.
    let local = dir.path().join("local");
    let out = common::run(&[SPEC, "--quiet", "--set", &format!("run.out_dir=\"{}\"", local.display())]);
    common::assert_exit(&out, 0);
    let reference = common::weights(&local.join("model.safetensors"));

    // The files of the `<job>-tls` Secret, made as a user would: `trainrun certs --for
    // kubernetes` names each pod as the others reach it.
    let tls = dir.path().join("tls-secret");
    let names: Vec<String> = (0..2).map(|i| format!("netns-job-{i}.netns-job")).collect();
    let out = common::run(&["certs", SPEC, "--for", "kubernetes", "--out", &tls.display().to_string()]);
    common::assert_exit(&out, 0);
    let (said, _) = common::text(&out);
    assert!(names.iter().all(|n| said.lines().any(|l| l.trim() == n)), "the pods' names:\n{said}");

    for (round, kill) in [(0, false), (1, true)] {
        let tls_set = "cluster.tls={ cert_file = \"x\", key_file = \"x\", ca_file = \"x\" }";
        let yaml = manifest(&["--set", tls_set]);
        assert!(yaml.contains("secretName: netns-job-tls"), "the manifest mounts the TLS Secret");
        let root = dir.path().join(format!("pods-{round}"));
        let pods = Pods::from_manifest(&yaml, &root, &tls);
        assert_eq!((pods.job.as_str(), pods.completions), ("netns-job", 2));
        let cluster = Cluster::new(pods.completions, &names).unwrap();
        let logs: Vec<PathBuf> = (0..2).map(|i| root.join(format!("pod-{i}.log"))).collect();
        let started: Vec<Child> = (0..2).map(|i| pods.start(&cluster.pods[i], i, &logs[i])).collect();
        let mut started = started.into_iter();
        let (chief, worker) = (started.next().unwrap(), started.next().unwrap());
        if kill {
            // Once the chief has a backup, the Job loses worker:1's pod.
            let backup = pods.runs().join("backup");
            let t = Instant::now();
            while !std::fs::read_dir(&backup)
                .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.path().join("manifest.json").exists())))
            {
                assert!(t.elapsed() < RUN_LIMIT, "no backup appeared: {}", log_of(&logs[0]));
                std::thread::sleep(Duration::from_millis(20));
            }
            common::signal(worker.id(), libc::SIGKILL);
            let killed = wait(worker, RUN_LIMIT, &logs[1]);
            assert_eq!(killed, -1, "killed by the signal");
            let code = wait(chief, RUN_LIMIT, &logs[0]);
            assert_eq!(code, 5, "the chief fails the job naming the dead task: {}", log_of(&logs[0]));
            assert!(log_of(&logs[0]).contains("worker:1"), "{}", log_of(&logs[0]));
            // The Job controller recreates each failed pod with its index.
            let again: Vec<PathBuf> = (0..2).map(|i| root.join(format!("pod-{i}-again.log"))).collect();
            let codes: Vec<i32> = (0..2)
                .map(|i| pods.start(&cluster.pods[i], i, &again[i]))
                .collect::<Vec<_>>()
                .into_iter()
                .zip(&again)
                .map(|(c, log)| wait(c, RUN_LIMIT, log))
                .collect();
            assert_eq!(codes, [0, 0], "{}\n{}", log_of(&again[0]), log_of(&again[1]));
            assert!(log_of(&again[0]).contains("resuming from"), "the chief resumes: {}", log_of(&again[0]));
            let said = |log: &Path, what: &str| {
                log_of(log).lines().filter(|l| l.contains(what)).map(str::to_owned).collect::<Vec<_>>()
            };
            println!("chief when worker:1's pod was killed: {:?}", said(&logs[0], "error"));
            println!("recreated chief: {:?}", said(&again[0], "resuming from"));
        } else {
            let codes = [wait(chief, RUN_LIMIT, &logs[0]), wait(worker, RUN_LIMIT, &logs[1])];
            assert_eq!(codes, [0, 0], "{}\n{}", log_of(&logs[0]), log_of(&logs[1]));
        }
        let run = common::json(&pods.runs().join("run.json"));
        assert_eq!(run["cluster"]["source"], "kubernetes", "{run}");
        assert_eq!(run["cluster"]["tasks"]["worker:1"], "netns-job-1.netns-job:2222", "{run}");
        let weights = common::weights(&pods.runs().join("model.safetensors"));
        println!("round {round}: cluster from {} with tasks {}", run["cluster"]["source"], run["cluster"]["tasks"]);
        assert_eq!(weights, reference, "round {round}: the pods' weights equal the local launcher's");
        drop(cluster);
    }
}
