//! The command line end to end: `check`, `schema`, `bench --only`, exit codes, and every broken spec giving a
//! clear error with exit code 2 and never a panic.

mod common;

use common::{assert_exit, run, text};
use std::path::Path;

fn specs() -> Vec<String> {
    let mut specs: Vec<String> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("specs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| format!("specs/{}", p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()))
        .collect();
    specs.sort();
    specs
}

#[test]
fn check_plans_every_checked_in_spec() {
    let specs = specs();
    assert!(specs.len() >= 3, "{specs:?}");
    for spec in specs {
        let out = run(&["check", &spec]);
        assert_exit(&out, 0);
        let (stdout, _) = text(&out);
        for line in ["strategy", "num_replicas_in_sync", "batch", "learning_rate", "steps", "all-reduce", "checkpoints"]
        {
            assert!(stdout.contains(line), "{spec}: no `{line}` in\n{stdout}");
        }
    }
}

/// A published dataset not yet downloaded is not an error for `check`, but it says so, and
/// whether a run would fetch it or, offline, stop on it.
#[test]
fn check_says_which_data_files_a_run_would_download() {
    let empty = common::tempdir();
    let check = |offline: &str| {
        let out = common::trainrun()
            .args(["check", "specs/mnist_single.toml"])
            .env("TRAINRUN_DATA_DIR", empty.path())
            .env("TRAINRUN_OFFLINE", offline)
            .output()
            .expect("trainrun runs");
        assert_exit(&out, 0);
        let (stdout, _) = text(&out);
        stdout.lines().find(|l| l.contains("data folder")).unwrap_or_default().to_string()
    };
    let online = check("0");
    assert!(online.contains("not there yet: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz"), "{online}");
    assert!(online.contains("a run downloads them first"), "{online}");
    let offline = check("1");
    assert!(offline.contains("missing: train-images-idx3-ubyte.gz") && offline.contains("TRAINRUN_OFFLINE is set"));
    let (stdout, _) = text(&run(&["check", "specs/mnist_single.toml"]));
    let present = stdout.lines().find(|l| l.contains("data folder")).unwrap_or_default();
    assert!(!present.contains('('), "the real data is all there: {present}");
}

#[test]
fn check_shows_the_multiworker_arithmetic() {
    let out = run(&["check", "specs/mnist_multiworker.toml"]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("multi_worker_mirrored"), "{stdout}");
    assert!(stdout.contains("2 (2 workers × 1 device)"), "{stdout}");
    assert!(
        stdout.contains("global 128 = per_replica 64 × 2 replicas × 1 accumulation step (global derived)"),
        "{stdout}"
    );
    assert!(stdout.contains("data policy"), "{stdout}");
}

#[test]
fn check_json_is_the_plan() {
    let out = run(&["check", "specs/mnist_multiworker.toml", "--json"]);
    assert_exit(&out, 0);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON: {e}"));
    assert_eq!(plan["batch"]["global"], 128);
    assert_eq!(plan["batch"]["per_replica"], 64);
    assert_eq!(plan["strategy"]["num_replicas_in_sync"], 2);
    assert_eq!(plan["model"]["params"], 2_770_634);
    assert_eq!(plan["cluster"]["part"]["kind"], "launcher");
    // The strategy's own settings sit beside its kind (`plan::Distribution`).
    assert_eq!(plan["strategy"]["kind"], "multi_worker_mirrored");
    assert_eq!(plan["strategy"]["transport"], "shared_memory");
    assert_eq!(plan["learning_rate"]["scaled"], 0.001);
}

#[test]
fn overrides_reach_the_plan() {
    let out = common::trainrun()
        .args(["check", "specs/mnist_single.toml", "--json", "--set", "batch.global=128"])
        .env("TRAINRUN_OPTIMIZER__LEARNING_RATE", "0.05")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_exit(&out, 0);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan["batch"]["global"], 128);
    assert_eq!(plan["learning_rate"]["base"], 0.05);
}

#[test]
fn schema_command_prints_the_checked_in_schema() {
    let out = run(&["schema"]);
    assert_exit(&out, 0);
    let file = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/trainrun.schema.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        String::from_utf8_lossy(&out.stdout) == file,
        "schemas/trainrun.schema.json is stale: run `cargo run --release -- schema > schemas/trainrun.schema.json`"
    );
}

#[test]
fn every_checked_in_spec_names_the_schema() {
    for spec in specs() {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&spec)).unwrap_or_default();
        assert!(text.starts_with("#:schema ../schemas/trainrun.schema.json"), "{spec} must start with a #:schema line");
    }
}

/// Every broken spec — load-level (`tests/broken`) and plan-level (`tests/broken_plan`) —
/// exits with 2 and a located error; the plan-level texts are snapshotted here (the load-level
/// ones in `spec_corpus.rs`).
#[test]
fn every_broken_spec_exits_2_with_a_clear_error() {
    let mut cases = Vec::new();
    for dir in ["tests/broken", "tests/broken_plan"] {
        for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)).into_iter().flatten().flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if entry.path().is_dir() { format!("{dir}/{name}/spec.toml") } else { format!("{dir}/{name}") };
            if path.ends_with(".toml") {
                cases.push((dir, name.trim_end_matches(".toml").to_string(), path));
            }
        }
    }
    cases.sort();
    assert!(cases.len() >= 40, "{} broken specs", cases.len());
    for (dir, name, path) in cases {
        let out = run(&["check", &path]);
        assert_exit(&out, 2);
        let (_, stderr) = text(&out);
        assert!(stderr.contains("error: ") && stderr.contains("problem"), "{path}:\n{stderr}");
        if dir == "tests/broken_plan" {
            // The data folder differs between machines.
            let stderr = stderr.replace(&common::data_dir().display().to_string(), "[DATA_DIR]");
            insta::assert_snapshot!(format!("plan_{name}"), stderr);
        }
    }
}

#[test]
fn an_override_error_names_the_override() {
    let out = run(&["check", "specs/mnist_single.toml", "--set", "optimizer.learning_rate=-1"]);
    assert_exit(&out, 2);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("--set optimizer.learning_rate=-1"), "{stderr}");
}

#[test]
fn a_missing_spec_file_is_a_clear_error() {
    let out = run(&["check", "specs/does_not_exist.toml"]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("specs/does_not_exist.toml"));
}

/// `trainrun check` under parameter_server: the coordinator's settings, where each shard lives
/// (rows dealt div-style, shards round-robin over the ps tasks) and the bytes per ps.
#[test]
fn check_shows_parameter_server_placement() {
    let out = run(&[
        "check",
        "specs/mnist_parameter_server.toml",
        "--set",
        "cluster.ps=2",
        "--set",
        "strategy.variable_partitioner={ kind = \"fixed_shards\", shards = 3 }",
        "--set",
        "strategy.max_staleness=4",
        "--set",
        "train.steps_per_execution=5",
    ]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    for line in [
        "coordinator           queue of 262144 closures, max_staleness 4: a worker 5 steps ahead of the slowest waits, 5 steps per closure",
        "at least once per epoch, not exactly once",
        // conv2d/kernel has 3 rows: one per shard, on ps 0, 1, 0.
        "placement             conv2d/kernel [3, 3, 1, 32] → 3 shards: rows 0..1 on ps 0, rows 1..2 on ps 1, rows 2..3 on ps 0",
        // conv2d/bias [32]: 11/11/10 rows, continuing on ps 1.
        "conv2d/bias [32] → 3 shards: rows 0..11 on ps 1, rows 11..22 on ps 0, rows 22..32 on ps 1",
        // 2,770,634 values × 4 bytes over both ps.
        "bytes per ps          ps 0: ",
        "input                 full shuffle each epoch, drop remainder, prefetch 2, one shard",
    ] {
        assert!(stdout.contains(line), "no `{line}` in\n{stdout}\n{stderr}");
    }
    let bytes: u64 = stdout
        .lines()
        .filter_map(|l| l.split_once("bytes per ps"))
        .flat_map(|(_, v)| v.split(" B)").filter_map(|p| p.rsplit('(').next()?.parse::<u64>().ok()).collect::<Vec<_>>())
        .sum();
    assert_eq!(bytes, 2_770_634 * 4, "{stdout}");
}

#[test]
fn gpu_devices_need_a_gpu_build() {
    let out = run(&[
        "specs/mnist_single.toml",
        "-q",
        "--set",
        "strategy={ kind = \"mirrored\", devices = [\"gpu:0\", \"gpu:1\"] }",
    ]);
    assert_exit(&out, 3);
    // A CUDA build tries the GPUs instead, and says why it cannot use them (tests/cuda.rs).
    let want = if cfg!(feature = "cuda") { "GPU: " } else { "needs a GPU build" };
    assert!(text(&out).1.contains(want), "{}", text(&out).1);
}

#[test]
fn multi_worker_on_gpus_is_refused_before_any_worker_starts() {
    let out = run(&["specs/mnist_multiworker.toml", "-q", "--set", r#"strategy.devices=["gpu:0"]"#]);
    assert_exit(&out, 3);
    let (stdout, stderr) = text(&out);
    assert!(stderr.contains("multi_worker_mirrored runs on CPU devices only"), "{stderr}");
    // Refused by the launcher itself: no task was started, so no task-prefixed lines.
    assert!(!stderr.contains("[worker:") && !stdout.contains("[worker:"), "{stdout}{stderr}");
}

#[test]
fn missing_data_offline_names_the_files_and_the_folder() {
    let dir = common::tempdir();
    let out = common::trainrun()
        .args(["specs/mnist_single.toml", "-q"])
        .env("TRAINRUN_DATA_DIR", dir.path())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_exit(&out, 4);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("train-images-idx3-ubyte.gz") && stderr.contains(&dir.path().display().to_string()),
        "{stderr}"
    );
}

#[test]
fn no_arguments_prints_help_and_fails() {
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("Usage"));
}

#[test]
fn check_shows_clipping_decay_exclusions_and_the_cosine_floor() {
    let out = run(&[
        "check",
        "specs/mnist_single.toml",
        "--set",
        "optimizer.kind=adamw",
        "--set",
        "optimizer.clip_norm=1.0",
        "--set",
        "optimizer.schedule={kind=\"cosine\", final_learning_rate=0.0001}",
    ]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("cosine to 0.0001 (0.1 × peak) at step 210"), "{stdout}");
    assert!(stdout.contains("weight decay 0.004 (matrices only), clip_norm 1"), "{stdout}");
    let out = run(&[
        "check",
        "specs/mnist_single.toml",
        "--set",
        "optimizer.kind=adamw",
        "--set",
        "optimizer.exclude_from_weight_decay=[\"bias\"]",
        "--set",
        "optimizer.schedule={kind=\"cosine\"}",
    ]);
    assert_exit(&out, 0);
    let (stdout, _) = text(&out);
    assert!(stdout.contains("weight decay 0.004 (except bias)"), "{stdout}");
    assert!(stdout.contains("cosine to 0 at step 210"), "a floor of 0 reads as one: {stdout}");
}

/// `bench --only engine` prints the engine table, every configuration of it, and nothing else
/// (no peers, no all-reduce, no jobs): an A/B sitting can time one table.
#[test]
fn bench_only_prints_the_one_table_asked_for() {
    let out = run(&["bench", "--quick", "--only", "engine"]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("== engine: tutorial model"), "{stdout}\n{stderr}");
    let rows = stdout.lines().filter(|l| l.trim_start().starts_with("64 ") || l.trim_start().starts_with("128 "));
    let rates: Vec<f64> = rows.filter_map(|l| l.split_whitespace().last()?.parse().ok()).collect();
    assert_eq!(rates.len(), 8, "batch 64 and 128 × 1 and 2 threads × SGD and momentum:\n{stdout}");
    assert!(rates.iter().all(|r| *r > 0.0), "{stdout}");
    for other in ["== peer", "== all-reduce", "== jobs", "== time to 98%"] {
        assert!(!stdout.contains(other), "`--only engine` printed {other}:\n{stdout}");
    }
}

/// `bench --quick --only precision` prints the GPT's table of `mixed_bfloat16` against float32
/// and PyTorch: a row per size with every ratio and a verdict line against the targets, or,
/// with a Python without torch, why not.
#[test]
fn bench_only_precision_prints_each_size_against_its_targets_or_why_not() {
    let out = run(&["bench", "--quick", "--only", "precision"]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("== GPT under mixed_bfloat16") && stdout.contains("== machine: "), "{stdout}\n{stderr}");
    if let Some(skipped) = stdout.lines().find(|l| l.starts_with("skipped: ")) {
        assert!(skipped.contains("no PyTorch figure (") && skipped.contains("TRAINRUN_BENCH_PYTHON"), "{skipped}");
        return;
    }
    for size in ["shakespeare", "nanogpt"] {
        let row = stdout.lines().find(|l| l.trim_start().starts_with(&format!("{size} "))).unwrap_or("");
        assert_eq!(row.matches('×').count(), 2, "{size}: no row with both ratios:\n{stdout}");
        let verdict = stdout.lines().find(|l| l.starts_with(&format!("{size}: mixed_bfloat16 median"))).unwrap_or("");
        assert!(verdict.contains("(target ≥ 1.5×)"), "{size}: no verdict:\n{stdout}");
    }
}

/// `bench --quick --only corpus` prints its three rows (tiktoken, a `tokenizer.json`, a Parquet
/// text column), each ending in its median ratio against the target or in why it has none
/// (a Python without tiktoken, tokenizers or pyarrow), with trainrun's figure in every pair.
#[test]
fn bench_only_corpus_prints_each_row_against_its_target_or_why_not() {
    let out = run(&["bench", "--quick", "--only", "corpus"]);
    assert_exit(&out, 0);
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("== corpus: tokenizers and a Parquet text column") && stdout.contains("CPU: "), "{stdout}");
    let titles =
        ["tiktoken gpt2 vs Python tiktoken", "shakespeare_bpe.json vs Python tokenizers", "Parquet text column"];
    let mut rest = stdout.as_str();
    for title in titles {
        let at = rest.find(title).unwrap_or_else(|| panic!("no row {title:?}:\n{stdout}\n{stderr}"));
        rest = &rest[at..];
        let end = rest.lines().position(|l| l.starts_with("median") || l.starts_with("parquet SKIPPED"));
        let lines: Vec<&str> = rest.lines().take(end.map_or(0, |e| e + 1)).collect();
        let last = lines.last().unwrap_or_else(|| panic!("{title}: no verdict:\n{stdout}"));
        if last.starts_with("median ratio") {
            assert!(last.contains("(target ≥ ") && (last.ends_with(": met") || last.ends_with(": NOT met")), "{last}");
            // Both pairs, each with trainrun's and the peer's figures and their ratio.
            let pairs = lines.iter().filter(|l| l.starts_with("    1 ") || l.starts_with("    2 ")).count();
            assert_eq!(pairs, 2, "{title}:\n{}", lines.join("\n"));
            assert!(lines.iter().filter(|l| l.contains('×')).count() >= 3, "{}", lines.join("\n"));
        } else {
            // Skipped: said on a line of its own, with the reason.
            assert!(lines.iter().any(|l| l.contains("no Python figure (")), "{title}:\n{}", lines.join("\n"));
        }
    }
}
