//! Model building: zoo sizes, the diagnostics' text, and a spec-built model that learns.

use super::{ModelSpec, ZooModel};
use super::{build_spec, summary};
use crate::diagnostic::Diagnostic;
use crate::engine::optimizer::Sgd;
use crate::engine::{LossFn, Optimizer, Pass, Sequential, Shape, init};
use crate::vocab::LossKind;
use rand::RngExt;

fn zoo(z: ZooModel, input: &[usize], classes: usize) -> Sequential {
    let spec = ModelSpec { zoo: Some(z), ..ModelSpec::default() };
    match build_spec(&spec, &Shape(input.to_vec()), classes) {
        Ok(m) => m,
        Err(d) => panic!("{}", render(&d)),
    }
}

pub(super) fn spec(toml_text: &str) -> ModelSpec {
    match toml::from_str(toml_text) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

/// Diagnostics as a user reads them: key, message, help.
pub(super) fn render(diags: &[Diagnostic]) -> String {
    diags.iter().map(|d| format!("{}: {d}", d.key)).collect::<Vec<_>>().join("\n")
}

fn errors(toml_text: &str, input: &[usize], classes: usize) -> String {
    match build_spec(&spec(toml_text), &Shape(input.to_vec()), classes) {
        Ok(_) => panic!("expected diagnostics"),
        Err(d) => render(&d),
    }
}

#[test]
fn mnist_cnn_matches_the_tutorial() {
    // conv 3·3·1·32 + 32 = 320; dense 26·26·32 = 21,632 → 128: 2,769,024; 128 → 10: 1,290.
    let model = zoo(ZooModel::MnistCnn, &[28, 28], 10);
    assert_eq!(model.param_len(), 2_770_634);
    assert_eq!(model.state_len(), 0);
    insta::assert_snapshot!(summary(&model), @r"
    Layer                       Output shape                 Param #
    ────────────────────────────────────────────────────────────────
    reshape                     (None, 28, 28, 1)                  0
    conv2d                      (None, 26, 26, 32)               320
    flatten                     (None, 21632)                      0
    dense                       (None, 128)                2,769,024
    dense_1                     (None, 10)                     1,290
    ────────────────────────────────────────────────────────────────
    Total params: 2,770,634
    Trainable params: 2,770,634
    Non-trainable params: 0
    ");
    // Flat MNIST rows get the same reshape; (h, w, c) data needs none.
    assert_eq!(zoo(ZooModel::MnistCnn, &[784], 10).param_len(), 2_770_634);
    assert_eq!(zoo(ZooModel::MnistCnn, &[28, 28, 1], 10).summary().len(), 4);
}

#[test]
fn resnet20_has_272_474_trainable_params() {
    // No conv bias (batch norm's β replaces it) and 1×1 projection shortcuts with batch norm
    // at the two stride-2 blocks (+2,752 over the paper's zero-padding shortcuts: 269,722).
    let model = zoo(ZooModel::Resnet20, &[32, 32, 3], 10);
    assert_eq!(model.param_len(), 272_474);
    // Moving mean and variance of 784 batch-norm channels.
    assert_eq!(model.state_len(), 1_568);
    let rows = model.summary();
    assert_eq!(rows.len(), 3 + 9 + 2);
    assert_eq!(rows[4].name, "residual_1");
    assert_eq!(rows[12].output_shape, Shape(vec![64]));
    assert!(model.tensors().iter().any(|t| t.name == "residual_2/conv_1/kernel" && t.shape == [3, 3, 16, 16]));
    assert!(model.state_tensors().iter().any(|t| t.name == "residual_3/shortcut_bn/moving_variance"));
    let text = summary(&model);
    assert!(text.contains("Total params: 274,042\n"), "{text}");
    assert!(text.contains("Non-trainable params: 1,568\n"), "{text}");
}

#[test]
fn resnet56_and_mnist_inputs() {
    let model = zoo(ZooModel::Resnet56, &[32, 32, 3], 100);
    // 855,770 with 10 classes; the head grows by 64 + 1 per extra class.
    assert_eq!(model.param_len(), 855_770 + 90 * 65);
    assert_eq!(model.state_len(), 4_256);
    // (h, w) data: a channel axis is added; 28 → 14 → 7.
    let model = zoo(ZooModel::Resnet20, &[28, 28], 10);
    assert_eq!(model.summary()[0].output_shape, Shape(vec![28, 28, 1]));
    assert_eq!(model.summary()[12].output_shape, Shape(vec![7, 7, 64]));
}

#[test]
fn conv_on_flat_input_suggests_a_reshape() {
    let layers = r#"
        [[layers]]
        type = "conv2d"
        filters = 8
        kernel_size = 3
        [[layers]]
        type = "flatten"
        [[layers]]
        type = "dense"
        units = 10
    "#;
    insta::assert_snapshot!(errors(layers, &[784], 10), @r"
    model.layers[0]: error: conv2d needs an image input (h, w, c) but gets (784)
      help: add a reshape layer before it with `target_shape = [28, 28, 1]`
    ");
    insta::assert_snapshot!(errors(layers, &[28, 28], 10), @r"
    model.layers[0]: error: conv2d needs an image input (h, w, c) but gets (28, 28)
      help: add a reshape layer before it with `target_shape = [28, 28, 1]`
    ");
    insta::assert_snapshot!(errors(layers, &[1000], 10), @r"
    model.layers[0]: error: conv2d needs an image input (h, w, c) but gets (1000)
      help: add a reshape layer before it whose `target_shape = [h, w, c]` holds 1000 values
    ");
}

#[test]
fn every_problem_is_reported_at_once() {
    let layers = r#"
        [[layers]]
        type = "reshape"
        target_shape = [28, 28, 2]
        [[layers]]
        type = "conv2d"
        filters = 8
        kernel_size = 3
        [[layers]]
        type = "max_pool2d"
        pool_size = 30
        [[layers]]
        type = "flatten"
        [[layers]]
        type = "dropout"
        rate = 1.5
        [[layers]]
        type = "batch_norm"
        momentum = 2.0
        epsilon = 0.0
        [[layers]]
        type = "dense"
        units = 12
        [[layers]]
        type = "activation"
        activation = "softmax"
    "#;
    insta::assert_snapshot!(errors(layers, &[784], 10), @r#"
    model.layers[0].target_shape: error: target_shape [28, 28, 2] holds 1568 values, input (784) has 784
      help: use `target_shape = [28, 28, 1]`
    model.layers[2].pool_size: error: pool_size 30×30 is larger than its 26×26 input under `valid` padding
      help: use `padding = "same"`, or a pool_size of at most 26×26
    model.layers[4].rate: error: rate = 1.5 is outside [0, 1)
      help: use a fraction such as `rate = 0.5`; 1 would drop everything
    model.layers[5].momentum: error: momentum = 2 is outside [0, 1]
      help: Keras's default is `momentum = 0.99`
    model.layers[5].epsilon: error: epsilon = 0 must be a positive number
      help: Keras's default is `epsilon = 0.001`
    model.layers[6].units: error: model outputs 12 values per example but the dataset has 10 classes
      help: make the last dense layer `units = 10`
    "#);
}

#[test]
fn model_needs_exactly_one_of_zoo_and_layers() {
    insta::assert_snapshot!(errors("", &[784], 10), @r#"
    model: error: no model: neither `zoo` nor `[[model.layers]]` is given
      help: add `zoo = "mnist_cnn"` (or `resnet20`, `resnet56`, `gpt`), or list `[[model.layers]]`
    "#);
    let both = "zoo = \"resnet20\"\n[[layers]]\ntype = \"flatten\"";
    insta::assert_snapshot!(errors(both, &[784], 10), @r#"
    model: error: both `zoo = "resnet20"` and 1 `[[model.layers]]` are given
      help: keep one: remove `zoo` to use your layers, or the layers to use the zoo model
    "#);
    insta::assert_snapshot!(errors("zoo = \"mnist_cnn\"", &[50], 10), @r"
    model.zoo: error: mnist_cnn needs image examples (h, w) or (h, w, c), but the data gives (50)
      help: use `[[model.layers]]` starting with a reshape to the image's shape
    ");
    insta::assert_snapshot!(errors("zoo = \"mnist_cnn\"", &[2, 2], 10), @r#"
    model.zoo: error: mnist_cnn layer 1 (conv2d): kernel_size 3×3 is larger than its 2×2 input under `valid` padding
      help: use `padding = "same"`, or a kernel_size of at most 2×2
    "#);
}

#[test]
fn image_head_without_dense_gets_a_hint() {
    let layers = "[[layers]]\ntype = \"global_avg_pool2d\"";
    insta::assert_snapshot!(errors(layers, &[8, 8, 3], 10), @r"
    model.layers[0]: error: model outputs 3 values per example but the dataset has 10 classes
      help: end the model with a dense layer of `units = 10` (after a flatten or global_avg_pool2d for images)
    ");
}

/// Three classes of 6×6 images: a bright horizontal band at rows 0–1, 2–3 or 4–5, in noise.
fn bands(n: usize) -> (Vec<f32>, Vec<u32>) {
    let mut r = init::rng(&[42]);
    let mut x = Vec::with_capacity(n * 36);
    let mut labels = Vec::with_capacity(n);
    for e in 0..n {
        let class = (e % 3) as u32;
        labels.push(class);
        for row in 0..6 {
            for _ in 0..6 {
                let band = if row / 2 == class as usize { 1.0 } else { 0.0 };
                x.push(band + r.random_range(-0.3..0.3));
            }
        }
    }
    (x, labels)
}

/// Trains `model` full-batch for `steps`; returns the first and last losses and the weights.
fn train(model: &mut Sequential, steps: u64) -> (f64, f64, Vec<f32>, Vec<f32>) {
    let (x, labels) = bands(48);
    let n = labels.len();
    let loss = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
    let (mut params, mut state) = model.init(7);
    let mut grads = vec![0.0; model.param_len()];
    let mut opt = Optimizer::Sgd(Sgd::new(params.len(), 0.9, false, 0.0));
    let mut losses = Vec::new();
    for step in 0..steps {
        let pass = Pass { training: true, seed: init::derive_seed(&[7, step]), accumulate: false, threads: 2 };
        model.forward(pass, &params, &mut state, &x, n);
        let (out, g) = model.output_and_grad(n);
        let stats = loss.evaluate(out, crate::engine::Truth::Classes(&labels), 3, 1.0 / n as f32, Some(g));
        losses.push(stats.loss());
        model.backward(pass, &params, &mut grads, &x, n);
        opt.step(&mut params, &grads, 0.05);
    }
    (losses[0], losses[losses.len() - 1], params, state)
}

#[test]
fn a_spec_built_cnn_learns_and_is_deterministic() {
    let layers = r#"
        [[layers]]
        type = "reshape"
        target_shape = [6, 6, 1]
        [[layers]]
        type = "conv2d"
        filters = 4
        kernel_size = 3
        padding = "same"
        activation = "relu"
        [[layers]]
        type = "batch_norm"
        momentum = 0.5
        [[layers]]
        type = "max_pool2d"
        [[layers]]
        type = "dropout"
        rate = 0.1
        [[layers]]
        type = "flatten"
        [[layers]]
        type = "dense"
        units = 3
    "#;
    let make = || match build_spec(&spec(layers), &Shape(vec![6, 6]), 3) {
        Ok(m) => m,
        Err(d) => panic!("{}", render(&d)),
    };
    let mut model = make();
    let (first, last, params, mut state) = train(&mut model, 40);
    assert!(last < 0.25 * first, "loss {first} → {last}");

    // Inference (moving statistics, no dropout) classifies the training set.
    let (x, labels) = bands(48);
    let pass = Pass { training: false, seed: 0, accumulate: false, threads: 2 };
    let out = model.forward(pass, &params, &mut state, &x, labels.len());
    let f = LossFn { kind: LossKind::SparseCategoricalCrossentropy, from_logits: true };
    let acc = f.evaluate(out, crate::engine::Truth::Classes(&labels), 3, 1.0, None).accuracy();
    assert!(acc > 0.9, "accuracy {acc}");

    // Same spec, seed and thread count: bit-identical weights and statistics.
    let (_, _, again, again_state) = train(&mut make(), 40);
    assert_eq!(params, again);
    assert_eq!(state, again_state);
}

#[test]
fn a_two_axis_input_feeds_a_dense_mlp() {
    let layers = r#"
        [[layers]]
        type = "dense"
        units = 16
        activation = "relu"
        [[layers]]
        type = "dense"
        units = 3
    "#;
    let mut model = match build_spec(&spec(layers), &Shape(vec![6, 6]), 3) {
        Ok(m) => m,
        Err(d) => panic!("{}", render(&d)),
    };
    assert_eq!(model.param_len(), 36 * 16 + 16 + 16 * 3 + 3);
    let (first, last, _, _) = train(&mut model, 40);
    assert!(last < 0.25 * first, "loss {first} → {last}");
}
