//! The transformer layers against an independent implementation: PyTorch autograd in float64
//! on the same inputs (`tests/fixtures/gpt/make_fixtures.py`, which also says how to
//! regenerate them).
//!
//! "Within 1e-5 relative error" means, for every value, `|got − want| ≤ 1e-5 · max(|want|,
//! rms(want))`: relative for every value at least as large as the tensor's RMS, and relative
//! to the RMS for the smaller ones, whose own relative error f32 cannot bound (a gradient that
//! is a sum cancelling to nearly zero).

use super::*;
use crate::engine::fastmath::{erf, erfc};
use crate::engine::layer::{Backward, Forward, Layer, Pass};
use crate::engine::sequential::Sequential;
use crate::engine::shape::Shape;
use serde_json::Value;

const TOLERANCE: f64 = 1e-5;

fn load(text: &str) -> Value {
    serde_json::from_str(text).unwrap()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// Inputs are float32-exact in the fixtures.
fn f32s(v: &Value) -> Vec<f32> {
    f64s(v).into_iter().map(|x| x as f32).collect()
}

fn int(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap() as usize
}

fn assert_matches(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (f64::from(*g) - w).abs() / w.abs().max(rms).max(f64::MIN_POSITIVE))
        .fold(0.0, f64::max);
    eprintln!("{what}: worst relative error {worst:.1e}");
    assert!(worst <= TOLERANCE, "{what}: relative error {worst:e} > {TOLERANCE:e}");
}

fn pass(seed: u64) -> Pass {
    Pass { training: true, seed, accumulate: false, threads: 2 }
}

/// Forward then backward of `layer` on `x` with gradient `dy`: `(y, parameter grads, dx)`.
fn run(
    layer: &mut dyn Layer,
    params: &[f32],
    x: &[f32],
    dy: &[f32],
    n: usize,
    seed: u64,
    with_dx: bool,
) -> [Vec<f32>; 3] {
    let mut y = vec![0.0; n * layer.output_shape().numel()];
    layer.forward(Forward { pass: pass(seed), x, n }, params, &mut [], &mut y);
    let mut grads = vec![f32::NAN; params.len()];
    let mut dx = vec![f32::NAN; x.len()];
    layer.backward(Backward { pass: pass(seed), x, y: &y, dy, n }, params, &mut grads, with_dx.then_some(&mut dx[..]));
    [y, grads, dx]
}

/// The layer's tensors, concatenated in its order, from the fixture's `params` by name.
fn params_by_name(layer: &dyn Layer, params: &Value) -> Vec<f32> {
    layer.params().iter().flat_map(|p| f32s(&params[&p.name])).collect()
}

/// Compares each tensor of `grads` (laid out as `layer.params()`) with `want` by name.
fn assert_grads(layer: &dyn Layer, grads: &[f32], want: &Value, what: &str) {
    let mut at = 0;
    for p in layer.params() {
        assert_matches(&grads[at..at + p.len()], &f64s(&want[&p.name]), &format!("{what} d{}", p.name));
        at += p.len();
    }
}

#[test]
fn embedding_matches_torch() {
    let f = load(include_str!("../../../tests/fixtures/gpt/embedding.json"));
    let mut layer = Embedding::new(int(&f, "vocab"), int(&f, "dim"), int(&f, "seq_len"));
    let [y, grads, _] =
        run(&mut layer, &f32s(&f["embeddings"]), &f32s(&f["ids"]), &f32s(&f["dy"]), int(&f, "n"), 1, false);
    assert_matches(&y, &f64s(&f["y"]), "embedding y");
    assert_matches(&grads, &f64s(&f["d_embeddings"]), "embedding dE");
}

#[test]
fn position_embedding_matches_torch() {
    let f = load(include_str!("../../../tests/fixtures/gpt/position_embedding.json"));
    let mut layer = PositionEmbedding::new(int(&f, "block_size"), int(&f, "seq_len"), int(&f, "dim")).unwrap();
    let [y, grads, dx] =
        run(&mut layer, &f32s(&f["embeddings"]), &f32s(&f["x"]), &f32s(&f["dy"]), int(&f, "n"), 1, true);
    assert_matches(&y, &f64s(&f["y"]), "position_embedding y");
    assert_matches(&grads, &f64s(&f["d_embeddings"]), "position_embedding dP");
    assert_matches(&dx, &f64s(&f["dx"]), "position_embedding dx");
}

#[test]
fn layer_norm_matches_torch() {
    let f = load(include_str!("../../../tests/fixtures/gpt/layer_norm.json"));
    let shape = Shape(vec![int(&f, "seq_len"), int(&f, "dim")]);
    let mut layer = LayerNorm::new(shape, f["epsilon"].as_f64().unwrap() as f32);
    let params: Vec<f32> = [f32s(&f["gamma"]), f32s(&f["beta"])].concat();
    let [y, grads, dx] = run(&mut layer, &params, &f32s(&f["x"]), &f32s(&f["dy"]), int(&f, "n"), 1, true);
    assert_matches(&y, &f64s(&f["y"]), "layer_norm y");
    let d = int(&f, "dim");
    assert_matches(&grads[..d], &f64s(&f["d_gamma"]), "layer_norm dgamma");
    assert_matches(&grads[d..], &f64s(&f["d_beta"]), "layer_norm dbeta");
    assert_matches(&dx, &f64s(&f["dx"]), "layer_norm dx");
}

#[test]
fn gelu_and_erf_match_torch_and_python() {
    let f = load(include_str!("../../../tests/fixtures/gpt/gelu.json"));
    let x = f32s(&f["x"]);
    for (form, name) in [(GeluForm::Exact, "exact"), (GeluForm::Tanh, "tanh")] {
        let mut layer = Gelu::new(form, Shape(vec![x.len()]));
        let [y, _, dx] = run(&mut layer, &[], &x, &f32s(&f["dy"]), 1, 1, true);
        // Elementwise: every value is compared on its own, tails included.
        for (i, (y, w)) in y.iter().zip(f64s(&f[format!("y_{name}")])).enumerate() {
            assert_matches(&[*y], &[w], &format!("gelu {name} y at x = {}", x[i]));
        }
        assert_matches(&dx, &f64s(&f[format!("dx_{name}")]), &format!("gelu {name} dx"));
    }
    let z = f32s(&f["erf_x"]);
    for (i, (want_erf, want_erfc)) in f64s(&f["erf"]).into_iter().zip(f64s(&f["erfc"])).enumerate() {
        assert_matches(&[erf(z[i])], &[want_erf], &format!("erf({})", z[i]));
        assert_matches(&[erfc(z[i])], &[want_erfc], &format!("erfc({})", z[i]));
    }
}

#[test]
fn lm_head_matches_torch() {
    let f = load(include_str!("../../../tests/fixtures/gpt/lm_head.json"));
    let mut layer = LmHead::untied(int(&f, "seq_len"), int(&f, "dim"), int(&f, "vocab"));
    let [y, grads, dx] = run(&mut layer, &f32s(&f["kernel"]), &f32s(&f["x"]), &f32s(&f["dy"]), int(&f, "n"), 1, true);
    assert_matches(&y, &f64s(&f["y"]), "lm_head y");
    assert_matches(&grads, &f64s(&f["d_kernel"]), "lm_head dkernel");
    assert_matches(&dx, &f64s(&f["dx"]), "lm_head dx");
}

#[test]
fn attention_matches_torch() {
    let f = load(include_str!("../../../tests/fixtures/gpt/attention.json"));
    for case in f["cases"].as_array().unwrap() {
        let (t, d, heads, n) = (int(case, "seq_len"), int(case, "dim"), int(case, "heads"), int(case, "n"));
        let (causal, rate) = (case["causal"].as_bool().unwrap(), case["rate"].as_f64().unwrap() as f32);
        let what = format!("attention T={t} causal={causal} rate={rate}");
        let mut layer =
            MultiHeadAttention::new(t, d, heads, causal).unwrap().with_dropout(rate, int(case, "salt") as u64);
        let params = params_by_name(&layer, &case["params"]);
        let [y, grads, dx] =
            run(&mut layer, &params, &f32s(&case["x"]), &f32s(&case["dy"]), n, int(case, "seed") as u64, true);
        assert_matches(&y, &f64s(&case["y"]), &format!("{what} y"));
        assert_matches(&dx, &f64s(&case["dx"]), &format!("{what} dx"));
        assert_grads(&layer, &grads, &case["grads"], &what);
    }
}

fn block_config(f: &Value, gelu: GeluForm, dropout: f32) -> BlockConfig {
    BlockConfig {
        seq_len: int(f, "seq_len"),
        dim: int(f, "dim"),
        heads: int(f, "heads"),
        hidden: int(f, "hidden"),
        dropout,
        epsilon: f["epsilon"].as_f64().unwrap() as f32,
        gelu,
        layers: 2,
    }
}

#[test]
fn transformer_block_matches_torch() {
    let f = load(include_str!("../../../tests/fixtures/gpt/transformer_block.json"));
    for case in f["cases"].as_array().unwrap() {
        let form = if case["gelu"] == "tanh" { GeluForm::Tanh } else { GeluForm::Exact };
        let rate = case["rate"].as_f64().unwrap() as f32;
        let what = format!("block gelu={form:?} rate={rate}");
        let mut layer = TransformerBlock::new(block_config(&f, form, rate), int(case, "salt") as u64).unwrap();
        let params = params_by_name(&layer, &case["params"]);
        let (x, dy) = (f32s(&case["x"]), f32s(&case["dy"]));
        let [y, grads, dx] = run(&mut layer, &params, &x, &dy, int(&f, "n"), int(case, "seed") as u64, true);
        assert_matches(&y, &f64s(&case["y"]), &format!("{what} y"));
        assert_matches(&dx, &f64s(&case["dx"]), &format!("{what} dx"));
        assert_grads(&layer, &grads, &case["grads"], &what);
    }
}

/// A whole tied GPT through `Sequential`: the head's and the embedding's gradients must add up
/// in the one shared tensor.
#[test]
fn tied_gpt_matches_torch() {
    let f = load(include_str!("../../../tests/fixtures/gpt/gpt.json"));
    let (n, t, d, vocab) = (int(&f, "n"), int(&f, "seq_len"), int(&f, "dim"), int(&f, "vocab"));
    let cfg = block_config(&f, GeluForm::Tanh, 0.0);
    let layers: Vec<Box<dyn Layer>> = vec![
        Box::new(Embedding::new(vocab, d, t)),
        Box::new(PositionEmbedding::new(int(&f, "block_size"), t, d).unwrap()),
        Box::new(TransformerBlock::new(cfg, 1).unwrap()),
        Box::new(TransformerBlock::new(cfg, 2).unwrap()),
        Box::new(LayerNorm::new(Shape(vec![t, d]), cfg.epsilon)),
        Box::new(LmHead::tied(t, d, vocab, "embedding/embeddings")),
    ];
    let mut model = Sequential::try_new(Shape(vec![t]), layers).unwrap();
    let want_params = f["params"].as_object().unwrap();
    assert_eq!(model.tensors().len(), want_params.len(), "the tied table is one tensor");
    let mut params = vec![f32::NAN; model.param_len()];
    for info in model.tensors() {
        params[info.range()].copy_from_slice(&f32s(&want_params[&info.name]));
    }
    let mut state = Vec::new();
    let ids = f32s(&f["ids"]);
    let logits = model.forward(pass(0), &params, &mut state, &ids, n).to_vec();
    assert_matches(&logits, &f64s(&f["logits"]), "gpt logits");
    let (_, g) = model.output_and_grad(n);
    g.copy_from_slice(&f32s(&f["dy"]));
    let mut grads = vec![f32::NAN; params.len()];
    model.backward(pass(0), &params, &mut grads, &ids, n);
    for info in model.tensors() {
        assert_matches(&grads[info.range()], &f64s(&f["grads"][&info.name]), &format!("gpt d{}", info.name));
    }
}
