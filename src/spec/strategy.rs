//! `[strategy]` and `[cluster]`: how replicas are laid out over devices, processes and hosts.

use super::device::Devices;
use crate::vocab::Device;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::num::{NonZeroU32, NonZeroU64};
use std::path::PathBuf;

/// `[strategy]`: the distribution strategy, TensorFlow's `tf.distribute` names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum StrategySpec {
    /// No distribution: one replica on the default device (`tf.distribute.get_strategy()`).
    #[default]
    Default,
    /// One replica placed on one named device (`OneDeviceStrategy`).
    OneDevice {
        /// The device, `cpu:N` or `gpu:N`. Default: `cpu:0`. Example: `device = "gpu:0"`.
        #[serde(default)]
        device: Device,
    },
    /// One replica per local device in one process, variables mirrored (`MirroredStrategy`).
    Mirrored {
        /// The devices: a list such as `["cpu:0", "cpu:1"]`, or a count of devices
        /// (GPUs when present, else CPU replicas). Default: `2`. Example: `devices = ["gpu:0", "gpu:1"]`.
        #[serde(default)]
        devices: Devices,
        /// How replicas' gradients are summed. Default: `auto`. Example: `cross_device_ops = "nccl"`.
        #[serde(default)]
        cross_device_ops: CrossDeviceOps,
    },
    /// Variables live once on the CPU; compute is replicated over local devices
    /// (`CentralStorageStrategy`).
    CentralStorage {
        /// The compute devices, as for `mirrored`. Default: `2`. Example: `devices = 2`.
        #[serde(default)]
        devices: Devices,
    },
    /// One or more replicas per worker process, on one host or many, with collective
    /// all-reduce between workers (`MultiWorkerMirroredStrategy`).
    MultiWorkerMirrored {
        /// Local devices per worker. Default: `1` (one CPU replica per worker).
        /// Example: `devices = ["gpu:0", "gpu:1"]`.
        #[serde(default = "Devices::one")]
        devices: Devices,
        /// Cross-worker all-reduce options (TensorFlow's `CommunicationOptions`).
        #[serde(default)]
        communication: CommunicationOptions,
    },
    /// Variables live on parameter-server tasks; workers push gradients and pull variables
    /// (`ParameterServerStrategy`).
    ParameterServer {
        /// How variables are split along their first axis before being placed on the `ps`
        /// tasks, TensorFlow's `tf.distribute.experimental.partitioners`; shards and whole
        /// variables then go round-robin over the ps tasks. Default: `{ kind = "round_robin" }`
        /// (whole variables). Example: `variable_partitioner = { kind = "fixed_shards", shards = 2 }`.
        #[serde(default)]
        variable_partitioner: VariablePartitioner,
        /// The stale-synchronous bound: a worker more than this many steps ahead of the slowest
        /// worker waits for it. Default: unbounded, TensorFlow's fully asynchronous training.
        /// Example: `max_staleness = 4`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_staleness: Option<u32>,
        /// Closures the coordinator's queue holds before `schedule` blocks (TensorFlow's
        /// `ClusterCoordinator` closure queue). Default: `262144` (256 Ki, as TensorFlow).
        /// Example: `queue_size = 64`.
        #[serde(default = "default_queue_size")]
        queue_size: NonZeroU32,
        /// A ps or worker that does not answer a pull, a push or a closure within this many
        /// seconds fails the job, naming it (a dead worker costs only its step, which runs
        /// again elsewhere). From 0.001 to 604800 (a week). Default: `30`. Example:
        /// `timeout_s = 10`.
        #[serde(default = "default_timeout_s")]
        #[schemars(range(min = 0.001, max = 604_800.0))]
        timeout_s: f64,
        /// How pulls and pushes travel between a worker and a ps. `auto`: through a
        /// shared-memory segment when the two run on one host (no socket, no kernel copies),
        /// over TCP when they do not or the segment cannot be set up; `shared_memory`: always
        /// the segment, and a worker that cannot set one up fails the job saying why; `tcp`:
        /// always TCP. Requests, answers and failure detection stay on TCP either way.
        /// Default: `auto`. Example: `transport = "tcp"`.
        #[serde(default)]
        transport: CollectiveTransport,
    },
}

/// `strategy.cross_device_ops`: the single-host reduction algorithm of `mirrored`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CrossDeviceOps {
    /// NCCL on GPUs, hierarchical copy otherwise; `trainrun check` shows the choice.
    #[default]
    Auto,
    /// NCCL all-reduce between GPUs (`NcclAllReduce`).
    Nccl,
    /// Reduce in groups, then across groups, then broadcast (`HierarchicalCopyAllReduce`).
    HierarchicalCopy,
    /// Reduce everything on one device, then broadcast (`ReductionToOneDevice`).
    ReductionToOneDevice,
}

fn default_queue_size() -> NonZeroU32 {
    NonZeroU32::new(256 * 1024).unwrap_or(NonZeroU32::MIN)
}

/// `strategy.variable_partitioner` of `parameter_server`: how many shards each variable is
/// split into along axis 0 (rows are dealt div-style: 13 rows over 5 shards are 3/3/3/2/2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum VariablePartitioner {
    /// Whole variables, no sharding: each goes to the next `ps` task in turn.
    #[default]
    RoundRobin,
    /// `FixedShardsPartitioner`: `shards` shards per variable (fewer when it has fewer rows).
    /// Example: `{ kind = "fixed_shards", shards = 2 }`.
    FixedShards {
        /// Shards per variable. Example: `shards = 2`.
        shards: NonZeroU32,
    },
    /// `MinSizePartitioner`: as many shards as keep each at least `min_shard_bytes`, at most
    /// `max_shards`. Example: `{ kind = "min_size", min_shard_bytes = 262144, max_shards = 4 }`.
    MinSize {
        /// Smallest shard in bytes. Default: `262144` (256 KiB, as TensorFlow).
        /// Example: `min_shard_bytes = 65536`.
        #[serde(default = "default_min_shard_bytes")]
        min_shard_bytes: NonZeroU64,
        /// Most shards per variable. Default: `1`, as TensorFlow. Example: `max_shards = 4`.
        #[serde(default = "one_shard")]
        max_shards: NonZeroU32,
    },
    /// `MaxSizePartitioner`: as few shards as keep each at most `max_shard_bytes` (a single
    /// row may exceed it), at most `max_shards`.
    /// Example: `{ kind = "max_size", max_shard_bytes = 1048576 }`.
    MaxSize {
        /// Largest shard in bytes. Example: `max_shard_bytes = 1048576`.
        max_shard_bytes: NonZeroU64,
        /// Most shards per variable. Default: no limit. Example: `max_shards = 8`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_shards: Option<NonZeroU32>,
    },
}

fn default_min_shard_bytes() -> NonZeroU64 {
    NonZeroU64::new(256 << 10).unwrap_or(NonZeroU64::MIN)
}

fn one_shard() -> NonZeroU32 {
    NonZeroU32::MIN
}

/// `[strategy.communication]`: TensorFlow's `tf.distribute.experimental.CommunicationOptions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommunicationOptions {
    /// The all-reduce algorithm between workers. Default: `auto`. Example: `implementation = "ring"`.
    #[serde(default)]
    pub implementation: CollectiveImplementation,
    /// Gradients travel in packs of about this many bytes, filled from the last layer back so
    /// finished packs travel while backward continues. Default: `4194304` (4 MiB).
    /// Example: `bytes_per_pack = 1048576`.
    #[serde(default = "default_bytes_per_pack")]
    #[schemars(range(min = 1024))]
    pub bytes_per_pack: u64,
    /// How gradients travel between workers. Default: `auto`. Example: `transport = "tcp"`.
    #[serde(default)]
    pub transport: CollectiveTransport,
    /// A collective that cannot complete within this many seconds fails, naming the task that
    /// did not answer; a task that stops answering the chief's heartbeats for this long is
    /// declared dead. From 0.001 to 604800 (a week). Default: `30`. Example: `timeout_s = 10`.
    #[serde(default = "default_timeout_s")]
    #[schemars(range(min = 0.001, max = 604_800.0))]
    pub timeout_s: f64,
    /// The α–β–γ cost model `implementation = "auto"` picks the algorithm with, for the pack
    /// size (`docs/cost-model.md`). Default: the figures fitted on loopback TCP and shared
    /// memory of a 2-core machine. Example:
    /// `cost_model = { network = { latency_us = 50, gigabytes_per_s = 1.25 } }`.
    #[serde(default, skip_serializing_if = "CostModelSpec::is_default")]
    pub cost_model: CostModelSpec,
}

/// `[strategy.communication.cost_model]`: the links' latency and bandwidth, and how fast a
/// worker sums.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CostModelSpec {
    /// Between hosts. Default: `{ latency_us = 40, gigabytes_per_s = 2.5 }` (loopback TCP).
    #[serde(default = "default_network")]
    pub network: LinkSpec,
    /// Between workers of one host. Default: `{ latency_us = 5, gigabytes_per_s = 8 }`.
    #[serde(default = "default_shared_memory")]
    pub shared_memory: LinkSpec,
    /// Gigabytes (10⁹ bytes) a worker sums per second. Default: `4`. Example: `sum_gigabytes_per_s = 8`.
    #[serde(default = "default_sum_rate")]
    #[schemars(range(min = 0.0))]
    pub sum_gigabytes_per_s: f64,
}

/// One kind of link in the cost model.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Microseconds one message takes, however small (α). Example: `latency_us = 50`.
    #[schemars(range(min = 0.0))]
    pub latency_us: f64,
    /// Gigabytes (10⁹ bytes) per second once a message flows (1/β). Example: `gigabytes_per_s = 1.25`.
    #[schemars(range(min = 0.0))]
    pub gigabytes_per_s: f64,
}

fn default_network() -> LinkSpec {
    LinkSpec { latency_us: 40.0, gigabytes_per_s: 2.5 }
}

fn default_shared_memory() -> LinkSpec {
    LinkSpec { latency_us: 5.0, gigabytes_per_s: 8.0 }
}

fn default_sum_rate() -> f64 {
    4.0
}

impl CostModelSpec {
    /// Whether it is all defaults, so the resolved spec (and every manifest made from it)
    /// leaves it out.
    pub fn is_default(&self) -> bool {
        *self == CostModelSpec::default()
    }
}

impl Default for CostModelSpec {
    fn default() -> Self {
        Self {
            network: default_network(),
            shared_memory: default_shared_memory(),
            sum_gigabytes_per_s: default_sum_rate(),
        }
    }
}

fn default_bytes_per_pack() -> u64 {
    4 << 20
}

fn default_timeout_s() -> f64 {
    30.0
}

impl Default for CommunicationOptions {
    fn default() -> Self {
        Self {
            implementation: CollectiveImplementation::default(),
            bytes_per_pack: default_bytes_per_pack(),
            transport: CollectiveTransport::default(),
            timeout_s: default_timeout_s(),
            cost_model: CostModelSpec::default(),
        }
    }
}

/// `strategy.communication.implementation`: TensorFlow's `CommunicationImplementation`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveImplementation {
    /// The cheapest algorithm for the pack size by the cost model (`cost_model`): `direct`
    /// over shared memory on one host, the ring between two hosts, `halving_doubling` or
    /// `hierarchical` for many ranks; `trainrun check` shows the estimates and the choice.
    #[default]
    Auto,
    /// Chunked, pipelined ring all-reduce (reduce-scatter + all-gather).
    Ring,
    /// Rabenseifner's reduce-scatter by recursive halving + all-gather by recursive doubling:
    /// 2·log₂N messages instead of the ring's 2(N−1).
    HalvingDoubling,
    /// Inside each host (over shared memory), among one leader per host, then back inside
    /// each host (Horovod's hierarchical all-reduce).
    Hierarchical,
    /// NCCL (GPU builds only).
    Nccl,
}

/// `strategy.communication.transport`: the data plane between workers, chosen by measurement
/// (an 11 MB all-reduce between two processes on one host: ~0.2–0.8 ms through shared memory,
/// ~4 ms through loopback TCP).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveTransport {
    /// Shared memory when every worker runs on one host; on several hosts, shared memory
    /// inside each host and TCP across for `hierarchical`, TCP for the others.
    #[default]
    Auto,
    /// A shared-memory segment (every worker on one host).
    SharedMemory,
    /// A TCP ring (works across hosts).
    Tcp,
}

/// `[cluster]`: the tasks of the job by role, as TF_CONFIG's `cluster`. Each role is either a
/// count of local tasks on free ports (`worker = 2`) or a list of `host:port` addresses.
/// A `TF_CONFIG` environment variable, when set, defines the cluster instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// The chief: at most one. Without one, worker 0 is chief. Example: `chief = ["10.0.0.1:2222"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chief: Option<Tasks>,
    /// The workers. Example: `worker = 2` or `worker = ["localhost:2222", "localhost:2223"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<Tasks>,
    /// Parameter servers (`parameter_server` only). Example: `ps = 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ps: Option<Tasks>,
    /// The sidecar evaluator, outside the replicas: at most one. Example: `evaluator = 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluator: Option<Tasks>,
    /// File holding the job token that authenticates tasks to each other on manual clusters
    /// (else `TRAINRUN_JOB_TOKEN`; the local launcher makes its own).
    /// Example: `token_file = "/etc/trainrun/job.token"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// Seconds every task has to check in at start-up before the job fails, listing the
    /// missing tasks. From 0.001 to 604800 (a week). Default: `60`. Example: `startup_timeout_s = 120`.
    #[serde(default = "default_startup_timeout_s")]
    #[schemars(range(min = 0.001, max = 604_800.0))]
    pub startup_timeout_s: f64,
    /// Times the local launcher restarts every task after one fails (exits non-zero or is
    /// killed), each time resuming from the last `backup_and_restore` backup. Spec, data and
    /// preemption exits (codes 2, 3, 4, 6) are not restarted. Under `parameter_server` a
    /// worker that dies is not counted here: it alone is started again at once and rejoins the
    /// running job. Default: `0` (a failure ends the job). Example: `max_restarts = 3`.
    #[serde(default)]
    pub max_restarts: u32,
    /// Seconds the launcher waits before the first restart; the wait doubles with each further
    /// restart, up to 60 s. Default: `0.5`. Example: `restart_backoff_s = 2`.
    #[serde(default = "default_restart_backoff_s")]
    #[schemars(range(min = 0.0, max = 3600.0))]
    pub restart_backoff_s: f64,
    /// Mutual TLS between tasks, on the control plane and the TCP ring: every task presents
    /// `cert_file` and accepts only peers whose certificate `ca_file` signed; the job token is
    /// still required. Default: none (plain TCP, fine on one host or a trusted network).
    /// Example: `tls = { cert_file = "tls/task.crt", key_file = "tls/task.key", ca_file = "tls/ca.crt" }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
}

/// `cluster.tls`: PEM files for mutual TLS. The three travel together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// This task's certificate chain (PEM), leaf first. Its names (DNS or IP) must cover every
    /// address other tasks reach this task by. Example: `cert_file = "/etc/trainrun/tls/tls.crt"`.
    pub cert_file: PathBuf,
    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    /// Example: `key_file = "/etc/trainrun/tls/tls.key"`.
    pub key_file: PathBuf,
    /// The job's certificate authority (PEM): peers must present a certificate it signed.
    /// Example: `ca_file = "/etc/trainrun/tls/ca.crt"`.
    pub ca_file: PathBuf,
}

fn default_restart_backoff_s() -> f64 {
    0.5
}

fn default_startup_timeout_s() -> f64 {
    60.0
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            chief: None,
            worker: None,
            ps: None,
            evaluator: None,
            token_file: None,
            startup_timeout_s: default_startup_timeout_s(),
            max_restarts: 0,
            restart_backoff_s: default_restart_backoff_s(),
            tls: None,
        }
    }
}

/// One role's tasks: a count of local tasks, or their addresses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Tasks {
    /// That many tasks on this host, on free ports.
    Count(NonZeroU32),
    /// One `host:port` per task.
    Addresses(#[schemars(schema_with = "addresses_schema")] Vec<String>),
}

/// The address list checks each entry's form, so a missing port is reported with the spec's
/// other problems rather than when the cluster starts.
fn addresses_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {
            "title": "`host:port` address",
            "description": "A task address: `host:port`.",
            "type": "string",
            "pattern": "^([^\\s:\\[\\]]+|\\[[0-9A-Fa-f:.]+\\]):[0-9]{1,5}$",
            "examples": ["localhost:2222", "10.0.0.1:2222"]
        }
    })
}

impl Tasks {
    /// How many tasks this role has.
    pub fn len(&self) -> usize {
        match self {
            Tasks::Count(n) => n.get() as usize,
            Tasks::Addresses(a) => a.len(),
        }
    }

    /// Whether the role has no task.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
