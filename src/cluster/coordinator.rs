//! The chief's view of the job: who checked in, who waits at which barrier, when each task was
//! last heard, the commands sent and the metrics received. It decides; the gRPC service
//! ([`super::service`]) and the chief's own [`super::ControlPlane`] only ask and wait.
//!
//! The first failure wins and is final: the job has one cause, reported alike everywhere.
//! State sits behind a std mutex held only for bookkeeping, never across an `.await`; watch
//! channels wake the waiters, and each waiter re-reads what it needs.
//!
//! At a thousand tasks, whom a change wakes is what the chief's load is made of: a change
//! that woke every stream would cost O(N) wake-ups, and N such changes (one per check-in, one
//! per goodbye) O(N²), a million at 1,024 tasks. So there are three channels: `changed` for
//! what heartbeat streams and barriers wait on (commands, failures, barriers, the end),
//! `decided` for the rendezvous' outcome alone, and `gone` for streams that end, which only
//! a chief on its way out waits for.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::watch;

use super::health::Local;
use super::plane::Settings;
use super::stragglers::{self, StepTimes, Straggler};
use super::wire::{self, pb};
use super::{Command, Failure, Member, MetricRecord, Roster, TaskId};

/// A task's request to join, as the chief received it.
pub(crate) struct CheckIn {
    pub(crate) task: TaskId,
    pub(crate) incarnation: u64,
    pub(crate) spec_hash: String,
    pub(crate) spec_keys: std::collections::BTreeMap<String, String>,
    pub(crate) version: String,
    pub(crate) peer: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) payload: Vec<u8>,
}

impl CheckIn {
    fn describe(&self) -> String {
        format!("pid {} on {} ({})", self.pid, self.host, self.peer)
    }
}

/// Where the rendezvous stands.
pub(crate) enum Rendezvous {
    /// Who is still missing, or `None` when the asker already knows (the same [`Missing`]
    /// version).
    Waiting(Option<Missing>),
    Done(Arc<Roster>),
    Failed(Failure),
}

/// The tasks not checked in yet, as of one version of the arrivals.
pub(crate) struct Missing {
    pub(crate) version: u64,
    pub(crate) tasks: Vec<TaskId>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Checked in; its heartbeat stream has not opened yet.
    Expected,
    Open,
    /// Said goodbye: shut down cleanly.
    Left,
    Closed,
}

struct Liveness {
    link: Link,
    last_seen: Instant,
}

struct Barrier {
    /// Counts completions, so a name can be reused (say, once per epoch).
    generation: u64,
    arrived: BTreeSet<TaskId>,
    since: Instant,
}

/// What a heartbeat stream has already told its task.
#[derive(Default)]
pub(crate) struct HeartbeatCursor {
    commands: usize,
    failure: bool,
    finished: bool,
}

#[derive(Default)]
struct Inner {
    /// Each check-in's attempt number beside it, so a stale stream cannot withdraw a newer one.
    arrivals: BTreeMap<TaskId, (u64, CheckIn)>,
    /// Counts changes to `arrivals` before the roster, so that a waiting task is told who
    /// is missing only when that changed.
    arrivals_version: u64,
    attempts: u64,
    roster: Option<Arc<Roster>>,
    failure: Option<Failure>,
    barriers: HashMap<String, Barrier>,
    liveness: BTreeMap<TaskId, Liveness>,
    commands: Vec<Command>,
    metrics: Vec<MetricRecord>,
    /// Each task's latest step times, from its heartbeat.
    step_times: BTreeMap<TaskId, StepTimes>,
    finished: bool,
    /// Check-in streams still open, per task: a refused or failed task may not have read its
    /// answer yet, and a failing chief waits for it (see [`CoordinationService::wait_heard`]).
    answering: BTreeMap<TaskId, usize>,
}

/// TensorFlow's coordination service, on the chief (see the module docs); not the
/// parameter-server `Coordinator`, which is TensorFlow's `ClusterCoordinator`.
pub(crate) struct CoordinationService {
    settings: Arc<Settings>,
    local: Arc<Local>,
    inner: Mutex<Inner>,
    changed: watch::Sender<u64>,
    /// The roster completed or the job failed.
    decided: watch::Sender<u64>,
    /// A stream ended: a heartbeat stream closed or said goodbye, a check-in stream was read.
    gone: watch::Sender<u64>,
}

impl CoordinationService {
    /// The chief checks itself in.
    pub(crate) fn new(settings: Arc<Settings>, local: Arc<Local>, own: CheckIn) -> Arc<Self> {
        let coordinator = Arc::new(CoordinationService {
            settings,
            local,
            inner: Mutex::new(Inner::default()),
            changed: watch::Sender::new(0),
            decided: watch::Sender::new(0),
            gone: watch::Sender::new(0),
        });
        // The chief always matches itself, so its own check-in cannot be refused.
        let _ = coordinator.check_in(own);
        coordinator
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Bookkeeping never panics midway, so a poisoned lock still guards consistent state.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn notify(&self) {
        bump(&self.changed);
    }

    /// How many tasks the job has.
    pub(crate) fn tasks(&self) -> usize {
        self.settings.roster.len()
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Wakes when the rendezvous completes or fails.
    pub(crate) fn subscribe_decided(&self) -> watch::Receiver<u64> {
        self.decided.subscribe()
    }

    /// Re-evaluates `f` after every change until it yields.
    async fn wait_for<T>(&self, f: impl FnMut(&Inner) -> Option<T>) -> T {
        self.wait_on(self.subscribe(), f).await
    }

    /// Re-evaluates `f` after every wake-up of `changes` until it yields.
    async fn wait_on<T>(&self, mut changes: watch::Receiver<u64>, mut f: impl FnMut(&Inner) -> Option<T>) -> T {
        loop {
            if let Some(t) = f(&self.lock()) {
                return t;
            }
            if changes.changed().await.is_err() {
                // Unreachable while `self` lives: it owns the sender.
                std::future::pending::<()>().await;
            }
        }
    }

    fn fail_locked(&self, inner: &mut Inner, failure: Failure) {
        // Not logged here: every task's trainer reports the failure as its exit error.
        if inner.failure.is_none() && !inner.finished {
            inner.failure = Some(failure.clone());
            self.local.fail(failure);
            self.notify();
            bump(&self.decided);
        }
    }

    pub(crate) fn fail(&self, failure: Failure) {
        let mut inner = self.lock();
        self.fail_locked(&mut inner, failure);
    }

    /// Registers a task, or refuses it. While the job is starting, a refusal fails every task:
    /// a task on another spec, outside the cluster, or started twice is a launch mistake that
    /// waiting cannot fix. Returns the attempt number for [`CoordinationService::withdraw`], and the
    /// check-in stream's [`Answering`], counted before any failure is decided so that a
    /// failing chief cannot miss it.
    pub(crate) fn check_in(self: &Arc<Self>, c: CheckIn) -> (Result<u64, Failure>, Answering) {
        let mut inner = self.lock();
        *inner.answering.entry(c.task).or_default() += 1;
        let answering = Answering { coordinator: self.clone(), task: c.task };
        (self.check_in_locked(&mut inner, c), answering)
    }

    fn check_in_locked(&self, inner: &mut Inner, c: CheckIn) -> Result<u64, Failure> {
        let s = &self.settings;
        if let Some(f) = &inner.failure {
            return Err(f.clone());
        }
        let refusal = if !s.roster.contains_key(&c.task) {
            Some(Failure::UnknownTask { task: c.task, known: s.roster.keys().copied().collect() })
        } else if c.spec_hash != s.spec_hash || c.version != s.version {
            Some(Failure::SpecMismatch {
                task: c.task,
                spec_hash: c.spec_hash.clone(),
                version: c.version.clone(),
                chief: s.chief,
                chief_spec_hash: s.spec_hash.clone(),
                chief_version: s.version.clone(),
                keys: differing_keys(&c.spec_keys, &s.spec_keys),
            })
        } else {
            match inner.arrivals.get(&c.task) {
                Some((_, first)) if first.incarnation != c.incarnation && !self.rejoins(inner, c.task) => {
                    Some(Failure::DuplicateTask { task: c.task, first: first.describe(), second: c.describe() })
                }
                _ => None,
            }
        };
        if let Some(refusal) = refusal {
            if inner.roster.is_none() {
                self.fail_locked(inner, refusal.clone());
            } else {
                eprintln!("trainrun: refused a check-in after the job started: {refusal}");
            }
            return Err(refusal);
        }
        inner.attempts += 1;
        let attempt = inner.attempts;
        if inner.roster.is_none() {
            inner.arrivals.insert(c.task, (attempt, c));
            inner.arrivals_version += 1;
            if inner.arrivals.len() == s.roster.len() {
                self.complete(inner);
            }
        } else if self.rejoins(inner, c.task) {
            // The restarted process takes its predecessor's place: its requests are the
            // task's now, and it has the failure timeout to open its heartbeat stream.
            let task = c.task;
            inner.arrivals.insert(task, (attempt, c));
            inner.liveness.insert(task, Liveness { link: Link::Expected, last_seen: Instant::now() });
            self.notify();
        }
        Ok(attempt)
    }

    /// Whether `task` checking in now is a restarted process of an expendable role taking
    /// the place of one that died after the job started.
    fn rejoins(&self, inner: &Inner, task: TaskId) -> bool {
        let dead = inner.liveness.get(&task).is_some_and(|l| l.link == Link::Closed);
        inner.roster.is_some() && dead && self.settings.expendable.contains(&task.role)
    }

    fn complete(&self, inner: &mut Inner) {
        let s = &self.settings;
        let members = inner
            .arrivals
            .values()
            .enumerate()
            .map(|(rank, (_, c))| Member {
                task: c.task,
                rank,
                address: s.roster.get(&c.task).cloned().unwrap_or_default(),
                host: c.host.clone(),
                pid: c.pid,
                payload: c.payload.clone(),
            })
            .collect();
        inner.roster = Some(Arc::new(Roster { members }));
        let now = Instant::now();
        for &task in s.roster.keys().filter(|&&t| t != s.chief) {
            let link = Link::Expected;
            inner.liveness.insert(task, Liveness { link, last_seen: now });
        }
        bump(&self.decided);
    }

    /// A task whose check-in stream broke before the roster was complete is missing again,
    /// and may check in anew (a restarted process draws a new incarnation).
    pub(crate) fn withdraw(&self, task: TaskId, attempt: u64) {
        let mut inner = self.lock();
        let current = inner.arrivals.get(&task).map(|(a, _)| *a);
        if inner.roster.is_none() && current == Some(attempt) && task != self.settings.chief {
            inner.arrivals.remove(&task);
            inner.arrivals_version += 1;
        }
    }

    /// Where the rendezvous stands, for a task last told of version `told` of the arrivals.
    pub(crate) fn rendezvous(&self, told: Option<u64>) -> Rendezvous {
        let inner = self.lock();
        match decision(&inner) {
            Some(Ok(roster)) => Rendezvous::Done(roster),
            Some(Err(f)) => Rendezvous::Failed(f),
            None if told == Some(inner.arrivals_version) => Rendezvous::Waiting(None),
            None => Rendezvous::Waiting(Some(Missing {
                version: inner.arrivals_version,
                tasks: missing(&inner, &self.settings),
            })),
        }
    }

    pub(crate) async fn wait_rendezvous(&self) -> Result<Arc<Roster>, Failure> {
        self.wait_on(self.subscribe_decided(), decision).await
    }

    /// Checks that a request comes from the process that checked in as its task, once the
    /// job has started.
    pub(crate) fn caller(&self, caller: Option<&pb::Caller>) -> Result<TaskId, tonic::Status> {
        use tonic::Status;
        let caller = caller.ok_or_else(|| Status::invalid_argument("a request without a caller"))?;
        let task = wire::task(&caller.task)?;
        let inner = self.lock();
        if inner.roster.is_none() {
            return Err(Status::failed_precondition("the job has not started: check in first"));
        }
        match inner.arrivals.get(&task) {
            Some((_, c)) if c.incarnation == caller.incarnation => Ok(task),
            Some(_) => {
                Err(Status::failed_precondition(format!("{task} is a different process from the one that checked in")))
            }
            None => Err(Status::failed_precondition(format!("{task} is not in this job"))),
        }
    }

    /// Waits until every task has arrived at barrier `name`, or the job fails.
    pub(crate) async fn barrier(&self, task: TaskId, name: &str) -> Result<(), Failure> {
        let generation = {
            let mut inner = self.lock();
            if let Some(f) = &inner.failure {
                return Err(f.clone());
            }
            let everyone = self.settings.roster.len();
            let b = inner.barriers.entry(name.to_owned()).or_insert(Barrier {
                generation: 0,
                arrived: BTreeSet::new(),
                since: Instant::now(),
            });
            if b.arrived.is_empty() {
                b.since = Instant::now();
            }
            b.arrived.insert(task);
            let generation = b.generation;
            if b.arrived.len() == everyone {
                b.generation += 1;
                b.arrived.clear();
                self.notify();
            }
            generation
        };
        self.wait_for(|inner| {
            let passed = inner.barriers.get(name).is_some_and(|b| b.generation > generation);
            match (&inner.failure, passed) {
                (_, true) => Some(Ok(())),
                (Some(f), false) => Some(Err(f.clone())),
                (None, false) => None,
            }
        })
        .await
    }

    /// Fails the job on every deadline that has passed: rendezvous, barriers, heartbeats.
    pub(crate) fn tick(&self, now: Instant) {
        let s = &self.settings;
        let mut inner = self.lock();
        if inner.failure.is_some() || inner.finished {
            return;
        }
        let Some(roster) = inner.roster.clone() else {
            if now >= s.started + s.timeouts.startup {
                let missing = missing(&inner, s);
                let after = s.timeouts.startup;
                self.fail_locked(&mut inner, Failure::RendezvousTimeout { after, missing });
            }
            return;
        };
        let after = s.timeouts.failure;
        let late_barrier =
            inner.barriers.iter().find(|(_, b)| !b.arrived.is_empty() && now.duration_since(b.since) >= after).map(
                |(name, b)| Failure::BarrierTimeout {
                    name: name.clone(),
                    after,
                    missing: (roster.members.iter()).map(|m| m.task).filter(|t| !b.arrived.contains(t)).collect(),
                },
            );
        let silent = inner
            .liveness
            .iter()
            .find(|(_, l)| matches!(l.link, Link::Expected | Link::Open) && now.duration_since(l.last_seen) >= after)
            .map(|(&task, _)| Failure::Silent { task, after });
        // A dead task also misses barriers; naming its silence says more.
        if let Some(f) = silent.or(late_barrier) {
            self.fail_locked(&mut inner, f);
        }
    }

    pub(crate) fn ping(&self, task: TaskId, step_times: Option<StepTimes>) {
        let mut inner = self.lock();
        if let Some(t) = step_times {
            inner.step_times.insert(task, t);
        }
        if let Some(l) = inner.liveness.get_mut(&task) {
            l.last_seen = Instant::now();
            if l.link == Link::Expected {
                l.link = Link::Open;
            }
        }
    }

    pub(crate) fn left(&self, task: TaskId) {
        if let Some(l) = self.lock().liveness.get_mut(&task) {
            l.link = Link::Left;
        }
        bump(&self.gone);
    }

    /// A heartbeat stream ended. Without a goodbye first, the task is gone: killed, crashed or
    /// cut off; a stream's end is the fastest sign of that, well before any timeout.
    pub(crate) fn closed(&self, task: TaskId, cause: &str) {
        let mut inner = self.lock();
        let link = inner.liveness.get(&task).map(|l| l.link);
        if link == Some(Link::Left) {
            return;
        }
        if let Some(l) = inner.liveness.get_mut(&task) {
            l.link = Link::Closed;
        }
        bump(&self.gone);
        if self.settings.expendable.contains(&task.role) && inner.roster.is_some() {
            // The strategy runs its work elsewhere (the parameter-server coordinator), and a
            // restarted process may take the task's place.
            self.notify();
            return;
        }
        let detail = format!(
            "its heartbeat stream closed without a goodbye: the process exited, was killed, \
             or lost its connection ({cause})"
        );
        self.fail_locked(&mut inner, Failure::Died { task, detail });
    }

    /// What `cursor`'s stream has not been told yet; `None` when nothing is new, unless
    /// `always` (a ping always gets an answer, which is how a task knows the chief lives).
    pub(crate) fn pong(&self, cursor: &mut HeartbeatCursor, always: bool) -> Option<pb::Pong> {
        let inner = self.lock();
        let commands: Vec<pb::Command> = (inner.commands.iter().enumerate())
            .skip(cursor.commands)
            .map(|(i, c)| wire::command(i as u64 + 1, c))
            .collect();
        let failure = (inner.failure.as_ref()).filter(|_| !cursor.failure);
        let finished = inner.finished && !cursor.finished;
        if commands.is_empty() && failure.is_none() && !finished && !always {
            return None;
        }
        cursor.commands = inner.commands.len();
        cursor.failure |= failure.is_some();
        cursor.finished |= finished;
        Some(pb::Pong { commands, failure: failure.map(pb::Failure::from), finished })
    }

    pub(crate) fn broadcast(&self, command: Command) {
        let mut inner = self.lock();
        inner.commands.push(command.clone());
        let seq = inner.commands.len() as u64;
        self.local.deliver(seq, command);
        self.notify();
    }

    pub(crate) fn add_metrics(&self, task: TaskId, json: String) {
        self.lock().metrics.push(MetricRecord { task, json });
    }

    /// The job's stragglers by its step times so far, the chief's own included.
    pub(crate) fn stragglers(&self) -> Vec<Straggler> {
        let mut times = self.lock().step_times.clone();
        if let Some(own) = self.local.clock.read() {
            times.insert(self.settings.chief, own);
        }
        stragglers::stragglers(&times)
    }

    pub(crate) fn take_metrics(&self) -> Vec<MetricRecord> {
        std::mem::take(&mut self.lock().metrics)
    }

    /// The chief is done: tasks are told, and their streams' ends are no failure any more.
    pub(crate) fn finish(&self) {
        self.lock().finished = true;
        self.notify();
    }

    /// Once the job has failed: waits until every task that can still hear has been told,
    /// that is, has ended its streams after reading the failure. A task that is dead or hangs
    /// (the failure's [`Failure::unreachable`]) is not waited for. The chief calls this before
    /// its process goes, so that the others report the failure rather than the chief's death.
    pub(crate) async fn wait_heard(&self) {
        // Only streams ending (on `gone`) change the answer once the job has failed.
        self.wait_on(self.gone.subscribe(), |inner| {
            let deaf = inner.failure.as_ref().and_then(Failure::unreachable);
            let listening = |t: &TaskId| Some(*t) != deaf && *t != self.settings.chief;
            let streaming =
                (inner.liveness.iter()).any(|(t, l)| listening(t) && matches!(l.link, Link::Expected | Link::Open));
            let answering = inner.answering.iter().any(|(t, &n)| listening(t) && n > 0);
            (!streaming && !answering).then_some(())
        })
        .await;
    }

    pub(crate) fn failed(&self) -> bool {
        self.lock().failure.is_some()
    }

    /// Waits until every task has said goodbye or closed its stream.
    pub(crate) async fn wait_all_gone(&self) {
        let gone = |inner: &Inner| {
            let gone = |l: &Liveness| matches!(l.link, Link::Left | Link::Closed);
            inner.liveness.values().all(gone).then_some(())
        };
        self.wait_on(self.gone.subscribe(), gone).await;
    }
}

/// One open check-in stream; dropping it (when the stream's task ends) uncounts it.
pub(crate) struct Answering {
    coordinator: Arc<CoordinationService>,
    task: TaskId,
}

impl Drop for Answering {
    fn drop(&mut self) {
        let mut inner = self.coordinator.lock();
        if let Some(n) = inner.answering.get_mut(&self.task) {
            *n = n.saturating_sub(1);
        }
        drop(inner);
        bump(&self.coordinator.gone);
    }
}

fn bump(channel: &watch::Sender<u64>) {
    channel.send_modify(|v| *v = v.wrapping_add(1));
}

/// The rendezvous' outcome, once there is one.
fn decision(inner: &Inner) -> Option<Result<Arc<Roster>, Failure>> {
    match (&inner.roster, &inner.failure) {
        (Some(roster), _) => Some(Ok(roster.clone())),
        (None, Some(f)) => Some(Err(f.clone())),
        (None, None) => None,
    }
}

/// Key paths present in one map and not the other, or with another value, in order.
fn differing_keys(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> Vec<String> {
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).filter(|k| a.get(*k) != b.get(*k)).collect();
    keys.into_iter().cloned().collect()
}

fn missing(inner: &Inner, s: &Settings) -> Vec<TaskId> {
    (s.roster.keys()).filter(|t| !inner.arrivals.contains_key(t)).copied().collect()
}
