//! What the parameter-server coordinator did, as `summary.json` and `metrics.jsonl` record it.

use serde::Serialize;

/// What the parameter-server coordinator did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParameterServerStats {
    /// Steps put on the coordinator's queue.
    pub steps_scheduled: u64,
    /// Steps the ps tasks applied (every scheduled step, at least once, on success).
    pub steps_applied: u64,
    /// Steps applied by each worker, by worker index.
    pub steps_applied_per_worker: Vec<u64>,
    /// Closures run again after their worker was lost.
    pub closures_rescheduled: u64,
    /// How often each worker came back after it was lost (the launcher restarted it).
    pub rejoins_per_worker: Vec<u64>,
    /// Steps applied by each worker since it last rejoined (all of its steps when it never
    /// left).
    pub steps_applied_since_rejoin: Vec<u64>,
    /// Milliseconds each worker was lost before it came back (or the run ended), in all:
    /// the launcher's restart, the process's start and its reconnection.
    pub absent_ms_per_worker: Vec<u64>,
    /// Steps by staleness: the updates other workers applied between a step's pull and its
    /// push (the most over the ps tasks), as `{"0": 120, "1": 80}`.
    pub staleness_histogram: std::collections::BTreeMap<u64, u64>,
    /// Per ps, the workers that pulled and pushed through shared memory (on its host) rather
    /// than TCP when the chief last pulled, as `[2]`.
    pub shared_memory_workers_per_ps: Vec<u64>,
}
