//! Golden results: short versions of the checked-in jobs under every strategy, with threads
//! fixed, must end with exactly these weights and test losses. A change that moves them is
//! either a bug or a deliberate change of the numerics, which must update the values here and
//! say why in its commit (the values below were recorded with the binary before the plan
//! refactor, and it kept every one of them; the one-process value moved once, see there).

mod common;

use common::{assert_exit, json, run, tempdir};

/// 20 steps of one epoch, evaluated on two test batches.
const SHORT: [&str; 6] =
    ["--set", "train.epochs=1", "--set", "train.steps_per_epoch=20", "--set", "train.validation_steps=2"];

/// What every worker-count-independent run of the tutorial model at global batch 128 ends with.
///
/// Every value in this file moved deliberately again (2026-11-25, issue 16) when the big dense
/// layer began to skip the zeros of the convolution's ReLU output (`src/engine/sparse.rs`):
/// where that output is mostly zero (at most 1/5 of it nonzero for forward, 1/3 of a block
/// of kernel rows' columns for backward), forward sums each row's nonzeros in column
/// order, the kernel's gradient sums each row's examples in batch order, and `dx` is one dot
/// product per nonzero, where gemm summed the same terms (and the zeros) in its own order, so
/// the results differ by rounding (test losses moved in the ninth digit). Replicas and workers
/// still agree with each other exactly. Before: one process `a570288e…`, two replicas
/// `3b98853c…`, multi-worker `350fb0f8…`.
///
/// They moved deliberately once before (2026-11-24, issue 16) when the
/// tutorial's first convolution (one channel, 3 × 3) left im2col + gemm for direct AVX-512
/// kernels (`src/engine/layers/conv2d_direct.rs`): forward is gemm's bits, but its kernel
/// gradient sums each part's pixels in pixel order where gemm summed in its own blocks, so it
/// differs by rounding (test losses moved in the ninth digit). Before: one process
/// `80830f18…`, two replicas `da3a526a…`, multi-worker `00685490…`.
const BATCH_128_MULTIWORKER: (&str, f64) =
    ("073c43aa72d2060037e2c70335dd265dc490604e545fda606e4e30b77b8bbb42", 2.2926724531377354);

fn finish(spec: &str, extra: &[&str]) -> (String, f64) {
    let dir = tempdir();
    let out_dir = format!("run.out_dir={}", dir.path().join("run").display());
    let mut args = vec![spec, "--quiet", "--set", &out_dir];
    args.extend(SHORT);
    args.extend(extra);
    let out = run(&args);
    assert_exit(&out, 0);
    let s = json(&dir.path().join("run/summary.json"));
    let sha = s["weights_sha256"].as_str().unwrap_or_default().to_string();
    (sha, s["test_loss"].as_f64().unwrap_or(f64::NAN))
}

fn check(name: &str, got: (String, f64), want: (&str, f64)) {
    assert_eq!(got.0, want.0, "{name}: the weights changed");
    assert_eq!(got.1.to_bits(), want.1.to_bits(), "{name}: test_loss {} != {}", got.1, want.1);
}

#[test]
fn one_process() {
    let got = finish("specs/mnist_single.toml", &["--set", "run.threads=2"]);
    // Moved deliberately when plain SGD was fused into the dense layers' backward pass for one
    // replica: the update is applied per layer as its gradient is formed, which rounds once
    // where the separate optimizer pass rounded twice.
    check("default", got, ("5f04056af49ea226f19cfdbf5f03e436d674b895fd386ae126b37f5d93f65106", 2.292236892196039));
}

/// Kept, bit for bit, when mirrored replicas began to meet inside backward at the big dense
/// layer (`src/engine/meet.rs`): each block of the kernel sums the replicas' products in
/// replica order and updates with the optimizer's own arithmetic, as the update pass did.
#[test]
fn two_replicas_in_one_process() {
    let want = ("e722125efed91156478d217d8d903a6e103af574a3d780401239e4253e5f71e2", 2.2926724531377354);
    for spec in ["specs/mnist_mirrored.toml", "specs/mnist_central_storage.toml"] {
        check(spec, finish(spec, &["--set", "run.threads=2"]), want);
    }
}

#[test]
fn two_workers_over_shared_memory_and_tcp() {
    for transport in ["shared_memory", "tcp"] {
        let set = format!("strategy.communication.transport={transport}");
        let got = finish("specs/mnist_multiworker.toml", &["--set", &set, "--set", "run.threads=1"]);
        check(transport, got, BATCH_128_MULTIWORKER);
    }
}

#[test]
fn the_fault_tolerant_job() {
    let got = finish("specs/mnist_fault_tolerant.toml", &["--set", "run.threads=1"]);
    check("fault tolerant", got, BATCH_128_MULTIWORKER);
}

/// `parameter_server` with one worker and one ps: the worker's steps in order, each pushed and
/// applied by the ps. Not `default`'s bits: there the SGD update is fused into the dense
/// layers' backward pass (one rounding), here the ps applies it after the push (two).
#[test]
fn parameter_servers_with_one_worker() {
    let got = finish("specs/mnist_parameter_server.toml", &["--set", "cluster.worker=1", "--set", "run.threads=1"]);
    check(
        "parameter_server",
        got,
        ("e5a741b06cedc68be892c6d7489460a6cd6cf4d713aaf2e6a5fc3e3816662458", 2.292236890643835),
    );
}

/// A regression on a CSV table (`y = 2a - b + 0.5` on a grid), mean squared error.
#[test]
fn a_csv_regression() {
    let dir = tempdir();
    for (name, rows, offset) in [("train.csv", 400, 0), ("test.csv", 64, 1000)] {
        let mut csv = String::from("a,y,b\n");
        for i in 0..rows {
            let a = ((i + offset) % 17) as f32 / 17.0 - 0.5;
            let b = ((i + offset) * 7 % 13) as f32 / 13.0 - 0.5;
            csv += &format!("{a},{},{b}\n", 2.0 * a - b + 0.5);
        }
        std::fs::write(dir.path().join(name), csv).unwrap();
    }
    let spec = dir.path().join("spec.toml");
    let text = format!(
        "[run]\nname = \"regression\"\nseed = 5\nthreads = 1\n[data]\ndataset = \"csv\"\ndir = \"{}\"\n\
         [data.csv]\ntrain = \"train.csv\"\ntest = \"test.csv\"\nlabel = \"y\"\n[batch]\nglobal = 32\n\
         [optimizer]\nkind = \"sgd\"\nlearning_rate = 0.1\n[model]\n[[model.layers]]\ntype = \"dense\"\nunits = 8\nactivation = \"relu\"\n\
         [[model.layers]]\ntype = \"dense\"\nunits = 1\n[train]\nepochs = 2\nsteps_per_epoch = 12\nloss = \"mean_squared_error\"\nmetrics = [\"mae\"]\n",
        dir.path().display()
    );
    std::fs::write(&spec, text).unwrap();
    let out_dir = format!("run.out_dir={}", dir.path().join("run").display());
    let out = run(&[spec.to_str().unwrap(), "--quiet", "--set", &out_dir]);
    assert_exit(&out, 0);
    let s = json(&dir.path().join("run/summary.json"));
    let got =
        (s["weights_sha256"].as_str().unwrap_or_default().to_string(), s["test_loss"].as_f64().unwrap_or(f64::NAN));
    check(
        "csv regression",
        got,
        ("73fcc50c5ac0e404969bb58e2ef60dd06d1c0b4b5d68949fc79180167efed2ef", 0.2500097529184586),
    );
}

/// The checked-in character GPT (4 layers, `n_embd` 128, block 64, two replicas, AdamW with
/// warmup, cosine decay and clipping), 50 steps, validated on four batches.
///
/// Moved deliberately (2026-11-29, issue 31) when token windows began to be shuffled by a
/// seeded bijection computed per position (`src/data/bijection.rs`) instead of a listed
/// Fisher–Yates permutation of 8 bytes per window, so that a corpus's order costs O(1) memory:
/// the same windows, visited in another order. Before: `52e9d536…`, test loss 3.1222606690134853.
#[test]
fn the_shakespeare_gpt_for_50_steps() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/shakespeare");
    let data = format!("data.dir={}", std::fs::canonicalize(&dir).unwrap_or(dir).display());
    let out_dir = tempdir();
    let out = format!("run.out_dir={}", out_dir.path().join("run").display());
    let args = ["specs/shakespeare_char.toml", "--quiet", "--set", &out, "--set", &data, "--set", "run.threads=2"];
    let sets = ["--set", "train.steps_per_epoch=50", "--set", "train.validation_steps=4"];
    let out = run(&[&args[..], &sets[..]].concat());
    assert_exit(&out, 0);
    let s = json(&out_dir.path().join("run/summary.json"));
    let got =
        (s["weights_sha256"].as_str().unwrap_or_default().to_string(), s["test_loss"].as_f64().unwrap_or(f64::NAN));
    check("gpt", got, ("4244974f1b1545549fa93ff460a07a18774016629e77e74ac926f12334a68a2f", 3.1168820119152465));
}
