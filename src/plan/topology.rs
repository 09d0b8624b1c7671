//! The job's topology: which workers share a host, found without configuration from the
//! cluster's addresses. Tasks whose addresses have the same host part (`10.0.0.1:2222` and
//! `10.0.0.1:2223`) share a host; local tasks (counts) and loopback addresses (`localhost`,
//! `127.0.0.1`, `[::1]`) are this host. The all-reduce groups by it: shared memory inside a
//! host, the network across, and `hierarchical` leads each host by its first worker.

use super::ClusterPlan;
use crate::cluster::job::host_name;
use crate::cluster::{Address, Role, TaskId};
use serde::Serialize;

/// One host and the workers on it, in rank order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostGroup {
    /// The host part of its tasks' addresses (`localhost` for local and loopback ones).
    pub name: String,
    pub workers: Vec<TaskId>,
}

/// The hosts of the training workers (chief and workers), in the order of their first worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostLayout {
    pub hosts: Vec<HostGroup>,
}

impl HostLayout {
    /// The training workers of `cluster` by host; one host when the cluster is local (or
    /// there is none).
    pub fn of(cluster: &ClusterPlan) -> HostLayout {
        let mut hosts: Vec<HostGroup> = Vec::new();
        let workers = cluster.tasks.iter().filter(|(t, _)| matches!(t.role, Role::Chief | Role::Worker));
        for (task, address) in workers {
            let name = match address {
                Address::Local => "localhost".to_string(),
                Address::At(a) => host_name(a),
            };
            match hosts.iter_mut().find(|h| h.name == name) {
                Some(h) => h.workers.push(*task),
                None => hosts.push(HostGroup { name, workers: vec![*task] }),
            }
        }
        HostLayout { hosts }
    }

    /// Workers on all hosts.
    pub fn workers(&self) -> usize {
        self.hosts.iter().map(|h| h.workers.len()).sum()
    }

    /// Whether every worker is on one host.
    pub fn one_host(&self) -> bool {
        self.hosts.len() <= 1
    }

    /// The cost model's view: ranks, hosts, and the workers of the fullest host.
    pub fn placement(&self) -> crate::collective::cost::Placement {
        crate::collective::cost::Placement {
            ranks: self.workers().max(1),
            hosts: self.hosts.len().max(1),
            per_host: self.hosts.iter().map(|h| h.workers.len()).max().unwrap_or(1),
        }
    }
}
