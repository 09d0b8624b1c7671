//! `[data.preprocessing]` resolution: what each source's `rescale` means, the facts after a
//! crop and a validation split, and every error naming the key, the value and a fix.

use super::*;
use crate::data::preprocess::{AdaptWord, RandomCropConfig};
use crate::data::{AnySource, DataDirs, LabelKind};
use crate::spec::{DataSpec, DatasetKind};

fn facts(shape: &[usize], train: usize, test: usize) -> DataFacts {
    DataFacts {
        train_examples: train,
        test_examples: test,
        example_shape: shape.to_vec(),
        labels: LabelKind::Class { classes: 10 },
        train_files: 1,
        warnings: vec![],
    }
}

fn cifar() -> DataFacts {
    facts(&[32, 32, 3], 50_000, 10_000)
}

/// The source `data.dataset = dataset` names, with the smallest table it needs.
fn source(dataset: DatasetKind) -> AnySource {
    let tables = r#"
        csv = { train = "t.csv", label = "y" }
        npy = { train = { features = "x.npy", labels = "y.npy" } }
        text = { train = ["t.txt"], block_size = 64 }
        tokens = { train = ["t.bin"], block_size = 64 }
        tfrecord = { train = ["t.tfrecord"], shape = [8, 8, 1], classes = 10 }
    "#;
    let spec = DataSpec { dataset, ..toml::from_str(tables).unwrap() };
    let dirs = DataDirs { trainrun_data_dir: Some("/data".into()), ..DataDirs::default() };
    crate::plan::source(&spec, &dirs, 0).unwrap()
}

fn run(c: PreprocessingConfig, dataset: DatasetKind, f: &DataFacts) -> (Preprocessing, DataFacts, Vec<String>) {
    let mut diags = Vec::new();
    let (p, f) = resolve(Some(&c), &*source(dataset), f, &mut diags);
    (
        p,
        f,
        diags.iter().map(|d| format!("{}: {} (help: {})", d.key, d.message, d.help.as_deref().unwrap_or(""))).collect(),
    )
}

#[test]
fn no_table_is_no_preprocessing() {
    let mut diags = Vec::new();
    let (p, f) = resolve(None, &*source(DatasetKind::Mnist), &cifar(), &mut diags);
    assert!(p.is_identity() && diags.is_empty());
    assert_eq!(f, cifar());
}

#[test]
fn rescale_is_relative_to_what_the_source_gives() {
    let c = |r| PreprocessingConfig { rescale: Some(r), ..Default::default() };
    assert_eq!(run(c(1.0 / 255.0), DatasetKind::Cifar10, &cifar()).0.scale, None);
    assert_eq!(run(c(1.0), DatasetKind::Cifar10, &cifar()).0.scale, Some(255.0));
    assert_eq!(run(c(0.5), DatasetKind::Csv, &facts(&[4], 100, 0)).0.scale, Some(0.5));
    assert_eq!(run(c(1.0), DatasetKind::Csv, &facts(&[4], 100, 0)).0.scale, None);
    let (_, _, errors) = run(c(0.5), DatasetKind::Npy, &facts(&[4], 100, 0));
    assert!(
        errors[0].starts_with("data.preprocessing.rescale: rescale = 0.5 is not applied to data.dataset = \"npy\"")
    );
}

#[test]
fn the_standard_cifar_augmentation_keeps_the_shape() {
    let c = PreprocessingConfig {
        random_crop: Some(RandomCropConfig { padding: 4, height: None, width: None }),
        random_flip: Some(FlipMode::Horizontal),
        ..Default::default()
    };
    let (p, f, errors) = run(c, DatasetKind::Cifar10, &cifar());
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p.crop, Some(Crop { padding: 4, height: 32, width: 32 }));
    assert!(p.flip);
    assert_eq!(f, cifar());
}

#[test]
fn a_smaller_crop_changes_the_models_input_and_a_larger_one_is_refused() {
    let c = |h| PreprocessingConfig {
        random_crop: Some(RandomCropConfig { padding: 2, height: Some(h), width: Some(24) }),
        ..Default::default()
    };
    let (_, f, errors) = run(c(24), DatasetKind::Cifar10, &cifar());
    assert!(errors.is_empty());
    assert_eq!(f.example_shape, [24, 24, 3]);
    let (_, _, errors) = run(c(37), DatasetKind::Cifar10, &cifar());
    assert_eq!(
        errors,
        [
            "data.preprocessing.random_crop: random_crop of 37 × 24 does not fit the padded image: 32 × 32 with padding = 2 is 36 × 36 (help: use a crop of 1 × 1 to 36 × 36, or more padding)"
        ]
    );
}

#[test]
fn augmentation_needs_images() {
    let c = PreprocessingConfig { random_flip: Some(FlipMode::Horizontal), ..Default::default() };
    let (_, _, errors) = run(c.clone(), DatasetKind::Csv, &facts(&[4], 100, 0));
    assert!(errors[0].starts_with(
        "data.preprocessing.random_flip: random_flip needs images (height, width, channels), but data.dataset = \"csv\" gives examples shaped [4]"
    ));
    let (_, _, errors) = run(c, DatasetKind::Text, &facts(&[64], 100, 0));
    assert!(errors[0].contains("its examples are token ids"), "{errors:?}");
}

#[test]
fn normalize_needs_one_value_per_channel() {
    let c = |mean: Vec<f32>, std: Vec<f32>| PreprocessingConfig {
        normalize: Some(NormalizeConfig::Given { mean, std }),
        ..Default::default()
    };
    let (p, _, errors) = run(c(vec![0.5; 3], vec![0.25; 3]), DatasetKind::Cifar10, &cifar());
    assert!(errors.is_empty());
    assert!(matches!(p.normalize, Some(Normalize::Given(_))));
    let (_, _, errors) = run(c(vec![0.1307], vec![0.0]), DatasetKind::Cifar10, &cifar());
    assert_eq!(
        errors,
        [
            "data.preprocessing.normalize.mean: normalize.mean has 1 value but examples (shaped [32, 32, 3]) have 3 channels (help: give one mean per channel (3), or use normalize = \"adapt\")",
            "data.preprocessing.normalize.std: normalize.std has 1 value but examples (shaped [32, 32, 3]) have 3 channels (help: give one std per channel (3), or use normalize = \"adapt\")",
            "data.preprocessing.normalize.std: normalize.std holds 0; each must be above 0 (help: use the channel's standard deviation, or normalize = \"adapt\")",
        ]
    );
    let adapt = PreprocessingConfig { normalize: Some(NormalizeConfig::Adapt(AdaptWord::Adapt)), ..Default::default() };
    assert_eq!(run(adapt, DatasetKind::Csv, &facts(&[4], 10, 0)).0.normalize, Some(Normalize::Adapt));
}

#[test]
fn validation_split_carves_the_training_split_when_there_is_no_test_split() {
    let c = |v| PreprocessingConfig { validation_split: Some(v), ..Default::default() };
    let (p, f, errors) = run(c(0.25), DatasetKind::Csv, &facts(&[4], 150, 0));
    assert!(errors.is_empty());
    assert_eq!((p.keep_for_training, f.train_examples, f.test_examples), (Some(112), 112, 38));
    let (_, _, errors) = run(c(0.2), DatasetKind::Mnist, &facts(&[28, 28, 1], 60_000, 10_000));
    assert_eq!(
        errors,
        [
            "data.preprocessing.validation_split: validation_split = 0.2, but data.dataset = \"mnist\" has a test split (10000 examples), which is evaluated (help: remove validation_split)"
        ]
    );
    let (_, _, errors) = run(c(1.0), DatasetKind::Csv, &facts(&[4], 150, 0));
    assert!(errors[0].contains("validation_split = 1 of 150 training examples leaves 0 for training"), "{errors:?}");
}

#[test]
fn tfrecord_images_are_augmented_but_not_split() {
    let c = PreprocessingConfig {
        normalize: Some(NormalizeConfig::Adapt(AdaptWord::Adapt)),
        random_crop: Some(RandomCropConfig { padding: 2, height: None, width: None }),
        random_flip: Some(FlipMode::Horizontal),
        ..Default::default()
    };
    let (p, f, errors) = run(c.clone(), DatasetKind::Tfrecord, &facts(&[8, 8, 1], 1024, 0));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!((p.crop.map(|c| (c.height, c.width)), p.flip, f.example_shape), (Some((8, 8)), true, vec![8, 8, 1]));
    let split = PreprocessingConfig { validation_split: Some(0.2), ..c };
    let (p, _, errors) = run(split, DatasetKind::Tfrecord, &facts(&[8, 8, 1], 1024, 0));
    assert!(p.is_identity());
    assert!(
        errors.len() == 1
            && errors[0].starts_with("data.preprocessing.validation_split: validation_split is not supported")
            && errors[0].contains("data.tfrecord.test"),
        "{errors:?}"
    );
}
