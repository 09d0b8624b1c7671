//! The data module on the real MNIST files (never downloaded: `TRAINRUN_DATA_DIR`, else
//! `../shared/data/mnist` beside the project), including a download served from a local
//! server, and timings (`cargo test --release --test data_mnist -- --ignored --nocapture`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use trainrun::data::download::verify;
use trainrun::data::{
    AnySource, Cursor, DataDirs, EvalBatches, Fetcher, Pipeline, PipelineOptions, Preset, Shard, Shuffle,
};
use trainrun::spec::DataSpec;

mod common;

fn mnist_dir() -> PathBuf {
    common::data_dir()
}

fn mnist() -> AnySource {
    let dirs = DataDirs { trainrun_data_dir: Some(mnist_dir()), ..DataDirs::default() };
    trainrun::plan::source(&DataSpec::default(), &dirs, 42).unwrap()
}

#[test]
fn real_mnist_loads_with_its_published_shape() {
    let source = mnist();
    assert!(source.missing_files().is_empty(), "MNIST not found in {:?}", source.dir());
    let data = source.load().unwrap();
    assert_eq!(data.train.len(), 60_000);
    let train = data.train.read(0..60_000).unwrap();
    assert_eq!(train.x.len(), 60_000 * 28 * 28);
    assert_eq!(data.train.shape(), [28, 28, 1]);
    let test = data.test.as_ref().unwrap();
    assert_eq!(test.len(), 10_000);
    assert!(train.y.iter().chain(&test.read(0..10_000).unwrap().y).all(|&l| l < 10));
    // Every digit occurs, and the first training label is the well-known 5.
    assert!((0..10).all(|d| train.y.contains(&d)));
    assert_eq!(train.y[0], 5);
    assert_eq!(source.facts().unwrap(), data.facts(1));
    assert!(data.bytes_held() < 56_000_000, "{}", data.bytes_held());
}

#[test]
fn real_mnist_matches_the_published_sha256() {
    let dir = mnist_dir();
    let preset = Preset::mnist();
    for file in [&preset.train_images, &preset.train_labels, &preset.test_images, &preset.test_labels] {
        assert_eq!(verify(&dir.join(&file.name), &file.checksum), Ok(()), "{}", file.name);
    }
}

#[test]
fn real_mnist_epoch_is_a_permutation_and_resumes() {
    let data = Arc::new(mnist().load().unwrap());
    let options = PipelineOptions {
        seed: 7,
        shuffle: Shuffle::Full,
        global_batch: NonZeroUsize::new(1000).unwrap(),
        drop_remainder: true,
        prefetch: 2,
        shard: Shard::WHOLE,
    };
    let mut pipeline = Pipeline::new(data.clone(), &options, Cursor::default()).unwrap();
    let mut counts = [0usize; 10];
    let mut first = vec![];
    for step in 0..60 {
        let batch = pipeline.next_batch().unwrap();
        assert_eq!((batch.n, batch.x.len()), (1000, 784_000));
        batch.y.iter().for_each(|&y| counts[y as usize] += 1);
        if step == 30 {
            first = batch.x.clone();
        }
        pipeline.recycle(batch);
    }
    // Each label as often as in the training set: the epoch used every example once.
    let mut want = [0usize; 10];
    data.train.read(0..data.train.len()).unwrap().y.iter().for_each(|&l| want[l as usize] += 1);
    assert_eq!(counts, want);
    assert_eq!(pipeline.cursor(), Cursor { epoch: 1, offset: 0 });
    let mut resumed = Pipeline::new(data, &options, Cursor { epoch: 0, offset: 30_000 }).unwrap();
    assert_eq!(resumed.next_batch().unwrap().x, first);
}

#[test]
fn eval_covers_the_test_split() {
    let data = mnist().load().unwrap();
    let test = data.test.as_ref().unwrap();
    let batches = EvalBatches::new(test, NonZeroUsize::new(128).unwrap(), Shard::WHOLE);
    let sizes: Vec<usize> = batches.map(|b| b.n).collect();
    assert_eq!(sizes.len(), 79);
    assert_eq!(sizes.iter().sum::<usize>(), 10_000);
    assert_eq!(sizes.last(), Some(&(10_000 - 78 * 128)));
}

/// Serves the real files over HTTP/1.0 on loopback; stops by itself after `max` requests or
/// 60 s.
fn serve(files: HashMap<String, Vec<u8>>, max: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut served = 0;
        while served < max && Instant::now() < deadline {
            let Ok((mut conn, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            };
            served += 1;
            let _ = conn.set_nonblocking(false);
            let mut request = vec![];
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).is_ok_and(|n| n == 1) {
                request.push(byte[0]);
            }
            let text = String::from_utf8_lossy(&request);
            let path = text.split_whitespace().nth(1).unwrap_or("/");
            let name = path.rsplit('/').next().unwrap_or("");
            match files.get(name) {
                Some(body) => {
                    let head = format!("HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                    let _ = conn.write_all(head.as_bytes());
                    let _ = conn.write_all(body);
                }
                None => {
                    let _ = conn.write_all(b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n");
                }
            }
        }
    });
    format!("http://{addr}/mnist/")
}

#[test]
fn mnist_downloads_from_a_local_mirror_verifies_and_loads() {
    let preset = Preset::mnist();
    let mut files = HashMap::new();
    for file in [&preset.train_images, &preset.train_labels, &preset.test_images, &preset.test_labels] {
        files.insert(file.name.clone(), std::fs::read(mnist_dir().join(&file.name)).unwrap());
    }
    // A first mirror with corrupt training images (the first file fetched): rejected by
    // checksum, then the second mirror is used.
    let mut corrupt = files.clone();
    let flipped = gz_with_one_pixel_changed(&files[&preset.train_images.name]);
    corrupt.insert(preset.train_images.name.clone(), flipped);
    let bad = serve(corrupt, 1);
    let good = serve(files, 4);
    let target = tempfile::tempdir().unwrap();
    let dirs = DataDirs { xdg_cache_home: Some(target.path().to_path_buf()), ..DataDirs::default() };
    let source = trainrun::plan::source(&DataSpec::default(), &dirs, 0).unwrap();
    assert_eq!(source.dir(), Some(target.path().join("trainrun/mnist").as_path()));
    // The bad mirror answers one request and stops, so later files meet a refused connection
    // there before the good mirror serves them.
    let written = source.fetch_missing(&Fetcher::with_mirrors(vec![bad, good])).unwrap();
    assert_eq!(written.len(), 4);
    let data = source.load().unwrap();
    assert_eq!((data.train.len(), data.test.map(|t| t.len())), (60_000, Some(10_000)));
}

/// A valid gzip of the same IDX file with one pixel changed: only the checksum can tell.
fn gz_with_one_pixel_changed(gz: &[u8]) -> Vec<u8> {
    let mut raw = vec![];
    flate2::read::GzDecoder::new(gz).read_to_end(&mut raw).unwrap();
    raw[1000] ^= 1;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(&raw).unwrap();
    enc.finish().unwrap()
}

/// Timings and memory for the report. Run alone, in release, so peak RSS means something.
#[test]
#[ignore = "measurement, not a check"]
fn measure() {
    let source = mnist();
    let t = Instant::now();
    let facts = source.facts().unwrap();
    let facts_time = t.elapsed();
    let mut loads = vec![];
    let mut data = None;
    for _ in 0..5 {
        // Drop the previous copy first, so peak memory is that of one load.
        drop(data.take());
        let t = Instant::now();
        data = Some(source.load().unwrap());
        loads.push(t.elapsed());
    }
    println!("after loading: {}", peak_rss());
    let images = mnist_dir().join(&Preset::mnist().train_images.name);
    let t = Instant::now();
    let train_images = trainrun::data::source::idx::read_idx(&images).unwrap();
    println!("train images alone (one thread): {:?}", t.elapsed());
    drop(train_images);
    let data = Arc::new(data.unwrap());
    let t = Instant::now();
    let synthetic = trainrun::plan::source(
        &DataSpec { dataset: trainrun::spec::DatasetKind::Synthetic, ..DataSpec::default() },
        &DataDirs::default(),
        1,
    )
    .unwrap()
    .load()
    .unwrap();
    let synthetic_time = t.elapsed();
    println!("facts (headers only): {facts_time:?} -> {facts:?}");
    println!("MNIST load train+test, 5 runs: {loads:?}");
    println!("synthetic 60k+10k x 784: {synthetic_time:?}");
    println!("bytes held: MNIST {} synthetic {}", data.bytes_held(), synthetic.bytes_held());
    drop(synthetic);
    for global in [64, 128] {
        let options = PipelineOptions {
            seed: 1,
            shuffle: Shuffle::Full,
            global_batch: NonZeroUsize::new(global).unwrap(),
            drop_remainder: true,
            prefetch: 2,
            shard: Shard::WHOLE,
        };
        let mut pipeline = Pipeline::new(data.clone(), &options, Cursor::default()).unwrap();
        let t = Instant::now();
        let steps = 5000;
        for _ in 0..steps {
            let batch = pipeline.next_batch().unwrap();
            pipeline.recycle(batch);
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "pipeline global batch {global}: {:.0} batches/s ({:.0} examples/s)",
            steps as f64 / s,
            (steps * global) as f64 / s
        );
    }
    println!("at the end: {}", peak_rss());
}

fn peak_rss() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let pick = |key: &str| {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap_or("");
        line.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
    };
    format!("peak RSS {}, RSS {}", pick("VmHWM"), pick("VmRSS"))
}
