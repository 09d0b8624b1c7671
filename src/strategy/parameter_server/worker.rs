//! A worker task under `parameter_server`: it reads its own shuffle of the data (TensorFlow's
//! `create_per_worker_dataset`) and runs the closures the chief sends. Each step pulls the
//! current values from every ps, computes the gradient of its own batch and pushes each ps
//! its part; the ps tasks apply it. A ps that is gone or silent fails the closure with a
//! message naming it, which the chief raises as the job's error.
//!
//! The step computes what the default strategy's step computes (same dropout draws, same
//! loss scaling, the gradient clipped by its global norm before it is split over the ps), so
//! one worker with one ps trains bit for bit as `default` does.

use super::layout::{Piece, PsLayout, wire_order};
use super::shared::Shared;
use super::wire::{Conn, Frame, Secure, Tag, peer_error};
use crate::cluster::{Role, TaskId};
use crate::collective::{RingTls, TransportKind};
use crate::data::{Batch, Cursor, Dataset, Pipeline, PipelineOptions, Shard};
use crate::engine::init::{STEP_DOMAIN, derive_seed};
use crate::engine::optimizer::clip_by_global_norm;
use crate::metrics::Sums;
use crate::plan::{OptimizerPlan, ParameterServerPlan, Plan};
use crate::strategy::{BatchView, MicroStep, Replica, StrategyError};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::num::NonZeroUsize;
use std::sync::Arc;

/// Separates each worker's shuffle from the others' (worker 0 keeps the run seed's).
const WORKER_DOMAIN: u64 = 0x5750_4b52; // "WPKR"

/// What a worker task needs.
pub struct WorkerTask {
    /// Its index among the workers.
    pub index: u32,
    /// Its bound data-plane listener, which the chief dials.
    pub listener: TcpListener,
    /// Every ps task's data-plane address and host (which its certificate names), by ps
    /// index.
    pub ps: Vec<(TaskId, SocketAddr, String)>,
    /// The job token's hash.
    pub token: u64,
    /// Mutual TLS on every connection (`cluster.tls`).
    pub tls: Option<RingTls>,
}

/// One worker's model, data and connections.
struct Stepper<'a> {
    plan: &'a Plan,
    replica: Replica,
    dataset: Arc<Dataset>,
    options: PipelineOptions,
    pipeline: Pipeline,
    /// Steps whose batches this worker's pipeline has given (its place in its shuffle).
    drawn: u64,
    layout: PsLayout,
    ps: Vec<(TaskId, Conn)>,
    /// Per ps, the segment pulls and pushes go through when it runs on this host.
    shared: Vec<Option<Shared>>,
    params: Vec<f32>,
    state: Vec<f32>,
    grads: Vec<f32>,
    versions: Vec<u64>,
    micro: Vec<Batch>,
}

/// The pipeline options of worker `index`: its own shuffle of every example.
pub fn pipeline_options(plan: &Plan, index: u32) -> PipelineOptions {
    let seed = if index == 0 { plan.seed } else { derive_seed(&[plan.seed, WORKER_DOMAIN, u64::from(index)]) };
    PipelineOptions {
        seed,
        shuffle: plan.data.shuffle,
        global_batch: NonZeroUsize::new(plan.batch.per_replica).unwrap_or(NonZeroUsize::MIN),
        drop_remainder: plan.data.drop_remainder,
        prefetch: plan.data.prefetch,
        shard: Shard::WHOLE,
    }
}

/// Runs the chief's closures until it says stop.
pub fn serve(
    plan: &Plan,
    ps_plan: &ParameterServerPlan,
    dataset: Arc<Dataset>,
    task: WorkerTask,
) -> Result<(), StrategyError> {
    let failed = StrategyError::Remote;
    let model = plan.model.build().map_err(|e| failed(e.to_string()))?;
    let layout = PsLayout::new(ps_plan, model.tensors(), model.state_tensors()).map_err(failed)?;
    let (params, state) = (vec![0.0; model.param_len()], vec![0.0; model.state_len()]);
    let options = pipeline_options(plan, task.index);
    let pipeline =
        Pipeline::new(Arc::clone(&dataset), &options, Cursor::default()).map_err(|e| failed(e.to_string()))?;
    let timeout = plan.cluster.timeout;
    let (mut ps, mut shared) = (Vec::new(), Vec::new());
    let me = TaskId::new(Role::Worker, task.index);
    let secure = task.tls.as_ref().map(|tls| Secure { tls, within: plan.cluster.startup_timeout, peer: None });
    for (i, (t, addr, host)) in task.ps.iter().enumerate() {
        let dial = secure.map(|s| Secure { peer: Some(host), ..s });
        let mut conn = Conn::dial(*addr, task.token, plan.cluster.startup_timeout, timeout, dial)
            .map_err(|e| failed(peer_error(*t, "the connection", &e, timeout)))?;
        // A push carries the learning rate and the ps's values.
        let floats = layout.len(i) + 1;
        shared.push(match ps_plan.transport {
            // `auto` falls back to TCP; an explicit `shared_memory` that cannot work fails.
            TransportKind::SharedMemory => match Shared::offer(&mut conn, (me, *t), floats, task.token, timeout) {
                Ok(Some(s)) => Some(s),
                Ok(None) if ps_plan.auto_transport => None,
                Err(why) if ps_plan.auto_transport => {
                    eprintln!("warning: {me} moves pulls and pushes over TCP: {why}");
                    None
                }
                Ok(None) => {
                    return Err(failed(format!(
                        "strategy.transport = \"shared_memory\", but {me} and {t} run on different hosts; \
                         use transport = \"auto\" or \"tcp\""
                    )));
                }
                Err(why) => {
                    return Err(failed(format!(
                        "strategy.transport = \"shared_memory\": {why}; transport = \"auto\" falls back to TCP"
                    )));
                }
            },
            // The routed kinds are the all-reduce's; the parameter-server plan never picks them.
            TransportKind::Tcp
            | TransportKind::TcpTls
            | TransportKind::SharedMemoryAndTcp
            | TransportKind::SharedMemoryAndTcpTls => None,
        });
        ps.push((*t, conn));
    }
    let grads = vec![0.0; params.len()];
    let replica = Replica::new(model, plan.train.loss_fn(), plan.model.classes, plan.threads);
    let versions = vec![0; ps.len()];
    let mut stepper = Stepper {
        plan,
        replica,
        dataset,
        options,
        pipeline,
        drawn: 0,
        layout,
        ps,
        shared,
        params,
        state,
        grads,
        versions,
        micro: Vec::new(),
    };
    let (stream, _) = task.listener.accept().map_err(|e| failed(format!("the chief did not connect: {e}")))?;
    // Between closures the chief may evaluate or save for a while: no read timeout here.
    let mut chief =
        Conn::accept(stream, task.token, None, secure).map_err(|e| failed(format!("the chief's hello: {e}")))?;
    loop {
        let request = chief.read().map_err(|e| failed(format!("the chief is gone: {e}")))?;
        let reply = match request.tag {
            Tag::Run => stepper.closure(&request).unwrap_or_else(|e| Frame::error(&e)),
            Tag::Stop => {
                // Training is over; the chief hears the goodbye before this task leaves.
                let _ = chief.write(&Frame::new(Tag::Ok, Vec::new(), Vec::new()));
                return Ok(());
            }
            Tag::Hello | Tag::Ok | Tag::Error | Tag::Pull | Tag::Push | Tag::Set | Tag::Share => {
                Frame::error("a worker answers run and stop")
            }
        };
        chief.write(&reply).map_err(|e| failed(format!("the chief is gone: {e}")))?;
    }
}

impl Stepper<'_> {
    /// Runs `ints = [first step, steps, steps this worker completed before]` at
    /// `floats = [lr of each step]`; answers `[the bits of each slot of the steps' sums,
    /// staleness of each step…]`.
    fn closure(&mut self, request: &Frame) -> Result<Frame, String> {
        let &[first, steps, done] = request.ints.as_slice() else {
            return Err("a run names its first step, its steps and the worker's steps done".into());
        };
        if done != self.drawn {
            self.seek(done)?;
        }
        if request.floats.len() as u64 != steps {
            return Err(format!("a run of {steps} steps with {} learning rates", request.floats.len()));
        }
        let mut stats = Sums::default();
        let mut staleness = Vec::with_capacity(steps as usize);
        for (k, &lr) in request.floats.iter().enumerate() {
            let (s, stale) = self.step(first + k as u64, lr)?;
            stats.add(s);
            staleness.push(stale);
        }
        let mut ints: Vec<u64> = stats.values().map(f64::to_bits).to_vec();
        ints.extend(staleness);
        Ok(Frame::new(Tag::Ok, ints, Vec::new()))
    }

    /// Puts the pipeline where `steps` completed steps leave this worker's shuffle: after a
    /// restart, or a resume from a backup, the worker goes on with its own sequence of batches
    /// (deterministic from the seed, its index and its steps) instead of starting it again.
    fn seek(&mut self, steps: u64) -> Result<(), String> {
        let batches = steps * self.plan.batch.accumulation_steps as u64;
        let per_epoch = self.pipeline.batches_per_epoch().max(1) as u64;
        let cursor = Cursor {
            epoch: batches / per_epoch,
            offset: (batches % per_epoch) as usize * self.options.global_batch.get(),
        };
        self.pipeline = Pipeline::new(Arc::clone(&self.dataset), &self.options, cursor).map_err(|e| e.to_string())?;
        self.drawn = steps;
        Ok(())
    }

    /// One step: pull, forward and backward, push. Returns its statistics and the most
    /// updates any ps applied between this step's pull and its push.
    fn step(&mut self, step: u64, lr: f32) -> Result<(Sums, u64), String> {
        let timeout = self.plan.cluster.timeout;
        for i in 0..self.ps.len() {
            let (t, conn) = &mut self.ps[i];
            let shared = self.shared[i].as_ref();
            let version = pull(conn, shared, &self.layout.ps[i], &mut self.params, &mut self.state);
            self.versions[i] = version.map_err(|e| peer_error(*t, "a pull", &e, timeout))?;
        }
        for _ in 0..self.plan.batch.accumulation_steps {
            self.micro.push(self.pipeline.next_batch().map_err(|e| e.to_string())?);
        }
        let scale = 1.0 / self.micro.iter().map(Batch::global_rows).sum::<usize>().max(1) as f32;
        let seed = derive_seed(&[self.plan.seed, STEP_DOMAIN, step]);
        let mut stats = Sums::default();
        for (i, batch) in self.micro.iter().enumerate() {
            let s = derive_seed(&[seed, i as u64, 0]);
            let view = BatchView::of(batch);
            let grads = &mut self.grads.as_mut_slice();
            let micro = MicroStep { scale, seed: s, accumulate: i > 0 };
            stats.add(self.replica.forward_backward_view(&self.params, &mut self.state, grads, view, micro));
        }
        for b in self.micro.drain(..) {
            self.pipeline.recycle(b);
        }
        self.drawn += 1;
        if !stats.loss_sum().is_finite() {
            return Err(format!("training diverged at step {}: the loss is not finite (NaN or infinite)", step + 1));
        }
        if let Some(c) = clip_norm(&self.plan.optimizer) {
            clip_by_global_norm(&mut self.grads, c as f32);
        }
        let mut stale = 0;
        let lr = [lr];
        for (i, ((t, conn), shared)) in self.ps.iter_mut().zip(&mut self.shared).enumerate() {
            // The ps's part goes out from where it lies: the learning rate, then its shards of
            // the gradient and of the state in wire order.
            let (grads, state) = (&self.grads[..], &self.state[..]);
            let mut parts: Vec<&[f32]> = vec![&lr];
            parts.extend(wire_order(&self.layout.ps[i]).map(|p| &if p.state { state } else { grads }[p.range.clone()]));
            let sent = match shared {
                // On one host the parts go into the shared area and the request carries none.
                Some(sh) => {
                    let area = sh.push_mut();
                    let mut at = 0;
                    for part in &parts {
                        area[at..at + part.len()].copy_from_slice(part);
                        at += part.len();
                    }
                    sh.publish();
                    conn.send(Tag::Push, &[self.versions[i]], &[])
                }
                None => conn.send(Tag::Push, &[self.versions[i]], &parts),
            };
            let answer = sent.and_then(|()| conn.read()).map_err(|e| peer_error(*t, "a push", &e, timeout))?;
            if answer.tag == Tag::Error {
                return Err(format!("{t} refused a push: {}", answer.text()));
            }
            stale = stale.max(answer.ints.first().copied().unwrap_or(0));
        }
        Ok((stats, stale))
    }
}

/// Pulls a ps's values straight into their places in `params` and `state`, in wire order,
/// from the socket or, on one host, from the shared area; returns the version pulled.
fn pull(
    conn: &mut Conn,
    shared: Option<&Shared>,
    pieces: &[Piece],
    params: &mut [f32],
    state: &mut [f32],
) -> io::Result<u64> {
    conn.send(Tag::Pull, &[0], &[])?;
    let head = conn.read_head()?;
    let len: usize = pieces.iter().map(|p| p.range.len()).sum();
    let expected = if shared.is_some() { 0 } else { len };
    if head.tag != Tag::Ok || head.floats != expected {
        let mut floats = vec![0.0; head.floats];
        conn.read_floats(&mut floats)?;
        let text = Frame::new(head.tag, head.ints, floats).text();
        let why = if head.tag == Tag::Ok { format!("sent {} values for {expected}", head.floats) } else { text };
        return Err(io::Error::other(why));
    }
    let mut at = 0;
    for p in wire_order(pieces) {
        let buffer = if p.state { &mut *state } else { &mut *params };
        let into = &mut buffer[p.range.clone()];
        match shared {
            Some(sh) => into.copy_from_slice(&sh.pulled()[at..at + into.len()]),
            None => conn.read_floats(into)?,
        }
        at += into.len();
    }
    Ok(head.ints.first().copied().unwrap_or(0))
}

/// Keras's `global_clipnorm`, applied here to the whole gradient.
fn clip_norm(optimizer: &OptimizerPlan) -> Option<f64> {
    match *optimizer {
        OptimizerPlan::Sgd { clip_norm, .. } | OptimizerPlan::Adam { clip_norm, .. } => clip_norm,
    }
}
