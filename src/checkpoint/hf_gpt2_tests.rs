//! A tiny GPT-2 that `transformers` saved (tests/fixtures/hf_gpt2/, with the script that made
//! it) loads into trainrun's GPT and computes the logits `transformers` computed on the same
//! ids; configs that differ are refused naming each key with both values.

use super::*;
use crate::checkpoint::warm_start;
use crate::data::LabelKind;
use crate::engine::{Pass, Shape};
use crate::model::{InitFrom, ModelSpec, describe_for};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/hf_gpt2");

/// The fixture's GPT-2 as `[model]` writes it: 2 layers, 4 heads, 32 wide, 16 positions.
const TINY: &str =
    "zoo = \"gpt\"\n[gpt]\nn_layer = 2\nn_head = 4\nn_embd = 32\nblock_size = 16\napproximate_gelu = true\n";

fn plan(toml_text: &str, vocab: usize) -> ModelPlan {
    let spec: ModelSpec = toml::from_str(toml_text).unwrap();
    describe_for(&spec, &Shape(vec![16]), LabelKind::Sequence { classes: vocab as u32, len: 16 }).unwrap()
}

fn init(strict: bool) -> InitFrom {
    InitFrom { path: format!("{FIXTURE}/tiny").into(), strict, format: None }
}

/// The model of `toml_text` with the fixture loaded; its params and state.
fn loaded(toml_text: &str) -> (crate::engine::Sequential, Vec<f32>, Vec<f32>) {
    let plan = plan(toml_text, 256);
    let model = plan.build().unwrap();
    let (mut params, mut state) = model.init(7);
    let layout = crate::builder::layout(&model);
    let report =
        warm_start::load(&init(true), &plan, (&layout.tensors, &mut params), (&layout.state_tensors, &mut state))
            .unwrap();
    assert!(report.mismatches().is_empty(), "{:?}", report.mismatches());
    // Every tensor, and an untied model's head (from the tied GPT-2's embedding).
    let head = usize::from(!plan.layers.contains(&crate::model::LayerConfig::LmHead { tie_embeddings: true }));
    assert_eq!(report.loaded.len(), 2 + 2 * 12 + 2 + head);
    (model, params, state)
}

struct Reference {
    ids: Vec<Vec<u32>>,
    logits: Vec<f32>,
    loss: f64,
}

fn reference() -> Reference {
    let text = std::fs::read_to_string(format!("{FIXTURE}/tiny_logits.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ids = serde_json::from_value(v["ids"].clone()).unwrap();
    let logits: Vec<Vec<Vec<f32>>> = serde_json::from_value(v["logits"].clone()).unwrap();
    let logits = logits.into_iter().flatten().flatten().collect();
    Reference { ids, logits, loss: v["loss"].as_f64().unwrap() }
}

/// `transformers`' causal-LM loss: each position predicts the next id, averaged.
fn next_token_loss(logits: &[f32], ids: &[Vec<u32>], vocab: usize) -> f64 {
    let (mut sum, mut count) = (0.0f64, 0usize);
    for (s, seq) in ids.iter().enumerate() {
        for (t, next) in seq.iter().enumerate().skip(1) {
            let row = &logits[(s * seq.len() + t - 1) * vocab..][..vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)) as f64;
            let lse = max + row.iter().map(|v| (*v as f64 - max).exp()).sum::<f64>().ln();
            sum += lse - row[*next as usize] as f64;
            count += 1;
        }
    }
    sum / count as f64
}

#[test]
fn transformers_gpt2_gives_the_same_logits_and_loss_in_trainrun() {
    let r = reference();
    for (name, toml_text) in [("tied", TINY.to_string()), ("untied", format!("{TINY}tie_embeddings = false\n"))] {
        let (mut model, params, mut state) = loaded(&toml_text);
        let x: Vec<f32> = r.ids.iter().flatten().map(|&i| i as f32).collect();
        let pass = Pass { training: false, seed: 0, accumulate: false, threads: 1 };
        let logits = model.forward(pass, &params, &mut state, &x, r.ids.len()).to_vec();
        assert_eq!(logits.len(), r.logits.len());
        let worst = logits.iter().zip(&r.logits).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0f32, f32::max);
        assert!(worst <= 1e-4, "{name}: logits differ from transformers' by {worst} (relative)");
        let loss = next_token_loss(&logits, &r.ids, 256);
        assert!((loss - r.loss).abs() <= 1e-4 * r.loss, "{name}: loss {loss} vs transformers' {}", r.loss);
    }
}

#[test]
fn every_config_difference_is_named_with_both_values() {
    let other = "zoo = \"gpt\"\n[gpt]\nn_layer = 3\nn_head = 2\nn_embd = 32\nblock_size = 16\n";
    let plan = plan(other, 300);
    let model = plan.build().unwrap();
    let (mut params, mut state) = model.init(7);
    let layout = crate::builder::layout(&model);
    let load = |init: InitFrom, params: &mut [f32], state: &mut [f32]| {
        warm_start::load(&init, &plan, (&layout.tensors, params), (&layout.state_tensors, state))
            .unwrap_err()
            .to_string()
    };
    let e = load(init(true), &mut params, &mut state);
    for line in [
        "n_layer: config.json has 2, the spec's model has 3",
        "n_head: config.json has 4, the spec's model has 2",
        "vocab_size: config.json has 256, the spec's model has 300",
        "activation_function: config.json has gelu_new = tanh-approximated GELU (approximate_gelu = true), the spec's \
         model has gelu = exact GELU (approximate_gelu = false)",
    ] {
        assert!(e.contains(line), "missing `{line}` in:\n{e}");
    }
    // Not strict, sizes show as the tensors left, but a different function is still refused.
    let e = load(init(false), &mut params, &mut state);
    assert!(e.contains("n_head") && e.contains("activation_function") && !e.contains("n_layer"), "{e}");
}

#[test]
fn only_gpt2_folders_and_gpt2_shaped_models_are_read() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "llama", "hidden_size": 32}"#).unwrap();
    let plan = plan(TINY, 256);
    let shape = Gpt2Shape::of(&plan).unwrap();
    let e = read(dir.path(), &shape, true).unwrap_err().to_string();
    assert!(e.contains("model_type is \"llama\"") && e.contains("\"gpt2\""), "{e}");
    let mlp: ModelSpec = toml::from_str("[[layers]]\ntype = \"dense\"\nunits = 4\n").unwrap();
    let mlp = describe_for(&mlp, &Shape(vec![8]), LabelKind::Class { classes: 4 }).unwrap();
    let e = Gpt2Shape::of(&mlp).unwrap_err();
    assert!(e.contains("layer 1 is dense where an embedding belongs"), "{e}");
}

#[test]
fn attention_buffers_and_a_tied_head_are_skipped() {
    // What older `transformers` saved: the causal-mask buffer and a copy of the tied head.
    let bytes = std::fs::read(format!("{FIXTURE}/tiny/model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mask = vec![0u8; 16 * 16];
    let mut tensors = st.tensors();
    let wte = tensors.iter().find(|(n, _)| n == "transformer.wte.weight").unwrap().1.clone();
    tensors.push(("lm_head.weight".into(), wte));
    tensors.push(("transformer.h.0.attn.bias".into(), TensorView::new(Dtype::U8, vec![1, 1, 16, 16], &mask).unwrap()));
    let shape = Gpt2Shape::of(&plan(TINY, 256)).unwrap();
    let renamed = rename(Path::new("x"), &safetensors::serialize(tensors, None).unwrap(), &shape).unwrap();
    let renamed = SafeTensors::deserialize(&renamed).unwrap();
    let mut names = renamed.names();
    names.sort_unstable();
    assert_eq!(names.len(), 28);
    assert!(names.iter().all(|n| !n.contains('.')), "{names:?}");
}
