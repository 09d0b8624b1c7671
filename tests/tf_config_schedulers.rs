//! TF_CONFIG as real schedulers write it, with real task processes on loopback: Kubeflow's
//! form (`"index": "1"` as a string, `"environment": "cloud"`, the evaluator listed in the
//! cluster) trains; tasks that differ only in `run.out_dir` and `run.threads` (each worker its
//! own folder, hosts with other core counts) train together; tasks whose specs differ in what
//! changes the results are refused with the keys that differ.

mod common;

use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(180);
const TOKEN: &str = "tf-config-test-token-0123456789";

fn short(dir: &std::path::Path) -> Vec<String> {
    [
        "specs/mnist_multiworker.toml".to_owned(),
        "--quiet".into(),
        "--set".into(),
        "train.epochs=1".into(),
        "--set".into(),
        "train.steps_per_epoch=10".into(),
        "--set".into(),
        format!("run.out_dir=\"{}\"", dir.display()),
    ]
    .to_vec()
}

/// Kubeflow's TF_CONFIG for `task` of a chief, one worker and an evaluator.
fn kubeflow(ports: &[u16; 3], task: (&str, &str)) -> String {
    format!(
        r#"{{"cluster":{{"chief":["127.0.0.1:{}"],"evaluator":["127.0.0.1:{}"],"worker":["127.0.0.1:{}"]}},"task":{{"type":"{}","index":"{}"}},"environment":"cloud"}}"#,
        ports[0], ports[1], ports[2], task.0, task.1
    )
}

#[test]
fn kubeflows_tf_config_trains_without_waiting_for_its_evaluator() {
    let dir = common::tempdir();
    let ports = common::free_ports::<3>();
    let args = short(&dir.path().join("run"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // No evaluator process is started: the training tasks must not wait for it.
    let chief = common::spawn_task(&kubeflow(&ports, ("chief", "0")), TOKEN, &args);
    let worker = common::spawn_task(&kubeflow(&ports, ("worker", "0")), TOKEN, &args);
    for child in [chief, worker] {
        let (out, _) = common::wait_within(child, LIMIT);
        common::assert_exit(&out, 0);
    }
    let run = common::json(&dir.path().join("run/run.json"));
    assert_eq!(run["cluster"]["source"], "tf_config");
    assert!(run["cluster"]["tasks"].get("evaluator:0").is_none(), "{run}");
}

#[test]
fn tasks_may_differ_in_output_folder_and_threads_but_not_in_results() {
    let dir = common::tempdir();
    let ports = common::free_ports::<2>();
    let chief_args = short(&dir.path().join("chief"));
    let mut worker_args = short(&dir.path().join("worker-own-folder"));
    worker_args.extend(["--set".into(), "run.threads=1".into()]);
    let run = |worker_args: &[String]| {
        let a: Vec<&str> = chief_args.iter().map(String::as_str).collect();
        let b: Vec<&str> = worker_args.iter().map(String::as_str).collect();
        let chief = common::spawn_task(&common::tf_config(&ports, ("worker", 0)), TOKEN, &a);
        let worker = common::spawn_task(&common::tf_config(&ports, ("worker", 1)), TOKEN, &b);
        [chief, worker].map(|c| common::wait_within(c, LIMIT).0)
    };
    for out in run(&worker_args) {
        common::assert_exit(&out, 0);
    }
    worker_args.extend([
        "--set".into(),
        "optimizer.learning_rate=0.05".into(),
        "--set".into(),
        "train.epochs=2".into(),
    ]);
    for out in run(&worker_args) {
        common::assert_exit(&out, 5);
        let (_, stderr) = common::text(&out);
        assert!(
            stderr.contains("worker:1 runs spec")
                && stderr.contains("they differ in optimizer.learning_rate, train.epochs"),
            "{stderr}"
        );
    }
}

#[test]
fn kubeflows_evaluator_watches_the_checkpoints_on_its_own_and_exits_when_training_ends() {
    let dir = common::tempdir();
    let ports = common::free_ports::<3>();
    let mut args = short(&dir.path().join("run"));
    args.extend(["--set".into(), "callbacks=[{ kind = \"model_checkpoint\", save_freq = 5 }]".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let evaluator = common::spawn_task(&kubeflow(&ports, ("evaluator", "0")), TOKEN, &args);
    let chief = common::spawn_task(&kubeflow(&ports, ("chief", "0")), TOKEN, &args);
    let worker = common::spawn_task(&kubeflow(&ports, ("worker", "0")), TOKEN, &args);
    for child in [chief, worker, evaluator] {
        let (out, _) = common::wait_within(child, LIMIT);
        common::assert_exit(&out, 0);
    }
    let lines = std::fs::read_to_string(dir.path().join("run/eval.jsonl")).unwrap();
    let steps: Vec<u64> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [5, 10], "every checkpoint evaluated once, the last one included");
}
