//! Property-based tests of every reader of outside input: random specs and random `--set` and
//! `TRAINRUN_*` overrides (keys of the schema and others; numbers such as 0, negatives, 2^63,
//! NaN, ±inf; huge strings) through `spec::load` and then planning (`prepare::plan`, as
//! `trainrun check`: batch and step arithmetic, the cluster, the model against the data); random and mutated bytes through TF_CONFIG,
//! the checkpoint manifest reader, the safetensors reader, the IDX and gzip readers and the
//! rewrites of a damaged `run.json`.
//! Nothing may panic, and every refusal of a spec is located (a file and line, an environment
//! variable or a `--set`). Over 100,000 cases in all, about 15 s in release builds; the
//! counts are per test below.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use trainrun::prepare::{Invocation, Unplanned};
use trainrun::spec::{LoadError, load};

/// Runs `strategy` `cases` times through `test`; fails with the smallest failing input.
fn check<S: Strategy>(cases: u32, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Specs.

/// Every key name of the schema, and the section paths they live in.
fn schema_keys() -> &'static (Vec<String>, Vec<String>) {
    static KEYS: OnceLock<(Vec<String>, Vec<String>)> = OnceLock::new();
    KEYS.get_or_init(|| {
        fn walk(v: &serde_json::Value, prefix: &str, keys: &mut Vec<String>, paths: &mut Vec<String>, depth: usize) {
            match v {
                serde_json::Value::Object(map) => {
                    if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                        for (k, sub) in props {
                            let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                            keys.push(k.clone());
                            paths.push(path.clone());
                            if depth < 3 {
                                walk(sub, &path, keys, paths, depth + 1);
                            }
                        }
                    }
                    for (k, sub) in map {
                        if k != "properties" {
                            walk(sub, prefix, keys, paths, depth);
                        }
                    }
                }
                serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, prefix, keys, paths, depth)),
                _ => {}
            }
        }
        let (mut keys, mut paths) = (Vec::new(), Vec::new());
        walk(trainrun::spec::schema_value(), "", &mut keys, &mut paths, 0);
        keys.sort();
        keys.dedup();
        paths.sort();
        paths.dedup();
        (keys, paths)
    })
}

/// A key: one of the schema's, or something else.
fn key() -> impl Strategy<Value = String> {
    let known = schema_keys().0.clone();
    prop_oneof![
        4 => proptest::sample::select(known),
        1 => "[a-z_]{1,12}",
        1 => "\\PC{0,6}",
    ]
}

/// Numbers at the edges: 0, ±1, 2^63, 2^64, i64::MIN, NaN, ±inf, tiny and huge.
fn edge_number() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1".to_string()),
        Just("9223372036854775808".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-9223372036854775808".to_string()),
        Just("340282366920938463463374607431768211456".to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("1e308".to_string()),
        Just("-0.0".to_string()),
        Just("5e-324".to_string()),
        any::<i64>().prop_map(|i| i.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        (0u64..5000).prop_map(|i| i.to_string()),
    ]
}

/// A TOML value as text: numbers at the edges, booleans, strings (huge ones too), lists and
/// inline tables.
fn value() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        4 => edge_number(),
        1 => any::<bool>().prop_map(|b| b.to_string()),
        2 => "\\PC{0,12}".prop_map(|s| format!("{s:?}")),
        1 => (1usize..20_000).prop_map(|n| format!("\"{}\"", "x".repeat(n))),
        1 => proptest::sample::select(vec!["\"mnist_cnn\"", "\"sgd\"", "\"adam\"", "\"epoch\"", "\"multi_worker_mirrored\"", "\"table\"", "\"dense\""]).prop_map(str::to_string),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| format!("[{}]", v.join(", "))),
            proptest::collection::vec(("[a-z_]{1,10}", inner), 0..4).prop_map(|kv| {
                let items: Vec<String> = kv.iter().map(|(k, v)| format!("{k} = {v}")).collect();
                format!("{{ {} }}", items.join(", "))
            }),
        ]
    })
}

/// A spec file: a few sections, each with a few `key = value` lines (keys may repeat and
/// values may be nonsense); usually with a model so that more of it is checked.
fn spec_text() -> impl Strategy<Value = String> {
    let section =
        (proptest::sample::select(schema_keys().1.clone()), proptest::collection::vec((key(), value()), 0..5));
    (any::<bool>(), proptest::collection::vec(section, 0..5)).prop_map(|(model, sections)| {
        let mut text = String::new();
        if model {
            text.push_str("[model]\nzoo = \"mnist_cnn\"\n\n");
        }
        for (name, lines) in sections {
            text.push_str(&format!("[{name}]\n"));
            for (k, v) in lines {
                text.push_str(&format!(
                    "{} = {v}\n",
                    if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !k.is_empty() {
                        k
                    } else {
                        format!("{k:?}")
                    }
                ));
            }
        }
        text
    })
}

/// A `--set` argument: a known or random key path, `=`, a value; sometimes malformed.
fn set_arg() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (proptest::sample::select(schema_keys().1.clone()), value()).prop_map(|(k, v)| format!("{k}={v}")),
        2 => (proptest::sample::select(schema_keys().1.clone()), edge_number()).prop_map(|(k, v)| format!("{k}={v}")),
        1 => ("[a-z_.\\[\\]0-9]{0,20}", value()).prop_map(|(k, v)| format!("{k}={v}")),
        1 => "\\PC{0,20}",
    ]
}

/// A `TRAINRUN_*` variable: a spec override (known or not) or another name.
fn env_var() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        proptest::sample::select(schema_keys().1.clone())
            .prop_map(|p| format!("TRAINRUN_{}", p.replace('.', "__").to_uppercase())),
        "[A-Z_]{0,16}".prop_map(|s| format!("TRAINRUN_{s}")),
    ];
    (name, edge_number())
}

/// The MNIST folder for the data facts planning reads (headers only), absolute.
fn data_dir() -> &'static str {
    static DIR: OnceLock<String> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let given = std::env::var("TRAINRUN_DATA_DIR").unwrap_or_else(|_| "../shared/data/mnist".into());
        root.join(given).display().to_string()
    })
}

/// Plans a loaded spec as `trainrun check` does: nothing may panic, and every problem names
/// its key, with the place it came from when the spec or an override gave it.
fn plan_checked(
    loaded: &trainrun::spec::Loaded,
    path: &Path,
    env: &[(String, String)],
    sets: &[String],
) -> Result<(), TestCaseError> {
    let mut env = env.to_vec();
    env.push(("TRAINRUN_DATA_DIR".into(), data_dir().into()));
    env.push(("TRAINRUN_OFFLINE".into(), "1".into()));
    let inv = Invocation {
        spec: path.to_path_buf(),
        sets: sets.to_vec(),
        env,
        quiet: true,
        task: None,
        launched: std::time::Instant::now(),
    };
    match trainrun::prepare::plan(loaded, &inv) {
        Ok(_) | Err(Unplanned::Run(_) | Unplanned::TooBig(_)) => Ok(()),
        Err(Unplanned::Spec(diags)) => {
            let parts = trainrun::spec::render_each(&diags, &loaded.origins);
            prop_assert!(!parts.is_empty(), "a refusal without a problem");
            for (diag, part) in diags.iter().zip(&parts) {
                prop_assert!(
                    part.contains("--> ") || part.contains(diag.key.as_str()),
                    "a problem that names neither its place nor its key:\n{part}\n--- sets: {sets:?}"
                );
            }
            Ok(())
        }
    }
}

/// Loads `text` as a spec file with `env` and `sets`, then plans it; checks the outcome.
fn load_checked(dir: &Path, text: &str, env: &[(String, String)], sets: &[String]) -> Result<(), TestCaseError> {
    let path = dir.join("spec.toml");
    std::fs::write(&path, text).map_err(|e| TestCaseError::fail(e.to_string()))?;
    match load(&path, env, sets) {
        Ok(loaded) => plan_checked(&loaded, &path, env, sets),
        Err(LoadError::Read { .. }) => Err(TestCaseError::fail("a written spec file could not be read")),
        Err(LoadError::Invalid { parts, rendered, .. }) => {
            prop_assert!(!parts.is_empty(), "a refusal without a problem:\n{rendered}");
            for part in &parts {
                prop_assert!(
                    part.contains("--> "),
                    "a problem without a location:\n{part}\n--- spec:\n{text}\n--- sets: {sets:?}\n--- env: {env:?}"
                );
            }
            Ok(())
        }
    }
}

#[test]
fn random_specs_load_or_are_refused_with_located_messages() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    check(20_000, spec_text(), |text| load_checked(dir.path(), &text, &[], &[]));
}

#[test]
fn random_overrides_load_or_are_refused_with_located_messages() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let base =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mnist_tutorial.toml"))
            .unwrap_or_else(|e| panic!("{e}"));
    let overrides = (proptest::collection::vec(set_arg(), 0..4), proptest::collection::vec(env_var(), 0..3));
    check(20_000, overrides, |(sets, env)| load_checked(dir.path(), &base, &env, &sets));
}

// ---------------------------------------------------------------------------------------------
// Bytes.

/// `seed` changed at a few places, maybe cut short, or bytes from nowhere.
fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let edit = (
        proptest::sample::select(seeds),
        proptest::collection::vec((any::<Index>(), any::<u8>()), 0..6),
        proptest::option::of(any::<Index>()),
    )
        .prop_map(|(mut bytes, flips, cut)| {
            if !bytes.is_empty() {
                for (at, b) in flips {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
                if let Some(cut) = cut {
                    bytes.truncate(cut.index(bytes.len() + 1));
                }
            }
            bytes
        });
    prop_oneof![4 => edit, 1 => proptest::collection::vec(any::<u8>(), 0..300)]
}

#[test]
fn tf_config_of_random_and_mutated_text_never_panics() {
    let seeds: Vec<Vec<u8>> = [
        r#"{"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, "task": {"type": "worker", "index": 1}}"#,
        r#"{"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}, "environment": "cloud"}"#,
        r#"{"cluster": {"ps": ["[::1]:2222"], "worker": ["h:0"]}, "task": {"type": "ps", "index": 4294967295}}"#,
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let spec = trainrun::spec::ClusterSpec::default();
    check(20_000, mutated(seeds), |bytes| {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let env = vec![("TF_CONFIG".to_string(), text)];
        if let Err(d) = trainrun::cluster::resolve::resolve(&spec, 2222, true, &env, None) {
            prop_assert!(!d.message.is_empty());
        }
        Ok(())
    });
}

/// A real checkpoint of a two-tensor model, written by the store: its manifest and weights.
fn checkpoint_files() -> &'static (Vec<u8>, Vec<u8>, Vec<trainrun::engine::sequential::TensorInfo>) {
    use trainrun::checkpoint::manifest::*;
    use trainrun::checkpoint::{Layout, Snapshot, Store};
    use trainrun::engine::sequential::TensorInfo;
    use trainrun::metrics::{accuracy, loss, mae, rmse};
    static FILES: OnceLock<(Vec<u8>, Vec<u8>, Vec<TensorInfo>)> = OnceLock::new();
    FILES.get_or_init(|| {
        let tensors = vec![
            TensorInfo { name: "dense/kernel".into(), shape: vec![3, 2], offset: 0 },
            TensorInfo { name: "dense/bias".into(), shape: vec![2], offset: 6 },
        ];
        let layout = Layout { tensors: tensors.clone(), state_tensors: vec![], params: 8, state: 0 };
        let snapshot = Snapshot {
            params: (0..8).map(|i| i as f32 * 0.5).collect(),
            state: vec![],
            optimizer: vec![("momentum".into(), vec![0.25; 8])],
            best: None,
        };
        let mut sums = trainrun::metrics::Sums::of_examples(4);
        for (slot, value) in
            [(loss::SUM, 1.5), (accuracy::CORRECT, 3.0), (mae::ABS_ERROR, 0.5), (rmse::SQUARED_ERROR, 0.25)]
        {
            sums.accumulate(slot, value);
        }
        let manifest = Manifest {
            format: FORMAT,
            trainrun_version: "fuzz".into(),
            kind: Kind::Backup,
            step: 30,
            epoch: 1,
            cursor: trainrun::data::Cursor { epoch: 1, offset: 640 },
            rng: RngState { seed: 42, step: 30 },
            spec_hash: "abc".into(),
            spec_keys: Default::default(),
            topology: SavedTopology {
                num_workers: 2,
                num_replicas_in_sync: 2,
                per_replica_batch: 32,
                global_batch: 64,
                accumulation_steps: 1,
            },
            optimizer: OptimizerState { kind: SavedOptimizer::Sgd, iterations: 30, buffers: vec!["momentum".into()] },
            loop_state: LoopState {
                examples: 1920,
                epoch_sums: sums,
                last_epoch_sums: trainrun::metrics::Sums::default(),
                last_eval: Some(EvalState { step: 20, sums }),
                callbacks: [
                    ("model_checkpoint".to_string(), serde_json::json!({ "best": 0.5 })),
                    ("early_stopping".to_string(), serde_json::json!({ "best": "inf", "wait": 2 })),
                ]
                .into_iter()
                .collect::<CallbacksState>(),
                best_weights: false,
                worker_steps: vec![30, 29],
            },
            metrics: Metrics { loss: Some(0.5), accuracy: Some(0.75), val_loss: None, val_accuracy: None },
            unix_time: 1.0,
            files: vec![],
        };
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let written = Store::new(dir.path()).write(&snapshot, &layout, manifest).unwrap_or_else(|e| panic!("{e}"));
        let read = |name: &str| std::fs::read(written.join(name)).unwrap_or_else(|e| panic!("{e}"));
        (read("manifest.json"), read("model.safetensors"), tensors)
    })
}

#[test]
fn checkpoint_manifests_of_random_and_mutated_bytes_never_panic() {
    let (manifest, _, _) = checkpoint_files();
    let path = PathBuf::from("ckpt-0000000030/manifest.json");
    prop_assert_ok(trainrun::checkpoint::store::parse_manifest(&path, manifest).map(|_| ()));
    check(15_000, mutated(vec![manifest.clone()]), |bytes| {
        let _ = trainrun::checkpoint::store::parse_manifest(&path, &bytes);
        Ok(())
    });
}

/// Manifests whose JSON is well formed and whose checksum matches, with one value replaced
/// by an edge case: the deserializer itself must refuse without panicking.
#[test]
fn checkpoint_manifests_with_wrong_values_and_right_checksums_never_panic() {
    use sha2::{Digest, Sha256};
    let (manifest, _, _) = checkpoint_files();
    let file: serde_json::Value = serde_json::from_slice(manifest).unwrap_or_else(|e| panic!("{e}"));
    let inner = file["manifest"].clone();
    let mut leaves = Vec::new();
    fn paths(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => m.iter().for_each(|(k, s)| paths(s, format!("{at}/{k}"), out)),
            serde_json::Value::Array(a) => a.iter().enumerate().for_each(|(i, s)| paths(s, format!("{at}/{i}"), out)),
            _ => out.push(at),
        }
    }
    paths(&inner, String::new(), &mut leaves);
    let replacement = prop_oneof![
        edge_number().prop_map(|n| serde_json::from_str(&n).unwrap_or(serde_json::Value::String(n))),
        "\\PC{0,8}".prop_map(serde_json::Value::String),
        Just(serde_json::Value::Null),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
    ];
    let path = PathBuf::from("manifest.json");
    check(10_000, (proptest::sample::select(leaves), replacement), |(at, new)| {
        let mut value = inner.clone();
        if let Some(slot) = value.pointer_mut(&at) {
            *slot = new;
        }
        let compact = serde_json::to_vec(&value).unwrap_or_default();
        let sha: String = Sha256::digest(&compact).iter().map(|b| format!("{b:02x}")).collect();
        let bytes = serde_json::to_vec(&serde_json::json!({ "sha256": sha, "manifest": value })).unwrap_or_default();
        let _ = trainrun::checkpoint::store::parse_manifest(&path, &bytes);
        Ok(())
    });
}

fn prop_assert_ok(r: Result<(), impl std::fmt::Display>) {
    if let Err(e) = r {
        panic!("the seed itself is refused: {e}");
    }
}

#[test]
fn safetensors_of_random_and_mutated_bytes_never_panic() {
    let (_, model, tensors) = checkpoint_files();
    let path = PathBuf::from("model.safetensors");
    check(15_000, mutated(vec![model.clone()]), |bytes| {
        if let Ok(reader) = trainrun::checkpoint::tensors::Reader::new(&path, &bytes) {
            let mut arena = vec![0.0f32; 8];
            let _ = reader.fill("", tensors, &mut arena);
        }
        Ok(())
    });
}

fn idx_seeds() -> Vec<Vec<u8>> {
    use std::io::Write;
    let mut plain = vec![0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 3];
    plain.extend((0..18).map(|i| i as u8));
    let labels = vec![0, 0, 0x08, 1, 0, 0, 0, 4, 7, 2, 1, 0];
    let gz = |bytes: &[u8]| {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let _ = enc.write_all(bytes);
        enc.finish().unwrap_or_default()
    };
    vec![gz(&plain), gz(&labels), plain, labels]
}

#[test]
fn idx_and_gzip_of_random_and_mutated_bytes_never_panic() {
    let path = PathBuf::from("train-images-idx3-ubyte.gz");
    for seed in idx_seeds() {
        prop_assert_ok(trainrun::data::source::idx::decode_idx(seed, &path).map(|_| ()));
    }
    check(15_000, mutated(idx_seeds()), |bytes| {
        let _ = trainrun::data::source::idx::decode_idx(bytes, &path);
        Ok(())
    });
}

#[test]
fn idx_headers_read_from_files_of_random_and_mutated_bytes_never_panic() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("t10k-labels-idx1-ubyte.gz");
    check(5_000, mutated(idx_seeds()), |bytes| {
        std::fs::write(&path, &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let _ = trainrun::data::source::idx::read_idx_dims(&path);
        Ok(())
    });
}

#[test]
fn run_json_rewrites_of_random_and_mutated_files_never_panic() {
    // The stop watchdog and the launcher rewrite a `run.json` that may be damaged or cut short
    // (a full disk, a killed writer): they change a `running` record and leave anything else.
    use trainrun::signals::Stop;
    use trainrun::train::run_json::{mark_failed, mark_interrupted, mark_stopped};
    let seeds: Vec<Vec<u8>> = [
        r#"{"status": "running", "exit_code": null, "error": null, "wall_s": 1.5}"#,
        r#"{"status": "preempted", "exit_code": 6}"#,
        r#"[{"status": "running"}]"#,
        "null",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("run.json");
    check(4_000, (mutated(seeds), 0..4u8), |(bytes, how)| {
        std::fs::write(&path, &bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Ctrl-C at the launcher also turns a chief's `preempted` into `interrupted`.
        let from: &[&str] = if how == 2 { &["running", "preempted"] } else { &["running"] };
        let running =
            serde_json::from_slice::<serde_json::Value>(&bytes).is_ok_and(|v| from.iter().any(|f| v["status"] == *f));
        match how {
            0 => mark_stopped(dir.path(), Stop::Terminated, "stopped"),
            1 => mark_stopped(dir.path(), Stop::Interrupted, "stopped"),
            2 => mark_interrupted(dir.path(), "interrupted"),
            _ => mark_failed(dir.path(), 5, "failed"),
        }
        let after = std::fs::read(&path).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if running {
            let record: serde_json::Value =
                serde_json::from_slice(&after).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let status = ["preempted", "interrupted", "interrupted", "failed"][usize::from(how)];
            prop_assert_eq!(&record["status"], status);
        } else {
            prop_assert_eq!(after, bytes, "only a running (or preempted) record is rewritten");
        }
        Ok(())
    });
}
