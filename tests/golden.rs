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
const BATCH_128_MULTIWORKER: Golden = Golden {
    zen4_row: ("073c43aa72d2060037e2c70335dd265dc490604e545fda606e4e30b77b8bbb42", 2.2926724531377354),
    intel_row: ("815d685a6958c9f50bc8ad2bffebc3b28e99eb0148ab45444dd0d2f13b02bedf", 2.292672452827295),
};

/// What a job ends with, by the sparse-walk thresholds of the CPU family's row it took
/// (`src/engine/tuning.rs`; `run.json`'s `host.cpu_family`, or `run.cpu_tuning` where pinned).
///
/// They split (2026-11-30, issue 34 item 4) when the thresholds became per CPU family: the
/// values recorded before are the Zen 4's row (forward at density ≤ 1/5, backward ≤ 1/3),
/// which AMD's and the rows not measured on their own take; Intel's rows walk at ≤ 1/6 and
/// ≤ 1/4, where the walk measured faster than gemm on an AMX Xeon, so in the 20 steps some
/// blocks of the tutorial's dense layer whose ReLU output is 25–33 % nonzero go to gemm, and
/// the sums are gemm's order there. `pinning_a_row_gives_its_bits_on_any_cpu` runs both rows
/// on whatever CPU the test has.
#[derive(Debug, Clone, Copy)]
struct Golden {
    zen4_row: (&'static str, f64),
    intel_row: (&'static str, f64),
}

impl Golden {
    /// The values for a run on `family` (as `run.json` names it).
    fn on(self, family: &str) -> (&'static str, f64) {
        if family.starts_with("intel") { self.intel_row } else { self.zen4_row }
    }
}

/// A short run's weights, test loss and the CPU family whose row it took.
fn finish(spec: &str, extra: &[&str]) -> ((String, f64), String) {
    let dir = tempdir();
    let out_dir = format!("run.out_dir={}", dir.path().join("run").display());
    let mut args = vec![spec, "--quiet", "--set", &out_dir];
    args.extend(SHORT);
    args.extend(extra);
    let out = run(&args);
    assert_exit(&out, 0);
    let s = json(&dir.path().join("run/summary.json"));
    let sha = s["weights_sha256"].as_str().unwrap_or_default().to_string();
    let family = json(&dir.path().join("run/run.json"))["host"]["cpu_family"].as_str().unwrap_or_default().to_string();
    ((sha, s["test_loss"].as_f64().unwrap_or(f64::NAN)), family)
}

fn check(name: &str, got: (String, f64), want: (&str, f64)) {
    assert_eq!(got.0, want.0, "{name}: the weights changed (test_loss {} against {})", got.1, want.1);
    assert_eq!(got.1.to_bits(), want.1.to_bits(), "{name}: test_loss {} != {}", got.1, want.1);
}

/// [`check`] against the values of the family the run took.
fn check_on(name: &str, (got, family): ((String, f64), String), want: Golden) {
    check(&format!("{name} ({family})"), got, want.on(&family));
}

#[test]
fn one_process() {
    // Moved deliberately when plain SGD was fused into the dense layers' backward pass for one
    // replica: the update is applied per layer as its gradient is formed, which rounds once
    // where the separate optimizer pass rounded twice.
    check_on("default", finish("specs/mnist_single.toml", &["--set", "run.threads=2"]), ONE_PROCESS);
}

/// [`one_process`]'s values.
const ONE_PROCESS: Golden = Golden {
    zen4_row: ("5f04056af49ea226f19cfdbf5f03e436d674b895fd386ae126b37f5d93f65106", 2.292236892196039),
    intel_row: ("0fd1521c20dc8178c51423d41347c914081e147b01a2037c1f177cb5acdd1583", 2.292236890333394),
};

/// `run.cpu_tuning` takes a family's row on any CPU, so a mixed fleet can get one set of bits:
/// each row's values here, whatever this CPU's family is.
#[test]
fn pinning_a_row_gives_its_bits_on_any_cpu() {
    for (family, want) in [("amd_zen4", ONE_PROCESS.zen4_row), ("intel_amx", ONE_PROCESS.intel_row)] {
        let pin = format!("run.cpu_tuning=\"{family}\"");
        let (got, took) = finish("specs/mnist_single.toml", &["--set", "run.threads=2", "--set", &pin]);
        assert_eq!(took, family, "run.json names the pinned family");
        check(family, got, want);
    }
}

/// Kept, bit for bit, when mirrored replicas began to meet inside backward at the big dense
/// layer (`src/engine/meet.rs`): each block of the kernel sums the replicas' products in
/// replica order and updates with the optimizer's own arithmetic, as the update pass did.
#[test]
fn two_replicas_in_one_process() {
    let want = Golden {
        zen4_row: ("e722125efed91156478d217d8d903a6e103af574a3d780401239e4253e5f71e2", 2.2926724531377354),
        intel_row: ("67997b87374a0dac2a9c50498919af0d6403991970c6c64c24df08d2d3317044", 2.2926724503437677),
    };
    for spec in ["specs/mnist_mirrored.toml", "specs/mnist_central_storage.toml"] {
        check_on(spec, finish(spec, &["--set", "run.threads=2"]), want);
    }
}

#[test]
fn two_workers_over_shared_memory_and_tcp() {
    for transport in ["shared_memory", "tcp"] {
        let set = format!("strategy.communication.transport={transport}");
        let got = finish("specs/mnist_multiworker.toml", &["--set", &set, "--set", "run.threads=1"]);
        check_on(transport, got, BATCH_128_MULTIWORKER);
    }
}

#[test]
fn the_fault_tolerant_job() {
    let got = finish("specs/mnist_fault_tolerant.toml", &["--set", "run.threads=1"]);
    check_on("fault tolerant", got, BATCH_128_MULTIWORKER);
}

/// `parameter_server` with one worker and one ps: the worker's steps in order, each pushed and
/// applied by the ps. Not `default`'s bits: there the SGD update is fused into the dense
/// layers' backward pass (one rounding), here the ps applies it after the push (two).
#[test]
fn parameter_servers_with_one_worker() {
    let got = finish("specs/mnist_parameter_server.toml", &["--set", "cluster.worker=1", "--set", "run.threads=1"]);
    let want = Golden {
        zen4_row: ("e5a741b06cedc68be892c6d7489460a6cd6cf4d713aaf2e6a5fc3e3816662458", 2.292236890643835),
        intel_row: ("6024636fcaaa2f95a8eafefadbabada3db19c91a17a6f6b8cd53ab6d75a87570", 2.292236890333394),
    };
    check_on("parameter_server", got, want);
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
