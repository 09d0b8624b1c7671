//! `trainrun predict` of a `multi_worker_mirrored` spec whose cluster is local
//! (`[cluster] worker = 2`): started as a training job is, by the launcher, one process of this
//! binary per task with the same `predict` arguments and `TF_CONFIG`, supervised to the end.
//! Each task joins the job, predicts its shard and the chief writes the file
//! ([`super::rounds`]); a task that dies fails the job naming it, within the cluster's
//! timeout, as in training.

use super::PredictOptions;
use crate::cluster::launch;
use crate::exit::RunError;
use crate::plan::Plan;
use crate::prepare::Invocation;
use std::path::Path;

/// Starts every task of the local cluster as `trainrun predict …` and waits for them.
pub(super) fn launch_tasks(
    inv: &Invocation,
    plan: &Plan,
    checkpoint: &Path,
    o: &PredictOptions,
) -> Result<(), RunError> {
    let path = |p: &Path| p.display().to_string();
    let mut args = vec!["predict".to_string(), path(&inv.spec)];
    for s in &inv.sets {
        args.extend(["--set".to_string(), s.clone()]);
    }
    args.extend(["--checkpoint".into(), path(checkpoint), "--output".into(), path(&o.output)]);
    args.extend(["--top-k".into(), o.top_k.to_string()]);
    for f in &o.inputs {
        args.extend(["--input".into(), path(f)]);
    }
    if o.force {
        args.push("--force".into());
    }
    if inv.quiet {
        args.push("--quiet".into());
    }
    let run = launch::Launch {
        epochs: 1,
        // A prediction is started again by running it again: nothing of it is kept.
        max_restarts: 0,
        expendable: Vec::new(),
        backs_up: false,
        ..super::super::launcher(inv, plan, args)?
    };
    launch::run(run).map_err(|e| match e {
        launch::LaunchError::Preempted(_) => RunError::Preempted(e.to_string()),
        launch::LaunchError::Interrupted(_) => RunError::Interrupted(e.to_string()),
        e => RunError::Launch(e),
    })
}
