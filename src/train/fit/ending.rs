//! How a run ends on paper: `summary.json` from what the loop measured, and the evaluation
//! batch size.

use crate::checkpoint::SaveStats;
use crate::metrics::{Reading, Sums};
use crate::plan::Plan;
use crate::train::Session;
use crate::train::callbacks::StopReason;
use crate::train::summary::{Summary, SummaryMetrics, peak_rss_mb};
use std::num::NonZeroUsize;
use std::time::Instant;

/// Activation memory an evaluation batch may use: bigger batches run the forward pass's
/// products more efficiently, and per-example results do not depend on the batch size.
const EVAL_BYTES: usize = 32 << 20;

/// How a training loop ended: what [`summary`] does not read from the plan or the session.
pub(super) struct Ending {
    pub stopped: StopReason,
    pub last_epoch: Sums,
    pub final_eval: Option<Sums>,
    pub steps: u64,
    pub examples: u64,
    pub first_step_s: Option<f64>,
    pub input_wait_s: f64,
    pub steady_examples_per_s: f64,
    pub weights_sha256: String,
    pub transport: Option<&'static str>,
    pub resumed_from_step: Option<u64>,
    pub saves: Option<SaveStats>,
    pub parameter_server: Option<crate::strategy::ParameterServerStats>,
    pub stragglers: Vec<crate::cluster::Straggler>,
}

/// `summary.json` of a run that ended so.
pub(super) fn summary(plan: &Plan, launched: Instant, session: &Session, end: Ending) -> Summary {
    let train_loss = end.last_epoch.loss();
    let final_loss = end.final_eval.map(|e| e.loss());
    let metrics = Reading::new(&plan.train.metrics, end.last_epoch, end.final_eval, end.steady_examples_per_s);
    Summary {
        trainrun_version: env!("CARGO_PKG_VERSION"),
        name: plan.name.clone(),
        seed: plan.seed,
        stopped: end.stopped,
        train_loss,
        train_accuracy: plan.train.accuracy.then(|| end.last_epoch.accuracy()),
        test_loss: final_loss,
        test_accuracy: end.final_eval.filter(|_| plan.train.accuracy).map(|e| e.accuracy()),
        steps: end.steps,
        examples: end.examples,
        wall_s: launched.elapsed().as_secs_f64(),
        first_step_s: end.first_step_s.unwrap_or(0.0),
        input_wait_s: end.input_wait_s,
        steady_examples_per_s: end.steady_examples_per_s,
        peak_rss_mb: peak_rss_mb(),
        metrics: SummaryMetrics(metrics),
        weights_sha256: end.weights_sha256,
        params: session.vars.params.len(),
        threads: plan.threads,
        num_replicas_in_sync: plan.strategy.num_replicas_in_sync,
        num_workers: plan.strategy.num_workers,
        transport: end.transport,
        resumed_from_step: end.resumed_from_step,
        checkpoints_written: end.saves.map(|s| s.saves),
        save_block_ms_max: end.saves.map(|s| s.block_max.as_secs_f64() * 1e3),
        save_write_ms_max: end.saves.map(|s| s.write_max.as_secs_f64() * 1e3),
        parameter_server: end.parameter_server,
        stragglers: end.stragglers,
    }
}

/// The largest multiple of the training micro-batch (at most 1024 examples per replica) whose
/// activations fit [`EVAL_BYTES`] on each replica.
pub fn eval_batch_size(micro: NonZeroUsize, replicas: usize, activation_len: usize) -> NonZeroUsize {
    let per_replica = (EVAL_BYTES / (4 * activation_len.max(1))).clamp(1, 1024);
    let multiple = (per_replica * replicas.max(1) / micro.get()).max(1);
    NonZeroUsize::new(micro.get() * multiple).unwrap_or(micro)
}
