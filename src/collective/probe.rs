//! The cost model measured at start-up, for `implementation = "auto"` per pack size
//! ([`SizeChoice`]). Every rank times the sum kernel (γ) and an all-reduce at 1 KB and
//! 512 KB: over TCP the job's own algorithm, from which the chief fits the network's α and β
//! ([`CostModel::fitted`]); over shared memory inside hosts and TCP across, halving-doubling
//! (every step over the network) for the network's α and β, then `hierarchical`, whose steps
//! inside the hosts give shared memory's α and β once the network's part is known
//! ([`CostModel::fitted_inside`]). The chief broadcasts its figures, so every rank chooses with
//! the same model. The chief keeps them in a file per job shape on its host (the cache), and
//! a later run of the same shape takes them from there instead of measuring again: the same
//! figures, the same choice per size, the same summation order and bits, run after run.
//! A spec that gives `[strategy.communication.cost_model]` is taken as it is, unmeasured.

use super::choice::SizeChoice;
use super::cost::{CostModel, LinkCost, Placement};
use super::reduce::add_assign_f32;
use super::{Algorithm, Collective, CollectiveError, Communicator, TransportKind};
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

/// The figures as the cache holds them: the network's α and β, γ, and shared memory's α and
/// β where the job measured them (shared memory inside hosts), each an f32 (what the
/// broadcast carries) so that a cached model is bit for bit the one first agreed on.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
struct Figures {
    network_latency_s: f32,
    network_s_per_byte: f32,
    sum_s_per_byte: f32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shared_memory_latency_s: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shared_memory_s_per_byte: Option<f32>,
}

/// Floats of the broadcast: found, the network's α and β, γ, whether shared memory's follow,
/// its α and β.
type ProbeMessage = [f32; 7];

impl Figures {
    fn as_message(self, found: bool) -> ProbeMessage {
        let shm = self.shared_memory_latency_s.zip(self.shared_memory_s_per_byte);
        let (a, b) = shm.unwrap_or((0.0, 0.0));
        let flag = |x: bool| f32::from(u8::from(x));
        [flag(found), self.network_latency_s, self.network_s_per_byte, self.sum_s_per_byte, flag(shm.is_some()), a, b]
    }

    fn from_message(m: ProbeMessage) -> Option<Figures> {
        let shm = (m[4] == 1.0).then_some((m[5], m[6]));
        (m[0] == 1.0).then_some(Figures {
            network_latency_s: m[1],
            network_s_per_byte: m[2],
            sum_s_per_byte: m[3],
            shared_memory_latency_s: shm.map(|s| s.0),
            shared_memory_s_per_byte: shm.map(|s| s.1),
        })
    }

    fn apply(self, model: CostModel) -> CostModel {
        let shm = self.shared_memory_latency_s.zip(self.shared_memory_s_per_byte);
        CostModel {
            network: LinkCost { alpha: f64::from(self.network_latency_s), beta: f64::from(self.network_s_per_byte) },
            shared_memory: shm
                .map_or(model.shared_memory, |(a, b)| LinkCost { alpha: f64::from(a), beta: f64::from(b) }),
            gamma: f64::from(self.sum_s_per_byte),
        }
    }
}

fn read_cache(path: &Path) -> Option<Figures> {
    let f: Figures = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let usable = |x: f32| x.is_finite() && x >= 0.0;
    let shm = [f.shared_memory_latency_s, f.shared_memory_s_per_byte].into_iter().flatten().all(usable);
    (usable(f.network_latency_s)
        && usable(f.network_s_per_byte)
        && f.sum_s_per_byte > 0.0
        && usable(f.sum_s_per_byte)
        && shm)
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

/// This rank's timings of an all-reduce at the two probe sizes, with whatever algorithm
/// `comm` runs now.
fn probe_times(comm: &mut dyn Communicator) -> Result<(f64, f64), CollectiveError> {
    let (mut small, mut large) = (vec![1.0f32; PROBE_FLOATS.0], vec![1.0f32; PROBE_FLOATS.1]);
    let t_small = median_secs(15, || comm.all_reduce_sum(&mut small))?;
    let t_large = median_secs(5, || comm.all_reduce_sum(&mut large))?;
    Ok((t_small, t_large))
}

const PROBE_BYTES: (usize, usize) = (PROBE_FLOATS.0 * 4, PROBE_FLOATS.1 * 4);

/// This rank's measurement: γ, then the network link fitted to its timings of `algorithm`
/// (the job's, not yet choosing per size) at the two probe sizes; over shared memory inside
/// hosts and TCP across, the network fitted to halving-doubling's timings and shared memory to
/// `hierarchical`'s. Every rank runs the same probes in the same order.
///
/// Halving-doubling, not the ring: `hierarchical`'s part among the hosts is halving-doubling,
/// where every rank sends at once, and on a network that all of them share (or on cores
/// fewer than the ranks) a message then costs more than one of the ring's, whose neighbours
/// take turns. Fitted to the ring (16 ranks as 8 hosts × 2 on the scale harness's link: 115
/// µs a message, halving-doubling's measured 215 µs), the model found halving-doubling
/// cheapest where it was 1.5–2× slower than `hierarchical`.
fn measure(comm: &mut Collective, auto: &AutoBySize, algorithm: Algorithm) -> Result<Option<Figures>, CollectiveError> {
    let gamma = sum_seconds_per_byte();
    let with_gamma = CostModel { gamma, ..auto.model };
    let (placement, transport) = (auto.placement, comm.transport());
    let figures = |net: LinkCost, shm: Option<LinkCost>| Figures {
        network_latency_s: net.alpha as f32,
        network_s_per_byte: net.beta as f32,
        sum_s_per_byte: gamma as f32,
        shared_memory_latency_s: shm.map(|l| l.alpha as f32),
        shared_memory_s_per_byte: shm.map(|l| l.beta as f32),
    };
    if !transport.routed() {
        let times = probe_times(comm.as_dyn())?;
        return Ok(with_gamma.fitted(algorithm, placement, PROBE_BYTES, times).map(|l| figures(l, None)));
    }
    // One algorithm at a time: a choice with a single candidate picks it at every size.
    let mut timed = |a: Algorithm| {
        comm.choose_by_size(SizeChoice { candidates: vec![a], ..SizeChoice::over(auto.model, transport, placement) })?;
        probe_times(comm.as_dyn())
    };
    let flat = timed(Algorithm::HalvingDoubling)?;
    let inside = if placement.per_host > 1 { Some(timed(Algorithm::Hierarchical)?) } else { None };
    let Some(network) = with_gamma.fitted(Algorithm::HalvingDoubling, placement, PROBE_BYTES, flat) else {
        return Ok(None);
    };
    let with_network = CostModel { network, ..with_gamma };
    let shm = inside.and_then(|times| with_network.fitted_inside(placement, PROBE_BYTES, times));
    Ok(Some(figures(network, shm)))
}

/// The choice per size every rank of `comm` agrees on: the spec's model, or the chief's
/// cached or measured figures (measured with `algorithm` over `transport`), broadcast.
/// Every rank calls it at the same point; the chief keeps new figures in `cache`.
pub fn agree(
    comm: &mut Collective,
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
    let mut head = cached.map_or([0.0; 7], |f| f.as_message(true));
    comm.broadcast(&mut head, 0)?;
    if let Some(f) = Figures::from_message(head) {
        let source = ModelSource::Cache(cache.map(Path::to_path_buf));
        return Ok((SizeChoice::over(f.apply(auto.model), transport, auto.placement), source));
    }
    let mine = measure(comm, auto, algorithm)?;
    let mut agreed = match mine {
        Some(f) if chief => f.as_message(true),
        Some(_) | None => [0.0; 7],
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
    let inside = match choice.transport.routed() {
        true => {
            format!("; shared memory α {:.1} µs, {:.2} GB/s", m.shared_memory.alpha * 1e6, 1e-9 / m.shared_memory.beta)
        }
        false => String::new(),
    };
    format!(
        "all-reduce cost model {from}: network α {:.1} µs, {:.2} GB/s{inside}; sums {:.2} GB/s; by pack size: {}",
        m.network.alpha * 1e6,
        1e-9 / m.network.beta,
        1e-9 / m.gamma,
        picks.join(", ")
    )
}
