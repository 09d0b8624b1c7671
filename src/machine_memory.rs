//! The memory this machine gives a job, read at the edge for the planner: the smallest of
//! `MemAvailable` and `MemTotal` in /proc/meminfo and the cgroup's `memory.max`, or
//! `TRAINRUN_MEMORY_LIMIT` when the user sets it (docs/reliability.md, "Models too big").

use crate::plan::{ADDRESS_SPACE, MachineMemory, MemorySource, parse_size};

/// The variable that replaces what this machine reports, for users who know better (a
/// machine with swap, or planning for another machine).
pub const LIMIT_VAR: &str = "TRAINRUN_MEMORY_LIMIT";

/// Why `TRAINRUN_MEMORY_LIMIT` cannot be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "{LIMIT_VAR}={value:?} is not a memory size; use bytes or a number with a unit, e.g. `{LIMIT_VAR}=512GiB` or `{LIMIT_VAR}=64G`"
)]
pub struct BadLimit {
    value: String,
}

/// The machine's memory: `TRAINRUN_MEMORY_LIMIT` if set, else the smallest known figure.
pub fn read(env: &[(String, String)]) -> Result<MachineMemory, BadLimit> {
    if let Some((_, value)) = env.iter().find(|(k, v)| k == LIMIT_VAR && !v.is_empty()) {
        let bytes = parse_size(value).ok_or_else(|| BadLimit { value: value.clone() })?;
        return Ok(MachineMemory { bytes, source: MemorySource::Variable });
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok();
    Ok(smallest(&meminfo, cgroup.as_deref()))
}

/// The smallest of the figures in `meminfo` and the cgroup limit (`max` when none).
fn smallest(meminfo: &str, cgroup: Option<&str>) -> MachineMemory {
    let field = |name: &str| {
        meminfo.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib.saturating_mul(1024))
        })
    };
    let known = [
        field("MemAvailable").map(|b| (b, MemorySource::Available)),
        field("MemTotal").map(|b| (b, MemorySource::Total)),
        cgroup.and_then(|c| c.trim().parse::<u64>().ok()).map(|b| (b, MemorySource::Cgroup)),
    ];
    known
        .into_iter()
        .flatten()
        .min_by_key(|(b, _)| *b)
        .map_or(MachineMemory { bytes: ADDRESS_SPACE, source: MemorySource::AddressSpace }, |(bytes, source)| {
            MachineMemory { bytes, source }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    8000000 kB\n";

    #[test]
    fn the_smallest_figure_wins_and_says_where_it_is_from() {
        let m = smallest(MEMINFO, Some("max\n"));
        assert_eq!((m.bytes, m.source), (8_000_000 * 1024, MemorySource::Available));
        let m = smallest(MEMINFO, Some("4294967296\n"));
        assert_eq!((m.bytes, m.source), (4 << 30, MemorySource::Cgroup));
        let m = smallest("", None);
        assert_eq!((m.bytes, m.source), (ADDRESS_SPACE, MemorySource::AddressSpace));
    }

    #[test]
    fn the_variable_replaces_the_machine() {
        let env = |v: &str| vec![(LIMIT_VAR.to_string(), v.to_string())];
        let m = read(&env("2TiB")).map_err(|e| e.to_string());
        assert_eq!(m, Ok(MachineMemory { bytes: 2 << 40, source: MemorySource::Variable }));
        let err = read(&env("lots")).map(|_| ()).map_err(|e| e.to_string());
        assert!(matches!(&err, Err(e) if e.contains("TRAINRUN_MEMORY_LIMIT=\"lots\" is not a memory size")), "{err:?}");
    }
}
