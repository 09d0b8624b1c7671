//! The strategy: which replicas exist, on which devices, and how their gradients meet. The
//! plan holds one [`Distribution`], whose variant is the strategy and carries exactly that
//! strategy's settings (the multi-worker all-reduce, the parameter servers' placement), so
//! nothing downstream re-checks that a setting is there or falls back when it is not.

use super::topology::HostLayout;
use super::{ClusterPlan, ParameterServerPlan};
use crate::cluster::{Role, Source};
use crate::collective::choice::SizeChoice;
use crate::collective::cost::{CostModel, LinkCost};
use crate::collective::probe::AutoBySize;
use crate::collective::{Algorithm, TransportKind};
use crate::spec::{
    CollectiveImplementation, CollectiveTransport, CommunicationOptions, CostModelSpec, CrossDeviceOps, Devices,
    Diagnostic, StrategySpec,
};
use crate::vocab::{Device, DeviceKind};
use serde::Serialize;
use std::num::NonZeroUsize;

/// The distribution strategy, TensorFlow's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StrategyKind {
    /// One replica on the default device.
    Default,
    /// One replica on a named device.
    OneDevice,
    /// One process, one replica per local device.
    Mirrored,
    /// Variables on the CPU, compute on local devices.
    CentralStorage,
    /// Collective all-reduce across worker processes.
    MultiWorkerMirrored,
    /// Variables on parameter servers.
    ParameterServer,
}

impl StrategyKind {
    /// The spec's name of the strategy.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Default => "default",
            StrategyKind::OneDevice => "one_device",
            StrategyKind::Mirrored => "mirrored",
            StrategyKind::CentralStorage => "central_storage",
            StrategyKind::MultiWorkerMirrored => "multi_worker_mirrored",
            StrategyKind::ParameterServer => "parameter_server",
        }
    }
}

/// The in-process reduction of `mirrored` and `central_storage`, resolved from
/// `cross_device_ops` (TensorFlow's `CrossDeviceOps` classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CrossDevice {
    /// Sum everything on the first replica (`ReductionToOneDevice`).
    ReductionToOneDevice,
    /// Sum within two halves, then across them (`HierarchicalCopyAllReduce`).
    HierarchicalCopy,
    /// NCCL between GPUs (`NcclAllReduce`).
    Nccl,
}

impl CrossDevice {
    /// The spec's name of the algorithm.
    pub fn name(self) -> &'static str {
        match self {
            CrossDevice::ReductionToOneDevice => "reduction_to_one_device",
            CrossDevice::HierarchicalCopy => "hierarchical_copy",
            CrossDevice::Nccl => "nccl",
        }
    }
}

/// How workers' gradients meet, as `[strategy.communication]` resolves: an algorithm over a
/// transport, a pair that can run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CollectivePlan {
    /// The all-reduce algorithm.
    pub algorithm: Algorithm,
    /// Whether `implementation = "auto"` chose it.
    pub auto: bool,
    /// The transport it runs over.
    pub transport: TransportKind,
    /// Whether `transport = "auto"` chose it.
    pub auto_transport: bool,
    /// Gradients travel in packs of about this many bytes while backward continues.
    pub bytes_per_pack: NonZeroUsize,
    /// The workers by host.
    pub topology: HostLayout,
    /// The α–β–γ model `auto` chose with.
    pub cost_model: CostModel,
    /// Whether the run measures the network's α, β and γ at start-up (or takes an earlier
    /// run's figures) to choose per pack size: `auto` without `cost_model` in the spec.
    pub measured_at_start: bool,
    /// Each algorithm's estimated seconds per pack, over the transport it would run on.
    pub estimates: Vec<(Algorithm, f64)>,
}

/// `mirrored`'s in-process reduction, as `cross_device_ops` resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CrossDevicePlan {
    pub algorithm: CrossDevice,
    /// Chosen by `auto` from the device kind.
    pub auto: bool,
}

/// The strategy, with exactly its own settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Distribution {
    /// One replica on the default device: nothing to reduce.
    Default,
    /// One replica on a named device: nothing to reduce.
    OneDevice,
    /// One replica per local device, summed in this process.
    Mirrored(CrossDevicePlan),
    /// Variables on the CPU, one replica per local device, summed on the CPU
    /// (`ReductionToOneDevice`).
    CentralStorage,
    /// One replica per device of every worker process, summed across them by all-reduce.
    MultiWorkerMirrored(CollectivePlan),
    /// Variables on parameter servers; workers step asynchronously on closures the chief
    /// schedules.
    ParameterServer(ParameterServerPlan),
}

impl Distribution {
    /// The strategy's kind.
    pub fn kind(&self) -> StrategyKind {
        match self {
            Distribution::Default => StrategyKind::Default,
            Distribution::OneDevice => StrategyKind::OneDevice,
            Distribution::Mirrored(_) => StrategyKind::Mirrored,
            Distribution::CentralStorage => StrategyKind::CentralStorage,
            Distribution::MultiWorkerMirrored(_) => StrategyKind::MultiWorkerMirrored,
            Distribution::ParameterServer(_) => StrategyKind::ParameterServer,
        }
    }
}

/// Which replicas exist and where: what every strategy has.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replicas {
    /// Devices of each worker, one replica each.
    pub devices: Vec<Device>,
    /// Worker processes that hold replicas (the chief counts as one under MultiWorkerMirrored).
    pub num_workers: usize,
    /// Replicas whose gradients are summed each step: `workers × devices`, or the devices of
    /// one worker under `parameter_server`, whose workers step on their own.
    pub num_replicas_in_sync: usize,
}

/// The resolved strategy and devices.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyPlan {
    /// Devices of each worker, one replica each.
    pub devices: Vec<Device>,
    /// Worker processes that hold replicas (the chief counts as one under MultiWorkerMirrored).
    pub num_workers: usize,
    /// `workers × devices`: replicas whose gradients are summed each step.
    pub num_replicas_in_sync: usize,
    /// The strategy and its settings.
    #[serde(flatten)]
    pub distribution: Distribution,
}

impl StrategyPlan {
    /// The strategy's kind.
    pub fn kind(&self) -> StrategyKind {
        self.distribution.kind()
    }
}

impl StrategyKind {
    /// Whether the strategy runs one process per task of a cluster.
    pub fn multi_process(self) -> bool {
        match self {
            StrategyKind::MultiWorkerMirrored | StrategyKind::ParameterServer => true,
            StrategyKind::Default | StrategyKind::OneDevice | StrategyKind::Mirrored | StrategyKind::CentralStorage => {
                false
            }
        }
    }

    /// The kind of a strategy section.
    pub fn of(spec: &StrategySpec) -> StrategyKind {
        match spec {
            StrategySpec::Default => StrategyKind::Default,
            StrategySpec::OneDevice { .. } => StrategyKind::OneDevice,
            StrategySpec::Mirrored { .. } => StrategyKind::Mirrored,
            StrategySpec::CentralStorage { .. } => StrategyKind::CentralStorage,
            StrategySpec::MultiWorkerMirrored { .. } => StrategyKind::MultiWorkerMirrored,
            StrategySpec::ParameterServer { .. } => StrategyKind::ParameterServer,
        }
    }
}

/// "2 workers × 1 device", to explain the replica count in messages.
fn replicas_text(w: usize, d: usize) -> String {
    format!("{w} worker{} × {d} device{}", if w == 1 { "" } else { "s" }, if d == 1 { "" } else { "s" })
}

impl Replicas {
    /// "2 workers × 1 device", to explain the replica count in messages.
    pub fn replicas_text(&self) -> String {
        replicas_text(self.num_workers, self.devices.len())
    }
}

impl StrategyPlan {
    /// "2 workers × 1 device", to explain the replica count in messages.
    pub fn replicas_text(&self) -> String {
        replicas_text(self.num_workers, self.devices.len())
    }
}

/// Machine facts the strategy depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hardware {
    /// GPUs this build can use on this machine.
    pub gpus: usize,
}

fn count_devices(devices: &Devices, hw: Hardware) -> Vec<Device> {
    match devices {
        Devices::List(list) => list.clone(),
        Devices::Count(n) => {
            let kind = if hw.gpus > 0 { DeviceKind::Gpu } else { DeviceKind::Cpu };
            (0..n.get()).map(|index| Device { kind, index }).collect()
        }
    }
}

/// The replicas the strategy runs, against the planned cluster and the hardware: what the
/// batch and the data shards are planned from, before the model is known.
pub fn replicas(
    strategy: &StrategySpec,
    cluster: &ClusterPlan,
    hw: Hardware,
    errors: &mut Vec<Diagnostic>,
) -> Replicas {
    let (chief, worker, ps) = (cluster.count(Role::Chief), cluster.count(Role::Worker), cluster.count(Role::Ps));
    // Where to point a problem: the spec's key, or the variable that defined the cluster.
    let key = |spec_key: &str| match cluster.source {
        Source::TfConfig | Source::Slurm | Source::Kubernetes => "cluster".to_string(),
        Source::Spec | Source::Single => spec_key.to_string(),
    };
    let devices = match strategy {
        StrategySpec::Default | StrategySpec::ParameterServer { .. } => vec![Device::default()],
        StrategySpec::OneDevice { device } => vec![*device],
        StrategySpec::Mirrored { devices, .. }
        | StrategySpec::CentralStorage { devices }
        | StrategySpec::MultiWorkerMirrored { devices, .. } => count_devices(devices, hw),
    };
    let kind = StrategyKind::of(strategy);
    if kind == StrategyKind::ParameterServer && (ps == 0 || worker == 0) {
        errors.push(
            Diagnostic::error(
                "strategy.kind",
                match cluster.source {
                    Source::Single => "strategy.kind = \"parameter_server\" needs ps and worker tasks, but there is no [cluster]".to_string(),
                    source => format!(
                        "strategy.kind = \"parameter_server\" needs ps and worker tasks; the cluster ({}) has {ps} ps and {worker} workers",
                        source.describe()
                    ),
                },
            )
                .help("add e.g. ps = 1 and worker = 2 to [cluster]"),
        );
    }

    let mut seen = std::collections::BTreeSet::new();
    for d in &devices {
        if !seen.insert(*d) {
            errors.push(
                Diagnostic::error("strategy.devices", format!("strategy.devices lists {d} twice"))
                    .help("list each device once"),
            );
        }
    }

    let num_workers = match kind {
        StrategyKind::MultiWorkerMirrored => (chief + worker).max(1),
        StrategyKind::ParameterServer => worker.max(1),
        StrategyKind::Default | StrategyKind::OneDevice | StrategyKind::Mirrored | StrategyKind::CentralStorage => 1,
    };
    if !kind.multi_process() && chief + worker > 1 {
        errors.push(
            Diagnostic::error(
                key("cluster.worker"),
                format!(
                    "strategy.kind = \"{}\" runs in one process, but the cluster ({}) lists {} tasks",
                    kind.name(),
                    cluster.source.describe(),
                    chief + worker
                ),
            )
            .help("use kind = \"multi_worker_mirrored\" to train across workers, or remove [cluster]"),
        );
    }
    if ps > 0 && kind != StrategyKind::ParameterServer {
        errors.push(
            Diagnostic::error(
                key("cluster.ps"),
                format!(
                    "the cluster ({}) lists {ps} parameter server{}, but strategy.kind = \"{}\"",
                    cluster.source.describe(),
                    if ps == 1 { "" } else { "s" },
                    kind.name()
                ),
            )
            .help("remove cluster.ps, or use kind = \"parameter_server\""),
        );
    }
    // Under ParameterServerStrategy training is asynchronous: each worker steps on its own.
    let replicas_per_step = if kind == StrategyKind::ParameterServer { 1 } else { num_workers };
    Replicas { num_replicas_in_sync: replicas_per_step * devices.len(), devices, num_workers }
}

/// The strategy over `replicas`, with its own settings resolved; `parameter_server` is the
/// placement planned for `strategy.kind = "parameter_server"` (`None` when that failed, which
/// `errors` already says).
pub fn resolve(
    strategy: &StrategySpec,
    replicas: Replicas,
    cluster: &ClusterPlan,
    parameter_server: Option<ParameterServerPlan>,
    errors: &mut Vec<Diagnostic>,
) -> Option<StrategyPlan> {
    let distribution = match strategy {
        StrategySpec::Default => Distribution::Default,
        StrategySpec::OneDevice { .. } => Distribution::OneDevice,
        StrategySpec::Mirrored { cross_device_ops, .. } => Distribution::Mirrored(CrossDevicePlan {
            algorithm: cross_device(&replicas.devices, *cross_device_ops, errors),
            auto: *cross_device_ops == CrossDeviceOps::Auto,
        }),
        StrategySpec::CentralStorage { .. } => Distribution::CentralStorage,
        StrategySpec::MultiWorkerMirrored { communication, .. } => {
            Distribution::MultiWorkerMirrored(collective(&replicas.devices, communication, cluster, errors))
        }
        StrategySpec::ParameterServer { .. } => Distribution::ParameterServer(parameter_server?),
    };
    let Replicas { devices, num_workers, num_replicas_in_sync } = replicas;
    Some(StrategyPlan { devices, num_workers, num_replicas_in_sync, distribution })
}

/// `cross_device_ops`, with `auto` resolved by the device kind.
fn cross_device(devices: &[Device], ops: CrossDeviceOps, errors: &mut Vec<Diagnostic>) -> CrossDevice {
    let all_gpu = devices.iter().all(|d| d.kind == DeviceKind::Gpu);
    match ops {
        CrossDeviceOps::Auto if all_gpu => CrossDevice::Nccl,
        CrossDeviceOps::Auto | CrossDeviceOps::ReductionToOneDevice => CrossDevice::ReductionToOneDevice,
        CrossDeviceOps::HierarchicalCopy => CrossDevice::HierarchicalCopy,
        CrossDeviceOps::Nccl => {
            if !all_gpu {
                errors.push(
                    Diagnostic::error(
                        "strategy.cross_device_ops",
                        "cross_device_ops = \"nccl\" needs GPU devices, but strategy.devices includes CPUs",
                    )
                    .help("use cross_device_ops = \"hierarchical_copy\" or \"reduction_to_one_device\" on CPUs"),
                );
            }
            CrossDevice::Nccl
        }
    }
}

/// `[strategy.communication]`, with `auto` resolved: on one host shared memory; on several,
/// shared memory inside each host and TCP across for `hierarchical`, TCP for the flat
/// algorithms (under TLS with `cluster.tls`); the algorithm the cost model finds cheapest for
/// a pack.
fn collective(
    devices: &[Device],
    c: &CommunicationOptions,
    cluster: &ClusterPlan,
    errors: &mut Vec<Diagnostic>,
) -> CollectivePlan {
    let topology = HostLayout::of(cluster);
    let model = cost_model(&c.cost_model, errors);
    let bytes_per_pack = usize::try_from(c.bytes_per_pack).ok().and_then(NonZeroUsize::new).unwrap_or_else(|| {
        errors.push(
            Diagnostic::error(
                "strategy.communication.bytes_per_pack",
                format!("bytes_per_pack = {} is not a usable pack size", c.bytes_per_pack),
            )
            .help("use a size such as 4194304 (4 MiB)"),
        );
        NonZeroUsize::MIN
    });
    // `cluster.tls` seals every connection between tasks, the gradients' too.
    let (tcp, routed) = match cluster.tls {
        Some(_) => (TransportKind::TcpTls, TransportKind::SharedMemoryAndTcpTls),
        None => (TransportKind::Tcp, TransportKind::SharedMemoryAndTcp),
    };
    let several = !topology.one_host() && !cluster.is_local();
    // The transport `transport = "auto"` gives an algorithm.
    let auto_for = |a: Algorithm| {
        if !several {
            return TransportKind::SharedMemory;
        }
        match a {
            Algorithm::Hierarchical => routed,
            Algorithm::Direct | Algorithm::Ring | Algorithm::HalvingDoubling => tcp,
        }
    };
    let (shape, pack) = (topology.placement(), bytes_per_pack.get());
    let key = "strategy.communication.implementation";
    let named = match c.implementation {
        CollectiveImplementation::Auto => None,
        CollectiveImplementation::Ring => Some(Algorithm::Ring),
        CollectiveImplementation::HalvingDoubling => Some(Algorithm::HalvingDoubling),
        CollectiveImplementation::Hierarchical => Some(Algorithm::Hierarchical),
        CollectiveImplementation::Nccl => {
            let gpus = devices.iter().all(|d| d.kind == DeviceKind::Gpu);
            let why = if gpus {
                "implementation = \"nccl\" needs NCCL between worker processes, which this version does not build"
            } else {
                "implementation = \"nccl\" needs GPU devices, but the workers' devices are CPUs"
            };
            errors.push(
                Diagnostic::error(key, why)
                    .help("use implementation = \"ring\" (or \"auto\") between worker processes"),
            );
            None
        }
    };
    let (algorithm, transport) = match (named, c.transport) {
        (Some(a), CollectiveTransport::Auto) => (a, auto_for(a)),
        (Some(a), CollectiveTransport::SharedMemory) => (a, TransportKind::SharedMemory),
        (Some(a), CollectiveTransport::Tcp) => (a, tcp),
        // Hosts with several workers each: shared memory inside them and TCP across, over
        // which every point-to-point algorithm runs and each pack size takes the cheapest.
        (None, CollectiveTransport::Auto) if several && shape.per_host > 1 => {
            (model.cheapest(routed, shape, pack), routed)
        }
        // Each algorithm over the transport it would get; ties keep `Algorithm::ALL`'s order.
        (None, CollectiveTransport::Auto) => Algorithm::ALL
            .into_iter()
            .filter_map(|a| Some((a, auto_for(a), model.estimate(a, auto_for(a), shape, pack)?)))
            .min_by(|x, y| x.2.total_cmp(&y.2))
            .map_or((Algorithm::fastest_over(tcp), tcp), |(a, t, _)| (a, t)),
        (None, CollectiveTransport::SharedMemory) => {
            (model.cheapest(TransportKind::SharedMemory, shape, pack), TransportKind::SharedMemory)
        }
        (None, CollectiveTransport::Tcp) => (model.cheapest(tcp, shape, pack), tcp),
    };
    if let Some(why) = algorithm.refuses(transport) {
        errors.push(
            Diagnostic::error(
                key,
                format!(
                    "implementation = \"{}\" cannot run over strategy.communication.transport = \"{}\": {why}",
                    algorithm.name(),
                    transport.name()
                ),
            )
            .help(format!(
                "use implementation = \"auto\" (it picks {})",
                model.cheapest(transport, shape, pack).name()
            )),
        );
    }
    // The others over the transport they would get: the spec's, or what `auto` gives them.
    let over = |a: Algorithm| match c.transport {
        CollectiveTransport::Auto => auto_for(a),
        CollectiveTransport::SharedMemory | CollectiveTransport::Tcp => transport,
    };
    let estimates =
        Algorithm::ALL.into_iter().filter_map(|a| Some((a, model.estimate(a, over(a), shape, pack)?))).collect();
    CollectivePlan {
        algorithm,
        auto: c.implementation == CollectiveImplementation::Auto,
        transport,
        auto_transport: c.transport == CollectiveTransport::Auto,
        bytes_per_pack,
        topology,
        cost_model: model,
        measured_at_start: c.cost_model.is_default(),
        estimates,
    }
}

impl CollectivePlan {
    /// What `implementation = "auto"` needs to choose per pack size at run time, for a
    /// gradient of `floats` values; `None` when the spec names the algorithm.
    pub fn auto_by_size(&self, floats: u64) -> Option<AutoBySize> {
        self.auto.then(|| AutoBySize {
            model: self.cost_model,
            measure: self.measured_at_start,
            placement: self.topology.placement(),
            packs: SizeChoice::packs(floats, self.bytes_per_pack.get()).into_iter().map(|(b, _)| b).collect(),
        })
    }
}

/// `[strategy.communication.cost_model]` as the model's units, each figure checked.
fn cost_model(spec: &CostModelSpec, errors: &mut Vec<Diagnostic>) -> CostModel {
    let defaults = CostModel::default();
    let mut rate = |key: &str, gb: f64| {
        if gb.is_finite() && gb > 0.0 {
            Some(1.0 / (gb * 1e9))
        } else {
            errors.push(
                Diagnostic::error(
                    format!("strategy.communication.cost_model.{key}"),
                    format!("strategy.communication.cost_model.{key} = {gb} is not a rate"),
                )
                .help("use a positive number of gigabytes per second, such as 1.25 for 10 Gbit/s"),
            );
            None
        }
    };
    let network_beta = rate("network.gigabytes_per_s", spec.network.gigabytes_per_s);
    let shm_beta = rate("shared_memory.gigabytes_per_s", spec.shared_memory.gigabytes_per_s);
    let gamma = rate("sum_gigabytes_per_s", spec.sum_gigabytes_per_s);
    let mut latency = |key: &str, us: f64| {
        if us.is_finite() && us >= 0.0 {
            Some(us * 1e-6)
        } else {
            errors.push(
                Diagnostic::error(
                    format!("strategy.communication.cost_model.{key}"),
                    format!("strategy.communication.cost_model.{key} = {us} is not a latency"),
                )
                .help("use microseconds, 0 or more, such as 50"),
            );
            None
        }
    };
    let network_alpha = latency("network.latency_us", spec.network.latency_us);
    let shm_alpha = latency("shared_memory.latency_us", spec.shared_memory.latency_us);
    CostModel {
        network: LinkCost {
            alpha: network_alpha.unwrap_or(defaults.network.alpha),
            beta: network_beta.unwrap_or(defaults.network.beta),
        },
        shared_memory: LinkCost {
            alpha: shm_alpha.unwrap_or(defaults.shared_memory.alpha),
            beta: shm_beta.unwrap_or(defaults.shared_memory.beta),
        },
        gamma: gamma.unwrap_or(defaults.gamma),
        // The spec's figures price every algorithm alike.
        measured: None,
    }
}
