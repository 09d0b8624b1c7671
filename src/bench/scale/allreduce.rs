//! All-reduce between N peer processes spread over the hosts of a [`NamespaceHosts`], the way
//! `bench --only collective` measures it on one host (same peers, same timing: the slowest
//! rank's time, median over rounds), for every algorithm this binary has that runs over TCP
//! ([`Algorithm::ALL`]), so an algorithm added there shows up here without an edit, and
//! `hierarchical` again over shared memory inside each host and TCP across; then as
//! `implementation = "auto"` runs (the cost model measured at start-up, each size the
//! algorithm it picks, over shared memory and TCP where hosts have several tasks), and how
//! close `auto` came to the fastest ([`verdicts`]). Each peer starts in its rank's host through
//! a small shell wrapper that reads the rank the group gives it and listens on that host's
//! address ([`ENV_HOST`]).

use super::hosts::{NamespaceHosts, address};
use super::train::TaskLayout;
use crate::collective::bench::{BenchError, BenchOptions, BenchRow, ENV_AUTO, ENV_HOST, ENV_RANK, Wire, run};
use crate::collective::cost::{CostModel, LinkCost, Placement};
use crate::collective::{Algorithm, Launcher};
use std::path::Path;

/// 1 KB, 1 MB and 16 MB, in floats.
pub const SIZES: [usize; 3] = [256, 262_144, 4_194_304];

/// Every algorithm that runs between hosts.
pub fn algorithms() -> Vec<Algorithm> {
    Algorithm::ALL.into_iter().filter(|a| Wire::Tcp.carries(*a)).collect()
}

/// How the peers choose their algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choosing {
    /// The one they are started with.
    Named,
    /// As `implementation = "auto"` does ([`ENV_AUTO`]).
    Auto,
}

/// `exe` started as rank `$TRAINRUN_COLLECTIVE_RANK` in that rank's host, listening there.
fn launcher(exe: &Path, cluster: &NamespaceHosts, p: TaskLayout, choosing: Choosing) -> Launcher {
    let pairs: Vec<String> =
        (0..p.tasks).map(|r| format!("{} {}", cluster.host(p.host_of(r)), address(p.host_of(r)))).collect();
    let auto = match choosing {
        Choosing::Named => String::new(),
        Choosing::Auto => format!("export {ENV_AUTO}=1; "),
    };
    let script = format!(
        "set -- {}; shift $((2 * ${ENV_RANK})); {auto}export {ENV_HOST}=\"$2\"; exec ip netns exec \"$1\" '{}'",
        pairs.join(" "),
        exe.display().to_string().replace('\'', r"'\''")
    );
    Launcher { program: "sh".into(), args: vec!["-c".into(), script.into()] }
}

/// Every algorithm, then `auto`, at every size in [`SIZES`] between `p.tasks` ranks.
pub fn measure(exe: &Path, cluster: &NamespaceHosts, p: TaskLayout) -> Result<Vec<BenchRow>, BenchError> {
    let mut rows = measure_sizes(exe, cluster, p, &algorithms(), &SIZES)?;
    rows.extend(measure_auto(exe, cluster, p, &SIZES)?);
    Ok(rows)
}

/// The transports between the hosts: TCP, and shared memory inside hosts of several tasks.
fn wires(p: TaskLayout) -> Vec<Wire> {
    if p.per_host() > 1 { vec![Wire::Tcp, Wire::Routed] } else { vec![Wire::Tcp] }
}

/// `algorithms` at `sizes` (floats) between `p.tasks` ranks, over each transport of [`wires`]
/// that carries them.
pub fn measure_sizes(
    exe: &Path,
    cluster: &NamespaceHosts,
    p: TaskLayout,
    algorithms: &[Algorithm],
    sizes: &[usize],
) -> Result<Vec<BenchRow>, BenchError> {
    run(&BenchOptions {
        launcher: launcher(exe, cluster, p, Choosing::Named),
        algorithms: algorithms.to_vec(),
        wires: wires(p),
        worlds: vec![p.tasks],
        sizes: sizes.to_vec(),
        // `hierarchical` groups ranks by the hosts they run in.
        per_host: p.per_host(),
    })
}

/// `auto` at `sizes` (floats) between `p.tasks` ranks, over the transport a job's `auto`
/// plans: shared memory inside hosts and TCP across when some host has several tasks.
pub fn measure_auto(
    exe: &Path,
    cluster: &NamespaceHosts,
    p: TaskLayout,
    sizes: &[usize],
) -> Result<Vec<BenchRow>, BenchError> {
    let wire = wires(p).last().copied().unwrap_or(Wire::Tcp);
    run(&BenchOptions {
        launcher: launcher(exe, cluster, p, Choosing::Auto),
        // What the peers start with, before the start-up measurement.
        algorithms: vec![wire.usual_algorithm()],
        wires: vec![wire],
        worlds: vec![p.tasks],
        sizes: sizes.to_vec(),
        per_host: p.per_host(),
    })
}

/// How `auto` did at one size: its row, and the fastest of the named algorithms' rows.
#[derive(Debug, Clone, PartialEq)]
pub struct AutoVerdict {
    pub auto: BenchRow,
    pub fastest: BenchRow,
}

impl AutoVerdict {
    /// `auto`'s median time over the fastest's.
    pub fn ratio(&self) -> f64 {
        self.auto.median.as_secs_f64() / self.fastest.median.as_secs_f64()
    }

    /// The issue's bar: within 10 % of the fastest.
    pub fn within(&self) -> bool {
        self.ratio() <= 1.10
    }

    /// One line for the table.
    pub fn line(&self) -> String {
        let ms = |r: &BenchRow| r.median.as_secs_f64() * 1e3;
        format!(
            "auto at {:>5} B × {}: {} {:.3} ms; fastest {} {:.3} ms; auto ÷ fastest {:.2} ({})",
            self.auto.bytes,
            self.auto.world,
            self.auto.label(),
            ms(&self.auto),
            self.fastest.label(),
            ms(&self.fastest),
            self.ratio(),
            if self.within() { "within 10 %" } else { "MISSED: more than 10 % slower" }
        )
    }
}

/// For each size `auto` ran at in `rows`, how it did against the fastest named algorithm.
pub fn verdicts(rows: &[BenchRow]) -> Vec<AutoVerdict> {
    rows.iter()
        .filter(|a| a.picked.is_some())
        .filter_map(|a| {
            let fastest = rows
                .iter()
                .filter(|r| r.picked.is_none() && r.bytes == a.bytes && r.world == a.world)
                .min_by(|x, y| x.median.cmp(&y.median))?;
            Some(AutoVerdict { auto: a.clone(), fastest: fastest.clone() })
        })
        .collect()
}

/// What the cost model gives as the bandwidth bound of one measured row: the time its bytes
/// take to send and sum over links whose β the same table fits, with no latency.
#[derive(Debug, Clone, PartialEq)]
pub struct BandwidthBound {
    pub row: BenchRow,
    /// Seconds.
    pub bound: f64,
}

impl BandwidthBound {
    /// The measured median over the bound (the issue's target at 16 MB: ≤ 1.3).
    pub fn ratio(&self) -> f64 {
        self.row.median.as_secs_f64() / self.bound
    }

    pub fn line(&self) -> String {
        format!(
            "{} at {} B × {}: {:.3} ms measured, bandwidth bound {:.3} ms, measured ÷ bound {:.2}",
            self.row.label(),
            self.row.bytes,
            self.row.world,
            self.row.median.as_secs_f64() * 1e3,
            self.bound * 1e3,
            self.ratio()
        )
    }
}

/// The bound of every named algorithm's row at the largest size in `rows`, from the links the
/// start-up probe would fit ([`CostModel::fitted`], [`CostModel::fitted_inside`]) to the same
/// table's smallest and next size: the network from the ring over TCP, shared memory from
/// `hierarchical` over shared memory and TCP. Empty when the table has fewer than three sizes.
pub fn bandwidth_bounds(rows: &[BenchRow], p: TaskLayout) -> Vec<BandwidthBound> {
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let [small, middle, .., largest] = sizes[..] else {
        return Vec::new();
    };
    let time = |a: Algorithm, w: Wire, bytes: usize| {
        rows.iter()
            .find(|r| r.picked.is_none() && (r.algorithm, r.wire, r.bytes) == (a, w, bytes))
            .map(|r| r.median.as_secs_f64())
    };
    let shape = Placement { ranks: p.tasks, hosts: p.hosts, per_host: p.per_host() };
    let fit = |a: Algorithm, w: Wire| Some((time(a, w, small)?, time(a, w, middle)?));
    let model = CostModel::default();
    let Some(network) =
        fit(Algorithm::Ring, Wire::Tcp).and_then(|t| model.fitted(Algorithm::Ring, shape, (small, middle), t))
    else {
        return Vec::new();
    };
    let model = CostModel { network, ..model };
    let inside =
        fit(Algorithm::Hierarchical, Wire::Routed).and_then(|t| model.fitted_inside(shape, (small, middle), t));
    let model = CostModel { shared_memory: inside.unwrap_or(model.shared_memory), ..model };
    // Latency set aside: what is left is the bandwidth (and summing) term.
    let bandwidth = |l: LinkCost| LinkCost { alpha: 0.0, ..l };
    let model = CostModel { network: bandwidth(model.network), shared_memory: bandwidth(model.shared_memory), ..model };
    rows.iter()
        .filter(|r| r.picked.is_none() && r.bytes == largest)
        .filter_map(|r| {
            let bound = model.estimate(r.algorithm, r.wire.kind(), shape, r.bytes)?;
            Some(BandwidthBound { row: r.clone(), bound })
        })
        .collect()
}
