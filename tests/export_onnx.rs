//! `trainrun export RUN --format onnx` end to end: the tutorial CNN, `mnist_fast` (batch norm,
//! max pooling), a CNN with average pooling (a partial `same` window) and ResNet-20 (residual blocks with projections) are trained briefly, exported,
//! checked by `onnx.checker`, and run by ONNX Runtime on the same inputs `trainrun predict`
//! reads; both give the same probabilities within 1e-5. Layers without an ONNX form are refused
//! by name, and an existing file is not overwritten. The Python checks say so loudly and skip
//! when `onnx` and `onnxruntime` cannot be imported (`.ci/run` installs them).

mod common;

use common::{assert_exit, data_dir, run, tempdir, text, with_python};
use std::path::Path;

/// Trains `spec` briefly into `dir/run`, exports it to `dir/model.onnx` and predicts the test
/// split into `dir/p.npy`.
fn train_export_predict(dir: &Path, spec: &str, extra: &[&str]) {
    let run_dir = dir.join("run");
    let mut args = vec![
        spec.to_string(),
        "-q".into(),
        "--set".into(),
        format!("run.out_dir={}", run_dir.display()),
        "--set".into(),
        "train.steps_per_epoch=20".into(),
        "--set".into(),
        "train.epochs=1".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    assert_exit(&run(&args.iter().map(String::as_str).collect::<Vec<_>>()), 0);
    let (r, m, p) = (run_dir.display().to_string(), dir.join("model.onnx"), dir.join("p.npy"));
    let (m, p) = (m.display().to_string(), p.display().to_string());
    let out = run(&["export", &r, "--format", "onnx", "--out", &m]);
    assert_exit(&out, 0);
    assert!(text(&out).1.contains("ONNX opset 13"), "{}", text(&out).1);
    let spec_toml = run_dir.join("spec.toml").display().to_string();
    assert_exit(&run(&["predict", &spec_toml, "--checkpoint", &r, "--output", &p]), 0);
}

/// `onnx.checker` passes and ONNX Runtime's softmaxed outputs on `x` (a NumPy expression over
/// the folder `d`) equal predict's probabilities within 1e-5.
fn onnx_runtime_agrees(dir: &Path, inputs: &str) {
    let script = format!(
        "import sys, os, gzip, numpy as np, onnx, onnxruntime as ort\n\
         d = sys.argv[1]\n\
         m = onnx.load(os.path.join(d, 'model.onnx'))\n\
         onnx.checker.check_model(m, full_check=True)\n\
         x = {inputs}\n\
         y = ort.InferenceSession(os.path.join(d, 'model.onnx')).run(['output'], {{'input': x}})[0]\n\
         e = np.exp(y - y.max(1, keepdims=True)); probs = e / e.sum(1, keepdims=True)\n\
         p = np.load(os.path.join(d, 'p.npy'))\n\
         assert probs.shape == p.shape, (probs.shape, p.shape)\n\
         diff = np.abs(probs - p).max()\n\
         assert diff <= 1e-5, diff\n\
         print('max difference', diff)\n"
    );
    with_python("onnxruntime", &script, dir);
}

/// The MNIST test images as the model reads them, as a NumPy expression.
fn mnist_test() -> String {
    let dir = data_dir();
    let gz = dir.join("t10k-images-idx3-ubyte.gz");
    let read = if gz.exists() {
        format!("gzip.open('{}').read()", gz.display())
    } else {
        format!("open('{}', 'rb').read()", dir.join("t10k-images-idx3-ubyte").display())
    };
    format!("np.frombuffer({read}[16:], np.uint8).reshape(-1, 28, 28, 1).astype(np.float32) / 255")
}

#[test]
fn the_tutorial_cnn_runs_in_onnx_runtime_as_in_trainrun() {
    let tmp = tempdir();
    train_export_predict(tmp.path(), "specs/mnist_single.toml", &[]);
    onnx_runtime_agrees(tmp.path(), &mnist_test());
}

#[test]
fn batch_norm_and_pooling_run_in_onnx_runtime_as_in_trainrun() {
    let tmp = tempdir();
    train_export_predict(tmp.path(), "specs/mnist_fast.toml", &[]);
    onnx_runtime_agrees(tmp.path(), &mnist_test());
}

#[test]
fn average_pooling_runs_in_onnx_runtime_as_in_trainrun() {
    let tmp = tempdir();
    // 3×3 windows at stride 2 under `same` padding: the last window is partial, and
    // TensorFlow (and trainrun) divide it by the pixels it covers.
    let layers = "model.layers=[{ type = \"reshape\", target_shape = [28, 28, 1] }, \
                  { type = \"conv2d\", filters = 4, kernel_size = 3, activation = \"relu\" }, \
                  { type = \"avg_pool2d\", pool_size = 3, strides = 2, padding = \"same\" }, \
                  { type = \"avg_pool2d\" }, { type = \"flatten\" }, { type = \"dense\", units = 10 }]";
    train_export_predict(tmp.path(), "specs/mnist_single.toml", &["--set", layers]);
    onnx_runtime_agrees(tmp.path(), &mnist_test());
}

#[test]
fn resnet20_runs_in_onnx_runtime_as_in_trainrun() {
    let tmp = tempdir();
    // 32×32 colour images and labels written by NumPy, read by both.
    let wrote = with_python(
        "numpy",
        "import numpy as np, sys, os\n\
         d = sys.argv[1]; r = np.random.default_rng(3)\n\
         for split, n in (('train', 64), ('test', 40)): \
         np.save(os.path.join(d, f'x_{split}.npy'), r.random((n, 32, 32, 3), dtype=np.float32)); \
         np.save(os.path.join(d, f'y_{split}.npy'), r.integers(0, 10, n))\n",
        tmp.path(),
    );
    if !wrote {
        return;
    }
    let data = format!(
        "data={{ dataset = \"npy\", dir = \"{}\", npy = {{ train = {{ features = \"x_train.npy\", labels = \"y_train.npy\" }}, \
         test = {{ features = \"x_test.npy\", labels = \"y_test.npy\" }} }} }}",
        tmp.path().display()
    );
    let sets =
        ["--set", &data, "--set", "model.layers=[]", "--set", "model.zoo=\"resnet20\"", "--set", "batch.global=16"];
    train_export_predict(tmp.path(), "specs/mnist_single.toml", &sets);
    onnx_runtime_agrees(tmp.path(), "np.load(os.path.join(d, 'x_test.npy'))");
}

#[test]
fn layers_without_an_onnx_form_are_refused_by_name_and_files_are_kept() {
    let tmp = tempdir();
    let run_dir = tmp.path().join("run");
    let layers = "model.layers=[{ type = \"reshape\", target_shape = [28, 28] }, { type = \"layer_norm\" }, \
                  { type = \"flatten\" }, { type = \"dense\", units = 10 }]";
    let o = format!("run.out_dir={}", run_dir.display());
    let out = run(&["specs/mnist_single.toml", "-q", "--set", &o, "--set", layers, "--set", "train.steps_per_epoch=2"]);
    assert_exit(&out, 0);
    let (r, m) = (run_dir.display().to_string(), tmp.path().join("m.onnx").display().to_string());
    let out = run(&["export", &r, "--format", "onnx", "--out", &m]);
    assert!(!out.status.success());
    assert!(text(&out).1.contains("layer `layer_norm` (layer_norm) has no ONNX form"), "{}", text(&out).1);
    assert!(!Path::new(&m).exists());

    std::fs::write(&m, "keep").unwrap();
    let out = run(&["export", &r, "--format", "onnx", "--out", &m]);
    assert_exit(&out, 2);
    assert!(text(&out).1.contains("--force"), "{}", text(&out).1);
    assert_eq!(std::fs::read_to_string(&m).unwrap(), "keep");
}

#[test]
fn a_gpt_with_exact_gelu_runs_in_onnx_runtime_as_in_trainrun() {
    // A byte-level GPT whose GELU is the exact (erf) form, trained a few steps so its weights
    // are not the initial ones; exported, its graph takes the `Erf` branch.
    let tmp = tempdir();
    let d = tmp.path();
    std::fs::write(d.join("train.txt"), "the quick brown fox jumps over the lazy dog; erf, not tanh.\n".repeat(40))
        .unwrap();
    let spec = d.join("spec.toml");
    std::fs::write(
        &spec,
        format!(
            "[run]\nname = \"erf\"\nout_dir = \"{}\"\n[data]\ndataset = \"text\"\ndir = \"{}\"\n[data.text]\n\
             train = [\"train.txt\"]\ntokenization = \"byte\"\nblock_size = 16\n[batch]\nglobal = 4\n[optimizer]\n\
             kind = \"adamw\"\nlearning_rate = 0.01\n[train]\nepochs = 1\nsteps_per_epoch = 3\nfrom_logits = true\n\
             [model]\nzoo = \"gpt\"\n[model.gpt]\nn_layer = 2\nn_head = 4\nn_embd = 32\nblock_size = 16\n\
             approximate_gelu = false\n",
            d.join("run").display(),
            d.display()
        ),
    )
    .unwrap();
    assert_exit(&run(&[spec.to_str().unwrap(), "-q"]), 0);
    let (r, m) = (d.join("run"), d.join("gpt.onnx"));
    let out = run(&["export", r.to_str().unwrap(), "--format", "onnx", "--out", m.to_str().unwrap()]);
    assert_exit(&out, 0);

    // trainrun's logits for three sequences of ids, from the run's weights, as predict runs
    // the model: inference mode, one batch.
    let inv = trainrun::prepare::Invocation {
        spec: r.join("spec.toml"),
        sets: vec![],
        env: vec![],
        quiet: true,
        task: None,
        launched: std::time::Instant::now(),
    };
    let plan = trainrun::prepare::prepare(&inv).unwrap_or_else(|e| panic!("{e}")).plan;
    let mut model = plan.model.build().unwrap();
    let layout = trainrun::builder::layout(&model);
    let file = r.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let reader = trainrun::checkpoint::tensors::Reader::new(&file, &bytes).unwrap();
    let (mut params, mut state) = (vec![0.0; layout.params], vec![0.0; layout.state]);
    reader.fill("", &layout.tensors, &mut params).unwrap();
    reader.fill("", &layout.state_tensors, &mut state).unwrap();
    let ids: Vec<Vec<u32>> = (0..3u32).map(|s| (0..16u32).map(|t| (s * 37 + t * 11) % 128).collect()).collect();
    let x: Vec<f32> = ids.iter().flatten().map(|&i| i as f32).collect();
    let pass = trainrun::engine::Pass { training: false, seed: 0, accumulate: false, threads: 1 };
    let logits = model.forward(pass, &params, &mut state, &x, ids.len()).to_vec();
    assert_eq!(logits.len(), 3 * 16 * 256);
    let reference = serde_json::json!({ "ids": ids, "logits": logits });
    std::fs::write(d.join("trainrun_logits.json"), reference.to_string()).unwrap();

    let script = "import sys, os, json, numpy as np, onnx, onnxruntime as ort\n\
        d = sys.argv[1]; path = os.path.join(d, 'gpt.onnx')\n\
        model = onnx.load(path)\n\
        onnx.checker.check_model(model, full_check=True)\n\
        assert any(n.op_type == 'Erf' for n in model.graph.node), 'no Erf node: the exact GELU was not exported'\n\
        ref = json.load(open(os.path.join(d, 'trainrun_logits.json')))\n\
        y = ort.InferenceSession(path).run(['output'], {'input': np.array(ref['ids'], dtype=np.int64)})[0]\n\
        worst = np.abs(y.reshape(-1) - np.array(ref['logits'], dtype=np.float32)).max()\n\
        assert worst <= 1e-5, worst\n\
        print('ONNX Runtime (Erf GELU): logits within', worst)\n";
    with_python("onnxruntime", script, d);
}
