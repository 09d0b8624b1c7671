//! The PyTorch reference: `benches/ddp_gloo.py` run with "a Python with torch"
//! (`TRAINRUN_BENCH_PYTHON`), one process per rank in the same hosts as trainrun's tasks: DDP
//! over gloo on the same MLP and batch (step times), and gloo's all-reduce at the same sizes.

use super::hosts::{NamespaceHosts, address};
use super::procs::{Procs, ProcsError, Start};
use super::train::TaskLayout;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

const SCRIPT: &str = "benches/ddp_gloo.py";

/// The interpreter and the script, both absolute (the ranks run in the cluster's folder).
pub struct TorchReference {
    python: PathBuf,
    script: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum GlooError {
    #[error(transparent)]
    Procs(#[from] ProcsError),
    #[error("rank 0 of {SCRIPT} printed no figures; its output:\n{0}")]
    NoFigures(String),
}

impl TorchReference {
    /// `python` if it can import torch and the script is here; else why not.
    pub fn find(python: &str) -> Result<TorchReference, String> {
        let script = std::env::current_dir().map_err(|e| e.to_string())?.join(SCRIPT);
        if !script.exists() {
            return Err(format!("no {SCRIPT} here: run the bench from the repository root"));
        }
        // Made absolute without resolving links: a venv's `python` is a link out of the venv.
        let python = match python.contains('/') {
            true => std::path::absolute(python).map_err(|e| format!("{python}: {e}"))?,
            false => PathBuf::from(python),
        };
        let out = std::process::Command::new(&python)
            .args(["-c", "import torch, torch.distributed as d; print(torch.__version__, d.is_gloo_available())"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        match out.status.success() && text.trim().ends_with("True") {
            true => Ok(TorchReference { python, script }),
            false => Err(format!(
                "{} has no torch with gloo; set TRAINRUN_BENCH_PYTHON to a Python with torch",
                python.display()
            )),
        }
    }

    /// Runs the script's `mode` on every rank; rank 0's figures line.
    fn ranks(
        &self,
        cluster: &NamespaceHosts,
        p: TaskLayout,
        args: &[String],
        deadline: Duration,
        stop: &AtomicBool,
    ) -> Result<serde_json::Value, GlooError> {
        let mut procs = Procs::default();
        for r in 0..p.tasks {
            let env = [
                ("RANK", r.to_string()),
                ("WORLD_SIZE", p.tasks.to_string()),
                ("MASTER_ADDR", address(0)),
                ("MASTER_PORT", "29500".to_string()),
                ("GLOO_SOCKET_IFNAME", "eth0".to_string()),
                ("OMP_NUM_THREADS", "1".to_string()),
            ];
            let mut all = vec![self.script.display().to_string()];
            all.extend_from_slice(args);
            procs.start(
                cluster,
                Start {
                    name: format!("torch-{}-rank{r}", args[0]),
                    host: p.host_of(r),
                    program: &self.python,
                    args: all,
                    env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
                },
            )?;
        }
        procs.wait(deadline, stop)?;
        let log = procs.log(0).unwrap_or_default();
        log.lines()
            .rev()
            .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok().filter(serde_json::Value::is_object))
            .ok_or(GlooError::NoFigures(log))
    }

    /// DDP's step times, ms.
    pub fn step_ms(
        &self,
        cluster: &NamespaceHosts,
        p: TaskLayout,
        batch: usize,
        steps: u64,
        deadline: Duration,
        stop: &AtomicBool,
    ) -> Result<Vec<f64>, GlooError> {
        let args = ["step".to_string(), "--batch".into(), batch.to_string(), "--steps".into(), steps.to_string()];
        let v = self.ranks(cluster, p, &args, deadline, stop)?;
        Ok(v["step_ms"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default())
    }

    /// gloo's all-reduce: (bytes, median seconds) per size.
    pub fn all_reduce(
        &self,
        cluster: &NamespaceHosts,
        p: TaskLayout,
        deadline: Duration,
        stop: &AtomicBool,
    ) -> Result<Vec<(usize, f64)>, GlooError> {
        let v = self.ranks(cluster, p, &["allreduce".to_string()], deadline, stop)?;
        let list = |k: &str| v[k].as_array().cloned().unwrap_or_default();
        Ok(list("bytes")
            .iter()
            .zip(list("median_s"))
            .filter_map(|(b, s)| Some((b.as_u64()? as usize, s.as_f64()?)))
            .collect())
    }
}
