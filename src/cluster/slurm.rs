//! The cluster of a job started with `srun`: every Slurm task is a worker, placed on the nodes
//! Slurm chose, on ports counted up from [`PORT_BASE`] per node (as TensorFlow's
//! `SlurmClusterResolver` does).

use super::resolve::{Address, Cluster, Source};
use super::{Role, TaskId};
use std::collections::BTreeMap;

/// The first port on each node; a node's k-th task listens on `PORT_BASE + k`.
pub const PORT_BASE: u16 = 8888;

/// Expands a Slurm hostlist (`node[01-03,07],gpu-a1`) into host names.
pub fn expand_hostlist(list: &str) -> Result<Vec<String>, String> {
    let bad = || format!("cannot read the Slurm node list `{list}`");
    let mut hosts = Vec::new();
    let mut rest = list.trim();
    while !rest.is_empty() {
        // A host ends at a comma outside brackets.
        let mut depth = 0;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '[' => 1,
                    ']' => -1,
                    _ => 0,
                };
                c == ',' && depth == 0
            })
            .map_or(rest.len(), |(i, _)| i);
        let item = &rest[..end];
        rest = rest[end..].trim_start_matches(',');
        match item.split_once('[') {
            None => hosts.push(item.to_string()),
            Some((prefix, ranges)) => {
                let ranges = ranges.strip_suffix(']').ok_or_else(bad)?;
                for range in ranges.split(',') {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    let (a, b) = (lo.parse::<u64>().map_err(|_| bad())?, hi.parse::<u64>().map_err(|_| bad())?);
                    for n in a..=b {
                        // Zero padding follows the range's first number (`01-10`).
                        hosts.push(format!("{prefix}{n:0width$}", width = lo.len()));
                    }
                }
            }
        }
    }
    Ok(hosts)
}

/// Expands Slurm's tasks-per-node (`2(x3),1`) into one count per node.
pub fn expand_tasks_per_node(text: &str) -> Result<Vec<usize>, String> {
    let bad = || format!("cannot read Slurm's tasks per node `{text}`");
    let mut counts = Vec::new();
    for item in text.split(',') {
        let (n, times) = match item.split_once("(x") {
            Some((n, t)) => (n, t.strip_suffix(')').ok_or_else(bad)?.parse::<usize>().map_err(|_| bad())?),
            None => (item, 1),
        };
        let n = n.trim().parse::<usize>().map_err(|_| bad())?;
        counts.extend(std::iter::repeat_n(n, times));
    }
    Ok(counts)
}

/// The cluster and this task from Slurm's variables, when this process runs under `srun` with
/// more than one task; `None` otherwise.
pub fn resolve(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<(Cluster, TaskId)>, String> {
    let (Some(procid), Some(ntasks)) = (var("SLURM_PROCID"), var("SLURM_NTASKS")) else {
        return Ok(None);
    };
    let number = |name: &str, v: &str| v.trim().parse::<usize>().map_err(|_| format!("{name} = `{v}` is not a number"));
    let (procid, ntasks) = (number("SLURM_PROCID", &procid)?, number("SLURM_NTASKS", &ntasks)?);
    if ntasks < 2 {
        return Ok(None);
    }
    let nodes =
        var("SLURM_STEP_NODELIST").or_else(|| var("SLURM_JOB_NODELIST")).ok_or("SLURM_STEP_NODELIST is not set")?;
    let per_node = var("SLURM_STEP_TASKS_PER_NODE")
        .or_else(|| var("SLURM_TASKS_PER_NODE"))
        .ok_or("SLURM_STEP_TASKS_PER_NODE is not set")?;
    let (hosts, counts) = (expand_hostlist(&nodes)?, expand_tasks_per_node(&per_node)?);
    if hosts.len() != counts.len() || counts.iter().sum::<usize>() != ntasks {
        return Err(format!(
            "Slurm's node list ({} nodes) and tasks per node ({per_node}, {} tasks) do not add up to SLURM_NTASKS = {ntasks}",
            hosts.len(),
            counts.iter().sum::<usize>()
        ));
    }
    // Slurm's default block distribution: a node's tasks have consecutive ranks.
    let mut tasks = BTreeMap::new();
    let mut rank = 0u32;
    for (host, count) in hosts.iter().zip(&counts) {
        for k in 0..*count {
            let port = PORT_BASE as usize + k;
            tasks.insert(TaskId::new(Role::Worker, rank), Address::At(format!("{host}:{port}")));
            rank += 1;
        }
    }
    Ok(Some((Cluster { source: Source::Slurm, tasks }, TaskId::new(Role::Worker, procid as u32))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostlists_expand_like_scontrol_show_hostnames() {
        assert_eq!(
            expand_hostlist("node[01-03,07],gpu-a1").unwrap(),
            ["node01", "node02", "node03", "node07", "gpu-a1"]
        );
        assert_eq!(expand_hostlist("a,b").unwrap(), ["a", "b"]);
        assert!(expand_hostlist("n[1-x]").is_err());
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
    }

    #[test]
    fn srun_tasks_become_workers_on_their_nodes() {
        let env = [
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_STEP_NODELIST", "n[1-2]"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
        ];
        let var = |k: &str| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let (cluster, task) = resolve(&var).unwrap().unwrap();
        assert_eq!(task, TaskId::new(Role::Worker, 3));
        assert_eq!(cluster.tasks.get(&TaskId::new(Role::Worker, 3)), Some(&Address::At("n2:8889".into())));
        let single = |k: &str| {
            (k == "SLURM_NTASKS" || k == "SLURM_PROCID")
                .then(|| if k == "SLURM_NTASKS" { "1" } else { "0" }.to_string())
        };
        assert!(resolve(&single).unwrap().is_none());
    }
}
