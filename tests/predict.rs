//! `trainrun predict` end to end, as a user runs it: a model trained by `trainrun` on MNIST
//! predicts the test split into `.csv`, `.jsonl` and `.npy` files that agree with each other,
//! with NumPy's reader and with the run's own test accuracy; one process, `mirrored` (two
//! replicas) and `multi_worker_mirrored` (two worker processes) write the same bytes in every
//! format, as do 1, 2 and 3 threads, and a worker killed mid-way fails the job naming it;
//! existing files, unknown formats, language models and non-finite weights are refused;
//! a stop leaves no file behind; a regression writes its values.

mod common;

use common::{assert_exit, data_dir, json, run, short_mnist_run, signal, spawn, tempdir, text, with_python};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// One short MNIST run shared by the tests (its folder holds `model.safetensors`).
fn trained() -> &'static Path {
    static RUN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, dir) = RUN.get_or_init(|| {
        let tmp = tempdir();
        let dir = tmp.path().join("run");
        short_mnist_run(&dir, 60);
        (tmp, dir)
    });
    dir
}

fn predict(spec: &str, output: &Path, extra: &[&str]) -> std::process::Output {
    let checkpoint = trained().display().to_string();
    let output = output.display().to_string();
    let mut args = vec!["predict", spec, "--checkpoint", &checkpoint, "--output", &output];
    args.extend_from_slice(extra);
    run(&args)
}

/// Starts predicting 3 000 000 synthetic examples (seconds of work) with `spec` into `output`.
fn spawn_long_predict(spec: &str, output: &Path, train_examples: usize, extra: &[&str]) -> std::process::Child {
    let checkpoint = trained().display().to_string();
    let o = output.display().to_string();
    let data = format!(
        "data={{ dataset = \"synthetic\", synthetic = {{ train_examples = {train_examples}, test_examples = 3000000 }} }}"
    );
    let mut args = vec!["predict", spec, "--checkpoint", &checkpoint, "--output", &o, "--set", &data];
    args.extend_from_slice(extra);
    spawn(&args)
}

/// The MNIST test labels, from the IDX file (gzip or raw) in the data folder.
fn test_labels() -> Vec<u8> {
    let dir = data_dir();
    let raw = dir.join("t10k-labels-idx1-ubyte");
    let bytes = if raw.exists() {
        std::fs::read(raw).unwrap()
    } else {
        let gz = std::fs::read(dir.join("t10k-labels-idx1-ubyte.gz")).unwrap();
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out).unwrap();
        out
    };
    bytes[8..].to_vec()
}

#[test]
fn the_three_formats_agree_with_each_other_and_with_the_runs_accuracy() {
    let tmp = tempdir();
    let [csv, jsonl, npy] = ["p.csv", "p.jsonl", "p.npy"].map(|n| tmp.path().join(n));
    for (path, extra) in [(&csv, &["--top-k", "3"][..]), (&jsonl, &["--top-k", "3"]), (&npy, &[])] {
        let out = predict("specs/mnist_single.toml", path, extra);
        assert_exit(&out, 0);
        let (_, stderr) = text(&out);
        assert!(stderr.contains("predicted 10000 examples"), "{stderr}");
    }
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    let mut lines = csv_text.lines();
    assert_eq!(lines.next(), Some("id,class,probability,class_2,probability_2,class_3,probability_3"));
    let rows: Vec<Vec<String>> = lines.map(|l| l.split(',').map(str::to_string).collect()).collect();
    assert_eq!(rows.len(), 10_000);
    let labels = test_labels();
    let mut right = 0;
    for (i, (row, line)) in rows.iter().zip(std::fs::read_to_string(&jsonl).unwrap().lines()).enumerate() {
        assert_eq!(row[0], i.to_string(), "ids are the examples' places, in order");
        let p: Vec<f32> = [2, 4, 6].iter().map(|&c| row[c].parse().unwrap()).collect();
        assert!(p[0] >= p[1] && p[1] >= p[2], "likeliest first: {row:?}");
        let j: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(j["id"], i);
        assert_eq!(j["class"].as_u64().unwrap().to_string(), row[1]);
        assert_eq!(j["top_k"].as_array().unwrap().len(), 3);
        assert_eq!(j["top_k"][2]["class"].as_u64().unwrap().to_string(), row[5]);
        right += usize::from(row[1] == labels[i].to_string());
    }
    let summary = json(&trained().join("summary.json"));
    let accuracy = right as f64 / 10_000.0;
    assert!(
        (accuracy - summary["test_accuracy"].as_f64().unwrap()).abs() < 1e-9,
        "predict's classes give accuracy {accuracy}, the run's evaluation {}",
        summary["test_accuracy"]
    );
    // NumPy reads the array; its argmax is the csv's class and each row sums to 1.
    std::fs::write(tmp.path().join("classes.txt"), rows.iter().map(|r| r[1].as_str()).collect::<Vec<_>>().join("\n"))
        .unwrap();
    with_python(
        "numpy",
        "import numpy as np, sys, os\n\
         d = sys.argv[1]\n\
         a = np.load(os.path.join(d, 'p.npy'))\n\
         assert a.shape == (10000, 10) and a.dtype == np.float32, (a.shape, a.dtype)\n\
         c = np.array([int(x) for x in open(os.path.join(d, 'classes.txt')).read().split()])\n\
         assert (a.argmax(1) == c).all()\n\
         assert np.allclose(a.sum(1), 1, atol=1e-5)\n",
        tmp.path(),
    );
}

#[test]
fn every_strategy_writes_the_same_bytes_in_every_format() {
    // Mirrored deals the batches to two replicas (model copies on this process's threads);
    // the multi-worker spec's launcher starts two worker processes that predict their shards
    // and gather them to the chief over the job's sockets.
    let tmp = tempdir();
    let mirrored = "strategy={ kind = \"mirrored\", devices = 2 }";
    let tcp = "strategy.communication.transport=\"tcp\"";
    for ext in ["csv", "jsonl", "npy"] {
        let mut files = Vec::new();
        for (name, spec, extra, sharded) in [
            ("single", "specs/mnist_single.toml", &[][..], None),
            ("mirrored", "specs/mnist_single.toml", &["--set", mirrored][..], Some("1 worker(s) × 2 replica(s)")),
            ("multiworker", "specs/mnist_multiworker.toml", &[], Some("2 worker(s) × 1 replica(s)")),
            (
                "multiworker_tcp",
                "specs/mnist_multiworker.toml",
                &["--set", tcp][..],
                Some("2 worker(s) × 1 replica(s)"),
            ),
        ] {
            let path = tmp.path().join(format!("{name}.{ext}"));
            let out = predict(spec, &path, extra);
            assert_exit(&out, 0);
            let stderr = text(&out).1;
            assert!(stderr.contains("predicted 10000 examples"), "{stderr}");
            if let Some(sharded) = sharded {
                assert!(stderr.contains(&format!("sharded over {sharded}")), "{name}: {stderr}");
            }
            files.push((name, std::fs::read(&path).unwrap()));
        }
        for (name, bytes) in &files[1..] {
            assert!(bytes == &files[0].1, "{name}.{ext} differs from {}.{ext}", files[0].0);
        }
    }
    // Only the chief wrote: nothing but the outputs in the folder.
    let mut left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    left.sort();
    assert_eq!(left.len(), 12, "{left:?}");
}

#[test]
fn any_thread_count_writes_the_same_bytes() {
    // Alone, predict runs one model copy per thread, each on whole batches: 1, 2 and 3
    // threads (3 on a 2-core host take turns, with a warning) must give the same bits.
    let tmp = tempdir();
    let mut files = Vec::new();
    for threads in [1, 2, 3] {
        let path = tmp.path().join(format!("t{threads}.npy"));
        let out = predict("specs/mnist_single.toml", &path, &["--set", &format!("run.threads={threads}")]);
        assert_exit(&out, 0);
        files.push(std::fs::read(&path).unwrap());
    }
    assert!(files[0].len() > 10_000 * 10 * 4, "{} bytes", files[0].len());
    assert!(files[1] == files[0], "2 threads differ from 1");
    assert!(files[2] == files[0], "3 threads differ from 1");
}

#[test]
fn a_worker_that_dies_during_predict_fails_the_job_naming_it() {
    let tmp = tempdir();
    let child = spawn_long_predict(
        "specs/mnist_multiworker.toml",
        &tmp.path().join("p.csv"),
        128,
        &["--set", "strategy.communication.timeout_s=5"],
    );
    let worker = common::launched_task(child.id(), ("worker", 1), Duration::from_secs(60)).expect("worker:1 started");
    // Let it join and predict a while, then kill it without warning.
    std::thread::sleep(Duration::from_secs(3));
    signal(worker, libc::SIGKILL);
    let (out, took) = common::wait_within(child, Duration::from_secs(60));
    assert!(!out.status.success());
    let stderr = text(&out).1;
    assert!(stderr.contains("worker:1"), "the error names the dead worker: {stderr}");
    assert!(took < Duration::from_secs(60), "took {took:?}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "a failed predict left {left:?}");
}

#[test]
fn an_existing_output_is_refused_unless_forced() {
    let tmp = tempdir();
    let path = tmp.path().join("p.csv");
    std::fs::write(&path, "keep me").unwrap();
    let out = predict("specs/mnist_single.toml", &path, &[]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("exists") && text(&out).1.contains("--force"), "{}", text(&out).1);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "keep me");
    assert_exit(&predict("specs/mnist_single.toml", &path, &["--force"]), 0);
    assert!(std::fs::read_to_string(&path).unwrap().starts_with("id,class"));
}

#[test]
fn unknown_formats_language_models_and_non_finite_weights_are_refused() {
    let tmp = tempdir();
    let out = predict("specs/mnist_single.toml", &tmp.path().join("p.parquet"), &[]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains(".csv, .jsonl or .npy"), "{}", text(&out).1);

    let out = predict("specs/shakespeare_char.toml", &tmp.path().join("p.csv"), &[]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("trainrun sample"), "{}", text(&out).1);

    // A NaN written over the first value of the weights file's data.
    let weights = tmp.path().join("model.safetensors");
    let mut bytes = std::fs::read(trained().join("model.safetensors")).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    bytes[8 + header..12 + header].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&weights, bytes).unwrap();
    let (w, o) = (weights.display().to_string(), tmp.path().join("nan.csv").display().to_string());
    let out = run(&["predict", "specs/mnist_single.toml", "--checkpoint", &w, "--output", &o]);
    assert_exit(&out, 2);
    let stderr = text(&out).1;
    assert!(stderr.contains("tensor ") && stderr.contains("NaN"), "{stderr}");
    assert!(!Path::new(&o).exists());
}

#[test]
fn a_stop_leaves_no_file_under_the_name_or_beside_it() {
    // Enough synthetic test examples that predicting takes seconds.
    let tmp = tempdir();
    let child = spawn_long_predict("specs/mnist_single.toml", &tmp.path().join("p.csv"), 64, &[]);
    let started = Instant::now();
    let partial = || std::fs::read_dir(tmp.path()).unwrap().flatten().any(|e| e.file_name() != "p.csv");
    while !partial() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(partial(), "predict never started writing");
    signal(child.id(), libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    assert_exit(&out, 6);
    assert!(text(&out).1.contains("nothing was written"), "{}", text(&out).1);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "a stopped predict left {left:?}");
}

#[test]
fn a_regression_writes_its_values() {
    let tmp = tempdir();
    let mut csv = String::from("a,y\n");
    for i in 0..200 {
        let a = (i % 17) as f32 / 17.0;
        csv += &format!("{a},{}\n", 2.0 * a + 0.5);
    }
    std::fs::write(tmp.path().join("train.csv"), &csv).unwrap();
    std::fs::write(tmp.path().join("test.csv"), &csv).unwrap();
    let spec = tmp.path().join("spec.toml");
    std::fs::write(
        &spec,
        format!(
            "[run]\nname = \"r\"\nout_dir = \"{}\"\n[data]\ndataset = \"csv\"\ndir = \"{}\"\n[data.csv]\ntrain = \"train.csv\"\n\
             test = \"test.csv\"\nlabel = \"y\"\n[batch]\nglobal = 20\n[optimizer]\nkind = \"sgd\"\nlearning_rate = 0.2\n\
             [model]\n[[model.layers]]\ntype = \"dense\"\nunits = 1\n[train]\nepochs = 20\nloss = \"mean_squared_error\"\n",
            tmp.path().join("run").display(),
            tmp.path().display()
        ),
    )
    .unwrap();
    let s = spec.display().to_string();
    assert_exit(&run(&[&s, "-q"]), 0);
    let (ckpt, o) = (tmp.path().join("run").display().to_string(), tmp.path().join("p.jsonl").display().to_string());
    assert_exit(&run(&["predict", &s, "--checkpoint", &ckpt, "--output", &o]), 0);
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&o).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 200);
    for (i, l) in lines.iter().enumerate() {
        let a = (i % 17) as f64 / 17.0;
        let v = l["value"].as_f64().unwrap();
        assert!((v - (2.0 * a + 0.5)).abs() < 0.2, "row {i}: predicted {v} for {}", 2.0 * a + 0.5);
    }
}
