//! Property tests of [`super::size`]: for random small models the estimate matches what
//! building allocates (parameters exactly, activations at least); for random huge ones it
//! never panics or wraps.

use super::config::{GptConfig, LayerConfig, ModelSpec, ZooModel};
use super::{describe_for, size};
use crate::data::LabelKind;
use crate::engine::Shape;
use crate::vocab::Activation;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::num::NonZeroUsize;

fn nz(v: usize) -> NonZeroUsize {
    NonZeroUsize::new(v).unwrap_or(NonZeroUsize::MIN)
}

fn gpt(n_layer: usize, n_head: usize, head: usize, block: usize, tie: bool, dropout: bool) -> ModelSpec {
    let g = GptConfig {
        n_layer: nz(n_layer),
        n_head: nz(n_head),
        n_embd: nz(n_head.saturating_mul(head)),
        block_size: nz(block),
        dropout: if dropout { 0.1 } else { 0.0 },
        tie_embeddings: tie,
        approximate_gelu: false,
    };
    ModelSpec { zoo: Some(ZooModel::Gpt), gpt: Some(g), ..ModelSpec::default() }
}

fn dense(units: usize) -> LayerConfig {
    LayerConfig::Dense { units: nz(units), activation: Activation::Relu, use_bias: true }
}

fn run(cases: u32, strategy: impl Strategy<Value = (ModelSpec, Shape, LabelKind)>, exact: bool) {
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&strategy, |(spec, input, labels)| {
        let estimate = size(&spec, &input, labels);
        if !exact {
            return Ok(());
        }
        let plan = describe_for(&spec, &input, labels).map_err(|d| TestCaseError::fail(format!("{d:?}")))?;
        let model = plan.build().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let estimate = estimate.ok_or_else(|| TestCaseError::fail("a model that builds has no size"))?;
        prop_assert_eq!(estimate.params, model.param_len() as u64);
        prop_assert_eq!(estimate.state, model.state_len() as u64);
        prop_assert!(
            estimate.activations >= model.activation_len() as u64,
            "{estimate:?} < {}",
            model.activation_len()
        );
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

#[test]
fn small_gpts_are_sized_as_they_build() {
    let s = (1..4usize, 1..4usize, 1..9usize, 1..12usize, 1..9usize, any::<bool>(), any::<bool>(), 2..40u32);
    let models = s.prop_map(|(layers, heads, head, t, extra, tie, dropout, vocab)| {
        let labels = LabelKind::Sequence { classes: vocab, len: t };
        (gpt(layers, heads, head, t + extra, tie, dropout), Shape(vec![t]), labels)
    });
    run(64, models, true);
}

#[test]
fn small_layer_lists_are_sized_as_they_build() {
    let s = (1..6usize, 1..6usize, 1..4usize, 1..40usize, 2..10u32);
    let models = s.prop_map(|(h, w, c, units, classes)| {
        let layers = vec![
            LayerConfig::Conv2d {
                filters: nz(units % 7 + 1),
                kernel_size: super::Size2::Square(nz(1)),
                strides: super::Size2::Square(nz(1)),
                padding: super::Padding::Same,
                activation: Activation::Relu,
                use_bias: true,
            },
            LayerConfig::BatchNorm { momentum: 0.99, epsilon: 1e-3 },
            LayerConfig::Flatten,
            dense(units),
            dense(classes as usize),
        ];
        (ModelSpec { layers, ..ModelSpec::default() }, Shape(vec![h, w, c]), LabelKind::Class { classes })
    });
    run(64, models, true);
}

#[test]
fn huge_sizes_saturate_instead_of_panicking() {
    let huge = prop_oneof![1..usize::MAX, Just(usize::MAX), 1usize << 30..1usize << 40];
    let s = (huge.clone(), huge.clone(), huge.clone(), huge, 1..u32::MAX);
    let models = s.prop_flat_map(|(a, b, c, d, vocab)| {
        let gpt =
            (gpt(a, 1, b, c, false, true), Shape(vec![c.min(1 << 20)]), LabelKind::Sequence { classes: vocab, len: 1 });
        let layers = vec![dense(a), dense(b), dense(vocab as usize)];
        let mlp = (ModelSpec { layers, ..ModelSpec::default() }, Shape(vec![d]), LabelKind::Class { classes: vocab });
        prop_oneof![Just(gpt), Just(mlp)]
    });
    run(256, models, false);
}
