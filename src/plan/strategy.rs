//! Strategy and cluster: which replicas exist, where, and how their gradients are reduced.

use crate::cluster::{Address, Resolution, Role, Source};
use crate::spec::CollectiveTransport;
use crate::spec::{CollectiveImplementation, CrossDeviceOps, Device, DeviceKind, Devices, Diagnostic, StrategySpec};
use serde::Serialize;

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

/// How gradients of replicas meet.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reduction {
    /// One replica: nothing to reduce.
    None,
    /// Replicas in one process (`mirrored`, `central_storage`), by this algorithm.
    CrossDevice {
        algorithm: CrossDeviceOps,
        /// Chosen by `auto` from the device kind.
        auto: bool,
    },
    /// Across worker processes.
    Collective {
        implementation: CollectiveImplementation,
        /// Chosen by `auto` from the device kind.
        auto: bool,
        /// How gradients travel: shared memory when every worker is on this host.
        transport: CollectiveTransport,
        bytes_per_pack: u64,
        timeout_s: f64,
    },
    /// Workers push gradients to parameter servers and pull variables.
    ParameterServer,
}

/// The job's tasks as resolved, and this process's place among them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterPlan {
    /// Where the cluster was defined.
    pub source: Source,
    /// Every task (`worker:1`) with its address (`a free local port` when the launcher picks it).
    pub tasks: Vec<(String, String)>,
    /// The chief: `chief:0`, or `worker:0` without one.
    pub chief: Option<String>,
    /// This process's task; `None` when it launches the local tasks (or there is no cluster).
    pub task: Option<String>,
    /// This process starts one process per task of a local cluster and supervises them.
    pub launches_local_tasks: bool,
}

/// The resolved strategy, devices and cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StrategyPlan {
    /// The strategy.
    pub kind: StrategyKind,
    /// Devices of each worker, one replica each.
    pub devices: Vec<Device>,
    /// Worker processes that hold replicas (the chief counts as one under MultiWorkerMirrored).
    pub num_workers: usize,
    /// `workers × devices`: replicas whose gradients are summed each step.
    pub num_replicas_in_sync: usize,
    /// How the gradients are reduced.
    pub reduction: Reduction,
    /// The cluster.
    pub cluster: ClusterPlan,
}

impl StrategyPlan {
    /// "2 workers × 1 device", to explain the replica count in messages.
    pub fn replicas_text(&self) -> String {
        let d = self.devices.len();
        let w = self.num_workers;
        format!("{w} worker{} × {d} device{}", if w == 1 { "" } else { "s" }, if d == 1 { "" } else { "s" })
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

/// Resolves the strategy against the resolved cluster and the hardware.
pub fn resolve(
    strategy: &StrategySpec,
    resolution: &Resolution,
    hw: Hardware,
    errors: &mut Vec<Diagnostic>,
) -> StrategyPlan {
    let cluster = &resolution.cluster;
    let (chief, worker, ps) = (cluster.count(Role::Chief), cluster.count(Role::Worker), cluster.count(Role::Ps));
    // Where to point a problem: the spec's key, or the variable that defined the cluster.
    let key = |spec_key: &str| match cluster.source {
        Source::TfConfig | Source::Slurm | Source::Kubernetes => "cluster".to_string(),
        Source::Spec | Source::Single => spec_key.to_string(),
    };
    for (task, address) in &cluster.tasks {
        if let Address::At(a) = address
            && !valid_address(a)
        {
            errors.push(
                Diagnostic::error(
                    key("cluster"),
                    format!("{task}'s address `{a}` ({}) is not host:port", cluster.source.describe()),
                )
                .help("write it as host:port, e.g. \"10.0.0.5:2222\""),
            );
        }
    }

    let (kind, devices, reduction) = match strategy {
        StrategySpec::Default => (StrategyKind::Default, vec![Device::default()], Reduction::None),
        StrategySpec::OneDevice { device } => (StrategyKind::OneDevice, vec![*device], Reduction::None),
        StrategySpec::Mirrored { devices, cross_device_ops } => {
            let devices = count_devices(devices, hw);
            let all_gpu = devices.iter().all(|d| d.kind == DeviceKind::Gpu);
            let algorithm = match cross_device_ops {
                CrossDeviceOps::Auto if all_gpu => CrossDeviceOps::Nccl,
                CrossDeviceOps::Auto => CrossDeviceOps::ReductionToOneDevice,
                CrossDeviceOps::Nccl if !all_gpu => {
                    errors.push(
                        Diagnostic::error(
                            "strategy.cross_device_ops",
                            "cross_device_ops = \"nccl\" needs GPU devices, but strategy.devices includes CPUs",
                        )
                        .help("use cross_device_ops = \"hierarchical_copy\" or \"reduction_to_one_device\" on CPUs"),
                    );
                    *cross_device_ops
                }
                other => *other,
            };
            let auto = *cross_device_ops == CrossDeviceOps::Auto;
            (StrategyKind::Mirrored, devices, Reduction::CrossDevice { algorithm, auto })
        }
        StrategySpec::CentralStorage { devices } => {
            let devices = count_devices(devices, hw);
            (
                StrategyKind::CentralStorage,
                devices,
                Reduction::CrossDevice { algorithm: CrossDeviceOps::ReductionToOneDevice, auto: false },
            )
        }
        StrategySpec::MultiWorkerMirrored { devices, communication } => {
            let devices = count_devices(devices, hw);
            let all_gpu = devices.iter().all(|d| d.kind == DeviceKind::Gpu);
            let implementation = match communication.implementation {
                CollectiveImplementation::Auto if all_gpu => CollectiveImplementation::Nccl,
                CollectiveImplementation::Auto => CollectiveImplementation::Ring,
                other => other,
            };
            if implementation == CollectiveImplementation::Nccl && !all_gpu {
                errors.push(
                    Diagnostic::error(
                        "strategy.communication.implementation",
                        "implementation = \"nccl\" needs GPU devices, but the workers' devices are CPUs",
                    )
                    .help("use implementation = \"ring\" (or \"auto\") for CPU workers"),
                );
            }
            let transport = match communication.transport {
                CollectiveTransport::Auto if cluster.is_local() => CollectiveTransport::SharedMemory,
                CollectiveTransport::Auto => CollectiveTransport::Tcp,
                other => other,
            };
            let reduction = Reduction::Collective {
                auto: communication.implementation == CollectiveImplementation::Auto,
                transport,
                implementation,
                bytes_per_pack: communication.bytes_per_pack,
                timeout_s: communication.timeout_s,
            };
            (StrategyKind::MultiWorkerMirrored, devices, reduction)
        }
        StrategySpec::ParameterServer { .. } => {
            if ps == 0 || worker == 0 {
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
            (StrategyKind::ParameterServer, vec![Device::default()], Reduction::ParameterServer)
        }
    };

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
        _ => 1,
    };
    if !matches!(kind, StrategyKind::MultiWorkerMirrored | StrategyKind::ParameterServer) && chief + worker > 1 {
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
                    "the cluster ({}) lists {ps} parameter servers, but strategy.kind = \"{}\"",
                    cluster.source.describe(),
                    kind.name()
                ),
            )
            .help("remove cluster.ps, or use kind = \"parameter_server\""),
        );
    }
    // Under ParameterServerStrategy training is asynchronous: each worker steps on its own.
    let replicas_per_step = if kind == StrategyKind::ParameterServer { 1 } else { num_workers };
    StrategyPlan {
        kind,
        num_replicas_in_sync: replicas_per_step * devices.len(),
        devices,
        num_workers,
        reduction,
        cluster: ClusterPlan {
            source: cluster.source,
            tasks: cluster
                .tasks
                .iter()
                .map(|(t, a)| {
                    (
                        t.to_string(),
                        match a {
                            Address::Local => "a free local port".to_string(),
                            Address::At(a) => a.clone(),
                        },
                    )
                })
                .collect(),
            chief: cluster.chief().map(|t| t.to_string()),
            task: resolution.task.map(|t| t.to_string()),
            launches_local_tasks: resolution.task.is_none() && cluster.tasks.len() > 1,
        },
    }
}

fn valid_address(addr: &str) -> bool {
    match addr.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok(),
        None => false,
    }
}
