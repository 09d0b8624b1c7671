//! Valid specs load into the expected types.

use std::num::NonZeroUsize;
use std::path::Path;
use trainrun::spec::{Activation, LayerConfig, LossKind, OptimizerKind, Size2, StrategySpec, load};

#[test]
fn the_tutorial_spec_loads() {
    let loaded = match load(Path::new("tests/fixtures/mnist_tutorial.toml"), &[], &[]) {
        Ok(loaded) => loaded,
        Err(error) => panic!("{error}"),
    };
    let spec = loaded.spec;
    assert_eq!(spec.run.name.as_deref(), Some("mnist_tutorial"));
    assert_eq!(spec.batch.global, NonZeroUsize::new(64));
    assert_eq!(spec.optimizer.kind, OptimizerKind::Sgd);
    assert_eq!(spec.optimizer.learning_rate, Some(0.001));
    assert_eq!(spec.train.epochs.get(), 3);
    assert_eq!(spec.train.steps_per_epoch.map(|s| s.get()), Some(70));
    assert_eq!(spec.train.loss, LossKind::SparseCategoricalCrossentropy);
    assert!(spec.train.from_logits);
    assert!(matches!(spec.strategy, StrategySpec::MultiWorkerMirrored { .. }));
    assert_eq!(spec.cluster.worker.as_ref().map(|w| w.len()), Some(2));
    let layers = &spec.model.layers;
    assert_eq!(layers.len(), 5);
    assert!(matches!(
        &layers[1],
        LayerConfig::Conv2d { filters, kernel_size: Size2::Square(k), activation: Activation::Relu, .. }
            if filters.get() == 32 && k.get() == 3
    ));
    assert!(matches!(&layers[4], LayerConfig::Dense { units, .. } if units.get() == 10));
    assert_eq!(loaded.files.len(), 1);
}

#[test]
fn overrides_reach_into_layers() {
    let sets = ["model.layers[3].units=256".to_string(), "run.name=tuned".to_string()];
    let env = [("TRAINRUN_TRAIN__EPOCHS".to_string(), "7".to_string())];
    let loaded = match load(Path::new("tests/fixtures/mnist_tutorial.toml"), &env, &sets) {
        Ok(loaded) => loaded,
        Err(error) => panic!("{error}"),
    };
    assert!(matches!(&loaded.spec.model.layers[3], LayerConfig::Dense { units, .. } if units.get() == 256));
    assert_eq!(loaded.spec.model.layers.len(), 5);
    assert_eq!(loaded.spec.train.epochs.get(), 7);
    assert_eq!(loaded.spec.run.name.as_deref(), Some("tuned"));
}
