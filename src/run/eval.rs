//! Evaluating checkpoints: `trainrun eval SPEC --checkpoint PATH` evaluates one on the test
//! split; the `evaluator` task of a job (TensorFlow's sidecar evaluator) evaluates each new
//! one until training finishes.

use super::{join, load_data, pool, say};
use crate::cluster::{Command, TaskId};
use crate::data::Dataset;
use crate::exit::RunError;
use crate::prepare::{Invocation, Prepared, prepare};
use crate::strategy::Replica;
use crate::train::{TrainError, evaluator};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// What evaluating needs: a replica of the planned model, its layout, the data and threads.
struct Evaluation {
    replica: Replica,
    layout: crate::checkpoint::Layout,
    dataset: Dataset,
    batch: NonZeroUsize,
    pool: rayon::ThreadPool,
}

fn evaluation(inv: &Invocation, p: &Prepared) -> Result<Evaluation, RunError> {
    let plan = &p.plan;
    let model = plan.model.build().map_err(|e| RunError::Failure(e.to_string()))?;
    let layout = crate::builder::layout(&model);
    let dataset = load_data(inv, plan)?;
    let batch = crate::train::eval_batch_size(NonZeroUsize::MIN, 1, model.activation_len());
    let replica = Replica::new(model, plan.train.loss_fn(), plan.model.classes, plan.threads);
    Ok(Evaluation { replica, layout, dataset, batch, pool: pool(plan.threads)? })
}

/// `trainrun eval SPEC --checkpoint PATH`: evaluates one checkpoint on the test split.
pub fn eval(inv: &Invocation, checkpoint: &Path) -> Result<(), RunError> {
    let p = prepare(inv)?;
    let mut e = evaluation(inv, &p)?;
    let loaded = crate::checkpoint::store::load(checkpoint, &e.layout)?;
    let test = e.dataset.test.as_ref().ok_or_else(|| RunError::Failure("the dataset has no test split".into()))?;
    let step = loaded.manifest.step;
    let (replica, batch) = (&mut e.replica, e.batch);
    let stats = e.pool.install(|| evaluator::evaluate_checkpoint(replica, test, batch, loaded))?;
    println!("checkpoint {} (step {step})", checkpoint.display());
    // Float targets have no accuracy.
    let accuracy = p.plan.train.accuracy.then(|| stats.accuracy());
    let shown = accuracy.map_or(String::new(), |a| format!(" - accuracy: {a:.4}"));
    println!("test: loss: {:.4}{shown}", stats.loss());
    let mut line = serde_json::json!({ "step": step, "test_loss": stats.loss(), "examples": stats.examples() });
    if let Some(a) = accuracy {
        line["test_accuracy"] = serde_json::json!(a);
    }
    println!("{line}");
    Ok(())
}

/// The evaluator task: joins the job's control plane (not the collective) and evaluates every
/// new checkpoint until training finishes.
pub fn sidecar(inv: &Invocation, p: &Prepared, task: TaskId) -> Result<(), RunError> {
    // SIGTERM (a preemption of the job) ends the evaluator after the checkpoint at hand.
    let stop = crate::signals::stop_requested();
    let plan = &p.plan;
    // Planning refused an evaluator without a model_checkpoint callback.
    let dirs: Vec<(String, PathBuf)> =
        plan.callbacks.model_dirs().map(|(name, dir)| (name.to_string(), dir.to_path_buf())).collect();
    if dirs.is_empty() {
        return Err(RunError::Failure("the evaluator has no checkpoints to watch".into()));
    }
    let mut e = evaluation(inv, p)?;
    let test = e.dataset.test.as_ref().ok_or_else(|| RunError::Failure("the dataset has no test split".into()))?;
    // Outside the training cluster (TF_CONFIG listed it there), it learns the end from the
    // chief's run record instead of the control plane.
    let job = match plan.cluster.tasks.iter().any(|(t, _)| *t == task) {
        true => Some(join(inv, plan, task, 0)?),
        false => None,
    };
    let record = crate::train::ended::Watcher::new(&plan.out_dir);
    // Its lines are the evaluator's output, shown unless `--quiet`: the launcher prefixes
    // them with the task itself.
    let quiet = inv.quiet;
    let prefix =
        if inv.env.iter().any(|(k, _)| k == "TRAINRUN_PROGRESS") { String::new() } else { format!("[{task}] ") };
    let watch = evaluator::CheckpointWatch {
        dirs,
        out: plan.out_dir.join("eval.jsonl"),
        layout: &e.layout,
        test,
        batch: e.batch,
        accuracy: plan.train.accuracy,
    };
    let plane = job.as_ref().map(|j| &j.plane);
    let finished = || -> Result<bool, TrainError> {
        let mut done = stop.load(Ordering::SeqCst);
        let Some(plane) = plane else {
            return Ok(done || record.ended());
        };
        while let Some(c) = plane.poll_command().map_err(|e| TrainError::Strategy(e.into()))? {
            done |= matches!(c, Command::Stop { .. });
        }
        Ok(done)
    };
    let replica = &mut e.replica;
    let count = e.pool.install(|| evaluator::watch(&watch, replica, finished, |t| say(quiet, &prefix, t)))?;
    say(quiet, &prefix, &format!("evaluated {count} checkpoint{}", if count == 1 { "" } else { "s" }));
    if let Some(job) = job {
        job.plane.shutdown();
    }
    if stop.load(Ordering::SeqCst) {
        return Err(RunError::Preempted("preempted: the evaluator stopped on SIGTERM".into()));
    }
    Ok(())
}
