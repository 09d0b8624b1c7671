//! [`ControlPlane`]: the blocking facade the synchronous trainer holds. It runs the gRPC server
//! and, on non-chief tasks, the link to the chief on a tokio runtime of one thread, so
//! heartbeats flow while the trainer's threads compute.
//!
//! Dropping a plane without [`ControlPlane::shutdown`] is how a task dies: its connections
//! close and the chief fails the job naming it, as if the process had been killed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use super::auth::{CheckToken, TagRpc};
use super::client::{ChiefLink, HeartbeatControl};
use super::coordinator::{CheckIn, CoordinationService};
use super::health::{Health, Local};
use super::service::ClusterService;
use super::wire::pb;
use super::{ClusterConfig, ClusterError, Command, Failure, MetricRecord, Roster, TaskId, Timeouts};

/// Control messages are small, but a roster carries every task's payload; 4 MiB (tonic's
/// default) could cut a large job short.
pub(crate) const MAX_MESSAGE: usize = 64 << 20;

/// The longest a failing chief waits for the other tasks to hear why the job failed.
const LINGER: Duration = Duration::from_millis(500);

/// About how many pings a second the chief hears in all, at most (see [`paced`]).
const PINGS_PER_S: u32 = 1000;

/// The heartbeat interval for a job of `tasks` tasks: the configured one, stretched in a large
/// job so that the chief hears at most [`PINGS_PER_S`] pings a second in all (4,096 a second
/// at 1,024 tasks pinging every 250 ms; 1,000 paced, every 1.02 s), but never so far that
/// fewer than four pings fit in the failure timeout. Every task derives the same interval from
/// the same roster. Detection does not slow down: a task is declared silent `failure` after
/// its last ping, the chief checks that every half of the configured interval, and a stream
/// that ends is noticed at once.
pub(crate) fn paced(t: Timeouts, tasks: usize) -> Timeouts {
    let spread = Duration::from_secs(1) * u32::try_from(tasks).unwrap_or(u32::MAX) / PINGS_PER_S;
    Timeouts { heartbeat: spread.min(t.failure / 4).max(t.heartbeat), ..t }
}

/// HTTP/2 windows (stream, connection) from DEPENDENCIES.md: a roster crosses in one round trip
/// instead of waiting on window updates. Small messages are unaffected.
pub(crate) fn window_sizes() -> (u32, u32) {
    (8 << 20, 16 << 20)
}

/// The config as the plane's parts read it.
pub(crate) struct Settings {
    pub(crate) task: TaskId,
    pub(crate) chief: TaskId,
    pub(crate) roster: BTreeMap<TaskId, String>,
    pub(crate) spec_hash: String,
    pub(crate) spec_keys: BTreeMap<String, String>,
    pub(crate) version: String,
    pub(crate) timeouts: Timeouts,
    /// Drawn at start: tells this process from another started as the same task.
    pub(crate) incarnation: u64,
    pub(crate) started: Instant,
    /// Roles whose death the job survives and whose restarted process may check in again.
    pub(crate) expendable: Vec<super::Role>,
}

enum Side {
    Chief(Arc<CoordinationService>),
    Worker(Arc<ChiefLink>),
}

/// The running control plane of one task.
pub struct ControlPlane {
    settings: Arc<Settings>,
    local: Arc<Local>,
    side: Side,
    local_addr: SocketAddr,
    own: pb::CheckInRequest,
    roster: Mutex<Option<Arc<Roster>>>,
    heartbeat: Mutex<Option<(mpsc::Sender<HeartbeatControl>, JoinHandle<()>)>>,
    /// `None` once shut down.
    runtime: Option<Runtime>,
}

impl ControlPlane {
    /// Binds this task's address from the roster, exactly as given, and starts serving.
    pub fn start(config: ClusterConfig) -> Result<ControlPlane, ClusterError> {
        validate(&config)?;
        let runtime = runtime()?;
        let address = (config.roster.get(&config.task).cloned()).unwrap_or_default();
        let bind = |source| ClusterError::Bind { task: config.task, address: address.clone(), source };
        let listener = runtime.block_on(tokio::net::TcpListener::bind(address.as_str())).map_err(bind)?;
        ControlPlane::launch(config, runtime, listener)
    }

    /// Like [`ControlPlane::start`] on a listener the caller bound, e.g. to port 0 in tests.
    pub fn start_on(config: ClusterConfig, listener: std::net::TcpListener) -> Result<ControlPlane, ClusterError> {
        validate(&config)?;
        let runtime = runtime()?;
        let bind = |source| ClusterError::Bind {
            task: config.task,
            address: (config.roster.get(&config.task).cloned()).unwrap_or_default(),
            source,
        };
        listener.set_nonblocking(true).map_err(bind)?;
        let listener = {
            let _context = runtime.enter();
            tokio::net::TcpListener::from_std(listener).map_err(bind)?
        };
        ControlPlane::launch(config, runtime, listener)
    }

    fn launch(
        config: ClusterConfig,
        runtime: Runtime,
        listener: tokio::net::TcpListener,
    ) -> Result<ControlPlane, ClusterError> {
        let local_addr = listener.local_addr().map_err(ClusterError::Runtime)?;
        let mut incarnation = [0u8; 8];
        getrandom::fill(&mut incarnation).map_err(|e| ClusterError::Random(e.to_string()))?;
        let tasks = config.roster.len();
        let settings = Arc::new(Settings {
            task: config.task,
            chief: config.chief,
            roster: config.roster,
            spec_hash: config.spec_hash,
            spec_keys: config.spec_keys,
            version: config.version,
            timeouts: paced(config.timeouts, tasks),
            incarnation: u64::from_le_bytes(incarnation),
            started: Instant::now(),
            expendable: config.expendable,
        });
        let own = pb::CheckInRequest {
            caller: Some(pb::Caller { task: settings.task.to_string(), incarnation: settings.incarnation }),
            spec_hash: settings.spec_hash.clone(),
            version: settings.version.clone(),
            host: hostname(),
            pid: std::process::id(),
            payload: config.payload,
            spec_keys: settings.spec_keys.clone().into_iter().collect(),
        };
        let local = Local::new();
        let _context = runtime.enter();
        let side = if settings.task == settings.chief {
            let coordinator =
                CoordinationService::new(settings.clone(), local.clone(), check_in(&settings, &own, local_addr));
            let ticking = coordinator.clone();
            // The configured interval, not the paced one: checking is cheap (a scan of N
            // timestamps), and a late check would name a silent task late.
            let period = config.timeouts.heartbeat / 2;
            runtime.spawn(async move {
                let mut tick = tokio::time::interval(period);
                loop {
                    tick.tick().await;
                    ticking.tick(Instant::now());
                }
            });
            Side::Chief(coordinator)
        } else {
            Side::Worker(Arc::new(ChiefLink::new(
                settings.clone(),
                local.clone(),
                &config.token,
                config.tls.as_deref(),
            )?))
        };
        let service = ClusterService {
            me: settings.task,
            chief: settings.chief,
            chief_address: (settings.roster.get(&settings.chief).cloned()).unwrap_or_default(),
            coordinator: match &side {
                Side::Chief(c) => Some(c.clone()),
                Side::Worker(_) => None,
            },
        };
        let server = pb::cluster_server::ClusterServer::new(service)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let server = TagRpc(InterceptedService::new(server, CheckToken::new(&config.token)));
        let (stream_window, connection_window) = window_sizes();
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut builder = Server::builder();
        if let Some(tls) = &config.tls {
            builder = builder
                .tls_config(tls.server())
                .map_err(|e| ClusterError::Config(format!("TLS for the control plane: {e}")))?;
        }
        let serving = builder
            .initial_stream_window_size(stream_window)
            .initial_connection_window_size(connection_window)
            .serve_with_incoming(server, incoming);
        let task = settings.task;
        runtime.spawn(async move {
            if let Err(e) = serving.await {
                eprintln!("trainrun: {task}'s control plane stopped serving: {e}");
            }
        });
        Ok(ControlPlane {
            settings,
            local,
            side,
            local_addr,
            own,
            roster: Mutex::new(None),
            heartbeat: Mutex::new(None),
            runtime: Some(runtime),
        })
    }

    /// The address the server listens on (its real port when the roster said port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn task(&self) -> TaskId {
        self.settings.task
    }

    pub fn is_chief(&self) -> bool {
        self.settings.task == self.settings.chief
    }

    /// A handle other threads can poll for the job's failure.
    pub fn health(&self) -> Health {
        Health(self.local.clone())
    }

    fn block_on<F: Future>(&self, call: &'static str, f: F) -> Result<F::Output, ClusterError> {
        let usage = |what| ClusterError::Usage { call, what };
        // `block_on` inside another runtime would panic; say what is wrong instead.
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(usage("a thread outside any async runtime"));
        }
        let runtime = self.runtime.as_ref().ok_or(usage("a running control plane"))?;
        Ok(runtime.block_on(f))
    }

    fn started(&self, call: &'static str) -> Result<(), ClusterError> {
        self.local.check()?;
        match lock(&self.roster).is_some() {
            true => Ok(()),
            false => Err(ClusterError::Usage { call, what: "a completed rendezvous: call rendezvous() first" }),
        }
    }

    fn coordinator(&self, call: &'static str) -> Result<&Arc<CoordinationService>, ClusterError> {
        match &self.side {
            Side::Chief(c) => Ok(c),
            Side::Worker(_) => Err(ClusterError::Usage { call, what: "the chief's control plane" }),
        }
    }

    /// Waits until every task has checked in, then returns everyone's roster, the same at
    /// every task; fails on a refused check-in or at the startup timeout.
    pub fn rendezvous(&self) -> Result<Roster, ClusterError> {
        if let Some(roster) = lock(&self.roster).as_ref() {
            return Ok(roster.as_ref().clone());
        }
        let roster = match &self.side {
            Side::Chief(c) => self.block_on("rendezvous", c.wait_rendezvous())??,
            Side::Worker(link) => {
                let deadline = Instant::now() + self.settings.timeouts.startup;
                let checking_in = link.rendezvous(self.own.clone(), deadline);
                let result = self.block_on("rendezvous", checking_in)?;
                let roster = result.inspect_err(|e| {
                    if let ClusterError::Failed(f) = e {
                        self.local.fail(f.clone());
                    }
                })?;
                let (tx, rx) = mpsc::channel(4);
                let (ready, started) = oneshot::channel();
                let runtime = self.runtime.as_ref();
                if let Some(handle) = runtime.map(|r| r.spawn(link.clone().heartbeats(ready, rx))) {
                    *lock(&self.heartbeat) = Some((tx, handle));
                }
                // Return only once the chief watches this task, so that a death from here on
                // is noticed at once rather than at the failure timeout.
                self.block_on("rendezvous", async {
                    tokio::select! {
                        _ = started => {}
                        _ = self.local.failed() => {}
                    }
                })?;
                self.local.check()?;
                Arc::new(roster)
            }
        };
        *lock(&self.roster) = Some(roster.clone());
        Ok(roster.as_ref().clone())
    }

    /// Waits until every task has reached the barrier `name`. Names can be reused.
    pub fn barrier(&self, name: &str) -> Result<(), ClusterError> {
        self.started("barrier")?;
        match &self.side {
            Side::Chief(c) => Ok(self.block_on("barrier", c.barrier(self.settings.task, name))??),
            Side::Worker(link) => self.block_on("barrier", link.barrier(name))?,
        }
    }

    /// `Err` once the job has failed, naming the cause. Cheap: call it every step.
    pub fn check(&self) -> Result<(), ClusterError> {
        self.local.check()
    }

    /// The chief's next command, in order; the chief receives its own broadcasts too.
    pub fn poll_command(&self) -> Result<Option<Command>, ClusterError> {
        self.local.check()?;
        Ok(self.local.pop())
    }

    /// Chief only: sends a command to every task.
    pub fn broadcast(&self, command: Command) -> Result<(), ClusterError> {
        let coordinator = self.coordinator("broadcast")?;
        self.local.check()?;
        coordinator.broadcast(command);
        Ok(())
    }

    /// Sends a small record (e.g. an epoch's metrics as JSON) to the chief.
    pub fn send_metrics(&self, json: &str) -> Result<(), ClusterError> {
        self.started("send_metrics")?;
        match &self.side {
            Side::Chief(c) => {
                c.add_metrics(self.settings.task, json.to_owned());
                Ok(())
            }
            Side::Worker(link) => self.block_on("send_metrics", link.send_metrics(json.to_owned()))?,
        }
    }

    /// Records how long this task worked in a step (waits in collectives excluded); its
    /// heartbeat carries the recent percentiles to the chief. Cheap: call it every step.
    pub fn record_step(&self, busy: Duration) {
        self.local.clock.record(busy);
    }

    /// The job's stragglers as the chief sees them (see [`crate::cluster::Straggler`]); empty
    /// at other tasks.
    pub fn stragglers(&self) -> Vec<super::Straggler> {
        match &self.side {
            Side::Chief(c) => c.stragglers(),
            Side::Worker(_) => Vec::new(),
        }
    }

    /// Chief only: the records received since the last call, in arrival order.
    pub fn take_metrics(&self) -> Result<Vec<MetricRecord>, ClusterError> {
        Ok(self.coordinator("take_metrics")?.take_metrics())
    }

    /// Fails the job for `reason`, naming this task at every task. Returns once the chief has
    /// heard (or is known gone); then call [`ControlPlane::shutdown`].
    pub fn abort(&self, reason: &str) {
        let failure = Failure::Aborted { task: self.settings.task, reason: reason.to_owned() };
        match &self.side {
            Side::Chief(c) => c.fail(failure),
            Side::Worker(_) => {
                let heartbeat = lock(&self.heartbeat).take();
                if let Some((tx, handle)) = heartbeat {
                    let limit = self.settings.timeouts.failure;
                    let _ = self.block_on("abort", async move {
                        let _ = tx.send(HeartbeatControl::Abort(reason.to_owned())).await;
                        let _ = tokio::time::timeout(limit, handle).await;
                    });
                }
                self.local.fail(failure);
            }
        }
    }

    /// Leaves the job cleanly. The chief first tells every task the job is over (they see a
    /// [`Command::Stop`]) and waits, up to the failure timeout, for their goodbyes, so that
    /// none mistakes the chief's exit for its death.
    pub fn shutdown(mut self) {
        let limit = self.settings.timeouts.failure;
        match &self.side {
            Side::Chief(c) => {
                c.finish();
                let gone = async { tokio::time::timeout(limit, c.wait_all_gone()).await };
                let _ = self.block_on("shutdown", gone);
            }
            Side::Worker(_) => {
                let heartbeat = lock(&self.heartbeat).take();
                if let Some((tx, handle)) = heartbeat {
                    let _ = self.block_on("shutdown", async move {
                        let _ = tx.send(HeartbeatControl::Leave).await;
                        let _ = tokio::time::timeout(limit, handle).await;
                    });
                }
            }
        }
        if let Some(runtime) = self.runtime.take() {
            // Inside another runtime only the background variant is allowed.
            match tokio::runtime::Handle::try_current() {
                Ok(_) => runtime.shutdown_background(),
                Err(_) => runtime.shutdown_timeout(Duration::from_millis(200)),
            }
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // A chief that failed the job stays until the others have heard why (bounded): gone at
        // once, it would be reported dead by a task that sees its connection break first.
        if let (Side::Chief(c), Some(runtime)) = (&self.side, &self.runtime)
            && c.failed()
            && tokio::runtime::Handle::try_current().is_err()
        {
            let linger = LINGER.min(self.settings.timeouts.failure);
            let _ = runtime.block_on(async { tokio::time::timeout(linger, c.wait_heard()).await });
        }
        // Otherwise abrupt on purpose: connections close without goodbyes, so the chief (or,
        // for the chief, every task) reports this task's death at once.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn runtime() -> Result<Runtime, ClusterError> {
    // One thread: the control plane's work is tiny; it must only never wait on the trainer.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("trainrun-control")
        .enable_all()
        .build()
        .map_err(ClusterError::Runtime)
}

fn check_in(settings: &Settings, own: &pb::CheckInRequest, local_addr: SocketAddr) -> CheckIn {
    CheckIn {
        task: settings.task,
        incarnation: settings.incarnation,
        spec_hash: own.spec_hash.clone(),
        spec_keys: settings.spec_keys.clone(),
        version: own.version.clone(),
        peer: local_addr.to_string(),
        host: own.host.clone(),
        pid: own.pid,
        payload: own.payload.clone(),
    }
}

fn validate(config: &ClusterConfig) -> Result<(), ClusterError> {
    let err = |m: String| Err(ClusterError::Config(m));
    let t = &config.timeouts;
    if !config.roster.contains_key(&config.task) {
        return err(format!("this task, {}, is not in the roster", config.task));
    }
    let expected = TaskId::chief_of(config.roster.keys());
    if expected != Some(config.chief) {
        let expected = expected.map_or_else(|| "none".to_owned(), |t| t.to_string());
        return err(format!(
            "the chief is {}, but by TF_CONFIG's rule it is {expected} (chief:0 if the cluster has one, else worker:0)",
            config.chief
        ));
    }
    let chief_address = config.roster.get(&config.chief).map_or("", String::as_str);
    if config.task != config.chief && chief_address.ends_with(":0") {
        return err(format!(
            "the chief {}'s address {chief_address} has port 0, which no other task can reach",
            config.chief
        ));
    }
    let day = Duration::from_secs(24 * 3600);
    if t.heartbeat < Duration::from_millis(1) || t.startup.is_zero() {
        return err("the heartbeat interval must be at least 1 ms, the startup timeout positive".into());
    }
    if t.startup > day || t.failure > day {
        return err("the startup and failure timeouts must be at most a day".into());
    }
    if t.failure < t.heartbeat * 2 {
        return err(format!(
            "the failure timeout ({:?}) must be at least two heartbeat intervals ({:?})",
            t.failure, t.heartbeat
        ));
    }
    Ok(())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "an unknown host".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{JobToken, Role};

    fn config() -> ClusterConfig {
        let roster = [("chief:0", "10.0.0.1:2222"), ("worker:0", "10.0.0.2:2222")];
        ClusterConfig {
            task: TaskId::new(Role::Worker, 0),
            roster: roster.map(|(t, a)| (t.parse().unwrap(), a.to_owned())).into(),
            chief: TaskId::new(Role::Chief, 0),
            token: JobToken::new("a-token-of-sixteen-chars", "the test").unwrap(),
            spec_hash: "spec".into(),
            spec_keys: BTreeMap::new(),
            version: "0.1.0".into(),
            timeouts: Timeouts::default(),
            payload: Vec::new(),
            tls: None,
            expendable: Vec::new(),
        }
    }

    #[test]
    fn configs_that_cannot_work_are_refused_up_front() {
        assert!(validate(&config()).is_ok());
        let mut c = config();
        c.chief = TaskId::new(Role::Worker, 0);
        let e = validate(&c).unwrap_err().to_string();
        assert!(e.contains("by TF_CONFIG's rule it is chief:0"), "{e}");
        let mut c = config();
        c.task = TaskId::new(Role::Worker, 7);
        assert!(validate(&c).is_err());
        let mut c = config();
        c.timeouts.failure = c.timeouts.heartbeat;
        assert!(validate(&c).is_err());
        let mut c = config();
        c.roster.insert(c.chief, "10.0.0.1:0".into());
        let e = validate(&c).unwrap_err().to_string();
        assert!(e.contains("port 0"), "{e}");
    }

    #[test]
    fn large_jobs_ping_less_often_but_four_times_per_failure_timeout_at_least() {
        let ms = Duration::from_millis;
        let t = Timeouts { startup: ms(60_000), failure: ms(10_000), heartbeat: ms(250) };
        assert_eq!(paced(t, 4).heartbeat, ms(250));
        assert_eq!(paced(t, 256).heartbeat, ms(256));
        assert_eq!(paced(t, 1024).heartbeat, ms(1024));
        assert_eq!(paced(Timeouts { failure: ms(2_000), ..t }, 1024).heartbeat, ms(500));
        // Never more often than configured.
        assert_eq!(paced(Timeouts { failure: ms(600), ..t }, 1024).heartbeat, ms(250));
    }
}
