//! The sequence layers and the `gpt` zoo model: sizes, shapes, ties and the diagnostics' text.

use super::tests::{render, spec};
use super::{ModelPlan, ModelSpec, ZooModel, describe_for};
use crate::data::LabelKind;
use crate::diagnostic::Diagnostic;
use crate::engine::{Sequential, Shape};

/// Plans a language model: `classes` labels at each of the input's positions.
fn describe(spec: &ModelSpec, input: &Shape, classes: usize) -> Result<ModelPlan, Vec<Diagnostic>> {
    let len = input.0.first().copied().unwrap_or(0);
    describe_for(spec, input, LabelKind::Sequence { classes: classes as u32, len })
}

fn build_spec(spec: &ModelSpec, input: &Shape, classes: usize) -> Result<Sequential, Vec<Diagnostic>> {
    describe(spec, input, classes)?.build().map_err(|e| vec![Diagnostic::error("model", e.to_string())])
}

fn errors(toml_text: &str, input: &[usize], classes: usize) -> String {
    match build_spec(&spec(toml_text), &Shape(input.to_vec()), classes) {
        Ok(_) => panic!("expected diagnostics"),
        Err(d) => render(&d),
    }
}

/// The baby GPT of `specs/shakespeare_char.toml`: 65 characters, 64 positions.
const BABY: &str = "zoo = \"gpt\"\n[gpt]\nn_layer = 4\nn_head = 4\nn_embd = 128\nblock_size = 64\n";

#[test]
fn gpt_counts_its_parameters_as_nanogpt() {
    // wte 65·128 = 8,320; wpe 64·128 = 8,192; per block: 2 layer norms 2·256, qkv
    // 128·384 + 384, output 128·128 + 128, fc 128·512 + 512, proj 512·128 + 128 = 198,272;
    // final layer norm 256; a tied head owns nothing.
    let plan = describe(&spec(BABY), &Shape(vec![64]), 65).unwrap();
    assert_eq!(plan.params, 8_320 + 8_192 + 4 * 198_272 + 256);
    assert_eq!(plan.output, Shape(vec![64, 65]));
    assert!(plan.per_position());
    let untied = describe(&spec(&format!("{BABY}tie_embeddings = false\n")), &Shape(vec![64]), 65).unwrap();
    assert_eq!(untied.params, plan.params + 128 * 65);
    // Shorter sequences than the block fit; the model has no GPU description yet.
    let model = build_spec(&spec(BABY), &Shape(vec![32]), 65).unwrap();
    let names: Vec<&str> = model.tensors().iter().map(|t| t.name.as_str()).collect();
    for name in ["embedding/embeddings", "position_embedding/embeddings", "transformer_block_3/mlp_proj/bias"] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("lm_head")), "a tied head owns no tensor");
    assert!(model.layer_views().iter().all(|v| v.op.is_none()), "the GPU engine must refuse these layers");
}

#[test]
fn gpt_defaults_are_the_baby_gpt_and_dropout_adds_a_layer() {
    let default = describe(&spec("zoo = \"gpt\""), &Shape(vec![64]), 65).unwrap();
    assert_eq!(default, describe(&spec(BABY), &Shape(vec![64]), 65).unwrap());
    let dropped = describe(&spec(&format!("{BABY}dropout = 0.2\n")), &Shape(vec![64]), 65).unwrap();
    assert_eq!(dropped.layers.len(), default.layers.len() + 1);
    assert_eq!(dropped.params, default.params);
}

#[test]
fn every_sequence_layer_builds_from_the_spec() {
    let layers = r#"
        [[layers]]
        type = "embedding"
        output_dim = 16
        [[layers]]
        type = "position_embedding"
        block_size = 8
        [[layers]]
        type = "multi_head_attention"
        num_heads = 2
        causal = true
        dropout = 0.1
        [[layers]]
        type = "layer_norm"
        epsilon = 1e-5
        [[layers]]
        type = "positionwise_dense"
        units = 32
        [[layers]]
        type = "gelu"
        approximate = true
        [[layers]]
        type = "positionwise_dense"
        units = 16
        use_bias = false
        [[layers]]
        type = "transformer_block"
        num_heads = 4
        intermediate_dim = 24
        [[layers]]
        type = "lm_head"
        tie_embeddings = true
    "#;
    let plan = describe(&spec(layers), &Shape(vec![8]), 11).unwrap();
    let attention = 16 * 48 + 48 + 16 * 16 + 16;
    let block = 4 * 16 + attention + 16 * 24 + 24 + 24 * 16 + 16;
    let want = 11 * 16 + 8 * 16 + attention + 2 * 16 + 16 * 32 + 32 + 32 * 16 + block;
    assert_eq!(plan.params, want);
    assert_eq!(plan.output, Shape(vec![8, 11]));
    assert_eq!(plan.build().unwrap().param_len(), want);
}

#[test]
fn sequence_layer_mistakes_name_the_key_and_the_fix() {
    let bad = r#"
        [[layers]]
        type = "embedding"
        output_dim = 12
        [[layers]]
        type = "position_embedding"
        block_size = 4
        [[layers]]
        type = "multi_head_attention"
        num_heads = 5
        [[layers]]
        type = "transformer_block"
        num_heads = 4
        dropout = 1.5
        [[layers]]
        type = "lm_head"
    "#;
    assert_eq!(
        errors(bad, &[6], 7),
        "model.layers[1].block_size: error: block_size = 4 is shorter than the data's sequences of 6 tokens\n  \
         help: use `block_size = 6` or more\n\
         model.layers[2].num_heads: error: num_heads = 5 does not divide the width 12\n  help: use `num_heads = 4`, a divisor of 12\n\
         model.layers[3].dropout: error: dropout = 1.5 is outside [0, 1)\n  help: use a fraction such as `dropout = 0.1`, or 0 for none"
    );
    let untied_first = "[[layers]]\ntype = \"dense\"\nunits = 4\n[[layers]]\ntype = \"embedding\"\noutput_dim = 4\n";
    assert!(errors(untied_first, &[6], 7).starts_with("model.layers[1]: error: embedding must be the first layer"));
    let image = "[[layers]]\ntype = \"embedding\"\noutput_dim = 4\n";
    assert!(errors(image, &[28, 28], 10).contains("use a `text` or `tokens` data source"));
    let no_embedding = "[[layers]]\ntype = \"reshape\"\ntarget_shape = [3, 2]\n[[layers]]\ntype = \"lm_head\"\ntie_embeddings = true\n";
    assert_eq!(
        errors(no_embedding, &[6], 7),
        "model.layers[1].tie_embeddings: error: tie_embeddings = true but no embedding layer comes before it\n  \
         help: add an embedding layer first, or set `tie_embeddings = false`"
    );
}

#[test]
fn gpt_mistakes_name_the_key_and_the_fix() {
    let short = errors(BABY, &[128], 65);
    assert_eq!(
        short,
        "model.gpt.block_size: error: model.gpt.block_size = 64 is shorter than the data's sequences of 128 tokens\n  \
         help: use `block_size = 128` or more"
    );
    assert!(
        errors(&format!("{BABY}n_head = 3\n").replace("n_head = 4\n", ""), &[64], 65)
            .starts_with("model.gpt.n_head: error: model.gpt.n_head = 3 does not divide n_embd = 128")
    );
    assert!(errors("zoo = \"gpt\"", &[28, 28], 10).contains("gpt needs sequences of token ids [T]"));
    assert!(
        errors("zoo = \"resnet20\"\n[gpt]\nn_layer = 2\n", &[32, 32, 3], 10)
            .starts_with("model.gpt: error: [model.gpt] sizes the gpt zoo model, but `zoo = \"gpt\"` is not set")
    );
    assert_eq!(ZooModel::Gpt, spec(BABY).zoo.unwrap());
}
