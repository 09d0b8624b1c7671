//! An sbatch script: the resolved spec in a here-doc, a fresh job token shared with every task
//! through the environment `srun` passes on, and `srun trainrun SPEC`, one Slurm task per
//! worker (trainrun reads the cluster from Slurm's variables, as TensorFlow's
//! `SlurmClusterResolver` does). One task per node, so `--mem` is a task's memory.

use super::{Job, ManifestError, cpu};
use crate::cluster::Role;

/// `"500m"` → 1, `"2"` → 2: Slurm counts whole CPUs.
fn cpus(quantity: &str) -> Option<u64> {
    match quantity.strip_suffix('m') {
        Some(milli) => milli.parse::<u64>().ok().map(|m| m.div_ceil(1000).max(1)),
        None => quantity.parse::<f64>().ok().map(|c| c.ceil().max(1.0) as u64),
    }
}

/// `"4Gi"` → `4096M`: Slurm's `--mem` takes megabytes.
fn megabytes(quantity: &str) -> Option<u64> {
    let split = quantity.find(|c: char| !c.is_ascii_digit()).unwrap_or(quantity.len());
    let (n, unit) = quantity.split_at(split);
    let n: u64 = n.parse().ok()?;
    let bytes = match unit {
        "" => n,
        "K" => n * 1000,
        "Ki" => n << 10,
        "M" => n * 1_000_000,
        "Mi" => n << 20,
        "G" => n * 1_000_000_000,
        "Gi" => n << 30,
        "T" => n * 1_000_000_000_000,
        "Ti" => n << 40,
        _ => return None,
    };
    Some(bytes.div_ceil(1 << 20).max(1))
}

pub(super) fn render(job: &Job) -> Result<String, ManifestError> {
    if let Some(other) = job.tasks.iter().find(|t| t.role != Role::Worker) {
        return Err(ManifestError::Spec(format!(
            "the spec's [cluster] has a {} task, but under Slurm every task is a worker: use worker = N only",
            other.role
        )));
    }
    let n = job.tasks.len();
    let file = format!("{}.spec.toml", job.name);
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name={}\n", job.name));
    s.push_str(&format!("#SBATCH --nodes={n}\n#SBATCH --ntasks={n}\n#SBATCH --ntasks-per-node=1\n"));
    if let Some(c) = cpu(job).as_deref().and_then(cpus) {
        s.push_str(&format!("#SBATCH --cpus-per-task={c}\n"));
    }
    if let Some(m) = job.deploy.memory.as_deref().and_then(megabytes) {
        s.push_str(&format!("#SBATCH --mem={m}M\n"));
    }
    if let Some(p) = &job.deploy.partition {
        s.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(t) = &job.deploy.time_limit {
        s.push_str(&format!("#SBATCH --time={t}\n"));
    }
    // SIGTERM reaches trainrun this long before the time limit, so the chief saves a backup.
    s.push_str(&format!("#SBATCH --signal=TERM@{}\n", job.grace_s));
    s.push_str(&format!("#SBATCH --output={}-%j.out\n", job.name));
    s.push_str("#SBATCH --requeue\n\n");
    s.push_str("set -euo pipefail\n\n");
    s.push_str("# The resolved spec (written by `trainrun manifest --for slurm`).\n");
    s.push_str(&format!("cat > \"{file}\" <<'TRAINRUN_SPEC'\n{}TRAINRUN_SPEC\n\n", job.spec_toml));
    s.push_str("# Every task of the job authenticates with this token; srun passes it on.\n");
    s.push_str(
        "export TRAINRUN_JOB_TOKEN=\"${TRAINRUN_JOB_TOKEN:-$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')}\"\n\n",
    );
    s.push_str(&format!("srun trainrun \"{file}\"\n"));
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_become_slurm_units() {
        assert_eq!(cpus("500m"), Some(1));
        assert_eq!(cpus("2"), Some(2));
        assert_eq!(cpus("1.5"), Some(2));
        assert_eq!(megabytes("4Gi"), Some(4096));
        assert_eq!(megabytes("512Mi"), Some(512));
        assert_eq!(megabytes("1G"), Some(954));
        assert_eq!(megabytes("3X"), None);
    }
}
