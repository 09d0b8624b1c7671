//! The job's topology: which workers share a host, found without configuration from the
//! cluster's addresses. Tasks whose addresses have the same host part (`10.0.0.1:2222` and
//! `10.0.0.1:2223`) share a host; local tasks (counts) and loopback addresses (`localhost`,
//! `127.0.0.1`, `[::1]`) are this host. The all-reduce groups by it: shared memory inside a
//! host, the network across, and `hierarchical` leads each host by its first worker.

use super::ClusterPlan;
use crate::cluster::{Address, Role, TaskId};
use serde::Serialize;

/// One host and the workers on it, in rank order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Host {
    /// The host part of its tasks' addresses (`localhost` for local and loopback ones).
    pub name: String,
    pub workers: Vec<TaskId>,
}

/// The hosts of the training workers (chief and workers), in the order of their first worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    pub hosts: Vec<Host>,
}

/// The host an address names: its host part, with every loopback name as `localhost`.
pub fn host_name(address: &str) -> String {
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    if host == "localhost" || host == "::1" || host.starts_with("127.") {
        "localhost".to_string()
    } else {
        host.to_string()
    }
}

impl Topology {
    /// The training workers of `cluster` by host; one host when the cluster is local (or
    /// there is none).
    pub fn of(cluster: &ClusterPlan) -> Topology {
        let mut hosts: Vec<Host> = Vec::new();
        let workers = cluster.tasks.iter().filter(|(t, _)| matches!(t.role, Role::Chief | Role::Worker));
        for (task, address) in workers {
            let name = match address {
                Address::Local => "localhost".to_string(),
                Address::At(a) => host_name(a),
            };
            match hosts.iter_mut().find(|h| h.name == name) {
                Some(h) => h.workers.push(*task),
                None => hosts.push(Host { name, workers: vec![*task] }),
            }
        }
        Topology { hosts }
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
    pub fn shape(&self) -> crate::collective::cost::Shape {
        crate::collective::cost::Shape {
            ranks: self.workers().max(1),
            hosts: self.hosts.len().max(1),
            per_host: self.hosts.iter().map(|h| h.workers.len()).max().unwrap_or(1),
        }
    }
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
