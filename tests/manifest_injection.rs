//! No spec value can become code or structure in what `trainrun manifest` writes. Every free
//! string key of the spec schema (walked from the schema, so a new key must join the table) is
//! set to a hostile value through `--set`, for every target: the sbatch script is run under
//! bash with `srun` stubbed, and the Kubernetes and TFJob documents are parsed back. Either the
//! manifest refuses the value (exit 2, naming the key, printing nothing), or the value arrives
//! intact as data: no injected command ran, the documents have the same shape as with a
//! harmless value, and the spec the tasks read holds the value exactly.

mod common;

use serde_json::Value as Json;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const WORKERS: &str = "tests/fixtures/deploy/netns.toml";
const SINGLE: &str = "specs/mnist_single.toml";
const CHAR_LM: &str = "specs/shakespeare_char.toml";
const TOKENS_LM: &str = "tests/fixtures/deploy/tokens.toml";

/// Stands for the value in a `--set` template.
const AT: &str = "@";

/// One free string key of the schema and how to reach it: the spec to start from, the
/// settings that make the key meaningful, and the `--set` that gives it a value.
struct Case {
    /// The key as the schema walk names it (`[]` an array item, `*` a table's keys).
    path: &'static str,
    base: &'static str,
    sets: &'static [&'static str],
    /// `KEY=TOML`, with [`AT`] where the value goes.
    set: &'static str,
    /// A value the manifest accepts, proving the case reaches the renderer.
    benign: &'static str,
}

const CSV: &[&str] = &[
    "data.dataset=\"csv\"",
    "data.csv={ train = \"train.csv\", label = \"y\" }",
    "model.layers=[{ type = \"dense\", units = 2 }]",
];
const JSONL: &[&str] = &[
    "data.dataset=\"jsonl\"",
    "data.jsonl={ train = [\"t.jsonl\"], table = { label = \"y\" } }",
    "model.layers=[{ type = \"dense\", units = 2 }]",
];
const PARQUET: &[&str] = &[
    "data.dataset=\"parquet\"",
    "data.parquet={ train = [\"t.parquet\"], table = { label = \"y\", features = [\"x\"] } }",
    "model.layers=[{ type = \"dense\", units = 2 }]",
];
const HF_DATASETS: &[&str] = &[
    "data.dataset=\"hf_datasets\"",
    "data.hf_datasets={ table = { label = \"y\", features = [\"x\"] } }",
    "model.layers=[{ type = \"dense\", units = 2 }]",
];
const NPY: &[&str] = &["data.dataset=\"npy\"", "model.layers=[{ type = \"dense\", units = 2 }]"];
const TFRECORD: &[&str] = &["data.dataset=\"tfrecord\"", "model.layers=[{ type = \"dense\", units = 2 }]"];
const FOLDERS: &[&str] =
    &["data.dataset=\"image_folder\"", "model.layers=[{ type = \"flatten\" }, { type = \"dense\", units = 2 }]"];
const IDX: &[&str] = &["data.dataset=\"idx\""];
const TLS: &str = "cluster.tls={ cert_file = \"t.crt\", key_file = \"t.key\", ca_file = \"ca.crt\" }";

const CASES: &[Case] = &[
    Case {
        path: "callbacks[].backup_dir",
        base: WORKERS,
        sets: &[],
        set: "callbacks=[{ kind = \"backup_and_restore\", backup_dir = @ }]",
        benign: "backups",
    },
    Case {
        path: "callbacks[].dir",
        base: WORKERS,
        sets: &[],
        set: "callbacks=[{ kind = \"model_checkpoint\", dir = @ }]",
        benign: "ckpt",
    },
    Case {
        path: "callbacks[].filename",
        base: WORKERS,
        sets: &[],
        set: "callbacks=[{ kind = \"csv_logger\", filename = @ }]",
        benign: "log.csv",
    },
    Case {
        path: "cluster.chief[]",
        base: WORKERS,
        sets: &["cluster.worker=[\"w0:2222\"]"],
        set: "cluster.chief=[@]",
        benign: "c0:2222",
    },
    Case {
        path: "cluster.evaluator[]",
        base: WORKERS,
        sets: &["cluster.worker=[\"w0:2222\", \"w1:2222\"]", "callbacks=[{ kind = \"model_checkpoint\" }]"],
        set: "cluster.evaluator=[@]",
        benign: "e0:2222",
    },
    Case {
        path: "cluster.ps[]",
        base: WORKERS,
        sets: &["strategy={ kind = \"parameter_server\" }", "cluster.worker=[\"w0:2222\"]"],
        set: "cluster.ps=[@]",
        benign: "ps0:2222",
    },
    Case {
        path: "cluster.worker[]",
        base: WORKERS,
        sets: &[],
        set: "cluster.worker=[@, \"w1:2222\"]",
        benign: "w0:2222",
    },
    Case {
        path: "cluster.tls.ca_file",
        base: WORKERS,
        sets: &[],
        set: "cluster.tls={ cert_file = \"t.crt\", key_file = \"t.key\", ca_file = @ }",
        benign: "ca.crt",
    },
    Case {
        path: "cluster.tls.cert_file",
        base: WORKERS,
        sets: &[],
        set: "cluster.tls={ cert_file = @, key_file = \"t.key\", ca_file = \"ca.crt\" }",
        benign: "t.crt",
    },
    Case {
        path: "cluster.tls.key_file",
        base: WORKERS,
        sets: &[],
        set: "cluster.tls={ cert_file = \"t.crt\", key_file = @, ca_file = \"ca.crt\" }",
        benign: "t.key",
    },
    Case {
        path: "cluster.token_file",
        base: WORKERS,
        sets: &[],
        set: "cluster.token_file=@",
        benign: "secrets/job.token",
    },
    Case {
        path: "data.csv.features[]",
        base: WORKERS,
        sets: CSV,
        set: "data.csv={ train = \"train.csv\", label = \"y\", features = [@] }",
        benign: "x",
    },
    Case {
        path: "data.csv.label",
        base: WORKERS,
        sets: CSV,
        set: "data.csv={ train = \"train.csv\", label = @ }",
        benign: "y",
    },
    Case {
        path: "data.csv.test",
        base: WORKERS,
        sets: CSV,
        set: "data.csv={ train = \"train.csv\", label = \"y\", test = @ }",
        benign: "test.csv",
    },
    Case {
        path: "data.csv.train",
        base: WORKERS,
        sets: CSV,
        set: "data.csv={ train = @, label = \"y\" }",
        benign: "train.csv",
    },
    Case { path: "data.dir", base: WORKERS, sets: &[], set: "data.dir=@", benign: "/data/mnist" },
    Case {
        path: "data.files.test_images",
        base: WORKERS,
        sets: IDX,
        set: "data.files={ train_images = \"train-images-idx3-ubyte.gz\", train_labels = \"train-labels-idx1-ubyte.gz\", test_images = @, test_labels = \"t10k-labels-idx1-ubyte.gz\" }",
        benign: "t10k-images-idx3-ubyte.gz",
    },
    Case {
        path: "data.files.test_labels",
        base: WORKERS,
        sets: IDX,
        set: "data.files={ train_images = \"train-images-idx3-ubyte.gz\", train_labels = \"train-labels-idx1-ubyte.gz\", test_images = \"t10k-images-idx3-ubyte.gz\", test_labels = @ }",
        benign: "t10k-labels-idx1-ubyte.gz",
    },
    Case {
        path: "data.files.train_images",
        base: WORKERS,
        sets: IDX,
        set: "data.files={ train_images = @, train_labels = \"train-labels-idx1-ubyte.gz\" }",
        benign: "train-images-idx3-ubyte.gz",
    },
    Case {
        path: "data.files.train_labels",
        base: WORKERS,
        sets: IDX,
        set: "data.files={ train_images = \"train-images-idx3-ubyte.gz\", train_labels = @ }",
        benign: "train-labels-idx1-ubyte.gz",
    },
    Case {
        path: "data.image_folder.test",
        base: WORKERS,
        sets: FOLDERS,
        set: "data.image_folder={ train = \"train\", test = @, image_size = [8, 8] }",
        benign: "test",
    },
    Case {
        path: "data.image_folder.train",
        base: WORKERS,
        sets: FOLDERS,
        set: "data.image_folder={ train = @, image_size = [8, 8] }",
        benign: "train",
    },
    Case {
        path: "data.jsonl.table.features[]",
        base: WORKERS,
        sets: JSONL,
        set: "data.jsonl={ train = [\"t.jsonl\"], table = { label = \"y\", features = [@] } }",
        benign: "x",
    },
    Case {
        path: "data.jsonl.table.label",
        base: WORKERS,
        sets: JSONL,
        set: "data.jsonl={ train = [\"t.jsonl\"], table = { label = @ } }",
        benign: "y",
    },
    Case {
        path: "data.jsonl.text.end_of_text",
        base: WORKERS,
        sets: JSONL,
        set: "data.jsonl={ train = [\"t.jsonl\"], text = { block_size = 8, end_of_text = @ } }",
        benign: "<|endoftext|>",
    },
    Case {
        path: "data.jsonl.text.field",
        base: WORKERS,
        sets: JSONL,
        set: "data.jsonl={ train = [\"t.jsonl\"], text = { block_size = 8, field = @ } }",
        benign: "content",
    },
    Case {
        path: "data.jsonl.text.tokenization.tokenizer_json",
        base: WORKERS,
        sets: JSONL,
        set: "data.jsonl={ train = [\"t.jsonl\"], text = { block_size = 8, tokenization = { tokenizer_json = @ } } }",
        benign: "tokenizer.json",
    },
    Case {
        path: "data.jsonl.train[]",
        base: WORKERS,
        sets: JSONL,
        set: "data.jsonl={ train = [@], table = { label = \"y\" } }",
        benign: "train.jsonl.gz",
    },
    Case {
        path: "data.jsonl.validation[]",
        base: WORKERS,
        sets: JSONL,
        set: "data.jsonl={ train = [\"t.jsonl\"], validation = [@], table = { label = \"y\" } }",
        benign: "val.jsonl",
    },
    Case {
        path: "data.parquet.table.features[]",
        base: WORKERS,
        sets: PARQUET,
        set: "data.parquet={ train = [\"t.parquet\"], table = { label = \"y\", features = [@] } }",
        benign: "pixels",
    },
    Case {
        path: "data.parquet.table.label",
        base: WORKERS,
        sets: PARQUET,
        set: "data.parquet={ train = [\"t.parquet\"], table = { label = @, features = [\"x\"] } }",
        benign: "label",
    },
    Case {
        path: "data.parquet.text.column",
        base: WORKERS,
        sets: PARQUET,
        set: "data.parquet={ train = [\"t.parquet\"], text = { block_size = 8, column = @ } }",
        benign: "content",
    },
    Case {
        path: "data.parquet.text.tokenization.tokenizer_json",
        base: WORKERS,
        sets: PARQUET,
        set: "data.parquet={ train = [\"t.parquet\"], text = { block_size = 8, tokenization = { tokenizer_json = @ } } }",
        benign: "tokenizer.json",
    },
    Case {
        path: "data.parquet.text.end_of_text",
        base: WORKERS,
        sets: PARQUET,
        set: "data.parquet={ train = [\"t.parquet\"], text = { block_size = 8, end_of_text = @ } }",
        benign: "<|endoftext|>",
    },
    Case {
        path: "data.parquet.train[]",
        base: WORKERS,
        sets: PARQUET,
        set: "data.parquet={ train = [@], table = { label = \"y\", features = [\"x\"] } }",
        benign: "data/train-*.parquet",
    },
    Case {
        path: "data.parquet.validation[]",
        base: WORKERS,
        sets: PARQUET,
        set: "data.parquet={ train = [\"t.parquet\"], validation = [@], table = { label = \"y\", features = [\"x\"] } }",
        benign: "val.parquet",
    },
    Case {
        path: "data.hf_datasets.table.features[]",
        base: WORKERS,
        sets: HF_DATASETS,
        set: "data.hf_datasets={ table = { label = \"y\", features = [@] } }",
        benign: "pixels",
    },
    Case {
        path: "data.hf_datasets.table.label",
        base: WORKERS,
        sets: HF_DATASETS,
        set: "data.hf_datasets={ table = { label = @, features = [\"x\"] } }",
        benign: "label",
    },
    Case {
        path: "data.hf_datasets.text.column",
        base: WORKERS,
        sets: HF_DATASETS,
        set: "data.hf_datasets={ text = { block_size = 8, column = @ } }",
        benign: "content",
    },
    Case {
        path: "data.hf_datasets.text.tokenization.tokenizer_json",
        base: WORKERS,
        sets: HF_DATASETS,
        set: "data.hf_datasets={ text = { block_size = 8, tokenization = { tokenizer_json = @ } } }",
        benign: "tokenizer.json",
    },
    Case {
        path: "data.hf_datasets.text.end_of_text",
        base: WORKERS,
        sets: HF_DATASETS,
        set: "data.hf_datasets={ text = { block_size = 8, end_of_text = @ } }",
        benign: "<|endoftext|>",
    },
    Case {
        path: "data.hf_datasets.train",
        base: WORKERS,
        sets: HF_DATASETS,
        set: "data.hf_datasets={ train = @, table = { label = \"y\", features = [\"x\"] } }",
        benign: "train",
    },
    Case {
        path: "data.hf_datasets.validation",
        base: WORKERS,
        sets: HF_DATASETS,
        set: "data.hf_datasets={ validation = @, table = { label = \"y\", features = [\"x\"] } }",
        benign: "test",
    },
    Case {
        path: "data.npy.npz",
        base: WORKERS,
        sets: NPY,
        set: "data.npy={ npz = @, train = { features = \"x\", labels = \"y\" } }",
        benign: "all.npz",
    },
    Case {
        path: "data.npy.test.features",
        base: WORKERS,
        sets: NPY,
        set: "data.npy={ train = { features = \"x.npy\", labels = \"y.npy\" }, test = { features = @, labels = \"yt.npy\" } }",
        benign: "xt.npy",
    },
    Case {
        path: "data.npy.test.labels",
        base: WORKERS,
        sets: NPY,
        set: "data.npy={ train = { features = \"x.npy\", labels = \"y.npy\" }, test = { features = \"xt.npy\", labels = @ } }",
        benign: "yt.npy",
    },
    Case {
        path: "data.npy.train.features",
        base: WORKERS,
        sets: NPY,
        set: "data.npy={ train = { features = @, labels = \"y.npy\" } }",
        benign: "x.npy",
    },
    Case {
        path: "data.npy.train.labels",
        base: WORKERS,
        sets: NPY,
        set: "data.npy={ train = { features = \"x.npy\", labels = @ } }",
        benign: "y.npy",
    },
    Case {
        path: "data.text.tokenization.tokenizer_json",
        base: CHAR_LM,
        sets: &[],
        set: "data.text.tokenization={ tokenizer_json = @ }",
        benign: "specs/tokenizers/shakespeare_bpe.json",
    },
    Case { path: "data.text.train[]", base: CHAR_LM, sets: &[], set: "data.text.train=[@]", benign: "plays.txt" },
    Case {
        path: "data.text.validation[]",
        base: CHAR_LM,
        sets: &[],
        set: "data.text.validation=[@]",
        benign: "valid.txt",
    },
    Case {
        path: "data.tfrecord.image",
        base: WORKERS,
        sets: TFRECORD,
        set: "data.tfrecord={ train = [\"a.tfrecord\"], shape = [4], classes = 2, image = @ }",
        benign: "pixels",
    },
    Case {
        path: "data.tfrecord.label",
        base: WORKERS,
        sets: TFRECORD,
        set: "data.tfrecord={ train = [\"a.tfrecord\"], shape = [4], classes = 2, label = @ }",
        benign: "y",
    },
    Case {
        path: "data.tfrecord.test[]",
        base: WORKERS,
        sets: TFRECORD,
        set: "data.tfrecord={ train = [\"a.tfrecord\"], shape = [4], classes = 2, test = [@] }",
        benign: "t.tfrecord",
    },
    Case {
        path: "data.tfrecord.train[]",
        base: WORKERS,
        sets: TFRECORD,
        set: "data.tfrecord={ train = [@], shape = [4], classes = 2 }",
        benign: "a.tfrecord",
    },
    Case {
        path: "data.tokens.train[]",
        base: TOKENS_LM,
        sets: &[],
        set: "data.tokens={ train = [@], block_size = 16, vocab_size = 65 }",
        benign: "train.bin",
    },
    Case {
        path: "data.tokens.validation[]",
        base: TOKENS_LM,
        sets: &[],
        set: "data.tokens={ train = [\"train.bin\"], validation = [@], block_size = 16, vocab_size = 65 }",
        benign: "val.bin",
    },
    Case { path: "deploy.cpu", base: WORKERS, sets: &[], set: "deploy.cpu=@", benign: "2" },
    Case {
        path: "deploy.image",
        base: WORKERS,
        sets: &[],
        set: "deploy.image=@",
        benign: "registry.example.com/trainrun:1",
    },
    Case { path: "deploy.memory", base: WORKERS, sets: &[], set: "deploy.memory=@", benign: "4Gi" },
    Case {
        path: "deploy.node_selector.*",
        base: WORKERS,
        sets: &[],
        set: "deploy.node_selector={ @ = @ }",
        benign: "pool",
    },
    Case { path: "deploy.partition", base: WORKERS, sets: &[], set: "deploy.partition=@", benign: "cpu" },
    Case { path: "deploy.time_limit", base: WORKERS, sets: &[], set: "deploy.time_limit=@", benign: "02:00:00" },
    Case { path: "deploy.tls_secret", base: WORKERS, sets: &[TLS], set: "deploy.tls_secret=@", benign: "job-tls" },
    Case { path: "deploy.token_secret", base: WORKERS, sets: &[], set: "deploy.token_secret=@", benign: "job-token" },
    Case {
        path: "deploy.volume.name",
        base: WORKERS,
        sets: &[],
        set: "deploy.volume={ kind = \"claim\", name = @ }",
        benign: "team-runs",
    },
    Case {
        path: "deploy.volume.size",
        base: WORKERS,
        sets: &[],
        set: "deploy.volume={ kind = \"new\", size = @ }",
        benign: "20Gi",
    },
    Case {
        path: "deploy.volume.storage_class",
        base: WORKERS,
        sets: &[],
        set: "deploy.volume={ kind = \"new\", storage_class = @ }",
        benign: "nfs",
    },
    // `extends` is read from spec files only: the case writes one (see `manifest`).
    Case { path: "extends", base: WORKERS, sets: &[], set: "extends=@", benign: "netns.toml" },
    Case {
        path: "model.init_from.path",
        base: WORKERS,
        sets: &[],
        set: "model.init_from={ path = @ }",
        benign: "runs/pretrain",
    },
    Case {
        path: "optimizer.exclude_from_weight_decay[]",
        base: WORKERS,
        sets: &["optimizer={ kind = \"adamw\", learning_rate = 0.001 }"],
        set: "optimizer.exclude_from_weight_decay=[@]",
        benign: "bias",
    },
    Case { path: "run.name", base: WORKERS, sets: &[], set: "run.name=@", benign: "job" },
    Case { path: "run.out_dir", base: WORKERS, sets: &[], set: "run.out_dir=@", benign: "runs/job" },
    Case {
        path: "run.tracking.experiment",
        base: WORKERS,
        sets: &[],
        set: "run.tracking={ experiment = @ }",
        benign: "mnist",
    },
    Case {
        path: "run.tracking.mlflow",
        base: WORKERS,
        sets: &[],
        set: "run.tracking={ mlflow = @ }",
        benign: "http://mlflow:5000",
    },
    Case {
        path: "strategy.device",
        base: SINGLE,
        sets: &["strategy={ kind = \"one_device\" }"],
        set: "strategy.device=@",
        benign: "cpu:0",
    },
    Case {
        path: "strategy.devices[]",
        base: SINGLE,
        sets: &["strategy={ kind = \"mirrored\" }"],
        set: "strategy.devices=[@]",
        benign: "cpu:0",
    },
];

/// Keys the manifest rewrites or drops on purpose, so the value is not expected in the job
/// (everywhere: the run name becomes a DNS name, `extends` is resolved, the token file is the
/// scheduler's; on Kubernetes the run folder and TLS files are the pod's own paths).
fn rewritten(path: &str, target: &str) -> bool {
    matches!(path, "run.name" | "extends" | "cluster.token_file")
        || (target != "slurm" && (path == "run.out_dir" || path.starts_with("cluster.tls.")))
}

/// A value that ends the old here-doc early and runs commands, breaks out of quotes, expands,
/// substitutes, and would start a new YAML document, all at once. `{canary}` files appear if
/// any of it runs.
fn hostile(canary: &Path) -> String {
    let c = canary.display();
    format!(
        "x\nTRAINRUN_SPEC\ntouch {c}.1\ncat <<TRAINRUN_SPEC\nTRAINRUN_SPEC_1\n$(touch {c}.2)`touch {c}.3`\"; touch {c}.4; '\\\\${{HOME}}\n---\nkind: Pod\n#SBATCH --wrap=\"touch {c}.5\"\r\n"
    )
}

/// A string as a TOML basic string.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

/// The schema's free string keys: strings without a fixed set of values.
fn schema_string_keys() -> BTreeSet<String> {
    let schema: Json = serde_json::from_str(&std::fs::read_to_string("schemas/trainrun.schema.json").unwrap()).unwrap();
    let mut keys = BTreeSet::new();
    walk(&schema, &schema, String::new(), &mut Vec::new(), &mut keys);
    keys
}

fn walk(root: &Json, node: &Json, path: String, seen: &mut Vec<(String, String)>, keys: &mut BTreeSet<String>) {
    let mut node = node;
    if let Some(name) = node.get("$ref").and_then(Json::as_str) {
        let name = name.rsplit('/').next().unwrap().to_owned();
        if seen.contains(&(name.clone(), path.clone())) {
            return;
        }
        seen.push((name.clone(), path.clone()));
        node = &root["$defs"][&name];
    }
    for group in ["oneOf", "anyOf", "allOf"] {
        for branch in node.get(group).and_then(Json::as_array).into_iter().flatten() {
            walk(root, branch, path.clone(), seen, keys);
        }
    }
    let is_string = match node.get("type") {
        Some(Json::String(t)) => t == "string",
        Some(Json::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    };
    if is_string && node.get("enum").is_none() && node.get("const").is_none() {
        keys.insert(path.clone());
    }
    let join = |k: &str| if path.is_empty() { k.to_owned() } else { format!("{path}.{k}") };
    for (k, v) in node.get("properties").and_then(Json::as_object).into_iter().flatten() {
        walk(root, v, join(k), seen, keys);
    }
    if let Some(items) = node.get("items").filter(|i| i.is_object()) {
        walk(root, items, format!("{path}[]"), seen, keys);
    }
    if let Some(values) = node.get("additionalProperties").filter(|v| v.is_object()) {
        walk(root, values, join("*"), seen, keys);
    }
}

/// `trainrun manifest` of one case with `value`.
fn manifest(case: &Case, target: &str, value: &str) -> std::process::Output {
    let set = case.set.replace(AT, &toml_string(value));
    if case.path == "extends" {
        let spec = Path::new(case.base).with_file_name("extends.case.toml");
        let _cleanup = Removed(spec.clone());
        std::fs::write(&spec, format!("{set}\n")).unwrap();
        return common::run(&["manifest", &spec.display().to_string(), "--for", target]);
    }
    let mut args = vec!["manifest", case.base, "--for", target];
    for s in case.sets.iter().chain([&set.as_str()]) {
        args.extend(["--set", s]);
    }
    common::run(&args)
}

/// Removes a file when dropped, also when the test fails.
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Every string leaf (and table key) of a TOML document.
fn toml_strings(value: &toml::Value, out: &mut Vec<String>) {
    match value {
        toml::Value::String(s) => out.push(s.clone()),
        toml::Value::Array(items) => items.iter().for_each(|v| toml_strings(v, out)),
        toml::Value::Table(t) => t.iter().for_each(|(k, v)| {
            out.push(k.clone());
            toml_strings(v, out)
        }),
        _ => {}
    }
}

/// Every string leaf (and object key) of the YAML documents, with the TOML specs inside them.
fn yaml_strings(value: &Json, out: &mut Vec<String>) {
    match value {
        Json::String(s) => {
            out.push(s.clone());
            if let Ok(spec) = s.parse::<toml::Table>() {
                toml_strings(&toml::Value::Table(spec), out);
            }
        }
        Json::Array(items) => items.iter().for_each(|v| yaml_strings(v, out)),
        Json::Object(o) => o.iter().for_each(|(k, v)| {
            out.push(k.clone());
            yaml_strings(v, out)
        }),
        _ => {}
    }
}

/// The shape of a document: every key path, with array lengths, without the values; a key
/// equal to `value` (a node label the user wrote) is named `VALUE`.
fn shape(value: &Json, path: &str, user: &str, out: &mut BTreeSet<String>) {
    match value {
        Json::Array(items) => items.iter().enumerate().for_each(|(i, v)| shape(v, &format!("{path}[{i}]"), user, out)),
        Json::Object(o) => o.iter().for_each(|(k, v)| {
            let path = format!("{path}.{}", if k == user { "VALUE" } else { k });
            out.insert(path.clone());
            shape(v, &path, user, out)
        }),
        _ => {}
    }
}

fn documents(text: &str) -> Vec<Json> {
    use serde::Deserialize;
    serde_norway::Deserializer::from_str(text).map(|d| Json::deserialize(d).unwrap()).collect()
}

/// The shape of the YAML documents, values aside, but table keys the user wrote themselves
/// (node labels) named generically.
fn yaml_shape(text: &str, value: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, d) in documents(text).iter().enumerate() {
        shape(d, &format!("doc{i}"), value, &mut out);
    }
    out
}

/// Runs the sbatch script under bash in `dir` with `srun` stubbed; returns the spec file the
/// script wrote and what srun was asked to run.
fn run_sbatch(script: &str, dir: &Path) -> (String, String) {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let srun = bin.join("srun");
    std::fs::write(&srun, "#!/bin/sh\nprintf '%s\\n' \"$@\" > srun.args\n").unwrap();
    Command::new("chmod").arg("755").arg(&srun).status().unwrap();
    std::fs::write(dir.join("job.sbatch"), script).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash").arg("job.sbatch").current_dir(dir).env("PATH", path).output().unwrap();
    assert!(out.status.success(), "the script failed: {}\n{script}", String::from_utf8_lossy(&out.stderr));
    let args = std::fs::read_to_string(dir.join("srun.args")).unwrap();
    let spec_file = args.lines().nth(1).unwrap_or_default().to_owned();
    let spec = std::fs::read_to_string(dir.join(&spec_file)).unwrap();
    (spec, args)
}

#[test]
fn the_table_covers_every_free_string_key_of_the_schema() {
    let table: BTreeSet<String> = CASES.iter().map(|c| c.path.to_owned()).collect();
    let schema = schema_string_keys();
    let missing: Vec<_> = schema.difference(&table).collect();
    let stale: Vec<_> = table.difference(&schema).collect();
    assert!(missing.is_empty(), "string keys with no hostile-value case in tests/manifest_injection.rs: {missing:?}");
    assert!(stale.is_empty(), "cases for keys the schema no longer has: {stale:?}");
}

#[test]
fn no_spec_value_becomes_code_or_structure_in_any_manifest() {
    let dir = common::tempdir();
    let canary = dir.path().join("injected");
    let evil = hostile(&canary);
    let mut refused = Vec::new();
    let mut carried = 0;
    for case in CASES {
        for target in ["kubernetes", "tfjob", "slurm"] {
            let what = format!("{} under --for {target}", case.path);
            let benign = manifest(case, target, case.benign);
            // Every scheduler places the tasks itself: a cluster of addresses is refused
            // whatever they are, with a word on what to write instead.
            if case.path.starts_with("cluster.") && case.path.ends_with("[]") {
                for (out, why) in
                    [(&benign, "give a count"), (&manifest(case, target, &evil), "is not a `host:port` address")]
                {
                    common::assert_exit(out, 2);
                    let (text, err) = common::text(out);
                    assert!(text.is_empty() && err.contains(why), "{what}: {err}");
                }
                refused.push(what);
                continue;
            }
            assert_eq!(
                benign.status.code(),
                Some(0),
                "{what}: the harmless value {:?} is refused: {}",
                case.benign,
                common::text(&benign).1
            );
            let out = manifest(case, target, &evil);
            let (text, err) = common::text(&out);
            assert!(!err.contains("panicked"), "{what}: {err}");
            if out.status.code() == Some(2) {
                assert!(text.is_empty(), "{what}: refused, yet printed\n{text}");
                refused.push(what);
                continue;
            }
            assert_eq!(out.status.code(), Some(0), "{what}: {err}");
            let benign_text = common::text(&benign).0;
            let kept = !rewritten(case.path, target);
            let found = match target {
                "slurm" => {
                    let run = dir.path().join(format!("{}-{target}", case.path.replace(['[', ']', '*'], "_")));
                    let (spec, args) = run_sbatch(&text, &run);
                    let (_, benign_args) = run_sbatch(&benign_text, &dir.path().join("benign"));
                    assert_eq!(args.lines().next(), Some("trainrun"), "{what}: srun ran {args}");
                    assert_eq!(args.lines().count(), benign_args.lines().count(), "{what}: srun ran {args}");
                    let spec: toml::Table =
                        spec.parse().unwrap_or_else(|e| panic!("{what}: the written spec is not TOML: {e}"));
                    let mut strings = Vec::new();
                    toml_strings(&toml::Value::Table(spec), &mut strings);
                    strings.contains(&evil)
                }
                _ => {
                    assert_eq!(
                        yaml_shape(&text, &evil),
                        yaml_shape(&benign_text, case.benign),
                        "{what}: the documents changed shape"
                    );
                    let mut strings = Vec::new();
                    for d in documents(&text) {
                        yaml_strings(&d, &mut strings);
                    }
                    strings.contains(&evil)
                }
            };
            assert_eq!(
                found,
                kept,
                "{what}: the value is {} the job",
                if found { "unexpectedly in" } else { "not intact in" }
            );
            carried += 1;
            for n in 1..=5 {
                assert!(
                    !Path::new(&format!("{}.{n}", canary.display())).exists(),
                    "{what}: the injected command {n} ran"
                );
            }
        }
    }
    // Both outcomes happen: free strings (paths, names) are carried, patterned ones refused.
    assert!(carried > 60, "only {carried} cases carried the value; refused: {refused:?}");
    assert!(refused.iter().any(|r| r.starts_with("deploy.partition")), "{refused:?}");
}

/// A sweep's job array carries its spec as any job does: a hostile value in it runs nothing
/// when each index's script runs (under bash, `trainrun` stubbed), reaches the trials intact,
/// and leaves the Indexed Job's shape alone.
#[test]
fn no_sweep_value_becomes_code_or_structure_in_a_job_array() {
    let dir = common::tempdir();
    let canary = dir.path().join("injected");
    let evil = hostile(&canary);
    let sweep = |target: &str, value: &str| {
        let out_dir = format!("run.out_dir={}", toml_string(value));
        let out = common::run(&["manifest", "specs/mnist_sweep.toml", "--for", target, "--set", &out_dir]);
        common::assert_exit(&out, 0);
        common::text(&out).0
    };
    let run = dir.path().join("array");
    let bin = run.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("trainrun"), "#!/bin/sh\nprintf '%s\\n' \"$@\" > trainrun.args\n").unwrap();
    Command::new("chmod").arg("755").arg(bin.join("trainrun")).status().unwrap();
    let script = sweep("slurm", &evil);
    std::fs::write(run.join("job.sbatch"), &script).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new("bash")
        .arg("job.sbatch")
        .current_dir(&run)
        .env("PATH", path)
        .env("SLURM_ARRAY_TASK_ID", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "the script failed: {}\n{script}", String::from_utf8_lossy(&out.stderr));
    let args = std::fs::read_to_string(run.join("trainrun.args")).unwrap();
    assert_eq!(args, "sweep\nmnist-sweep.spec.toml\n--trial\n1\n");
    let spec: toml::Table = std::fs::read_to_string(run.join("mnist-sweep.spec.toml")).unwrap().parse().unwrap();
    assert_eq!(spec["run"]["out_dir"].as_str(), Some(evil.as_str()));
    let yaml = sweep("kubernetes", &evil);
    assert_eq!(yaml_shape(&yaml, &evil), yaml_shape(&sweep("kubernetes", "runs/x"), "runs/x"));
    for n in 1..=5 {
        assert!(!Path::new(&format!("{}.{n}", canary.display())).exists(), "the injected command {n} ran");
    }
}
