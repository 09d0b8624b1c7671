//! The cost model measured at start-up, for `implementation = "auto"` per pack size
//! ([`SizeChoice`]). Every rank times the sum kernel (γ) and the job's own all-reduce at
//! 1 KB and 512 KB over the connected transport; the chief fits the network's α and β from
//! its timings ([`CostModel::fitted`]) and broadcasts its figures, so every rank chooses with
//! the same model. The chief keeps them in a file per job shape on its host (the cache), and
//! a later run of the same shape takes them from there instead of measuring again: the same
//! figures, the same choice per size, the same summation order and bits, run after run.
//! A spec that gives `[strategy.communication.cost_model]` is taken as it is, unmeasured.

use super::choice::SizeChoice;
use super::cost::{CostModel, LinkCost, Placement};
use super::reduce::add_assign_f32;
use super::{Algorithm, CollectiveError, Communicator, TransportKind};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What `implementation = "auto"` needs at run time to choose per pack size.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoBySize {
    /// The spec's model, or the defaults the start-up measurement replaces.
    pub model: CostModel,
    /// Whether to measure at start-up (or take the cache): false when the spec gives the
    /// model.
    pub measure: bool,
    pub placement: Placement,
    /// The pack sizes (bytes) the trainer all-reduces, to report the choice for.
    pub packs: Vec<usize>,
}

/// Where the model the ranks agreed on came from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSource {
    /// `[strategy.communication.cost_model]`.
    Spec,
    /// Measured now (and kept in the file, when there is one).
    Measured(Option<PathBuf>),
    /// The chief's file, which an earlier run of the same shape measured (its path on the
    /// chief).
    Cache(Option<PathBuf>),
}

/// Floats of the two probe sizes: 1 KB (latency) and 512 KB (bandwidth).
const PROBE_FLOATS: (usize, usize) = (256, 131_072);

/// The cache file for a job of `placement` over `transport`, in `dir` (the chief's
/// `$XDG_CACHE_HOME/trainrun`).
pub fn cache_file(dir: &Path, transport: TransportKind, placement: Placement) -> PathBuf {
    let Placement { ranks, hosts, per_host } = placement;
    dir.join("cost-model").join(format!("{}-{ranks}-ranks-{hosts}-hosts-{per_host}-a-host.json", transport.name()))
}

/// The figures as the cache holds them: the network's α and β and γ, each an f32 (what the
/// broadcast carries) so that a cached model is bit for bit the one first agreed on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
struct Figures {
    network_latency_s: f32,
    network_s_per_byte: f32,
    sum_s_per_byte: f32,
}

impl Figures {
    fn as_message(self, found: bool) -> [f32; 4] {
        [f32::from(u8::from(found)), self.network_latency_s, self.network_s_per_byte, self.sum_s_per_byte]
    }

    fn from_message(m: [f32; 4]) -> Option<Figures> {
        (m[0] == 1.0).then_some(Figures { network_latency_s: m[1], network_s_per_byte: m[2], sum_s_per_byte: m[3] })
    }

    fn apply(self, model: CostModel) -> CostModel {
        CostModel {
            network: LinkCost { alpha: f64::from(self.network_latency_s), beta: f64::from(self.network_s_per_byte) },
            gamma: f64::from(self.sum_s_per_byte),
            ..model
        }
    }
}

fn read_cache(path: &Path) -> Option<Figures> {
    let f: Figures = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let usable = |x: f32| x.is_finite() && x >= 0.0;
    (usable(f.network_latency_s) && usable(f.network_s_per_byte) && f.sum_s_per_byte > 0.0 && usable(f.sum_s_per_byte))
        .then_some(f)
}

fn write_cache(path: &Path, f: Figures) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Written whole, then renamed: a run that reads it never sees half a file.
    let partial = path.with_extension(format!("partial-{}", std::process::id()));
    std::fs::write(&partial, serde_json::to_vec_pretty(&f).unwrap_or_default())?;
    std::fs::rename(&partial, path)
}

/// The median of `reps` timings of `f`, in seconds, after one untimed call.
fn median_secs(reps: usize, mut f: impl FnMut() -> Result<(), CollectiveError>) -> Result<f64, CollectiveError> {
    f()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Seconds per byte summed by the kernel the algorithms use.
fn sum_seconds_per_byte() -> f64 {
    let (mut dst, src) = (vec![1.0f32; 262_144], vec![0.5f32; 262_144]);
    let secs = median_secs(9, || {
        add_assign_f32(&mut dst, std::hint::black_box(&src));
        Ok(())
    })
    .unwrap_or(0.0);
    (secs / (dst.len() * 4) as f64).max(1e-13)
}

/// This rank's measurement: γ, then the network link fitted to its timings of `algorithm`
/// (the job's, not yet choosing per size) at the two probe sizes.
fn measure(
    comm: &mut dyn Communicator,
    algorithm: Algorithm,
    placement: Placement,
) -> Result<Option<Figures>, CollectiveError> {
    let gamma = sum_seconds_per_byte();
    let (mut small, mut large) = (vec![1.0f32; PROBE_FLOATS.0], vec![1.0f32; PROBE_FLOATS.1]);
    let t_small = median_secs(15, || comm.all_reduce_sum(&mut small))?;
    let t_large = median_secs(5, || comm.all_reduce_sum(&mut large))?;
    let with_gamma = CostModel { gamma, ..CostModel::default() };
    let link = with_gamma.fitted(algorithm, placement, (PROBE_FLOATS.0 * 4, PROBE_FLOATS.1 * 4), (t_small, t_large));
    Ok(link.map(|l| Figures {
        network_latency_s: l.alpha as f32,
        network_s_per_byte: l.beta as f32,
        sum_s_per_byte: gamma as f32,
    }))
}

/// The choice per size every rank of `comm` agrees on: the spec's model, or the chief's
/// cached or measured figures (measured with `algorithm` over `transport`), broadcast.
/// Every rank calls it at the same point; the chief keeps new figures in `cache`.
pub fn agree(
    comm: &mut dyn Communicator,
    auto: &AutoBySize,
    algorithm: Algorithm,
    cache: Option<&Path>,
) -> Result<(SizeChoice, ModelSource), CollectiveError> {
    let transport = comm.transport();
    if !auto.measure {
        return Ok((SizeChoice::over(auto.model, transport, auto.placement), ModelSource::Spec));
    }
    let chief = comm.rank() == 0;
    let cached = if chief { cache.and_then(read_cache) } else { None };
    let mut head = cached.map_or([0.0; 4], |f| f.as_message(true));
    comm.broadcast(&mut head, 0)?;
    if let Some(f) = Figures::from_message(head) {
        let source = ModelSource::Cache(cache.map(Path::to_path_buf));
        return Ok((SizeChoice::over(f.apply(auto.model), transport, auto.placement), source));
    }
    let mine = measure(comm, algorithm, auto.placement)?;
    let mut agreed = match mine {
        Some(f) if chief => f.as_message(true),
        Some(_) | None => [0.0; 4],
    };
    comm.broadcast(&mut agreed, 0)?;
    let Some(figures) = Figures::from_message(agreed) else {
        // The job's algorithm sends no messages to fit: the defaults stand.
        return Ok((SizeChoice::over(auto.model, transport, auto.placement), ModelSource::Spec));
    };
    let kept = match cache {
        Some(path) if chief => match write_cache(path, figures) {
            Ok(()) => Some(path.to_path_buf()),
            Err(e) => {
                eprintln!("trainrun: could not keep the measured cost model in {}: {e}", path.display());
                None
            }
        },
        Some(_) | None => None,
    };
    Ok((SizeChoice::over(figures.apply(auto.model), transport, auto.placement), ModelSource::Measured(kept)))
}

/// One line for the chief's log: where the model came from, its figures, and the algorithm
/// each of `packs` takes.
pub fn describe(choice: &SizeChoice, source: &ModelSource, packs: &[usize]) -> String {
    let m = &choice.model;
    let from = match source {
        ModelSource::Spec => "from the spec".to_string(),
        ModelSource::Measured(Some(p)) => format!("measured at start-up, kept in {}", p.display()),
        ModelSource::Measured(None) => "measured at start-up".to_string(),
        ModelSource::Cache(Some(p)) => format!("measured by an earlier run, from {}", p.display()),
        ModelSource::Cache(None) => "measured by an earlier run".to_string(),
    };
    let size = |b: usize| match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / 1_048_576.0),
    };
    let picks: Vec<String> = packs.iter().map(|&b| format!("{} → {}", size(b), choice.pick(b).name())).collect();
    format!(
        "all-reduce cost model {from}: network α {:.1} µs, {:.2} GB/s; sums {:.2} GB/s; by pack size: {}",
        m.network.alpha * 1e6,
        1e-9 / m.network.beta,
        1e-9 / m.gamma,
        picks.join(", ")
    )
}
