//! All-reduce between N peer processes spread over the hosts of a [`NamespaceHosts`], the way
//! `bench --only collective` measures it on one host (same peers, same timing: the slowest
//! rank's time, median over rounds), for every algorithm this binary has that runs over TCP
//! ([`Algorithm::ALL`]), so an algorithm added there shows up here without an edit. Each peer
//! starts in its rank's host through a small shell wrapper that reads the rank the group gives
//! it and listens on that host's address ([`ENV_HOST`]).

use super::hosts::{NamespaceHosts, address};
use super::train::TaskLayout;
use crate::collective::bench::{BenchError, BenchOptions, BenchRow, ENV_HOST, ENV_RANK, Wire, run};
use crate::collective::{Algorithm, Launcher};
use std::path::Path;

/// 1 KB, 1 MB and 16 MB, in floats.
pub const SIZES: [usize; 3] = [256, 262_144, 4_194_304];

/// Every algorithm that runs between hosts.
pub fn algorithms() -> Vec<Algorithm> {
    Algorithm::ALL.into_iter().filter(|a| Wire::Tcp.carries(*a)).collect()
}

/// `exe` started as rank `$TRAINRUN_COLLECTIVE_RANK` in that rank's host, listening there.
fn launcher(exe: &Path, cluster: &NamespaceHosts, p: TaskLayout) -> Launcher {
    let pairs: Vec<String> =
        (0..p.tasks).map(|r| format!("{} {}", cluster.host(p.host_of(r)), address(p.host_of(r)))).collect();
    let script = format!(
        "set -- {}; shift $((2 * ${ENV_RANK})); export {ENV_HOST}=\"$2\"; exec ip netns exec \"$1\" '{}'",
        pairs.join(" "),
        exe.display().to_string().replace('\'', r"'\''")
    );
    Launcher { program: "sh".into(), args: vec!["-c".into(), script.into()] }
}

/// Every algorithm at every size in [`SIZES`] between `p.tasks` ranks.
pub fn measure(exe: &Path, cluster: &NamespaceHosts, p: TaskLayout) -> Result<Vec<BenchRow>, BenchError> {
    measure_sizes(exe, cluster, p, &algorithms(), &SIZES)
}

/// `algorithms` at `sizes` (floats) between `p.tasks` ranks.
pub fn measure_sizes(
    exe: &Path,
    cluster: &NamespaceHosts,
    p: TaskLayout,
    algorithms: &[Algorithm],
    sizes: &[usize],
) -> Result<Vec<BenchRow>, BenchError> {
    run(&BenchOptions {
        launcher: launcher(exe, cluster, p),
        algorithms: algorithms.to_vec(),
        wires: vec![Wire::Tcp],
        worlds: vec![p.tasks],
        sizes: sizes.to_vec(),
        // `hierarchical` groups ranks by the hosts they run in.
        per_host: p.per_host(),
    })
}
