//! `trainrun bench`'s collective tables: all-reduce of 1, 11 and 64 MB between 2 and 4 real
//! worker processes (this binary, started as peers through environment variables: see
//! [`peer_main_from_env`]) for `direct` and the ring over every transport they run on, and of
//! 1 KB and 1 MB between 2, 4 and 8 for every algorithm over TCP (and `hierarchical` over
//! shared memory inside two-rank "hosts" and TCP across), reported as
//! median time and bus bandwidth the nccl-tests way: size × 2(N−1)/N ÷ time, the bytes each
//! rank's link must carry, comparable across world sizes.

use super::group::{GroupError, Launcher, PeerGroup, PeerOutcome, PeerSpec};
pub use super::peer::{
    ENV_AUTO, ENV_HOST, ENV_RANK, EXIT_COLLECTIVE, EXIT_OK, EXIT_USAGE, EXIT_WRONG_SUM, PeerMode, Wire,
    peer_exit_code_from_env, peer_main_from_env,
};
use super::{Algorithm, CollectiveTimeouts};
use std::fmt::Write as _;
use std::time::Duration;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub launcher: Launcher,
    /// Each runs over every wire of `wires` that carries it ([`Wire::carries`]).
    pub algorithms: Vec<Algorithm>,
    pub wires: Vec<Wire>,
    pub worlds: Vec<usize>,
    /// Float counts.
    pub sizes: Vec<usize>,
    /// Ranks per "host": rank r is on host r / per_host (what `hierarchical` groups by and
    /// [`Wire::Routed`] connects with shared memory).
    pub per_host: usize,
    /// Timed rounds per size at least; otherwise about a second of work ([`rounds`]).
    pub least_rounds: usize,
}

impl BenchOptions {
    /// Every algorithm over every transport, 2 and 4 ranks, 1 MB, 11.08 MB (the reference
    /// model's 2.77 M gradients) and 64 MB.
    pub fn standard(launcher: Launcher) -> BenchOptions {
        BenchOptions {
            launcher,
            algorithms: vec![Algorithm::Direct, Algorithm::Ring],
            wires: vec![Wire::Shm, Wire::ShmArena, Wire::Tcp, Wire::TcpTls],
            worlds: vec![2, 4],
            sizes: vec![250_000, 2_770_000, 16_000_000],
            per_host: 1,
            least_rounds: LEAST_ROUNDS,
        }
    }

    /// Every algorithm that runs between hosts, over TCP and over shared memory inside
    /// two-rank hosts, at 2, 4 and 8 ranks, 1 KB (latency) and 1 MB.
    pub fn scaling(launcher: Launcher) -> BenchOptions {
        BenchOptions {
            launcher,
            algorithms: Algorithm::ALL.into_iter().filter(|a| a.refuses(super::TransportKind::Tcp).is_none()).collect(),
            wires: vec![Wire::Tcp, Wire::Routed],
            worlds: vec![2, 4, 8],
            sizes: vec![256, 250_000],
            per_host: 2,
            least_rounds: LEAST_ROUNDS,
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub algorithm: Algorithm,
    pub wire: Wire,
    pub world: usize,
    pub bytes: usize,
    /// Median over the timed rounds of the slowest rank's time.
    pub median: Duration,
    pub min: Duration,
    /// Peers run as `auto` (`ENV_AUTO`): the algorithm it picked for this size, which then ran
    /// (`algorithm` is the one the peers were started with).
    pub picked: Option<Algorithm>,
    pub timed: Timed,
}

/// Which group of processes timed a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timed {
    /// A group started for this row alone.
    Alone,
    /// `auto`'s group, taking turns with `auto` in blocks of calls ([`PeerMode::Bench`]): same
    /// processes, same links, so it differs from `auto`'s row by the choice alone.
    BesideAuto,
}

impl BenchRow {
    /// Bus bandwidth, GB/s: bytes × 2(N−1)/N ÷ median time.
    pub fn bus_gb_per_s(&self) -> f64 {
        let n = self.world as f64;
        self.bytes as f64 * 2.0 * (n - 1.0) / n / self.median.as_secs_f64() / 1e9
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Group(#[from] GroupError),
    #[error("{wire} with {world} ranks: worker:{rank} failed (exit code {code:?}): {stderr}")]
    Peer { wire: String, world: usize, rank: usize, code: Option<i32>, stderr: String },
    #[error("{wire} with {world} ranks: rank 0 reported no result for {bytes} bytes")]
    NoResult { wire: String, world: usize, bytes: usize },
}

/// Rounds to time: enough for a stable median, about a second of work per size, and at least
/// `least` ([`LEAST_ROUNDS`] unless a table needs more).
fn rounds(floats: usize, least: usize) -> usize {
    (50_000_000 / floats.max(1)).clamp(10, 100).max(least)
}

/// The least timed rounds of a size.
pub const LEAST_ROUNDS: usize = 10;

/// Runs every configuration, one process group per algorithm, transport, world and size.
pub fn run(opts: &BenchOptions) -> Result<Vec<BenchRow>, BenchError> {
    let mut rows = Vec::new();
    for &algorithm in &opts.algorithms {
        for wire in opts.wires.iter().copied().filter(|w| w.carries(algorithm)) {
            for &world in &opts.worlds {
                for &floats in &opts.sizes {
                    let hosts: Vec<usize> = (0..world).map(|r| r / opts.per_host.max(1)).collect();
                    rows.extend(run_one(opts, algorithm, wire, &hosts, floats)?);
                }
            }
        }
    }
    Ok(rows)
}

/// `algorithm` over `wire` as the table labels it.
fn label(algorithm: Algorithm, wire: Wire) -> String {
    format!("{} over {}", algorithm.name(), wire.as_str())
}

impl BenchRow {
    /// What ran, as the tables label it: `auto (halving_doubling) over tcp` under `auto`.
    pub fn label(&self) -> String {
        match (self.picked, self.timed) {
            (Some(a), _) => format!("auto ({}) over {}", a.name(), self.wire.as_str()),
            (None, Timed::Alone) => label(self.algorithm, self.wire),
            (None, Timed::BesideAuto) => format!("{} beside auto", label(self.algorithm, self.wire)),
        }
    }
}

/// One group's row, and under `auto` the rows of the candidates it timed beside it.
fn run_one(
    opts: &BenchOptions,
    algorithm: Algorithm,
    wire: Wire,
    hosts: &[usize],
    floats: usize,
) -> Result<Vec<BenchRow>, BenchError> {
    let world = hosts.len();
    let spec = PeerSpec {
        label: format!("bench-{}-{}-{world}-{floats}", algorithm.name(), wire.as_str().replace('+', "-")),
        mode: PeerMode::Bench,
        wire,
        world,
        sizes: vec![floats],
        iters: rounds(floats, opts.least_rounds),
        timeouts: CollectiveTimeouts { connect: Duration::from_secs(30), op: Duration::from_secs(30) },
    };
    let outcomes = PeerGroup::spawn_on_hosts(&opts.launcher, &spec, algorithm, hosts)?.finish(Duration::from_secs(300));
    check(&outcomes, &label(algorithm, wire), world)?;
    let bytes = floats * 4;
    let lines = outcomes.first().map(|o| o.lines.as_slice()).unwrap_or_default();
    if let Some(model) = lines.iter().find_map(|l| l.strip_prefix("TRAINRUN-MODEL ")) {
        eprintln!("auto, {world} ranks over {}: {model}", wire.as_str());
    }
    // Under `auto` (`ENV_AUTO`), which algorithm the size took.
    let picked = lines.iter().find_map(|l| {
        let (b, name) = l.strip_prefix("TRAINRUN-AUTO ")?.split_once(' ')?;
        (b.parse::<usize>().ok()? == bytes).then(|| Algorithm::from_name(name.trim()))?
    });
    let result = lines
        .iter()
        .find_map(|l| parse_result(l))
        .filter(|r| r.0 == bytes)
        .ok_or_else(|| BenchError::NoResult { wire: label(algorithm, wire), world, bytes })?;
    let row = BenchRow { algorithm, wire, world, bytes, median: result.1, min: result.2, picked, timed: Timed::Alone };
    let beside = lines.iter().filter_map(|l| parse_beside(l)).filter(|b| b.1 == bytes).map(|(a, _, median, min)| {
        BenchRow { algorithm: a, median, min, picked: None, timed: Timed::BesideAuto, ..row.clone() }
    });
    Ok(std::iter::once(row.clone()).chain(beside).collect())
}

/// Every peer exited cleanly, or the first that did not.
fn check(outcomes: &[PeerOutcome], wire: &str, world: usize) -> Result<(), BenchError> {
    match outcomes.iter().find(|o| o.code != Some(0)) {
        None => Ok(()),
        Some(o) => Err(BenchError::Peer {
            wire: wire.to_string(),
            world,
            rank: o.rank,
            code: o.code,
            stderr: o.stderr.trim().to_string(),
        }),
    }
}

fn parse_result(line: &str) -> Option<(usize, Duration, Duration)> {
    let mut it = line.strip_prefix("TRAINRUN-RESULT ")?.split_whitespace();
    let bytes = it.next()?.parse().ok()?;
    let median: f64 = it.next()?.parse().ok()?;
    let min: f64 = it.next()?.parse().ok()?;
    Some((bytes, Duration::try_from_secs_f64(median).ok()?, Duration::try_from_secs_f64(min).ok()?))
}

/// `TRAINRUN-BESIDE <algorithm> <bytes> <median s> <min s>`.
fn parse_beside(line: &str) -> Option<(Algorithm, usize, Duration, Duration)> {
    let (name, rest) = line.strip_prefix("TRAINRUN-BESIDE ")?.split_once(' ')?;
    let (bytes, median, min) = parse_result(&format!("TRAINRUN-RESULT {rest}"))?;
    Some((Algorithm::from_name(name)?, bytes, median, min))
}

/// Runs the overlap measurement ([`PeerMode::Overlap`]) for each transport and world over an
/// arena of `arena` floats with packs of `packs` floats; rows of (transport, world, label,
/// median seconds per step).
pub fn run_overlap(
    opts: &BenchOptions,
    arena: usize,
    packs: &[usize],
    steps: usize,
) -> Result<Vec<(Wire, usize, String, Duration)>, BenchError> {
    let mut rows = Vec::new();
    for &wire in &opts.wires {
        for &world in &opts.worlds {
            let mut sizes = vec![arena];
            sizes.extend_from_slice(packs);
            let spec = PeerSpec {
                label: format!("overlap-{}-{world}", wire.as_str()),
                mode: PeerMode::Overlap,
                wire,
                world,
                sizes,
                iters: steps,
                timeouts: CollectiveTimeouts { connect: Duration::from_secs(30), op: Duration::from_secs(30) },
            };
            let outcomes = PeerGroup::spawn(&opts.launcher, &spec)?.finish(Duration::from_secs(300));
            check(&outcomes, wire.as_str(), world)?;
            for line in outcomes.first().map(|o| o.lines.as_slice()).unwrap_or_default() {
                let mut it = line.strip_prefix("TRAINRUN-OVERLAP ").unwrap_or_default().split_whitespace();
                if let (Some(label), Some(secs)) = (it.next(), it.next().and_then(|s| s.parse::<f64>().ok())) {
                    rows.push((wire, world, label.to_string(), Duration::from_secs_f64(secs.max(0.0))));
                }
            }
        }
    }
    Ok(rows)
}

/// The rows as a table.
pub fn table(rows: &[BenchRow]) -> String {
    let mut s = String::from("algorithm over transport  ranks      size   median ms   min ms   busbw GB/s\n");
    for r in rows {
        // Small messages in KB, so 1 KB does not read "0.0 MB".
        let size = if r.bytes < 100_000 {
            format!("{:>6.1} KB", r.bytes as f64 / 1e3)
        } else {
            format!("{:>6.1} MB", r.bytes as f64 / 1e6)
        };
        let _ = writeln!(
            s,
            "{:<24} {:>6} {size} {:>11.3} {:>8.3} {:>12.2}",
            r.label(),
            r.world,
            r.median.as_secs_f64() * 1e3,
            r.min.as_secs_f64() * 1e3,
            r.bus_gb_per_s()
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_is_the_nccl_tests_formula() {
        let r = BenchRow {
            algorithm: Algorithm::Direct,
            wire: Wire::Shm,
            world: 4,
            bytes: 1_000_000_000,
            median: Duration::from_secs(1),
            min: Duration::from_secs(1),
            picked: None,
            timed: Timed::Alone,
        };
        assert!((r.bus_gb_per_s() - 1.5).abs() < 1e-12);
        assert_eq!(
            parse_result("TRAINRUN-RESULT 44 1.5e-3 1e-3"),
            Some((44, Duration::from_micros(1500), Duration::from_millis(1)))
        );
        assert_eq!(
            parse_beside("TRAINRUN-BESIDE halving_doubling 1024 2e-3 1e-3"),
            Some((Algorithm::HalvingDoubling, 1024, Duration::from_millis(2), Duration::from_millis(1)))
        );
        assert_eq!(parse_beside("TRAINRUN-BESIDE nothing 1024 2e-3 1e-3"), None);
    }
}
