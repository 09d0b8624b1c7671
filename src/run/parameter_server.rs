//! The parts of a parameter-server job besides the chief (which trains through `train::fit`,
//! its strategy scheduling the steps): a ps task serves its shards, a worker task runs the
//! chief's closures. Both join the job as every task does, stay through SIGTERM until the chief,
//! which saves the backup, tells them to leave, and then leave the control plane.

use super::{join, load_data, pool, watch_stops};
use crate::builder;
use crate::cluster::job::{DataPlane, Job};
use crate::cluster::{Role, TaskId};
use crate::exit::RunError;
use crate::plan::ParameterServerPlan;
use crate::prepare::{Invocation, Prepared};
use crate::strategy::parameter_server::layout::{PsLayout, local_tensors};
use crate::strategy::parameter_server::{ps as server, worker as steps};
use std::sync::Arc;

/// Joins as `task` and takes the data-plane endpoints.
fn enter(inv: &Invocation, p: &Prepared, task: TaskId) -> Result<(Job, DataPlane), RunError> {
    let mut job = join(inv, &p.plan, task, 0)?;
    let data = job.data.take().ok_or_else(|| RunError::Cluster(format!("{task} joined without a data plane")))?;
    // From here a stop request waits for the chief, which saves before it says stop.
    crate::signals::cooperative_stop();
    Ok((job, data))
}

/// A ps task: holds its shards and applies the workers' gradients until the chief says stop.
pub fn ps(inv: &Invocation, p: &Prepared, ps_plan: &ParameterServerPlan, task: TaskId) -> Result<(), RunError> {
    let plan = &p.plan;
    watch_stops(inv, plan);
    let model = plan.model.build().map_err(|e| RunError::Failure(e.to_string()))?;
    let layout = PsLayout::new(ps_plan, model.tensors(), model.state_tensors()).map_err(RunError::Failure)?;
    let index = task.index as usize;
    let pieces = layout.ps.get(index).cloned().ok_or_else(|| RunError::Failure(format!("{task} holds no shards")))?;
    let tensors = local_tensors(&pieces, model.tensors());
    // Clipping by the global norm needs the whole gradient: the workers clip before pushing.
    let optimizer = builder::optimizer(&plan.optimizer, &tensors, layout.trainable_len(index)).with_clip_norm(None);
    let (job, data) = enter(inv, p, task)?;
    let task_data = server::PsTask {
        pieces,
        optimizer,
        listener: data.listener,
        token: data.token,
        task,
        timeout: plan.cluster.timeout,
        tls: data.tls,
    };
    let served = pool(plan.threads)?.install(|| server::serve(task_data));
    job.plane.shutdown();
    served.map_err(|e| RunError::Cluster(format!("{task} stopped serving: {e}")))
}

/// A worker task: reads its own shuffle of the data and runs the chief's closures.
pub fn worker(inv: &Invocation, p: &Prepared, ps_plan: &ParameterServerPlan, task: TaskId) -> Result<(), RunError> {
    let plan = &p.plan;
    watch_stops(inv, plan);
    let dataset = Arc::new(load_data(inv, plan)?);
    let (job, data) = enter(inv, p, task)?;
    let ps = data.peers(Role::Ps);
    let me = steps::WorkerTask { index: task.index, listener: data.listener, ps, token: data.token, tls: data.tls };
    let served = pool(plan.threads)?.install(|| steps::serve(plan, ps_plan, dataset, me));
    job.plane.shutdown();
    Ok(served?)
}
