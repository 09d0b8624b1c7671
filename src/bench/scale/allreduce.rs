//! All-reduce between N peer processes spread over the hosts of a [`NamespaceHosts`], the way
//! `bench --only collective` measures it on one host (same peers, same timing: the slowest
//! rank's time, median over rounds), for every algorithm this binary has that runs over TCP
//! ([`Algorithm::ALL`]), so an algorithm added there shows up here without an edit, and
//! `hierarchical` again over shared memory inside each host and TCP across; then as
//! `implementation = "auto"` runs (the cost model measured at start-up, each size the
//! algorithm it picks, over shared memory and TCP where hosts have several tasks, with every
//! candidate timed in turn beside it in the same processes), and how close `auto` came to the
//! fastest ([`verdicts`]). Each peer starts in its rank's host through
//! a small shell wrapper that reads the rank the group gives it and listens on that host's
//! address ([`ENV_HOST`]).

use super::hosts::{NamespaceHosts, address};
use super::train::TaskLayout;
use crate::collective::bench::{
    BenchError, BenchOptions, BenchRow, ENV_AUTO, ENV_HOST, ENV_RANK, LEAST_ROUNDS, Timed, Wire, run,
};
use crate::collective::cost::{CostModel, LinkCost, Placement, Terms};
use crate::collective::{Algorithm, Launcher};
use std::path::Path;
use std::time::Duration;

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

/// Rounds of every cell the bench measures, interleaved. One group of processes differs from
/// the next running the same algorithm by more than the 10 % `auto` is judged by (4 ranks as
/// 2 × 2 at 1 KB: `hierarchical` 0.26–0.38 ms over 10 launches), so a cell is the median of
/// its rounds ([`combine_rounds`]) and the spread is printed beside it.
pub const ROUNDS: usize = 3;

/// [`ROUNDS`] rounds of every algorithm, then `auto`, at every size in [`SIZES`] between
/// `p.tasks` ranks ([`measure_rounds`]).
pub fn measure(exe: &Path, cluster: &NamespaceHosts, p: TaskLayout) -> Result<Vec<Vec<BenchRow>>, BenchError> {
    measure_rounds(exe, cluster, p, &SIZES, ROUNDS)
}

/// `rounds` rounds, each every algorithm, then `auto`, at `sizes` (floats), each row a group of
/// processes of its own: A B C … A B C …, so that what drifts over a sitting (another job on
/// the cores) falls on every row alike.
pub fn measure_rounds(
    exe: &Path,
    cluster: &NamespaceHosts,
    p: TaskLayout,
    sizes: &[usize],
    rounds: usize,
) -> Result<Vec<Vec<BenchRow>>, BenchError> {
    (0..rounds.max(1))
        .map(|_| {
            let mut rows = measure_sizes(exe, cluster, p, &algorithms(), sizes)?;
            rows.extend(measure_auto(exe, cluster, p, sizes)?);
            Ok(rows)
        })
        .collect()
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
        least_rounds: LEAST_ROUNDS,
    })
}

/// `auto` at `sizes` (floats) between `p.tasks` ranks, over the transport a job's `auto`
/// plans: shared memory inside hosts and TCP across when some host has several tasks; and
/// every candidate in turn with it, in the same processes ([`Timed::BesideAuto`]).
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
        least_rounds: AUTO_LEAST_ROUNDS,
    })
}

/// `auto`'s group times its pick's algorithm twice a round, as `auto` and as a candidate
/// beside it; at 16 MB, 11 rounds (about a second of work) left those two medians of the same
/// algorithm 12 % apart at 8 ranks, more than the bar they are judged by.
const AUTO_LEAST_ROUNDS: usize = 25;

/// How `auto` did at one size: its row, the fastest candidate timed beside it in its own group
/// of processes, and the row of the algorithm it picked.
///
/// Beside it, because the same algorithm in a group of processes started afresh moves by more
/// than the 10 % `auto` is judged by (4 ranks as 2 × 2 at 1 KB: 0.26–0.38 ms over 10 launches;
/// 64 × 1 KB: 4.0–7.4 ms), so a row from another group compared two draws, not two choices.
/// Where `auto` had nothing to choose (two ranks) no candidate ran beside it and the named rows
/// stand in. The fastest row of any group and transport is kept too ([`Self::anywhere`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AutoVerdict {
    pub auto: BenchRow,
    pub fastest: BenchRow,
    pub pick: Option<BenchRow>,
    /// The fastest row of the table at this size: any group, any transport (such as
    /// `hierarchical` over TCP alone where `auto`'s job routes inside hosts over shared memory).
    pub anywhere: BenchRow,
}

/// What a cell's verdict says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `auto` within 10 % of the fastest.
    Within,
    /// More than 10 % slower, yet the algorithm it picked ran within 10 % of the fastest as a
    /// row of its own: `auto`'s timings and its pick's differ by noise, not the choice.
    MissedBySpread,
    /// More than 10 % slower, and its pick was too: the model chose wrong.
    MissedByPick,
}

impl AutoVerdict {
    /// `auto`'s median time over the fastest's.
    pub fn ratio(&self) -> f64 {
        self.auto.median.as_secs_f64() / self.fastest.median.as_secs_f64()
    }

    /// The row of `auto`'s pick over the fastest's, when the table has it.
    pub fn pick_ratio(&self) -> Option<f64> {
        Some(self.pick.as_ref()?.median.as_secs_f64() / self.fastest.median.as_secs_f64())
    }

    /// `auto`'s median time over the fastest row of any group and transport.
    pub fn anywhere_ratio(&self) -> f64 {
        self.auto.median.as_secs_f64() / self.anywhere.median.as_secs_f64()
    }

    /// The issue's bar: within 10 % of the fastest.
    pub fn within(&self) -> bool {
        self.ratio() <= 1.10
    }

    pub fn verdict(&self) -> Verdict {
        match (self.within(), self.pick_ratio().is_some_and(|r| r <= 1.10)) {
            (true, _) => Verdict::Within,
            (false, true) => Verdict::MissedBySpread,
            (false, false) => Verdict::MissedByPick,
        }
    }

    /// One line for the table.
    pub fn line(&self) -> String {
        let ms = |r: &BenchRow| r.median.as_secs_f64() * 1e3;
        let pick = match (&self.pick, self.pick_ratio()) {
            (Some(p), Some(r)) => format!("; its pick's row {:.3} ms, {r:.2}× the fastest", ms(p)),
            _ => String::new(),
        };
        let anywhere = match self.anywhere == self.fastest {
            true => String::new(),
            false => format!(
                "; fastest of any group {} {:.3} ms, auto ÷ it {:.2}",
                self.anywhere.label(),
                ms(&self.anywhere),
                self.anywhere_ratio()
            ),
        };
        format!(
            "auto at {:>5} B × {}: {} {:.3} ms; fastest {} {:.3} ms; auto ÷ fastest {:.2}{pick}{anywhere} ({})",
            self.auto.bytes,
            self.auto.world,
            self.auto.label(),
            ms(&self.auto),
            self.fastest.label(),
            ms(&self.fastest),
            self.ratio(),
            match self.verdict() {
                Verdict::Within => "within 10 %",
                Verdict::MissedBySpread => "MISSED by noise: its pick's row was within 10 %",
                Verdict::MissedByPick => "MISSED: the pick was more than 10 % slower",
            }
        )
    }
}

/// The row `auto`'s pick ran as: beside it when the table has those rows; otherwise the named
/// row, the flat algorithms over TCP (where the transport routes by host they take TCP
/// throughout), `hierarchical` over the transport `auto` ran on.
fn row_of_pick<'a>(rows: &'a [BenchRow], auto: &BenchRow) -> Option<&'a BenchRow> {
    let picked = auto.picked?;
    let wire = match picked {
        Algorithm::Ring | Algorithm::HalvingDoubling => Wire::Tcp,
        Algorithm::Direct | Algorithm::Hierarchical => auto.wire,
    };
    let cell = |r: &&BenchRow| r.picked.is_none() && (r.bytes, r.world) == (auto.bytes, auto.world);
    let beside = rows.iter().filter(cell).find(|r| r.timed == Timed::BesideAuto && r.algorithm == picked);
    beside.or_else(|| {
        rows.iter().filter(cell).find(|r| r.timed == Timed::Alone && (r.algorithm, r.wire) == (picked, wire))
    })
}

/// For each size `auto` ran at in `rows`, how it did against the fastest candidate beside it
/// (or, with none, the fastest named row) and against every row.
pub fn verdicts(rows: &[BenchRow]) -> Vec<AutoVerdict> {
    let fastest = |rows: &mut dyn Iterator<Item = &BenchRow>| rows.min_by(|x, y| x.median.cmp(&y.median)).cloned();
    rows.iter()
        .filter(|a| a.picked.is_some())
        .filter_map(|a| {
            let cell = |r: &&BenchRow| r.picked.is_none() && r.bytes == a.bytes && r.world == a.world;
            let anywhere = fastest(&mut rows.iter().filter(cell))?;
            let beside = fastest(&mut rows.iter().filter(cell).filter(|r| r.timed == Timed::BesideAuto));
            let named = || fastest(&mut rows.iter().filter(cell).filter(|r| r.timed == Timed::Alone));
            let fastest = beside.or_else(named)?;
            Some(AutoVerdict { auto: a.clone(), fastest, pick: row_of_pick(rows, a).cloned(), anywhere })
        })
        .collect()
}

/// The rows of several rounds of the same table as one: each row's median of its rounds'
/// medians and least minimum, and `auto`'s most frequent pick (the earliest of equals). Each
/// round's `auto` is a launch of its own whose start-up probe may measure differently, which
/// [`spread`] shows.
pub fn combine_rounds(rounds: &[Vec<BenchRow>]) -> Vec<BenchRow> {
    let Some(first) = rounds.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|row| {
            let same: Vec<&BenchRow> = rounds.iter().filter_map(|r| r.iter().find(|x| same_cell(x, row))).collect();
            let mut medians: Vec<_> = same.iter().map(|x| x.median).collect();
            medians.sort_unstable();
            let min = same.iter().map(|x| x.min).min().unwrap_or(row.min);
            let picks: Vec<Option<Algorithm>> = same.iter().map(|x| x.picked).collect();
            let count = |a: &Option<Algorithm>| picks.iter().filter(|b| *b == a).count();
            let picked =
                picks.iter().copied().fold(row.picked, |best, a| if count(&a) > count(&best) { a } else { best });
            BenchRow { median: medians[medians.len() / 2], min, picked, ..row.clone() }
        })
        .collect()
}

/// Whether two rows measure the same thing (`auto`'s rows whatever they picked).
fn same_cell(a: &BenchRow, b: &BenchRow) -> bool {
    (a.algorithm, a.wire, a.world, a.bytes, a.picked.is_some(), a.timed)
        == (b.algorithm, b.wire, b.world, b.bytes, b.picked.is_some(), b.timed)
}

/// One row's medians over rounds: the least and the greatest, and `auto`'s picks in order.
pub fn spread(rounds: &[Vec<BenchRow>], row: &BenchRow) -> (Duration, Duration, Vec<Option<Algorithm>>) {
    let same: Vec<&BenchRow> = rounds.iter().filter_map(|r| r.iter().find(|x| same_cell(x, row))).collect();
    let least = same.iter().map(|x| x.median).min().unwrap_or(row.median);
    let most = same.iter().map(|x| x.median).max().unwrap_or(row.median);
    (least, most, same.iter().map(|x| x.picked).collect())
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

/// The bound of every named algorithm's row at the largest size in `rows`: each row's own
/// link, fitted as the start-up probe fits one ([`CostModel::fitted`]) to the same algorithm's
/// rows over the same transport at the table's smallest and next size, then its bytes and
/// sums at that link's β with no latency (`hierarchical` over shared memory and TCP as one
/// link for its whole). Empty when the table has fewer than three sizes.
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
    let model = CostModel::default();
    rows.iter()
        .filter(|r| r.picked.is_none() && r.bytes == largest)
        .filter_map(|r| {
            let secs = (time(r.algorithm, r.wire, small)?, time(r.algorithm, r.wire, middle)?);
            let link = model.fitted(r.algorithm, shape, (small, middle), secs)?;
            // Latency set aside: what is left is the bandwidth (and summing) term.
            let terms = Terms::of(r.algorithm, shape, r.bytes as f64)?;
            let bound = terms.seconds(LinkCost { alpha: 0.0, ..link }, model.gamma);
            Some(BandwidthBound { row: r.clone(), bound })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(algorithm: Algorithm, wire: Wire, ms: u64, picked: Option<Algorithm>) -> BenchRow {
        let median = Duration::from_millis(ms);
        BenchRow { algorithm, wire, world: 16, bytes: 1024, median, min: median, picked, timed: Timed::Alone }
    }

    fn beside(algorithm: Algorithm, ms: u64) -> BenchRow {
        BenchRow { timed: Timed::BesideAuto, ..row(algorithm, Wire::Routed, ms, None) }
    }

    #[test]
    fn auto_is_judged_against_the_candidates_timed_beside_it() {
        let rows = [
            row(Algorithm::Ring, Wire::Tcp, 30, None),
            // Another group, another transport: faster, but not what `auto`'s job could run.
            row(Algorithm::Hierarchical, Wire::Tcp, 8, None),
            beside(Algorithm::Ring, 31),
            beside(Algorithm::HalvingDoubling, 12),
            beside(Algorithm::Hierarchical, 10),
            row(Algorithm::Hierarchical, Wire::Routed, 10, Some(Algorithm::Hierarchical)),
        ];
        let v = verdicts(&rows);
        assert_eq!(v.len(), 1);
        let v = &v[0];
        assert_eq!(
            (v.verdict(), v.fastest.timed, v.fastest.algorithm),
            (Verdict::Within, Timed::BesideAuto, Algorithm::Hierarchical)
        );
        assert_eq!(v.pick.as_ref().map(|p| p.timed), Some(Timed::BesideAuto));
        assert_eq!((v.anywhere.algorithm, v.anywhere.wire), (Algorithm::Hierarchical, Wire::Tcp));
        assert!((v.anywhere_ratio() - 1.25).abs() < 1e-9);
        assert!(v.line().contains("fastest of any group hierarchical over tcp"), "{}", v.line());
        // A pick 1.2× the fastest beside it is the model's miss.
        let mut rows = rows.to_vec();
        rows[5] = row(Algorithm::Hierarchical, Wire::Routed, 12, Some(Algorithm::HalvingDoubling));
        assert_eq!(verdicts(&rows)[0].verdict(), Verdict::MissedByPick);
        // Its pick's row within 10 % but its own timings not: noise inside the group.
        rows[5] = row(Algorithm::Hierarchical, Wire::Routed, 12, Some(Algorithm::Hierarchical));
        assert_eq!(verdicts(&rows)[0].verdict(), Verdict::MissedBySpread);
    }

    #[test]
    fn a_miss_is_the_pick_or_the_spread_between_groups() {
        let named = [
            row(Algorithm::Ring, Wire::Tcp, 30, None),
            row(Algorithm::HalvingDoubling, Wire::Tcp, 12, None),
            row(Algorithm::Hierarchical, Wire::Tcp, 10, None),
            row(Algorithm::Hierarchical, Wire::Routed, 11, None),
        ];
        let verdict = |auto: BenchRow| {
            let rows: Vec<BenchRow> = named.iter().cloned().chain([auto]).collect();
            let v = verdicts(&rows);
            assert_eq!(v.len(), 1);
            v[0].clone()
        };
        let v = verdict(row(Algorithm::Hierarchical, Wire::Routed, 10, Some(Algorithm::Hierarchical)));
        assert_eq!((v.verdict(), v.fastest.wire), (Verdict::Within, Wire::Tcp));
        // Its pick ran 1.10× as a named row (over shared memory and TCP): its own group was slow.
        let v = verdict(row(Algorithm::Hierarchical, Wire::Routed, 13, Some(Algorithm::Hierarchical)));
        assert_eq!(v.verdict(), Verdict::MissedBySpread, "{}", v.line());
        assert_eq!(v.pick.map(|p| p.wire), Some(Wire::Routed));
        // Halving-doubling under `auto` over shared memory and TCP runs over TCP: its named row is 1.2×.
        let v = verdict(row(Algorithm::Hierarchical, Wire::Routed, 12, Some(Algorithm::HalvingDoubling)));
        assert_eq!(v.verdict(), Verdict::MissedByPick, "{}", v.line());
        assert_eq!(v.pick.map(|p| (p.algorithm, p.wire)), Some((Algorithm::HalvingDoubling, Wire::Tcp)));
    }

    #[test]
    fn rounds_combine_into_each_rows_median_and_spread() {
        let rounds: Vec<Vec<BenchRow>> = [10, 14, 11]
            .into_iter()
            .map(|ms| {
                vec![
                    row(Algorithm::Ring, Wire::Tcp, ms, None),
                    row(Algorithm::Ring, Wire::Tcp, ms + 1, Some(Algorithm::Ring)),
                ]
            })
            .collect();
        let combined = combine_rounds(&rounds);
        assert_eq!(combined.len(), 2);
        assert_eq!((combined[0].median, combined[0].picked), (Duration::from_millis(11), None));
        assert_eq!((combined[1].median, combined[1].picked), (Duration::from_millis(12), Some(Algorithm::Ring)));
        let (least, most, picks) = spread(&rounds, &combined[1]);
        assert_eq!((least, most), (Duration::from_millis(11), Duration::from_millis(15)));
        assert_eq!(picks, [Some(Algorithm::Ring); 3]);
    }

    #[test]
    fn rounds_combine_into_autos_most_frequent_pick() {
        let picks = [Algorithm::HalvingDoubling, Algorithm::Hierarchical, Algorithm::Hierarchical];
        let rounds: Vec<Vec<BenchRow>> =
            picks.into_iter().map(|a| vec![row(Algorithm::Hierarchical, Wire::Routed, 10, Some(a))]).collect();
        assert_eq!(combine_rounds(&rounds)[0].picked, Some(Algorithm::Hierarchical));
        // A tie goes to the earliest round's.
        assert_eq!(combine_rounds(&rounds[..2])[0].picked, Some(Algorithm::HalvingDoubling));
    }
}
