//! The cost model measured at start-up, for `implementation = "auto"` per pack size
//! ([`SizeChoice`]). Every rank times the sum kernel (γ) and, at 1 KB and at the job's
//! largest pack (within 64 KiB … 4 MiB: [`AutoBySize::probe_floats`]), each algorithm it may
//! choose on its own terms: the ring and halving-doubling (every step over
//! the network), `hierarchical`'s steps inside the hosts alone (an all-reduce among each
//! host's ranks, over shared memory where the transport routes by host:
//! [`HierarchicalPart::InsideHosts`]), then the whole `hierarchical`. The chief fits a link to
//! each ([`CostModel::fitted`], [`CostModel::fitted_part`]): the network as the ring meets it,
//! as halving-doubling meets it (every rank sending at once), inside the hosts, and among the
//! leaders from the whole less the inside part at its own link
//! ([`CostModel::fitted_among_leaders`]; [`AlgorithmLinks`]). The chief broadcasts its
//! figures, so every rank chooses with the same model. The chief keeps them in a file per job
//! shape on its host (the cache), and a later run of the same shape takes them from there
//! instead of measuring again: the same figures, the same choice per size, the same summation
//! order and bits, run after run.
//! A spec that gives `[strategy.communication.cost_model]` is taken as it is, unmeasured.

use super::choice::SizeChoice;
use super::cost::{AlgorithmLinks, CostModel, LinkCost, Placement};
use super::reduce::add_assign_f32;
use super::{Algorithm, Collective, CollectiveError, Communicator, HierarchicalPart, TransportKind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    /// Measured now (and kept in the file, when there is one), in `took`.
    Measured { kept: Option<PathBuf>, took: Duration },
    /// The chief's file, which an earlier run of the same shape measured (its path on the
    /// chief).
    Cache(Option<PathBuf>),
}

/// Floats of the small probe size, 1 KB: the latency.
const SMALL_FLOATS: usize = 256;

/// The large probe size's bounds in floats, 64 KiB and 4 MiB (the default pack): below, β
/// would rest on too few bytes; above, one timing of halving-doubling among 64 processes on
/// 2 cores takes most of a second.
const LARGE_FLOATS: (usize, usize) = (16_384, 1_048_576);

impl AutoBySize {
    /// The probe's two sizes in floats: 1 KB, and the largest pack within [`LARGE_FLOATS`]
    /// (512 KB when there are no packs). At the size it chooses for, the fitted model gives
    /// back what was timed; from a fixed 512 KB it extrapolated, and on the scale harness every
    /// algorithm's time grows faster than its bytes past that: 16 MB took 1.3–2.2× what the
    /// fit at 1 KB and 512 KB predicted, by a different factor per algorithm, enough to turn
    /// the choice (`docs/cost-model.md`).
    pub fn probe_floats(&self) -> (usize, usize) {
        let largest = self.packs.iter().max().map_or(131_072, |b| b / 4);
        (SMALL_FLOATS, largest.clamp(LARGE_FLOATS.0, LARGE_FLOATS.1))
    }
}

/// The cache file for a job of `auto`'s placement over `transport`, in `dir` (the chief's
/// `$XDG_CACHE_HOME/trainrun`): one per shape and large probe size, since the figures are
/// fitted at that size.
pub fn cache_file(dir: &Path, transport: TransportKind, auto: &AutoBySize) -> PathBuf {
    let Placement { ranks, hosts, per_host } = auto.placement;
    let bytes = auto.probe_floats().1 * 4;
    let name = format!("{}-{ranks}-ranks-{hosts}-hosts-{per_host}-a-host-{bytes}-bytes.json", transport.name());
    dir.join("cost-model").join(name)
}

/// The figures as the cache holds them: γ, and each measured link's α (s) and β (s a byte)
/// ([`AlgorithmLinks`]), each an f32 (what the broadcast carries) so that a cached model is bit for
/// bit the one first agreed on. A file of an older layout does not parse and is measured again.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
struct Figures {
    sum_s_per_byte: f32,
    ring: [f32; 2],
    halving_doubling: [f32; 2],
    inside_hosts: [f32; 2],
    among_leaders: [f32; 2],
}

/// Floats of the broadcast: found, γ, then α and β of the ring, halving-doubling, inside the
/// hosts and among the leaders.
type ProbeMessage = [f32; 10];

impl Figures {
    fn new(gamma: f64, m: AlgorithmLinks) -> Figures {
        let pair = |l: LinkCost| [l.alpha as f32, l.beta as f32];
        Figures {
            sum_s_per_byte: gamma as f32,
            ring: pair(m.ring),
            halving_doubling: pair(m.halving_doubling),
            inside_hosts: pair(m.inside_hosts),
            among_leaders: pair(m.among_leaders),
        }
    }

    fn links(&self) -> [[f32; 2]; 4] {
        [self.ring, self.halving_doubling, self.inside_hosts, self.among_leaders]
    }

    fn as_message(self, found: bool) -> ProbeMessage {
        let mut m = [0.0; 10];
        m[0] = f32::from(u8::from(found));
        m[1] = self.sum_s_per_byte;
        for (i, [a, b]) in self.links().into_iter().enumerate() {
            (m[2 + 2 * i], m[3 + 2 * i]) = (a, b);
        }
        m
    }

    fn from_message(m: ProbeMessage) -> Option<Figures> {
        (m[0] == 1.0).then_some(Figures {
            sum_s_per_byte: m[1],
            ring: [m[2], m[3]],
            halving_doubling: [m[4], m[5]],
            inside_hosts: [m[6], m[7]],
            among_leaders: [m[8], m[9]],
        })
    }

    fn apply(self, model: CostModel) -> CostModel {
        let link = |[a, b]: [f32; 2]| LinkCost { alpha: f64::from(a), beta: f64::from(b) };
        CostModel {
            gamma: f64::from(self.sum_s_per_byte),
            measured: Some(AlgorithmLinks {
                ring: link(self.ring),
                halving_doubling: link(self.halving_doubling),
                inside_hosts: link(self.inside_hosts),
                among_leaders: link(self.among_leaders),
            }),
            ..model
        }
    }
}

fn read_cache(path: &Path) -> Option<Figures> {
    let f: Figures = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let usable = |x: f32| x.is_finite() && x >= 0.0;
    (f.sum_s_per_byte > 0.0 && usable(f.sum_s_per_byte) && f.links().into_iter().flatten().all(usable)).then_some(f)
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
    let secs = median_secs(5, || {
        add_assign_f32(&mut dst, std::hint::black_box(&src));
        Ok(())
    })
    .unwrap_or(0.0);
    (secs / (dst.len() * 4) as f64).max(1e-13)
}

/// How many timings one probe size takes ([`probe_times`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reps {
    /// Timings at least: the chief may stop the probe once this many have settled.
    least: usize,
    /// Timings at most, settled or not.
    most: usize,
}

/// 1 KB, then the large size. Before, a fixed 15 and 5 took about 2.4 s of a 64-task rendezvous on
/// 2 cores (4.4 s against 2.0 for a named algorithm, target ≤ 3 s); the 512 KB timings of the
/// slowest algorithm there take about 90 ms each. Where the timings agree, 4 and 3 give the
/// median; where they do not, the probe goes on, to 9 and 5 at most. Where timings are cheap it
/// takes more ([`chief_stops`]).
const REPS: (Reps, Reps) = (Reps { least: 4, most: 9 }, Reps { least: 3, most: 5 });

/// Seconds of timings one size takes at least before a settled median ends it, and before an
/// unsettled one may end at [`Reps::most`]. Where a timing is cheap, a handful of them left the
/// pick to chance: 4 ranks as 2 × 2 at 1 KB, 0.2 ms a timing, picked halving-doubling in 4 of 10
/// launches (0.38 ms, where `hierarchical` ran 0.33). At 64 tasks these budgets are spent
/// by the least count already, so the rendezvous there costs what it did.
const SETTLE_AFTER_S: f64 = 0.010;
const UNSETTLED_BUDGET_S: f64 = 0.040;

/// Timings of one size at most, whatever they cost.
const CAP: usize = 200;

/// Whether the chief ends a size's timings with the next call, having taken `t`.
fn chief_stops(t: &[f64], reps: Reps) -> bool {
    let (next, spent) = (t.len() + 1, t.iter().sum::<f64>());
    next >= reps.least
        && ((settled(t) && spent >= SETTLE_AFTER_S) || (next >= reps.most && spent >= UNSETTLED_BUDGET_S))
}

/// How close the timings around the median must lie, as a fraction of it, to call the median
/// settled.
const SETTLED: f64 = 0.1;

/// Whether the timings `t` so far pin their median down: the slowest less the fastest within
/// [`SETTLED`] of the median, from 4 timings on leaving out the fastest and the slowest, so that one outlier at either end (a
/// rank descheduled once) does not keep the probe going.
fn settled(t: &[f64]) -> bool {
    if t.len() < 2 {
        return false;
    }
    let mut s = t.to_vec();
    s.sort_by(f64::total_cmp);
    let median = s[s.len() / 2];
    let trim = usize::from(s.len() >= 4);
    let kept = &s[trim..s.len() - trim];
    kept[kept.len() - 1] - kept[0] <= SETTLED * median
}

/// Whether every rank's all-reduce reads every rank's data, which lets the chief's verdict
/// ride in the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    Everyone,
    /// A part of `hierarchical` sums among some ranks only (each host's, or the leaders): it
    /// runs the least count, the same on every rank.
    Part,
}

/// This rank's timings of `all_reduce` at the two probe sizes: the median of each.
///
/// Each timing starts from a barrier (untimed), so it is one all-reduce from a common start,
/// as a step's pack after the backward pass and the bench's rows see it. Back to back, the
/// ranks' successive all-reduces overlap, and differently per algorithm: 4 ranks as 2 hosts ×
/// 2 timed `hierarchical` at 1 KB slower than halving-doubling (about 0.36 against 0.30 ms)
/// where from a barrier it was faster (0.28 against 0.36).
///
/// Every rank must run as many as the chief: the first float of each all-reduce carries the
/// chief's verdict on its timings before it (1: settled, this call is the last; the other ranks
/// add 0), so every rank reads the same verdict from the sum, at no extra message. Only the
/// chief's timings are fitted ([`agree`] broadcasts its figures).
fn probe_times(
    comm: &mut Collective,
    floats: (usize, usize),
    reach: Reach,
    mut all_reduce: impl FnMut(&mut Collective, &mut [f32]) -> Result<(), CollectiveError>,
) -> Result<(f64, f64), CollectiveError> {
    let chief = comm.rank() == 0;
    let (mut small, mut large) = (vec![1.0f32; floats.0], vec![1.0f32; floats.1]);
    let mut median = |reps: Reps, warm_up: bool, data: &mut [f32]| -> Result<f64, CollectiveError> {
        let most = match reach {
            Reach::Everyone => CAP,
            Reach::Part => reps.least,
        };
        let mut t: Vec<f64> = Vec::with_capacity(most);
        let mut warm = !warm_up;
        loop {
            let last = warm && t.len() + 1 >= most;
            let early = reach == Reach::Everyone && chief && chief_stops(&t, reps);
            data[0] = f32::from(u8::from(early));
            comm.as_dyn().barrier()?;
            let start = Instant::now();
            all_reduce(comm, data)?;
            let took = start.elapsed().as_secs_f64();
            if !warm {
                warm = true;
                continue;
            }
            t.push(took);
            if last || (reach == Reach::Everyone && data[0] >= 0.5) {
                break;
            }
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    };
    // One untimed call at 1 KB first: the first collective of an algorithm sets up its
    // connections and buffers. The large timings need none (the median sets a slow first one
    // aside), and each costs up to 90 ms at 64 tasks on 2 cores at 512 KB.
    let t_small = median(REPS.0, true, &mut small)?;
    let t_large = median(REPS.1, false, &mut large)?;
    Ok((t_small, t_large))
}

/// This rank's timings of `algorithm` alone (a choice with a single candidate picks it at
/// every size), or `None` when it is not among the candidates `comm` was connected for.
fn time_algorithm(
    comm: &mut Collective,
    choice: &SizeChoice,
    floats: (usize, usize),
    algorithm: Algorithm,
) -> Result<Option<(f64, f64)>, CollectiveError> {
    if !choice.candidates.contains(&algorithm) {
        return Ok(None);
    }
    comm.choose_by_size(choice.only(algorithm))?;
    probe_times(comm, floats, Reach::Everyone, |c, data| c.as_dyn().all_reduce_sum(data)).map(Some)
}

/// This rank's timings of `part` of `hierarchical` alone, or `None` where it sends nothing
/// (one rank a host, or one host) or `hierarchical` is not a candidate. Timed alone, the
/// leaders' step read 150 µs a message between 2 hosts where the whole measured about 125, so
/// the probe times the inside part alone (small and steady) and the leaders within the whole.
fn time_part(
    comm: &mut Collective,
    choice: &SizeChoice,
    floats: (usize, usize),
    part: HierarchicalPart,
) -> Result<Option<(f64, f64)>, CollectiveError> {
    let ranks = match part {
        HierarchicalPart::InsideHosts => choice.placement.per_host,
        HierarchicalPart::AmongLeaders => choice.placement.hosts,
    };
    if ranks < 2 || !choice.candidates.contains(&Algorithm::Hierarchical) {
        return Ok(None);
    }
    probe_times(comm, floats, Reach::Part, |c, data| c.all_reduce_part(part, data)).map(Some)
}

/// This rank's measurement: γ, then a link fitted to its own timings of each candidate at the
/// two probe sizes ([`AlgorithmLinks`]), `hierarchical`'s among the leaders from its whole time less
/// its steps inside the hosts, timed alone. Every rank runs the same probes in the same order. A part
/// that sends nothing (or an algorithm that is not a candidate) takes the nearest measured
/// link: its terms are zero, or it is never chosen. `None` when neither flat algorithm could
/// be fitted: the defaults stand.
///
/// Each algorithm its own link, because one network figure cannot price them all: fitted to
/// the ring (16 ranks as 8 hosts × 2 on the scale harness's link), the model found
/// halving-doubling cheapest where it was 1.5–2× slower than `hierarchical`; fitted to
/// halving-doubling, it priced the ring's bytes out at 16 MB where the ring was fastest, and
/// shared memory, fitted to what `hierarchical`'s time left after the network's estimate,
/// came out at zero latency and unbounded bandwidth (`docs/cost-model.md`).
fn measure(comm: &mut Collective, auto: &AutoBySize) -> Result<Option<Figures>, CollectiveError> {
    let gamma = sum_seconds_per_byte();
    let model = CostModel { gamma, measured: None, ..auto.model };
    let (placement, transport) = (auto.placement, comm.transport());
    let choice = SizeChoice::over(auto.model, transport, placement);
    let floats = auto.probe_floats();
    let bytes = (floats.0 * 4, floats.1 * 4);
    let ring = time_algorithm(comm, &choice, floats, Algorithm::Ring)?;
    let hd = time_algorithm(comm, &choice, floats, Algorithm::HalvingDoubling)?;
    let inside = time_part(comm, &choice, floats, HierarchicalPart::InsideHosts)?;
    let whole = match placement.hosts > 1 {
        true => time_algorithm(comm, &choice, floats, Algorithm::Hierarchical)?,
        false => None,
    };
    let flat = |a: Algorithm, t: Option<(f64, f64)>| t.and_then(|t| model.fitted(a, placement, bytes, t));
    let (ring, hd) = (flat(Algorithm::Ring, ring), flat(Algorithm::HalvingDoubling, hd));
    let Some(network) = ring.or(hd) else {
        return Ok(None);
    };
    let hd = hd.unwrap_or(network);
    let inside_default = if transport.routed() { model.shared_memory } else { network };
    let inside = inside.and_then(|t| model.fitted_part(HierarchicalPart::InsideHosts, placement, bytes, t));
    let inside = inside.unwrap_or(inside_default);
    let among = whole.and_then(|t| model.fitted_among_leaders(placement, bytes, t, inside));
    let measured = AlgorithmLinks {
        ring: ring.unwrap_or(hd),
        halving_doubling: hd,
        inside_hosts: inside,
        among_leaders: among.unwrap_or(hd),
    };
    Ok(Some(Figures::new(gamma, measured)))
}

/// The choice per size every rank of `comm` agrees on: the spec's model, or the chief's
/// cached or measured figures ([`measure`]), broadcast.
/// Every rank calls it at the same point; the chief keeps new figures in `cache`.
pub fn agree(
    comm: &mut Collective,
    auto: &AutoBySize,
    cache: Option<&Path>,
) -> Result<(SizeChoice, ModelSource), CollectiveError> {
    let transport = comm.transport();
    if !auto.measure {
        return Ok((SizeChoice::over(auto.model, transport, auto.placement), ModelSource::Spec));
    }
    let chief = comm.rank() == 0;
    let cached = if chief { cache.and_then(read_cache) } else { None };
    let mut head = cached.map_or([0.0; 10], |f| f.as_message(true));
    comm.broadcast(&mut head, 0)?;
    if let Some(f) = Figures::from_message(head) {
        let source = ModelSource::Cache(cache.map(Path::to_path_buf));
        return Ok((SizeChoice::over(f.apply(auto.model), transport, auto.placement), source));
    }
    let start = Instant::now();
    let mine = measure(comm, auto)?;
    let mut agreed = match mine {
        Some(f) if chief => f.as_message(true),
        Some(_) | None => [0.0; 10],
    };
    comm.broadcast(&mut agreed, 0)?;
    let Some(figures) = Figures::from_message(agreed) else {
        // Nothing sent messages to fit: the defaults stand.
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
    Ok((
        SizeChoice::over(figures.apply(auto.model), transport, auto.placement),
        ModelSource::Measured { kept, took: start.elapsed() },
    ))
}

/// One line for the chief's log: where the model came from, its figures, and the algorithm
/// each of `packs` takes.
pub fn describe(choice: &SizeChoice, source: &ModelSource, packs: &[usize]) -> String {
    let m = &choice.model;
    let from = match source {
        ModelSource::Spec => "from the spec".to_string(),
        ModelSource::Measured { kept: Some(p), took } => {
            format!("measured at start-up ({:.2} s), kept in {}", took.as_secs_f64(), p.display())
        }
        ModelSource::Measured { kept: None, took } => format!("measured at start-up ({:.2} s)", took.as_secs_f64()),
        ModelSource::Cache(Some(p)) => format!("measured by an earlier run, from {}", p.display()),
        ModelSource::Cache(None) => "measured by an earlier run".to_string(),
    };
    let size = |b: usize| match b {
        0..1024 => format!("{b} B"),
        1024..1_048_576 => format!("{:.1} KiB", b as f64 / 1024.0),
        _ => format!("{:.1} MiB", b as f64 / 1_048_576.0),
    };
    let picks: Vec<String> = packs.iter().map(|&b| format!("{} → {}", size(b), choice.pick(b).name())).collect();
    let link = |l: LinkCost| format!("α {:.1} µs, {:.2} GB/s", l.alpha * 1e6, 1e-9 / l.beta);
    let links = match (&m.measured, choice.transport.routed()) {
        (Some(x), routed) => {
            let inside = if routed { "shared memory" } else { "network" };
            format!(
                "ring {}; halving_doubling {}; hierarchical inside hosts ({inside}) {}, among leaders {}",
                link(x.ring),
                link(x.halving_doubling),
                link(x.inside_hosts),
                link(x.among_leaders)
            )
        }
        (None, true) => format!("network {}; shared memory {}", link(m.network), link(m.shared_memory)),
        (None, false) => format!("network {}", link(m.network)),
    };
    format!(
        "all-reduce cost model {from}: {links}; sums {:.2} GB/s; by pack size: {}",
        1e-9 / m.gamma,
        picks.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> Figures {
        let link = |a: f64, gb: f64| LinkCost { alpha: a * 1e-6, beta: 1.0 / (gb * 1e9) };
        let measured = AlgorithmLinks {
            ring: link(101.0, 0.12),
            halving_doubling: link(170.0, 0.06),
            inside_hosts: link(7.5, 1.3),
            among_leaders: link(160.0, 0.13),
        };
        Figures::new(1.0 / 16e9, measured)
    }

    #[test]
    fn the_broadcast_and_the_cache_carry_every_link_bit_for_bit() {
        let f = figures();
        assert_eq!(Figures::from_message(f.as_message(true)), Some(f));
        assert_eq!(Figures::from_message(f.as_message(false)), None, "not found: measure");
        let model = f.apply(CostModel::default());
        let m = model.measured.expect("measured links");
        assert_eq!(m.ring.alpha, f64::from(f.ring[0]));
        assert_eq!(m.among_leaders.beta, f64::from(f.among_leaders[1]));
        // Each algorithm priced at its own link.
        let shape = Placement { ranks: 16, hosts: 8, per_host: 2 };
        let hd = model.estimate(Algorithm::HalvingDoubling, TransportKind::SharedMemoryAndTcp, shape, 1 << 20);
        assert_eq!(hd, Some(model.halving_doubling(m.halving_doubling, 16, f64::from(1 << 20))));
    }

    #[test]
    fn the_median_is_settled_when_the_timings_agree_but_for_one_outlier_at_each_end() {
        assert!(!settled(&[]) && !settled(&[1.0]), "one timing settles nothing");
        assert!(settled(&[1.0, 1.05]) && !settled(&[1.0, 1.2]));
        assert!(settled(&[1.0, 1.02, 0.98]));
        assert!(!settled(&[1.0, 1.02, 3.0]), "three timings, one far off: go on");
        assert!(settled(&[1.0, 1.02, 3.0, 0.99]), "four: the slowest is set aside");
        assert!(settled(&[0.2, 1.0, 1.02, 3.0, 0.99]), "five: one outlier at each end");
        assert!(!settled(&[1.0, 1.02, 3.0, 3.1]), "two far off");
        assert!(!settled(&[1.0, 1.5, 2.0, 2.5, 3.0]), "spread out: go on to the most");
    }

    #[test]
    fn cheap_timings_go_on_until_their_budget_and_dear_ones_stop_as_before() {
        let small = REPS.0;
        // 64 tasks at 1 KB, about 5 ms a timing: settled after the least, unsettled at the most.
        assert!(!chief_stops(&[5e-3; 3][..2], small) && chief_stops(&[5e-3; 3], small));
        let spread = [4e-3, 6e-3, 8e-3, 5e-3, 9e-3, 4e-3, 7e-3, 8e-3];
        assert!(!chief_stops(&spread[..7], small) && chief_stops(&spread, small));
        // 4 ranks at 1 KB, 0.2 ms a timing: settled only once 10 ms are spent.
        assert!(!chief_stops(&[2e-4; 48], small) && chief_stops(&[2e-4; 60], small));
        let cheap_spread: Vec<f64> = (0..120).map(|i| [1e-4, 6e-4][i % 2]).collect();
        assert!(!chief_stops(&cheap_spread[..100], small) && chief_stops(&cheap_spread, small));
    }

    #[test]
    fn the_large_probe_is_the_largest_pack_within_its_bounds_and_names_the_cache_file() {
        let shape = Placement { ranks: 16, hosts: 8, per_host: 2 };
        let auto =
            |packs: Vec<usize>| AutoBySize { model: CostModel::default(), measure: true, placement: shape, packs };
        // The scale harness's MLP: one pack of 99.4 KiB.
        assert_eq!(auto(vec![101_800]).probe_floats(), (256, 25_450));
        assert_eq!(auto(vec![4 << 20, 1_000_000]).probe_floats(), (256, 1 << 20), "the largest pack");
        assert_eq!(auto(vec![64 << 20]).probe_floats(), (256, 1 << 20), "at most 4 MiB");
        assert_eq!(auto(vec![1024]).probe_floats(), (256, 16_384), "at least 64 KiB");
        assert_eq!(auto(Vec::new()).probe_floats(), (256, 131_072), "no packs: 512 KB");
        // Figures fitted at one size are not taken for another.
        let routed = TransportKind::SharedMemoryAndTcp;
        let file = cache_file(Path::new("/c"), routed, &auto(vec![101_800]));
        assert_eq!(file, Path::new("/c/cost-model/shared_memory_and_tcp-16-ranks-8-hosts-2-a-host-101800-bytes.json"));
        assert_ne!(cache_file(Path::new("/c"), routed, &auto(vec![4 << 20])), file);
    }

    #[test]
    fn a_cache_file_of_the_older_layout_is_measured_again() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let old = dir.path().join("old.json");
        std::fs::write(&old, r#"{"network_latency_s": 4e-5, "network_s_per_byte": 4e-10, "sum_s_per_byte": 2.5e-10}"#)
            .expect("written");
        assert_eq!(read_cache(&old), None);
        let new = dir.path().join("new.json");
        write_cache(&new, figures()).expect("written");
        assert_eq!(read_cache(&new), Some(figures()));
    }
}
