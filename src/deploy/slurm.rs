//! An sbatch script: the resolved spec in a here-doc, a fresh job token shared with every task
//! through the environment `srun` passes on, and `srun trainrun SPEC`, one Slurm task per
//! worker (trainrun reads the cluster from Slurm's variables, as TensorFlow's
//! `SlurmClusterResolver` does). One task per node, so `--mem` is a task's memory.
//!
//! The script runs under bash on a shared cluster, so no spec value may become shell code: the
//! here-doc is quoted (no expansion inside) and ends at a marker that occurs nowhere in the spec
//! text (checked, not hoped for), and every `#SBATCH` value is refused unless it is one plain
//! word (a newline there would start a command line).
//!
//! A sweep spec becomes a job array instead ([`render_array`]): one single-node array task per
//! trial (a multi-worker trial starts its workers on that node, on free ports of its own), each
//! running `trainrun sweep SPEC --trial $SLURM_ARRAY_TASK_ID` into the shared sweep folder.

use super::{DeployJob, ManifestError, TrialArray, cpu};
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

/// The here-doc's end marker: `TRAINRUN_SPEC`, or the first `TRAINRUN_SPEC_<n>` that occurs
/// nowhere in `text`. bash ends a here-doc only at a line equal to its marker, so a marker that
/// is not even a substring of the body cannot be forged by any value in it.
fn heredoc_marker(text: &str) -> String {
    let mut marker = String::from("TRAINRUN_SPEC");
    let mut n = 0u64;
    while text.contains(&marker) {
        n += 1;
        marker = format!("TRAINRUN_SPEC_{n}");
    }
    marker
}

/// `#SBATCH --{option}={value}` for a value from the spec, which must be one word of printable
/// ASCII: sbatch reads the line, but bash runs whatever follows a newline in it.
fn directive(key: &str, option: &str, value: &str) -> Result<String, ManifestError> {
    let plain =
        |c: char| c.is_ascii_graphic() && !matches!(c, '\'' | '"' | '`' | '$' | '\\' | ';' | '&' | '|' | '<' | '>');
    if !value.is_empty() && value.chars().all(plain) {
        return Ok(format!("#SBATCH --{option}={value}\n"));
    }
    Err(ManifestError::Spec(format!(
        "{key} = {value:?} cannot go into an sbatch script: use one word of letters, digits, '-', '_', '.', ',' or ':' \
         (no spaces, quotes, newlines or shell characters), e.g. `{key} = \"cpu\"`"
    )))
}

pub(super) fn render(job: &DeployJob) -> Result<String, ManifestError> {
    if let Some(other) = job.tasks.iter().find(|t| t.role != Role::Worker) {
        return Err(ManifestError::Spec(format!(
            "the spec's [cluster] has a {} task, but under Slurm every task is a worker: use worker = N only",
            other.role
        )));
    }
    let n = job.tasks.len();
    let file = format!("{}.spec.toml", job.name);
    let tasks = format!("#SBATCH --nodes={n}\n#SBATCH --ntasks={n}\n#SBATCH --ntasks-per-node=1\n");
    let mut s = header(job, &tasks, "%j")?;
    let (marker, body) = spec_marker(job);
    s.push_str(&format!("cat > \"{file}\" <<'{marker}'\n{body}\n\n"));
    s.push_str("# Every task of the job authenticates with this token; srun passes it on.\n");
    s.push_str(
        "export TRAINRUN_JOB_TOKEN=\"${TRAINRUN_JOB_TOKEN:-$(od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')}\"\n\n",
    );
    s.push_str(&format!("srun trainrun \"{file}\"\n"));
    Ok(s)
}

/// The sbatch script of a sweep: a job array of one index per trial, `parallel` at once.
pub(super) fn render_array(job: &DeployJob, array: TrialArray) -> Result<String, ManifestError> {
    let file = format!("{}.spec.toml", job.name);
    let lines =
        format!("#SBATCH --array=0-{}%{}\n#SBATCH --nodes=1\n#SBATCH --ntasks=1\n", array.trials - 1, array.parallel);
    let mut s = header(job, &lines, "%A_%a")?;
    // Indexes start together on a shared folder: each writes its own copy, then renames it
    // over the shared name, so none reads another's half-written file.
    let (marker, body) = spec_marker(job);
    s.push_str(&format!("cat > \"{file}.$SLURM_ARRAY_TASK_ID\" <<'{marker}'\n{body}\n"));
    s.push_str(&format!("mv -f \"{file}.$SLURM_ARRAY_TASK_ID\" \"{file}\"\n\n"));
    s.push_str(&format!(
        "# This index's trial, into the shared sweep folder. Once every index has ended,\n\
         # `trainrun sweep {file} --collect` ranks the trials in results.csv.\n"
    ));
    s.push_str(&format!("trainrun sweep \"{file}\" --trial \"$SLURM_ARRAY_TASK_ID\"\n"));
    Ok(s)
}

/// The `#SBATCH` lines and the script's start, with `tasks` (the job's shape) after the name;
/// `%j` or `%A_%a` names the output file.
fn header(job: &DeployJob, tasks: &str, output: &str) -> Result<String, ManifestError> {
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name={}\n", job.name));
    s.push_str(tasks);
    if let Some(c) = cpu(job).as_deref().and_then(cpus) {
        s.push_str(&format!("#SBATCH --cpus-per-task={c}\n"));
    }
    if let Some(m) = job.deploy.memory.as_deref().and_then(megabytes) {
        s.push_str(&format!("#SBATCH --mem={m}M\n"));
    }
    if let Some(p) = &job.deploy.partition {
        s.push_str(&directive("deploy.partition", "partition", p)?);
    }
    if let Some(t) = &job.deploy.time_limit {
        s.push_str(&directive("deploy.time_limit", "time", t)?);
    }
    // SIGTERM reaches trainrun this long before the time limit, so the chief saves a backup.
    s.push_str(&format!("#SBATCH --signal=TERM@{}\n", job.grace_s));
    s.push_str(&format!("#SBATCH --output={}-{output}.out\n", job.name));
    s.push_str("#SBATCH --requeue\n\n");
    s.push_str("set -euo pipefail\n\n");
    s.push_str("# The resolved spec (written by `trainrun manifest --for slurm`).\n");
    Ok(s)
}

/// The here-doc's marker and the spec text it encloses, ending in its marker line.
fn spec_marker(job: &DeployJob) -> (String, String) {
    let mut spec = job.spec_toml.clone();
    if !spec.ends_with('\n') {
        spec.push('\n');
    }
    let marker = heredoc_marker(&spec);
    let body = format!("{spec}{marker}");
    (marker, body)
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

    #[test]
    fn the_heredoc_marker_occurs_nowhere_in_the_spec() {
        assert_eq!(heredoc_marker("a = 1\n"), "TRAINRUN_SPEC");
        assert_eq!(heredoc_marker("x = \"\"\"\nTRAINRUN_SPEC\n\"\"\"\n"), "TRAINRUN_SPEC_1");
        assert_eq!(heredoc_marker("TRAINRUN_SPEC TRAINRUN_SPEC_1 TRAINRUN_SPEC_2"), "TRAINRUN_SPEC_3");
    }

    #[test]
    fn sbatch_values_are_one_plain_word() {
        assert_eq!(directive("deploy.partition", "partition", "cpu,long").unwrap(), "#SBATCH --partition=cpu,long\n");
        for bad in ["", "cpu\ntouch /tmp/x", "a b", "$(id)", "`id`", "a;b", "x'y", "tab\t"] {
            let Err(ManifestError::Spec(m)) = directive("deploy.partition", "partition", bad) else {
                panic!("{bad:?} accepted")
            };
            assert!(m.starts_with(&format!("deploy.partition = {bad:?} cannot go into an sbatch script")), "{m}");
        }
    }
}
