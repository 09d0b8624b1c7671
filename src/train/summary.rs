//! How a run ends on paper: `summary.json` from what the loop measured, the statistics a
//! backup carries, and the evaluation batch size.

use super::Session;
use super::callbacks::StopReason;
use super::record::{NamedMetrics, Summary, peak_rss_mb};
use crate::checkpoint::SaveStats;
use crate::checkpoint::manifest::Sums;
use crate::engine::BatchStats;
use crate::plan::Plan;
use std::num::NonZeroUsize;
use std::time::Instant;

/// Activation memory an evaluation batch may use: bigger batches run the forward pass's
/// products more efficiently, and per-example results do not depend on the batch size.
const EVAL_BYTES: usize = 32 << 20;

pub(super) fn sums(s: &BatchStats) -> Sums {
    Sums {
        loss_sum: s.loss_sum,
        correct: s.correct,
        examples: s.examples,
        abs_error_sum: s.abs_error_sum,
        squared_error_sum: s.squared_error_sum,
    }
}

pub(super) fn stats(s: &Sums) -> BatchStats {
    BatchStats {
        loss_sum: s.loss_sum,
        correct: s.correct,
        examples: s.examples,
        abs_error_sum: s.abs_error_sum,
        squared_error_sum: s.squared_error_sum,
    }
}

/// How a training loop ended: what [`summary`] does not read from the plan or the session.
pub(super) struct Ending {
    pub stopped: StopReason,
    pub last_epoch: BatchStats,
    pub final_eval: Option<BatchStats>,
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
}

/// `summary.json` of a run that ended so.
pub(super) fn summary(plan: &Plan, launched: Instant, session: &Session, end: Ending) -> Summary {
    let train_loss = end.last_epoch.loss();
    let final_loss = end.final_eval.map(|e| e.loss());
    let named = NamedMetrics::of(&plan.train.metrics, train_loss, final_loss, end.steady_examples_per_s).errors(
        &plan.train.metrics,
        &end.last_epoch,
        end.final_eval.as_ref(),
    );
    Summary {
        trainrun_version: env!("CARGO_PKG_VERSION"),
        name: plan.name.clone(),
        seed: plan.seed,
        stopped: end.stopped,
        train_loss,
        train_accuracy: end.last_epoch.accuracy(),
        test_loss: final_loss,
        test_accuracy: end.final_eval.map(|e| e.accuracy()),
        steps: end.steps,
        examples: end.examples,
        wall_s: launched.elapsed().as_secs_f64(),
        first_step_s: end.first_step_s.unwrap_or(0.0),
        input_wait_s: end.input_wait_s,
        steady_examples_per_s: end.steady_examples_per_s,
        peak_rss_mb: peak_rss_mb(),
        train_perplexity: named.perplexity,
        test_perplexity: named.val_perplexity,
        steady_tokens_per_s: named.tokens_per_s,
        train_mae: named.mae,
        test_mae: named.val_mae,
        train_rmse: named.rmse,
        test_rmse: named.val_rmse,
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
    }
}

/// The largest multiple of the training micro-batch (at most 1024 examples per replica) whose
/// activations fit [`EVAL_BYTES`] on each replica.
pub fn eval_batch_size(micro: NonZeroUsize, replicas: usize, activation_len: usize) -> NonZeroUsize {
    let per_replica = (EVAL_BYTES / (4 * activation_len.max(1))).clamp(1, 1024);
    let multiple = (per_replica * replicas.max(1) / micro.get()).max(1);
    NonZeroUsize::new(micro.get() * multiple).unwrap_or(micro)
}
