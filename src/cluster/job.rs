//! Joining a job: this task starts its control plane, checks in with the chief (same spec,
//! same trainrun version, right token), and connects the data plane the plan chose
//! ([`DataPlaneKind`]): the training workers' all-reduce, its algorithm over its transport, or
//! every task's endpoint for a strategy that connects them itself.

use super::tls::{TlsMaterial, host_of};
use super::{ClusterConfig, ClusterError, ControlPlane, JobToken, Role, TaskId, Timeouts};
use crate::collective::choice::SizeChoice;
use crate::collective::probe::{self, AutoBySize};
use crate::collective::{
    Algorithm, Collective, CollectiveError, Communicator, Peers, ShmOptions, TcpOptions, TlsPeers, Transport,
    TransportKind, job_token_hash,
};
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often tasks ping the chief; several pings fit in any sensible timeout.
pub const HEARTBEAT: Duration = Duration::from_millis(250);

/// What joining needs.
pub struct JobConfig {
    /// This task.
    pub task: TaskId,
    /// Every task's control-plane `host:port`.
    pub addresses: BTreeMap<TaskId, String>,
    /// The job's shared secret.
    pub token: JobToken,
    /// Hash of what in the spec changes the results; the chief refuses tasks with another.
    pub spec_hash: String,
    /// A short hash per key path of the same, so a refusal names the keys that differ.
    pub spec_keys: BTreeMap<String, String>,
    /// Mutual TLS on the control plane and the TCP ring.
    pub tls: Option<Arc<TlsMaterial>>,
    /// How long every task has to check in.
    pub startup: Duration,
    /// How long a collective may stall, or a task stay silent, before the job fails.
    pub timeout: Duration,
    /// The data plane the plan chose.
    pub data_plane: DataPlaneKind,
    /// Gradient values the shared-memory arena holds, so backward writes straight into it.
    pub arena_floats: usize,
    /// Roles whose death the job survives and whose restarted process rejoins it.
    pub expendable: Vec<Role>,
    /// The control-plane listener on this task's address, already bound by whoever started
    /// the task (the local launcher, so that no other process can take the port in between);
    /// `None`: bind it here.
    pub control: Option<TcpListener>,
}

/// What the data plane among the tasks is, as the plan decided it.
#[derive(Debug, Clone, PartialEq)]
pub enum DataPlaneKind {
    /// The training workers all-reduce (synchronous training): this algorithm over this
    /// transport; with `auto`, each all-reduce the algorithm the cost model (measured at
    /// start-up unless the spec gives it) picks for its size, where there is a choice.
    AllReduce { algorithm: Algorithm, transport: TransportKind, auto: Option<AutoBySize> },
    /// This task keeps its data-plane listener and gets everyone's data address
    /// ([`DataPlane`]), for a data plane of the strategy's own (parameter servers).
    Endpoints,
}

/// The data-plane endpoints of every task, for a strategy that connects them itself.
pub struct DataPlane {
    /// This task's bound data-plane listener.
    pub listener: TcpListener,
    /// Every task's data-plane address, from the rendezvous.
    pub addresses: BTreeMap<TaskId, SocketAddr>,
    /// The job token's hash, which every connection's hello carries.
    pub token: u64,
    /// Mutual TLS for every connection (`cluster.tls`), and each task's host as the cluster
    /// names it, which its certificate must carry.
    pub tls: Option<crate::collective::RingTls>,
    pub hosts: BTreeMap<TaskId, String>,
}

impl DataPlane {
    /// Every task of `role`: its data-plane address and its host, in rank order.
    pub fn peers(&self, role: Role) -> Vec<(TaskId, SocketAddr, String)> {
        let host = |t: &TaskId| self.hosts.get(t).cloned().unwrap_or_default();
        self.addresses.iter().filter(|(t, _)| t.role == role).map(|(t, a)| (*t, *a, host(t))).collect()
    }
}

/// This task's place in a running job.
pub struct Job {
    /// The control plane (heartbeats, commands, barriers).
    pub plane: ControlPlane,
    /// The data plane among training workers; `None` for tasks outside the replicas.
    pub comm: Option<Box<dyn Communicator>>,
    /// Whether this task is the chief.
    pub is_chief: bool,
    /// The endpoints of a job without a ring.
    pub data: Option<DataPlane>,
}

/// Joining failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The control plane failed (refused, timed out, a task died).
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The data plane could not connect.
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    /// The data-plane port could not be bound.
    #[error("{task} cannot listen on {host}: {source}")]
    Bind {
        /// This task.
        task: TaskId,
        /// The host it tried.
        host: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The spec asks for a transport the placement cannot give.
    #[error("{0}")]
    Transport(String),
}

/// The host an address names, as the plan's topology groups workers: its host part, with
/// every loopback name as `localhost` (they all reach this machine).
pub fn host_name(address: &str) -> String {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    if host == "localhost" || host == "::1" || host.starts_with("127.") {
        "localhost".to_string()
    } else {
        host.to_string()
    }
}

/// Where the chief keeps the cost model measured at start-up: `$XDG_CACHE_HOME/trainrun`,
/// else `$HOME/.cache/trainrun`; `None` (measure every run) when neither is set.
fn cost_model_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache"))).map(|d| d.join("trainrun"))
}

/// Where shared-memory segments go: `/dev/shm` (memory), else the temporary directory.
pub fn segment_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() { shm } else { std::env::temp_dir() }
}

/// This task's own address, resolved. A pod's name in DNS (a Kubernetes Indexed Job's
/// `<job>-<i>.<service>`) may appear a moment after the pod starts, so a name that does not
/// resolve yet is retried until `within`.
fn own_address(task: TaskId, own: &str, within: Duration) -> Result<SocketAddr, JoinError> {
    let deadline = Instant::now() + within;
    loop {
        let error = match own.to_socket_addrs() {
            Ok(mut addrs) => match addrs.next() {
                Some(a) => return Ok(a),
                None => std::io::Error::new(std::io::ErrorKind::NotFound, "the name has no address"),
            },
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(JoinError::Bind { task, host: own.to_owned(), source: error });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Joins the job as `config.task`.
pub fn join(mut config: JobConfig) -> Result<Job, JoinError> {
    let task = config.task;
    let own = config.addresses.get(&task).cloned().ok_or_else(|| {
        JoinError::Transport(format!("{task} has no address in the cluster ({} tasks listed)", config.addresses.len()))
    })?;
    let host = host_of(&own).to_string();
    let bind = |source| JoinError::Bind { task, host: own.clone(), source };
    let at = own_address(task, &own, config.startup)?;
    let control = match config.control.take() {
        Some(listener) => listener,
        None => TcpListener::bind(at).map_err(bind)?,
    };
    let data =
        TcpListener::bind((at.ip(), 0)).map_err(|source| JoinError::Bind { task, host: host.clone(), source })?;
    let data_addr = data.local_addr().map_err(|source| JoinError::Bind { task, host: host.clone(), source })?;
    let chief = TaskId::chief_of(config.addresses.keys().filter(|t| matches!(t.role, Role::Chief | Role::Worker)))
        .unwrap_or(task);
    let plane = ControlPlane::start_on(
        ClusterConfig {
            task,
            roster: config.addresses.clone(),
            chief,
            token: config.token.clone(),
            spec_hash: config.spec_hash.clone(),
            spec_keys: config.spec_keys.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            timeouts: Timeouts { startup: config.startup, failure: config.timeout, heartbeat: HEARTBEAT },
            payload: data_addr.to_string().into_bytes(),
            tls: config.tls.clone(),
            expendable: config.expendable.clone(),
        },
        control,
    )?;
    let roster = plane.rendezvous()?;
    let DataPlaneKind::AllReduce { algorithm, transport, auto } = &config.data_plane else {
        let mut addresses = BTreeMap::new();
        for m in &roster.members {
            addresses.insert(m.task, data_address(m)?);
        }
        let data = match addresses.get(&task) {
            // A restarted process rejoining a running job gets the roster of the job's start,
            // where every peer knows this task by its predecessor's data-plane address: it
            // listens there again (the predecessor is dead, so the port is free).
            Some(&old) if old != data_addr => {
                drop(data);
                TcpListener::bind(old).map_err(|source| JoinError::Bind { task, host: old.to_string(), source })?
            }
            Some(_) | None => data,
        };
        let token = job_token_hash(config.token.as_str());
        let hosts = roster.members.iter().map(|m| (m.task, host_of(&m.address).to_owned())).collect();
        let tls = config.tls.as_ref().map(|t| t.ring().clone());
        let data = DataPlane { listener: data, addresses, token, tls, hosts };
        return Ok(Job { plane, comm: None, is_chief: task == chief, data: Some(data) });
    };
    let workers: Vec<_> = roster.members.iter().filter(|m| matches!(m.task.role, Role::Chief | Role::Worker)).collect();
    let Some(rank) = workers.iter().position(|m| m.task == task) else {
        return Ok(Job { plane, comm: None, is_chief: task == chief, data: None });
    };
    // Hosts as the plan's topology groups them, by the host part of each address: what
    // `hierarchical` groups by over any transport, and the routed transport's segments.
    let mut names: Vec<String> = Vec::new();
    let hosts: Vec<usize> = workers
        .iter()
        .map(|m| {
            let h = host_name(&m.address);
            names.iter().position(|n| *n == h).unwrap_or_else(|| {
                names.push(h);
                names.len() - 1
            })
        })
        .collect();
    let peers = Peers::new(rank, workers.iter().map(|m| m.task.to_string()).collect())?.on_hosts(hosts.clone())?;
    let token = job_token_hash(config.token.as_str());
    let (algorithm, kind) = (*algorithm, *transport);
    let transport = match kind {
        TransportKind::SharedMemory => {
            if !workers.iter().all(|m| m.host == workers[0].host) {
                let hosts: Vec<String> = workers.iter().map(|m| format!("{} on {}", m.task, m.host)).collect();
                return Err(JoinError::Transport(format!(
                    "the shared-memory transport needs every worker on one host, but they run on several ({}); set strategy.communication.transport = \"tcp\"",
                    hosts.join(", ")
                )));
            }
            // Unique per job and per launch: the token, and the chief's process id.
            let path = segment_dir().join(format!("trainrun-{token:016x}-{}", workers[0].pid));
            Transport::SharedMemory(ShmOptions {
                arena_bytes: 4 * config.arena_floats,
                job_token: token,
                ..ShmOptions::new(path)
            })
        }
        TransportKind::Tcp | TransportKind::TcpTls => Transport::TcpRing(tcp_options(&config, &workers, token, data)?),
        TransportKind::SharedMemoryAndTcp | TransportKind::SharedMemoryAndTcpTls => {
            let mine = hosts[rank];
            // Unique per job, launch and host: the token, and the host's first worker's pid.
            let first = workers.iter().zip(&hosts).find(|(_, h)| **h == mine).map_or(workers[rank].pid, |(m, _)| m.pid);
            let path = segment_dir().join(format!("trainrun-{token:016x}-{first}"));
            let shm = ShmOptions { job_token: token, ..ShmOptions::new(path) };
            let tcp = tcp_options(&config, &workers, token, data)?;
            Transport::Routed { shm, tcp }
        }
    };
    let timeouts = crate::collective::CollectiveTimeouts { connect: config.startup, op: config.timeout };
    // `auto` over a transport with several algorithms to choose among: connected for all
    // of them, then each pack size takes the one the agreed model picks.
    let choosing = auto.as_ref().filter(|a| SizeChoice::over(a.model, kind, a.placement).chooses());
    let also = choosing.map(|a| SizeChoice::over(a.model, kind, a.placement).candidates).unwrap_or_default();
    let mut comm = Collective::build_among(peers, algorithm, &also, transport, timeouts)?;
    if let Some(auto) = choosing {
        let cache = cost_model_dir().map(|d| probe::cache_file(&d, kind, auto));
        let (choice, source) = probe::agree(&mut comm, auto, cache.as_deref())?;
        if task == chief {
            eprintln!("trainrun: {}", probe::describe(&choice, &source, &auto.packs));
        }
        comm.choose_by_size(choice)?;
    }
    Ok(Job { plane, comm: Some(Box::new(comm)), is_chief: task == chief, data: None })
}

/// TCP to every worker's data-plane address, under TLS when the plan says so.
fn tcp_options(
    config: &JobConfig,
    workers: &[&super::Member],
    token: u64,
    data: TcpListener,
) -> Result<TcpOptions, JoinError> {
    let addrs = workers.iter().copied().map(data_address).collect::<Result<_, _>>()?;
    let sealed = matches!(
        config.data_plane,
        DataPlaneKind::AllReduce { transport: TransportKind::TcpTls | TransportKind::SharedMemoryAndTcpTls, .. }
    );
    let tls = match (&config.tls, sealed) {
        (_, false) => None,
        (Some(tls), true) => {
            // Each rank's certificate must name the host the cluster gives it.
            let names = workers.iter().map(|m| host_of(&m.address).to_owned()).collect();
            Some(TlsPeers { config: tls.ring().clone(), names })
        }
        (None, true) => {
            return Err(JoinError::Transport(format!(
                "{}: the plan moves gradients over TCP under TLS, but this task has no cluster.tls",
                config.task
            )));
        }
    };
    Ok(TcpOptions { job_token: token, tls, ..TcpOptions::new(addrs, data) })
}

/// The data-plane address `m` sent at check-in.
fn data_address(m: &super::Member) -> Result<SocketAddr, JoinError> {
    let text = String::from_utf8_lossy(&m.payload);
    text.parse().map_err(|_| JoinError::Transport(format!("{} sent a bad data-plane address `{text}`", m.task)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_are_one_host_and_ports_do_not_matter() {
        assert_eq!(host_name("10.0.0.1:2222"), host_name("10.0.0.1:2223"));
        assert_eq!(host_name("127.0.0.1:2222"), "localhost");
        assert_eq!(host_name("[::1]:2222"), "localhost");
        assert_eq!(host_name("localhost:1"), "localhost");
        assert_eq!(host_name("node-3.svc:2222"), "node-3.svc");
    }
}
