//! The chief's ends of the parameter-server data plane: [`Servers`] (every ps: set the values
//! at the start, pull them all for evaluation and checkpoints, stop) and [`RemoteWorker`] (a
//! worker as the coordinator drives it: send a closure, read its statistics).

use super::coordinator::{Closure, ClosureFailure, Worker};
use super::layout::{PsLayout, gather, gather_trainable, scatter, scatter_trainable};
use super::wire::{Conn, Frame, Secure, Tag, peer_error};
use crate::cluster::TaskId;
use crate::collective::RingTls;
use crate::engine::Optimizer;
use crate::metrics::Sums;
use crate::strategy::{StrategyError, Variables};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The chief's connections to every ps task.
pub struct Servers {
    ps: Vec<(TaskId, Conn)>,
    layout: PsLayout,
    timeout: Duration,
    /// Per ps, the workers it served through shared memory at the last pull.
    shared_workers: Vec<u64>,
}

impl Servers {
    /// Dials every ps of `ps` (by index, with its host) until `startup`, over TLS with `tls`;
    /// answers wait `timeout` at most.
    pub fn connect(
        layout: PsLayout,
        ps: &[(TaskId, SocketAddr, String)],
        token: u64,
        (startup, timeout): (Duration, Duration),
        tls: Option<&RingTls>,
    ) -> Result<Self, StrategyError> {
        let mut conns = Vec::new();
        for (t, addr, host) in ps {
            let secure = tls.map(|tls| Secure { tls, within: startup, peer: Some(host) });
            let conn = Conn::dial(*addr, token, startup, timeout, secure)
                .map_err(|e| StrategyError::Remote(peer_error(*t, "the connection", &e, timeout)))?;
            conns.push((*t, conn));
        }
        let shared_workers = vec![0; conns.len()];
        Ok(Self { ps: conns, layout, timeout, shared_workers })
    }

    fn call(&mut self, i: usize, frame: &Frame, what: &str) -> Result<Frame, StrategyError> {
        let (t, conn) = &mut self.ps[i];
        conn.call(frame).map_err(|e| StrategyError::Remote(peer_error(*t, what, &e, self.timeout)))
    }

    /// Gives every ps its shards of `vars` and of `optimizer`'s state (at the start, and
    /// after a resume).
    pub fn set(&mut self, vars: &Variables, optimizer: &Optimizer) -> Result<(), StrategyError> {
        for i in 0..self.ps.len() {
            let pieces = &self.layout.ps[i];
            let mut floats = Vec::with_capacity(self.layout.len(i));
            gather(pieces, &vars.params, &vars.state, &mut floats);
            for (_, buffer) in optimizer.state() {
                gather_trainable(pieces, buffer, &mut floats);
            }
            let frame = Frame::new(Tag::Set, vec![optimizer.iterations()], floats);
            self.call(i, &frame, "the initial values")?;
        }
        Ok(())
    }

    /// Pulls every shard into `vars`, and the optimizer's state into `optimizer`: the whole
    /// model as one process would hold it, for evaluation and checkpoints.
    pub fn pull(&mut self, vars: &mut Variables, optimizer: &mut Optimizer) -> Result<(), StrategyError> {
        for i in 0..self.ps.len() {
            let answer = self.call(i, &Frame::new(Tag::Pull, vec![1], Vec::new()), "a pull of every shard")?;
            let (len, trainable) = (self.layout.len(i), self.layout.trainable_len(i));
            let slots = optimizer.state().len();
            if answer.floats.len() != len + slots * trainable {
                let t = self.ps[i].0;
                return Err(StrategyError::Remote(format!("{t} sent {} values for {len}", answer.floats.len())));
            }
            let pieces = &self.layout.ps[i];
            scatter(pieces, &answer.floats[..len], &mut vars.params, &mut vars.state);
            let mut at = len;
            for (_, buffer) in optimizer.state_mut() {
                scatter_trainable(pieces, &answer.floats[at..at + trainable], buffer);
                at += trainable;
            }
            self.shared_workers[i] = answer.ints.get(2).copied().unwrap_or(0);
            if i == 0 {
                // Every push reaches every ps, so they all count the same updates.
                optimizer.set_iterations(answer.ints.get(1).copied().unwrap_or(0));
            }
        }
        Ok(())
    }

    /// Per ps, the workers it served through shared memory (the others over TCP) when the
    /// chief last pulled.
    pub fn shared_workers(&self) -> &[u64] {
        &self.shared_workers
    }

    /// Tells every ps that training is over.
    pub fn stop(&mut self) -> Result<(), StrategyError> {
        for i in 0..self.ps.len() {
            self.call(i, &Frame::new(Tag::Stop, Vec::new(), Vec::new()), "the stop")?;
        }
        Ok(())
    }
}

/// The learning rate of each step scheduled since the steps were last joined.
#[derive(Debug, Clone, Default)]
pub struct Rates {
    /// The first step with a rate.
    pub first: u64,
    /// One rate per step from `first`.
    pub lrs: Vec<f32>,
}

impl Rates {
    /// Adds the rates of the steps from `first`: after the steps so far, or, when those were
    /// all joined (a new epoch, steps cancelled), instead of them.
    pub fn extend(&mut self, first: u64, lrs: &[f32]) {
        if first != self.first + self.lrs.len() as u64 {
            self.first = first;
            self.lrs.clear();
        }
        self.lrs.extend_from_slice(lrs);
    }
}

/// What the workers' closures reported since the chief last took it.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The sums of each closure completed, in the order they completed.
    pub closures: Vec<Sums>,
    /// Steps by staleness: how many updates reached a ps between a step's pull and its push.
    pub staleness: BTreeMap<u64, u64>,
}

/// A worker task as the coordinator drives it.
pub struct RemoteWorker {
    task: TaskId,
    addr: SocketAddr,
    token: u64,
    /// Its host as the cluster names it, which its certificate must carry under `tls`.
    host: String,
    tls: Option<RingTls>,
    /// How long a restarted worker may take to start and listen again (the startup timeout).
    startup: Duration,
    timeout: Duration,
    conn: Option<Conn>,
    /// Steps this worker has completed, before this run included: where its shuffle is.
    done: u64,
    rates: Arc<Mutex<Rates>>,
    report: Arc<Mutex<Report>>,
}

impl RemoteWorker {
    /// Dials worker `task` at `addr` on `host` (over TLS with `tls`), which has completed
    /// `done` steps (in runs before this one); closures read their rates from `rates` and add
    /// what they found to `report`.
    pub fn connect(
        task: TaskId,
        (addr, host): (SocketAddr, String),
        (token, tls): (u64, Option<RingTls>),
        (startup, timeout): (Duration, Duration),
        done: u64,
        (rates, report): (Arc<Mutex<Rates>>, Arc<Mutex<Report>>),
    ) -> Result<Self, StrategyError> {
        let mut worker = Self { task, addr, token, host, tls, startup, timeout, conn: None, done, rates, report };
        let conn =
            worker.dial(startup).map_err(|e| StrategyError::Remote(peer_error(task, "the connection", &e, timeout)))?;
        worker.conn = Some(conn);
        Ok(worker)
    }

    /// Dials the worker, trying until `within`.
    fn dial(&self, within: Duration) -> std::io::Result<Conn> {
        let secure = self.tls.as_ref().map(|tls| Secure { tls, within: self.startup, peer: Some(&self.host) });
        Conn::dial(self.addr, self.token, within, self.timeout, secure)
    }

    /// Tells the worker that training is over.
    fn stop(&mut self) -> Result<(), StrategyError> {
        let Some(conn) = self.conn.as_mut() else { return Ok(()) };
        let stop = Frame::new(Tag::Stop, Vec::new(), Vec::new());
        conn.call(&stop)
            .map(|_| ())
            .map_err(|e| StrategyError::Remote(peer_error(self.task, "the stop", &e, self.timeout)))
    }
}

impl Drop for RemoteWorker {
    /// The coordinator is done with this worker: the job ended, or failed. Either way the
    /// worker leaves cleanly; a failure is the chief's to report.
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl Worker for RemoteWorker {
    fn run(&mut self, closure: &Closure) -> Result<(), ClosureFailure> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(ClosureFailure::WorkerLost(format!("{} is gone", self.task)));
        };
        let lrs: Vec<f32> = {
            let r = self.rates.lock().unwrap_or_else(PoisonError::into_inner);
            let from = closure.first_step.saturating_sub(r.first) as usize;
            r.lrs.iter().skip(from).take(closure.steps as usize).copied().collect()
        };
        if lrs.len() as u64 != closure.steps {
            return Err(ClosureFailure::Failed(format!("no learning rate for steps from {}", closure.first_step)));
        }
        // The worker's place in its own shuffle goes with every closure: a restarted worker,
        // or every worker after a resume, continues where its predecessor's completed steps
        // left it rather than from the start.
        let frame = Frame::new(Tag::Run, vec![closure.first_step, closure.steps, self.done], lrs);
        let answer = match conn.call(&frame) {
            Ok(a) => a,
            // The worker itself answered with an error: a ps is gone, or the loss diverged.
            Err(e) if e.kind() == std::io::ErrorKind::Other => return Err(ClosureFailure::Failed(e.to_string())),
            Err(e) => {
                self.conn = None;
                return Err(ClosureFailure::WorkerLost(peer_error(self.task, "a closure", &e, self.timeout)));
            }
        };
        let Some((sums, staleness)) = answer.ints.split_at_checked(Sums::LEN) else {
            return Err(ClosureFailure::Failed(format!("{} answered a closure without its statistics", self.task)));
        };
        self.done += closure.steps;
        let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        report.closures.push(Sums::from_values(std::array::from_fn(|i| f64::from_bits(sums[i]))));
        for s in staleness {
            *report.staleness.entry(*s).or_default() += 1;
        }
        Ok(())
    }

    fn rejoin(&mut self, give_up: &dyn Fn() -> bool) -> bool {
        // The launcher restarts a lost worker, which listens at the same data-plane address
        // (`cluster::job`) and gets work again; one not back within the startup timeout is
        // left out, and the others run its share.
        let deadline = Instant::now() + self.startup;
        while Instant::now() < deadline && !give_up() {
            if let Ok(conn) = self.dial(Duration::ZERO) {
                self.conn = Some(conn);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}
