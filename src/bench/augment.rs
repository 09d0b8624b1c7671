//! `trainrun bench`'s augmentation row: a folder of 50,000 32×32 RGB PNGs (generated once into
//! the cache folder, uniform noise: PNG's slowest case) read the way training reads it — the
//! `image_folder` source decoding in parallel, then `random_crop = { padding = 4 }` and
//! `random_flip = "horizontal"` — in batches of 256 on two threads. Target: 20,000 images/s.
//! Decoding alone is timed beside it, alternately, so the augmentation's share shows whatever
//! the load; CPU seconds come from `getrusage`, which the load does not inflate.

use crate::data::formats::bench::write_png_folder;
use crate::data::preprocess::Crop;
use crate::data::{Batch, DataSource, ImageFolderConfig, ImageFolderSource, Preprocessing, Split};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Examples per read: a typical global batch.
const BATCH: usize = 256;

/// One timed pass over a split.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedPass {
    pub images: usize,
    pub wall_s: f64,
    pub cpu_s: f64,
}

impl TimedPass {
    /// Images per wall-clock second.
    pub fn images_per_s(&self) -> f64 {
        self.images as f64 / self.wall_s.max(1e-9)
    }
}

/// Decode-only and decode+augment passes over the folder, alternated `rounds` times.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub decode: Vec<TimedPass>,
    pub augmented: Vec<TimedPass>,
}

/// Where the generated folder is kept between runs: `$XDG_CACHE_HOME/trainrun/bench`, else
/// `~/.cache/trainrun/bench`, else the temporary folder.
pub fn cache_dir() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("trainrun").join("bench")
}

/// The folder of `images` PNGs under `root`, written unless a previous run completed it.
pub fn png_folder(root: &Path, images: usize) -> Result<PathBuf, String> {
    let dir = root.join(format!("png32-{images}"));
    let done = dir.join("complete");
    if !done.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        write_png_folder(&dir.join("train"), images, 1).map_err(|e| e.to_string())?;
        std::fs::write(&done, b"").map_err(|e| format!("{}: {e}", done.display()))?;
    }
    Ok(dir)
}

/// CPU seconds (user + system) this process has used.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(usage.ru_utime) + t(usage.ru_stime)
}

/// Reads every example of `split` in batches, as the training pipeline's thread does.
fn pass(split: &Split, pool: &rayon::ThreadPool, epoch: u64) -> Result<TimedPass, String> {
    let indices: Vec<usize> = (0..split.len()).collect();
    let mut batch = Batch::default();
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    pool.install(|| {
        indices.chunks(BATCH).try_for_each(|chunk| {
            batch.x.clear();
            batch.y.clear();
            split.append_many_in_epoch(epoch, chunk, &mut batch)
        })
    })
    .map_err(|e| e.to_string())?;
    Ok(TimedPass { images: indices.len(), wall_s: wall.elapsed().as_secs_f64(), cpu_s: cpu_seconds() - cpu })
}

/// Times decode-only and decode+augment passes over `folder` on `threads` threads.
pub fn measure(folder: &Path, threads: usize, rounds: usize) -> Result<Measured, String> {
    let side = NonZeroUsize::new(32).unwrap_or(NonZeroUsize::MIN);
    let config = ImageFolderConfig { image_size: [side, side], ..ImageFolderConfig::default() };
    let source = ImageFolderSource { config, dir: folder.to_path_buf() };
    let plain = source.load().map_err(|e| e.to_string())?;
    let augment =
        Preprocessing { crop: Some(Crop { padding: 4, height: 32, width: 32 }), flip: true, ..Default::default() };
    let (augmented, _) = augment.apply(plain.clone(), 7).map_err(|e| e.to_string())?;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().map_err(|e| e.to_string())?;
    let mut m = Measured { decode: vec![], augmented: vec![] };
    for round in 0..rounds as u64 {
        m.decode.push(pass(&plain.train, &pool, round)?);
        m.augmented.push(pass(&augmented.train, &pool, round)?);
    }
    Ok(m)
}

fn best(passes: &[TimedPass]) -> TimedPass {
    passes.iter().copied().fold(passes[0], |b, p| if p.wall_s < b.wall_s { p } else { b })
}

/// Prints the row (a tenth of the images with `quick`).
pub fn run(quick: bool) -> Result<(), String> {
    let images = if quick { 5_000 } else { 50_000 };
    let folder = png_folder(&cache_dir(), images)?;
    let m = measure(&folder, 2, 3)?;
    let (d, a) = (best(&m.decode), best(&m.augmented));
    println!("\n== input: {images} 32×32 PNGs (cached in {}), 2 threads, best of 3 alternated", folder.display());
    println!(
        "png decode + random crop (pad 4) + flip: {:.0} images/s (target ≥ 20,000), {:.1} µs CPU per image",
        a.images_per_s(),
        1e6 * a.cpu_s / a.images as f64
    );
    println!(
        "png decode alone: {:.0} images/s, {:.1} µs CPU per image; crop and flip cost {:.1} % more CPU",
        d.images_per_s(),
        1e6 * d.cpu_s / d.images as f64,
        100.0 * (a.cpu_s / d.cpu_s.max(1e-9) - 1.0)
    );
    Ok(())
}
