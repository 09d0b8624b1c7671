//! The chief's strategy under `parameter_server` (TensorFlow's `ClusterCoordinator` driving
//! `model.fit`): it computes no step itself. Each execution schedules a closure of steps on
//! the workers through the coordinator and returns at once; [`Strategy::join`] waits for them,
//! takes their statistics and pulls every shard from the ps tasks, so the training loop
//! evaluates, calls back and saves with the variables as the ps tasks hold them. Its one
//! replica evaluates those variables with the evaluation threads of the plan.

use super::client::{Rates, RemoteWorker, Report, Servers};
use super::coordinator::Coordinator;
use super::layout::PsLayout;
use super::stats::ParameterServerStats;
use crate::cluster::Role;
use crate::cluster::job::{DataPlane, Job};
use crate::data::Batch;
use crate::engine::Optimizer;
use crate::metrics::Sums;
use crate::plan::{CrossDevice, ParameterServerPlan, StrategyKind};
use crate::strategy::local::Replicated;
use crate::strategy::{Executed, Execution, Input, Replica, Strategy, StrategyError, Synchronous, Variables};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The chief of a parameter-server job.
pub struct Chief {
    /// The replica that evaluates the pulled variables.
    local: Replicated,
    plan: ParameterServerPlan,
    /// How long tasks have to connect, and to answer.
    timeouts: (Duration, Duration),
    /// The job joined, until the end.
    job: Option<Job>,
    /// The ps tasks' and workers' data-plane endpoints and where the variables' shards lie,
    /// until training starts.
    data: Option<(DataPlane, PsLayout)>,
    running: Option<Running>,
}

/// The job under way: the ps tasks, the workers and what they report.
struct Running {
    servers: Servers,
    coordinator: Coordinator,
    rates: Arc<Mutex<Rates>>,
    report: Arc<Mutex<Report>>,
    /// Steps scheduled so far (closures carry several).
    scheduled_steps: u64,
    /// The step after the last one scheduled.
    next_step: u64,
    /// Steps the coordinator had applied at the last join.
    applied_at_join: u64,
    /// Steps each worker had completed before this run (from the backup resumed).
    resumed_worker_steps: Vec<u64>,
    /// Steps by staleness, over the steps joined so far.
    staleness: BTreeMap<u64, u64>,
    /// Every connection runs under mutual TLS (`cluster.tls`).
    encrypted: bool,
}

/// The chief of a parameter-server job over `replica`, in `job` as `plan` places it.
pub fn new(
    replica: Replica,
    mut job: Option<Job>,
    plan: ParameterServerPlan,
    timeouts: (Duration, Duration),
) -> Result<Chief, StrategyError> {
    let data = job.as_mut().and_then(|j| j.data.take()).ok_or_else(|| {
        StrategyError::Unsupported(
            "the parameter-server coordinator runs as the chief of a job: name the task with --task".into(),
        )
    })?;
    let layout = PsLayout::new(&plan, replica.model().tensors(), replica.model().state_tensors()).map_err(remote)?;
    Ok(Chief {
        local: Replicated::new(StrategyKind::ParameterServer, vec![replica], CrossDevice::ReductionToOneDevice),
        plan,
        timeouts,
        job,
        data: Some((data, layout)),
        running: None,
    })
}

fn remote(e: impl ToString) -> StrategyError {
    StrategyError::Remote(e.to_string())
}

impl Chief {
    fn running(&mut self) -> Result<&mut Running, StrategyError> {
        self.running.as_mut().ok_or(StrategyError::Finished)
    }
}

impl Running {
    /// Connects to every ps and worker of `data`, gives the ps tasks `vars` and `optimizer`'s
    /// state. `worker_steps`: the steps each worker completed before (from a backup), where
    /// each resumes its own shuffle.
    fn start(
        chief: &Chief,
        (data, layout): (DataPlane, PsLayout),
        (vars, optimizer): (&Variables, &Optimizer),
        worker_steps: &[u64],
    ) -> Result<Self, StrategyError> {
        let (startup, timeout) = chief.timeouts;
        let mut servers =
            Servers::connect(layout, &data.peers(Role::Ps), data.token, chief.timeouts, data.tls.as_ref())?;
        servers.set(vars, optimizer)?;
        let rates = Arc::new(Mutex::new(Rates::default()));
        let report = Arc::new(Mutex::new(Report::default()));
        let mut workers = Vec::new();
        let mut resumed_worker_steps = Vec::new();
        for (i, (t, addr, host)) in data.peers(Role::Worker).into_iter().enumerate() {
            let (r, s) = (Arc::clone(&rates), Arc::clone(&report));
            let done = worker_steps.get(i).copied().unwrap_or(0);
            resumed_worker_steps.push(done);
            let (at, auth) = ((addr, host), (data.token, data.tls.clone()));
            workers.push(RemoteWorker::connect(t, at, auth, (startup, timeout), done, (r, s))?);
        }
        let coordinator = Coordinator::new(workers, chief.plan.queue_size, chief.plan.max_staleness);
        Ok(Self {
            servers,
            coordinator,
            rates,
            report,
            scheduled_steps: 0,
            next_step: 0,
            applied_at_join: 0,
            resumed_worker_steps,
            staleness: BTreeMap::new(),
            encrypted: data.tls.is_some(),
        })
    }

    /// Ends the job: the workers are told to leave (dropping the coordinator), then the ps
    /// tasks.
    fn leave(self) -> Result<(), StrategyError> {
        let Running { mut servers, coordinator, .. } = self;
        drop(coordinator);
        servers.stop()
    }
}

impl Strategy for Chief {
    fn steps_per_execution(&self) -> u64 {
        self.plan.steps_per_execution.get()
    }

    fn start(&mut self, vars: &Variables, optimizer: &Optimizer, worker_steps: &[u64]) -> Result<(), StrategyError> {
        // From here a stop request waits for the chief, which lets the closures in flight
        // finish and saves before it tells every task to leave.
        crate::signals::cooperative_stop();
        let data = self.data.take().ok_or(StrategyError::Finished)?;
        self.running = Some(Running::start(self, data, (vars, optimizer), worker_steps)?);
        Ok(())
    }

    fn execute(&mut self, cx: Execution<'_>) -> Result<Executed, StrategyError> {
        let running = self.running()?;
        if cx.stop {
            // Only the closures in flight finish; those still queued were never started, so
            // their steps are not counted.
            let unrun = running.coordinator.cancel();
            running.next_step -= unrun;
            return Ok(Executed::Stopped { unrun });
        }
        let steps = cx.lrs.len() as u64;
        running.rates.lock().unwrap_or_else(PoisonError::into_inner).extend(cx.step, cx.lrs);
        running.coordinator.schedule(cx.step, steps).map_err(remote)?;
        running.scheduled_steps += steps;
        running.next_step = cx.step + steps;
        let applied = running.coordinator.stats().steps_applied() - running.applied_at_join;
        Ok(Executed::Scheduled { applied })
    }

    /// Steps are applied by the ps tasks as the workers push them.
    fn apply(&mut self, _: &mut Variables, _: &mut Optimizer, _: &mut Input, _: f32) -> Result<(), StrategyError> {
        Ok(())
    }

    fn join(
        &mut self,
        vars: &mut Variables,
        optimizer: &mut Optimizer,
        stats: &mut Sums,
        stop: &AtomicBool,
    ) -> Result<u64, StrategyError> {
        let running = self.running()?;
        // The whole epoch may be queued (the queue holds 256 Ki closures, as TensorFlow's): a
        // stop drops what no worker has started.
        let unrun = running.coordinator.join_unless(stop).map_err(remote)?;
        running.next_step -= unrun;
        running.applied_at_join = running.coordinator.stats().steps_applied();
        let report = std::mem::take(&mut *running.report.lock().unwrap_or_else(PoisonError::into_inner));
        for closure in report.closures {
            stats.add(closure);
        }
        for (k, v) in report.staleness {
            *running.staleness.entry(k).or_insert(0) += v;
        }
        *running.rates.lock().unwrap_or_else(PoisonError::into_inner) =
            Rates { first: running.next_step, lrs: Vec::new() };
        running.servers.pull(vars, optimizer)?;
        Ok(unrun)
    }

    /// Evaluates the variables pulled last. Every evaluation follows a join, so the workers
    /// wait meanwhile and the chief evaluates with the plan's evaluation threads (every core
    /// of its machine) rather than its share of the cores while they train. Evaluating a
    /// snapshot beside the training workers instead hid nothing on two cores: the chief, two
    /// workers and a ps already keep both busy, so the evaluation's work only slowed the steps.
    fn evaluate(
        &mut self,
        vars: &mut Variables,
        batches: &mut (dyn Iterator<Item = Batch> + Send),
    ) -> Result<Sums, StrategyError> {
        let threads = self.plan.eval_threads;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| remote(format!("cannot start {threads} evaluation threads: {e}")))?;
        let local = &mut self.local;
        pool.install(|| local.evaluate(vars, batches))
    }

    /// The workers and ps tasks are told to leave; the chief leaves the control plane last,
    /// waiting for their goodbyes.
    fn finish(&mut self) -> Result<(), StrategyError> {
        let left = self.running.take().map_or(Ok(()), Running::leave);
        if let Some(job) = self.job.take() {
            job.plane.shutdown();
        }
        left
    }

    fn transport(&self) -> Option<&'static str> {
        let encrypted = match (&self.running, &self.data) {
            (Some(r), _) => r.encrypted,
            (None, Some((data, _))) => data.tls.is_some(),
            (None, None) => false,
        };
        Some(if encrypted { "tcp_tls" } else { "tcp" })
    }

    fn worker_steps(&self) -> Vec<u64> {
        let Some(r) = &self.running else { return Vec::new() };
        let now = r.coordinator.stats().steps_per_worker;
        now.iter().zip(&r.resumed_worker_steps).map(|(a, b)| a + b).collect()
    }

    fn parameter_server_stats(&self) -> Option<ParameterServerStats> {
        let r = self.running.as_ref()?;
        let s = r.coordinator.stats();
        Some(ParameterServerStats {
            steps_scheduled: r.scheduled_steps,
            steps_applied: s.steps_applied(),
            steps_applied_per_worker: s.steps_per_worker,
            closures_rescheduled: s.rescheduled,
            rejoins_per_worker: s.rejoins_per_worker,
            steps_applied_since_rejoin: s.steps_since_rejoin,
            absent_ms_per_worker: s.absent_ms_per_worker,
            staleness_histogram: r.staleness.clone(),
            shared_memory_workers_per_ps: r.servers.shared_workers().to_vec(),
        })
    }
}
