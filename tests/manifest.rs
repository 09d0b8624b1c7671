//! `trainrun manifest`: snapshots of what each target renders, and proof without a cluster
//! that the output is what the engines accept: the Kubernetes objects pass
//! `kubernetes-validate --strict` against the oldest and newest Kubernetes it ships, the TFJob
//! passes Kubeflow's own CRD schema (vendored under `schemas/vendor/`) with unknown fields
//! refused, and the sbatch script is valid bash. The validators come from PyPI (`.ci/run`
//! installs them); without them those tests say loudly that they skipped.

mod common;

use serde_json::Value;
use std::path::Path;
use std::process::Command;
use trainrun::deploy::{Options, Target, render};

const FULL: &str = "tests/fixtures/deploy/full.toml";
const WORKERS: &str = "tests/fixtures/deploy/netns.toml";
/// A sweep of 4 trials: a job array (tests/sweep_array.rs runs its indexes).
const SWEEP: &str = "specs/mnist_sweep.toml";

fn rendered(spec: &str, target: Target) -> String {
    let loaded = trainrun::spec::load(Path::new(spec), &[], &[]).unwrap();
    let options = Options { image: None, namespace: Some("ml".into()), token: "<token>".into(), parallel: None };
    render(&loaded.spec, target, &options).unwrap()
}

#[test]
fn kubernetes_manifest_snapshot() {
    insta::assert_snapshot!("kubernetes", rendered(FULL, Target::Kubernetes));
}

#[test]
fn tfjob_manifest_snapshot() {
    insta::assert_snapshot!("tfjob", rendered(FULL, Target::Tfjob));
}

#[test]
fn slurm_script_snapshot() {
    insta::assert_snapshot!("slurm", rendered(WORKERS, Target::Slurm));
}

#[test]
fn the_command_line_takes_image_namespace_and_overrides() {
    let out = common::run(&[
        "manifest",
        WORKERS,
        "--image",
        "example.org/tr:1",
        "--namespace",
        "team-a",
        "--set",
        "cluster.worker=3",
        "--set",
        "batch.global=96",
    ]);
    common::assert_exit(&out, 0);
    let (yaml, _) = common::text(&out);
    assert!(yaml.contains("image: example.org/tr:1") && yaml.contains("namespace: team-a"), "{yaml}");
    assert!(yaml.contains("completions: 3") && yaml.contains("parallelism: 3"), "{yaml}");
    let out = common::run(&["manifest", FULL, "--for", "slurm"]);
    common::assert_exit(&out, 2);
    assert!(common::text(&out).1.contains("under Slurm every task is a worker"), "{:?}", common::text(&out));
    let out = common::run(&["manifest", WORKERS, "--set", "deploy.volum={ kind = \"claim\", name = \"x\" }"]);
    common::assert_exit(&out, 2);
    assert!(common::text(&out).1.contains("did you mean `volume`?"), "{:?}", common::text(&out));
}

/// `trainrun certs` names the tasks as each scheduler's tasks reach each other, and asks for
/// names under Slurm, whose nodes are known only when the job starts.
#[test]
fn certs_name_the_tasks_where_the_job_runs() {
    let dir = common::tempdir();
    let certs = |args: &[&str], out: &str| {
        let out_dir = dir.path().join(out).display().to_string();
        let all: Vec<&str> = [&["certs"][..], args, &["--out", &out_dir]].concat();
        common::run(&all)
    };
    let out = certs(&[FULL, "--for", "tfjob", "--namespace", "ml"], "tfjob");
    common::assert_exit(&out, 0);
    let (said, _) = common::text(&out);
    for name in ["full-job-chief-0.ml.svc", "full-job-worker-1.ml.svc", "full-job-evaluator-0.ml.svc"] {
        assert!(said.lines().any(|l| l.trim() == name), "{name} in\n{said}");
    }
    assert!(said.contains("kubectl create secret generic"), "{said}");
    let out = certs(&[WORKERS, "--for", "slurm"], "slurm");
    common::assert_exit(&out, 2);
    assert!(common::text(&out).1.contains("--name node01"), "{:?}", common::text(&out));
    assert!(!dir.path().join("slurm/tls.key").exists(), "nothing written on a refusal");
    let out = certs(&[WORKERS, "--for", "slurm", "--name", "*.hpc.example", "--name", "10.1.2.3"], "slurm");
    common::assert_exit(&out, 0);
    assert!(common::text(&out).0.contains("  *.hpc.example\n  10.1.2.3\n"), "{:?}", common::text(&out));
}

/// The program if it runs, else a loud skip.
fn tool(name: &str) -> bool {
    let found = Command::new(name).arg("--help").output().is_ok_and(|o| o.status.success());
    if !found {
        let why = format!("skipped: `{name}` is not installed (python3 -m pip install {name})");
        println!("{why}");
        eprintln!("{why}");
    }
    found
}

/// The Kubernetes versions whose schemas kubernetes-validate ships, oldest and newest.
fn shipped_versions() -> (String, String) {
    let script = "import kubernetes_validate, os, re\n\
        d = os.path.join(os.path.dirname(kubernetes_validate.__file__), 'kubernetes-json-schema')\n\
        vs = sorted({tuple(map(int, m.groups())) for m in (re.match(r'v(\\d+)\\.(\\d+)\\.(\\d+)-local-strict$', n) for n in os.listdir(d)) if m})\n\
        print('.'.join(map(str, vs[0])), '.'.join(map(str, vs[-1])))";
    let out = Command::new("python3").args(["-c", script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace().map(str::to_owned);
    (words.next().expect("no shipped version"), words.next().expect("no shipped version"))
}

fn validate(file: &Path, version: &str) -> (bool, String) {
    let out = Command::new("kubernetes-validate").args(["--strict", "-k", version]).arg(file).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn kubernetes_objects_pass_strict_validation_on_the_oldest_and_newest_kubernetes() {
    if !tool("kubernetes-validate") {
        return;
    }
    let dir = common::tempdir();
    let (oldest, newest) = shipped_versions();
    for (name, spec, target) in [
        ("full", FULL, Target::Kubernetes),
        ("workers", WORKERS, Target::Kubernetes),
        ("sweep", SWEEP, Target::Kubernetes),
        ("tfjob-objects", FULL, Target::Tfjob),
    ] {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, rendered(spec, target)).unwrap();
        for version in [&oldest, &newest] {
            let (ok, log) = validate(&file, version);
            assert!(ok, "{name} against Kubernetes {version}:\n{log}");
            assert!(!log.contains("ERROR"), "{log}");
        }
    }
    // The check can fail: a misspelled field is refused.
    let typo = dir.path().join("typo.yaml");
    std::fs::write(&typo, rendered(WORKERS, Target::Kubernetes).replace("backoffLimit", "backoffLimt")).unwrap();
    assert!(!validate(&typo, &newest).0, "a misspelled field must fail strict validation");
}

/// The CRD's schema as a JSON Schema that refuses unknown fields (the API server would prune
/// them silently), as kubeconform's `-strict` does.
fn strict(schema: &mut Value) {
    if let Value::Object(map) = schema {
        let open = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        if map.contains_key("properties") && !map.contains_key("additionalProperties") && !open {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
        map.values_mut().for_each(strict);
    } else if let Value::Array(items) = schema {
        items.iter_mut().for_each(strict);
    }
}

fn tfjob_schema(dir: &Path) -> std::path::PathBuf {
    let crd = std::fs::read_to_string("schemas/vendor/kubeflow-training-operator/kubeflow.org_tfjobs.yaml").unwrap();
    let crd: Value = serde_norway::from_str(crd.trim_start_matches("---\n")).unwrap();
    let version = crd["spec"]["versions"].as_array().unwrap().iter().find(|v| v["name"] == "v1").unwrap();
    let mut schema = version["schema"]["openAPIV3Schema"].clone();
    strict(&mut schema);
    schema["properties"]["apiVersion"] = serde_json::json!({ "const": "kubeflow.org/v1" });
    schema["properties"]["kind"] = serde_json::json!({ "const": "TFJob" });
    schema["required"] = serde_json::json!(["apiVersion", "kind", "metadata", "spec"]);
    // The API server owns metadata's fields; the CRD leaves them open.
    schema["properties"]["metadata"] = serde_json::json!({ "type": "object" });
    let path = dir.join("tfjob.schema.json");
    std::fs::write(&path, serde_json::to_string_pretty(&schema).unwrap()).unwrap();
    path
}

fn check_tfjob(schema: &Path, doc: &str, dir: &Path) -> (bool, String) {
    let file = dir.join("tfjob.yaml");
    std::fs::write(&file, doc).unwrap();
    let out = Command::new("check-jsonschema").arg("--schemafile").arg(schema).arg(&file).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn the_tfjob_passes_kubeflows_crd_schema() {
    if !tool("check-jsonschema") {
        return;
    }
    let dir = common::tempdir();
    let schema = tfjob_schema(dir.path());
    let text = rendered(FULL, Target::Tfjob);
    let tfjob = text.split("\n---\n").find(|d| d.contains("kind: TFJob")).unwrap();
    for replica in ["Chief:", "Worker:", "Evaluator:", "name: tensorflow", "name: tfjob-port"] {
        assert!(tfjob.contains(replica), "{replica} missing:\n{tfjob}");
    }
    let (ok, log) = check_tfjob(&schema, tfjob, dir.path());
    assert!(ok, "{log}\n{tfjob}");
    let (ok, _) = check_tfjob(&schema, &tfjob.replace("replicas:", "replcias:"), dir.path());
    assert!(!ok, "a misspelled field must fail the CRD schema");
}

#[test]
fn the_sbatch_script_is_valid_bash_and_carries_the_resources() {
    let dir = common::tempdir();
    let script = dir.path().join("job.sbatch");
    std::fs::write(&script, rendered(FULL.replace("full", "netns").as_str(), Target::Slurm)).unwrap();
    let out = Command::new("bash").arg("-n").arg(&script).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&script).unwrap();
    for line in ["#SBATCH --ntasks=2", "#SBATCH --cpus-per-task=1", "srun trainrun \"netns-job.spec.toml\""] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
    let array = dir.path().join("array.sbatch");
    std::fs::write(&array, rendered(SWEEP, Target::Slurm)).unwrap();
    let out = Command::new("bash").arg("-n").arg(&array).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&array).unwrap();
    for line in ["#SBATCH --array=0-3%4\n", "--trial \"$SLURM_ARRAY_TASK_ID\"\n"] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
}
