//! `hierarchical`: Horovod's hierarchical all-reduce. The ranks of each host sum among
//! themselves (over shared memory when the transport routes by host), one leader per host
//! (its lowest rank) all-reduces the hosts' sums across hosts, and each leader hands the
//! result back to its host. Each of the three steps is `halving_doubling` applied to a
//! subgroup ([`Group::subgroup`], [`Exchanges::among`]), whose latency grows as log N: the
//! network carries 2·log₂H messages per all-reduce for H hosts instead of the ring's 2(N−1).
//!
//! Hosts come from the topology ([`crate::collective::Peers::on_hosts`]); a rank's host is
//! an index, equal for ranks that share one.
//!
//! Determinism: every element is the sum of the hosts' sums, each in `halving_doubling`'s
//! fixed order, so the order depends only on the ranks, their hosts and the length: the same
//! bits on every rank and in every run.

use super::super::error::CollectiveError;
use super::super::transport::{Combine, HostRoute, Wiring, internal};
use super::halving_doubling::HalvingDoubling;
use super::{Exchanges, Group, PointToPointAlgorithm};

/// One of `hierarchical`'s steps, which the start-up probe times alone (an all-reduce among
/// one host's ranks, or among the hosts' leaders) to price each kind of link by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HierarchicalPart {
    /// Halving-doubling among each host's ranks, every host at once.
    InsideHosts,
    /// Halving-doubling among one leader per host; the other ranks take no part.
    AmongLeaders,
}

/// The hierarchical all-reduce over hosts; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hierarchical {
    /// The host of each global rank.
    pub(crate) hosts: Vec<usize>,
}

/// A group's ranks by host: this rank's host's ranks and one leader per host, both as group
/// ranks in rank order.
struct HostRanks {
    local: Vec<usize>,
    leaders: Vec<usize>,
}

impl Hierarchical {
    fn host(&self, g: &Group, r: usize) -> usize {
        self.hosts.get(g.global(r)).copied().unwrap_or(0)
    }

    /// The group rank `r`'s host's ranks, and the leaders.
    fn layout_of(&self, g: &Group, r: usize) -> HostRanks {
        let mine = self.host(g, r);
        let local = (0..g.size()).filter(|&q| self.host(g, q) == mine).collect();
        let leaders = (0..g.size()).filter(|&q| (0..q).all(|e| self.host(g, e) != self.host(g, q))).collect();
        HostRanks { local, leaders }
    }

    fn layout(&self, g: &Group) -> HostRanks {
        self.layout_of(g, g.rank())
    }

    /// `part` of the all-reduce alone, over the same subgroups and route as the whole; a rank
    /// outside the part's subgroup (not a leader) returns at once.
    pub(crate) fn all_reduce_part(
        &self,
        x: &mut Exchanges<'_>,
        data: &mut [u8],
        sum: Combine,
        part: HierarchicalPart,
    ) -> Result<(), CollectiveError> {
        let g = x.group().clone();
        let l = self.layout(&g);
        let ranks = match part {
            HierarchicalPart::InsideHosts => l.local,
            HierarchicalPart::AmongLeaders => l.leaders,
        };
        match g.subgroup(&ranks) {
            Some(sub) => HalvingDoubling.all_reduce(&mut x.among(&sub), data, sum),
            None => Ok(()),
        }
    }
}

impl PointToPointAlgorithm for Hierarchical {
    fn route(&self) -> HostRoute {
        // Each step runs among one host's ranks or among the leaders, never both.
        HostRoute::ByHost
    }

    fn wiring(&self, g: &Group) -> Wiring {
        let l = self.layout(g);
        [g.subgroup(&l.local), g.subgroup(&l.leaders)]
            .into_iter()
            .flatten()
            .fold(Wiring::default(), |w, sub| w.union(HalvingDoubling.wiring(&sub)))
    }

    fn all_reduce(&self, x: &mut Exchanges<'_>, data: &mut [u8], sum: Combine) -> Result<(), CollectiveError> {
        let g = x.group().clone();
        let l = self.layout(&g);
        let local = g.subgroup(&l.local).ok_or_else(|| internal("a rank off its host"))?;
        HalvingDoubling.all_reduce(&mut x.among(&local), data, sum)?;
        if let Some(leaders) = g.subgroup(&l.leaders) {
            HalvingDoubling.all_reduce(&mut x.among(&leaders), data, sum)?;
        }
        HalvingDoubling.broadcast(&mut x.among(&local), data, 0)
    }

    fn broadcast(&self, x: &mut Exchanges<'_>, data: &mut [u8], root: usize) -> Result<(), CollectiveError> {
        let g = x.group().clone();
        let l = self.layout(&g);
        let local = g.subgroup(&l.local).ok_or_else(|| internal("a rank off its host"))?;
        let root_host = self.layout_of(&g, root);
        let at_root = root_host.local.contains(&g.rank());
        if at_root {
            let from = root_host.local.iter().position(|&r| r == root).unwrap_or(0);
            HalvingDoubling.broadcast(&mut x.among(&local), data, from)?;
        }
        if let Some(leaders) = g.subgroup(&l.leaders) {
            let from = l.leaders.iter().position(|r| root_host.local.contains(r)).unwrap_or(0);
            HalvingDoubling.broadcast(&mut x.among(&leaders), data, from)?;
        }
        if !at_root {
            HalvingDoubling.broadcast(&mut x.among(&local), data, 0)?;
        }
        Ok(())
    }

    fn barrier(&self, x: &mut Exchanges<'_>) -> Result<(), CollectiveError> {
        // In, across, in again: nobody leaves before every host's leader heard from all hosts.
        let g = x.group().clone();
        let l = self.layout(&g);
        let local = g.subgroup(&l.local).ok_or_else(|| internal("a rank off its host"))?;
        HalvingDoubling.barrier(&mut x.among(&local))?;
        if let Some(leaders) = g.subgroup(&l.leaders) {
            HalvingDoubling.barrier(&mut x.among(&leaders))?;
        }
        HalvingDoubling.barrier(&mut x.among(&local))
    }
}
