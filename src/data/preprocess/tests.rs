//! Tests of preprocessing: each transform's exact pixels, the random draws' determinism and
//! spread, `validation_split`'s carve, `adapt`'s statistics, and the pipeline reading the
//! same augmented batches after a restart from a cursor.

use super::transform::{Draw, Steps, centre, place};
use super::*;
use crate::data::source::idx::IdxArray;
use crate::data::{Batch, Cursor, ExampleShape, LabelKind, Pipeline, PipelineOptions, Shard, Shuffle};
use std::num::NonZeroUsize;

fn crop(padding: usize, height: usize, width: usize) -> Crop {
    Crop { padding, height, width }
}

fn draw(top: usize, left: usize, flip: bool) -> Draw {
    Draw { top, left, flip }
}

fn placed(src: &[f32], shape: [usize; 3], window: Crop, d: Draw) -> Vec<f32> {
    let mut out = vec![f32::NAN; window.height * window.width * shape[2]];
    place(src, shape, window, d, &mut out);
    out
}

#[test]
fn a_crop_of_the_padded_image_takes_zeros_outside_it() {
    // 2×2 image, 1 pixel of padding: the padded image is 4×4.
    let img = [1.0, 2.0, 3.0, 4.0];
    let s = [2, 2, 1];
    assert_eq!(placed(&img, s, crop(1, 2, 2), draw(0, 0, false)), [0.0, 0.0, 0.0, 1.0]);
    assert_eq!(placed(&img, s, crop(1, 2, 2), draw(1, 1, false)), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(placed(&img, s, crop(1, 2, 2), draw(2, 2, false)), [4.0, 0.0, 0.0, 0.0]);
    assert_eq!(placed(&img, s, crop(1, 2, 2), draw(1, 2, false)), [2.0, 0.0, 4.0, 0.0]);
    assert_eq!(placed(&img, s, crop(1, 3, 2), draw(0, 1, false)), [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn a_flip_mirrors_columns_and_keeps_each_pixels_channels() {
    // 1×3 image with 2 channels.
    let img = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0];
    let s = [1, 3, 2];
    assert_eq!(placed(&img, s, crop(0, 1, 3), draw(0, 0, true)), [3.0, 30.0, 2.0, 20.0, 1.0, 10.0]);
    // Flipped inside the window: the crop [2, 3] (padding 1, left 2) mirrored.
    assert_eq!(placed(&img, s, crop(1, 1, 2), draw(1, 2, true)), [3.0, 30.0, 2.0, 20.0]);
}

#[test]
fn evaluation_takes_the_centre_window_unflipped() {
    assert_eq!(centre(crop(4, 32, 32), [32, 32]), draw(4, 4, false));
    assert_eq!(centre(crop(0, 2, 2), [4, 5]), draw(1, 1, false));
    let img: Vec<f32> = (0..16).map(|v| v as f32).collect();
    assert_eq!(placed(&img, [4, 4, 1], crop(2, 4, 4), centre(crop(2, 4, 4), [4, 4])), img);
}

#[test]
fn values_are_rescaled_then_normalized_per_channel() {
    let n = Normalization { mean: vec![1.0, 0.0], std: vec![2.0, 4.0] };
    let steps = Steps::new(Some(2.0), Some(&n), None, false);
    let mut x = [3.0, 4.0, 0.5, -2.0];
    steps.values(&mut x);
    assert_eq!(x, [2.5, 2.0, 0.0, -1.0]);
}

#[test]
fn draws_depend_only_on_seed_epoch_and_index_and_cover_every_window() {
    let window = crop(4, 32, 32);
    let steps = Steps::new(None, None, Some(window), true);
    let d = |seed, epoch, i| steps.random(window, [32, 32], seed, epoch, i);
    assert_eq!(d(7, 3, 11), d(7, 3, 11));
    assert_ne!((0..20).map(|i| d(7, 0, i)).collect::<Vec<_>>(), (0..20).map(|i| d(7, 1, i)).collect::<Vec<_>>());
    assert_ne!((0..20).map(|i| d(7, 0, i)).collect::<Vec<_>>(), (0..20).map(|i| d(8, 0, i)).collect::<Vec<_>>());
    let draws: Vec<Draw> = (0..20_000).map(|i| d(1, 0, i)).collect();
    let mut tops = [0usize; 9];
    draws.iter().for_each(|x| tops[x.top] += 1);
    assert!(draws.iter().all(|x| x.top <= 8 && x.left <= 8));
    assert!(tops.iter().all(|&c| (1900..2600).contains(&c)), "positions are uniform: {tops:?}");
    let flips = draws.iter().filter(|x| x.flip).count();
    assert!((9_500..10_500).contains(&flips), "a fair coin: {flips} of 20000");
    // Without random_flip nothing is mirrored.
    let no_flip = Steps::new(None, None, Some(window), false);
    assert!((0..1000).all(|i| !no_flip.random(window, [32, 32], 1, 0, i).flip));
}

/// `n` images 2×2×1 whose bytes are `i, i + 1, i + 2, i + 3` (mod 256), labelled `i % 5`.
fn dataset(n: usize) -> Dataset {
    let images: Vec<u8> = (0..n).flat_map(|i| (0..4).map(move |k| ((i + k) % 256) as u8)).collect();
    let labels: Vec<u8> = (0..n).map(|i| (i % 5) as u8).collect();
    let shape = ExampleShape { height: 2, width: 2, channels: 1 };
    let train = Split::new(IdxArray::from_parts(vec![n, 2, 2], images), IdxArray::from_parts(vec![n], labels), shape);
    Dataset { train, test: None, labels: LabelKind::Class { classes: 5 }, vocabulary: None, classes: None }
}

#[test]
fn nothing_declared_leaves_the_dataset_untouched() {
    let (data, stats) = Preprocessing::default().apply(dataset(3), 1).unwrap();
    assert!(stats.is_none());
    assert_eq!(data.train.read(0..3).unwrap().x, dataset(3).train.read(0..3).unwrap().x);
}

#[test]
fn validation_split_carves_the_last_examples_as_the_test_split() {
    let p = Preprocessing { keep_for_training: Some(8), ..Preprocessing::default() };
    let (data, _) = p.apply(dataset(10), 1).unwrap();
    assert_eq!(data.train.len(), 8);
    let test = data.test.unwrap();
    assert_eq!(test.len(), 2);
    let b = test.read(0..2).unwrap();
    assert_eq!(b.y, [3, 4]);
    assert_eq!(b.x[..4], [8.0 / 255.0, 9.0 / 255.0, 10.0 / 255.0, 11.0 / 255.0]);
    // A source with a test split of its own is refused.
    let with_test = Dataset { test: Some(dataset(2).train), ..dataset(10) };
    assert!(p.apply(with_test, 1).unwrap_err().to_string().contains("test split"));
}

#[test]
fn adapt_computes_each_channels_mean_and_std_over_the_training_split() {
    let p = Preprocessing { scale: Some(255.0), normalize: Some(Normalize::Adapt), ..Preprocessing::default() };
    // Two examples: values 0..=3 and 1..=4, so 0,1,1,2,2,3,3,4: mean 2, variance 1.5.
    let (data, stats) = p.apply(dataset(2), 1).unwrap();
    let stats = stats.unwrap();
    assert!((stats.mean[0] - 2.0).abs() < 1e-6, "{stats:?}");
    assert!((stats.std[0] - 1.5f32.sqrt()).abs() < 1e-6, "{stats:?}");
    let x = data.train.read(0..1).unwrap().x;
    let want: Vec<f32> = (0..4).map(|v| ((v as f32 / 255.0) * 255.0 - stats.mean[0]) / stats.std[0]).collect();
    assert_eq!(x, want);
}

#[test]
fn evaluation_is_centre_cropped_and_training_is_augmented_per_epoch() {
    let p = Preprocessing {
        crop: Some(crop(1, 2, 2)),
        flip: true,
        keep_for_training: Some(40),
        ..Preprocessing::default()
    };
    let (data, _) = p.apply(dataset(50), 9).unwrap();
    let test = data.test.as_ref().unwrap();
    assert_eq!(test.read(0..10).unwrap().x, dataset(50).train.read(40..50).unwrap().x);
    let mut a = Batch::default();
    let mut b = Batch::default();
    let all: Vec<usize> = (0..40).collect();
    data.train.append_many_in_epoch(0, &all, &mut a).unwrap();
    data.train.append_many_in_epoch(1, &all, &mut b).unwrap();
    assert_eq!(a.x.len(), 40 * 4);
    assert_ne!(a.x, b.x, "each epoch draws anew");
    let mut again = Batch::default();
    data.train.append_many_in_epoch(0, &all, &mut again).unwrap();
    assert_eq!(a.x, again.x);
    assert_eq!(a.y, again.y);
}

fn options(seed: u64) -> PipelineOptions {
    PipelineOptions {
        seed,
        shuffle: Shuffle::Full,
        global_batch: NonZeroUsize::new(8).unwrap(),
        drop_remainder: true,
        prefetch: 2,
        shard: Shard::WHOLE,
    }
}

#[test]
fn a_restarted_pipeline_reads_the_same_augmented_batches() {
    let p = Preprocessing { crop: Some(crop(1, 2, 2)), flip: true, ..Preprocessing::default() };
    let data = Arc::new(p.apply(dataset(20), 5).unwrap().0);
    let batches = |start: Cursor, k: usize| {
        let mut pipe = Pipeline::new(data.clone(), &options(5), start).unwrap();
        (0..k).map(|_| pipe.next_batch().unwrap()).map(|b| (b.x, b.y)).collect::<Vec<_>>()
    };
    // Two batches per epoch: the sixth batch starts epoch 2 at offset 8.
    let straight = batches(Cursor::default(), 7);
    let resumed = batches(Cursor { epoch: 2, offset: 8 }, 2);
    assert_eq!(straight[5..], resumed[..]);
    // The flips show: the same crops unflipped differ.
    let unflipped = Preprocessing { crop: Some(crop(1, 2, 2)), ..Preprocessing::default() };
    let unflipped = Arc::new(unflipped.apply(dataset(20), 5).unwrap().0);
    let mut pipe = Pipeline::new(unflipped, &options(5), Cursor::default()).unwrap();
    assert_ne!(pipe.next_batch().unwrap().x, straight[0].0);
}

/// A TFRecord training split streams through its preprocessing: read in file order, each
/// batch is what reading the same examples by index gives, the augmentation drawn from the
/// same (seed, epoch, position).
#[test]
fn a_tfrecord_stream_is_preprocessed_like_reading_by_index() {
    use crate::data::formats::bench::raw_image_example;
    use crate::data::source::tfrecord::write_record;
    use crate::data::{DataSource, TfRecordConfig, TfRecordSource};
    let dir = tempfile::tempdir().unwrap();
    for f in 0..2 {
        let mut bytes = vec![];
        for i in f * 10..(f + 1) * 10 {
            let pixels = (0..4).map(|k| ((i * 7 + k * 3) % 256) as u8).collect();
            write_record(&mut bytes, &raw_image_example(pixels, (i % 5) as i64)).unwrap();
        }
        std::fs::write(dir.path().join(format!("t{f}.tfrecord")), bytes).unwrap();
    }
    let config: TfRecordConfig =
        toml::from_str("train = [\"t*.tfrecord\"]\nshape = [2, 2, 1]\nclasses = 5\nshuffle_buffer = 0").unwrap();
    let p = Preprocessing { scale: Some(2.0), crop: Some(crop(1, 2, 2)), flip: true, ..Preprocessing::default() };
    let data =
        Arc::new(p.apply(TfRecordSource { dir: dir.path().to_path_buf(), config }.load().unwrap(), 3).unwrap().0);
    assert!(data.train.records().is_some(), "the preprocessed split still streams");
    let opts = PipelineOptions { shuffle: Shuffle::Off, drop_remainder: false, ..options(3) };
    let mut pipe = Pipeline::new(data.clone(), &opts, Cursor::default()).unwrap();
    // 20 examples in batches of 8: 8, 8 and 4, then the next epoch.
    let mut first = vec![];
    for (epoch, range) in [(0, 0..8), (0, 8..16), (0, 16..20), (1, 0..8)] {
        let b = pipe.next_batch().unwrap();
        let mut want = Batch::default();
        data.train.append_many_in_epoch(epoch, &range.collect::<Vec<_>>(), &mut want).unwrap();
        assert_eq!((&b.x, &b.y), (&want.x, &want.y), "epoch {epoch}");
        first.push(b.x);
    }
    assert_ne!(first[0], first[3], "each epoch draws its crops and flips anew");
}

/// The definition `place` implements, pixel by pixel: output (y, x) is padded pixel
/// (top + y, left + x'), x' mirrored when flipping, zero outside the image.
fn by_definition(src: &[f32], [h, w, c]: [usize; 3], window: Crop, d: Draw) -> Vec<f32> {
    let mut out = vec![];
    for y in 0..window.height {
        for x in 0..window.width {
            let x_from = if d.flip { window.width - 1 - x } else { x };
            let (r, col) =
                ((d.top + y) as isize - window.padding as isize, (d.left + x_from) as isize - window.padding as isize);
            for k in 0..c {
                let inside = (0..h as isize).contains(&r) && (0..w as isize).contains(&col);
                out.push(if inside { src[(r as usize * w + col as usize) * c + k] } else { 0.0 });
            }
        }
    }
    out
}

#[test]
fn place_matches_its_definition_at_every_window_position() {
    for (shape, window) in
        [([5, 4, 3], crop(2, 5, 4)), ([5, 4, 1], crop(1, 3, 6)), ([3, 7, 2], crop(0, 2, 3)), ([4, 4, 3], crop(3, 2, 2))]
    {
        let src: Vec<f32> = (0..shape.iter().product::<usize>()).map(|v| v as f32 + 1.0).collect();
        let [rows, cols] =
            [shape[0] + 2 * window.padding + 1 - window.height, shape[1] + 2 * window.padding + 1 - window.width];
        for top in 0..rows {
            for left in 0..cols {
                for flip in [false, true] {
                    let d = draw(top, left, flip);
                    assert_eq!(
                        placed(&src, shape, window, d),
                        by_definition(&src, shape, window, d),
                        "{shape:?} {window:?} {d:?}"
                    );
                }
            }
        }
    }
}
