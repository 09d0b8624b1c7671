//! `implementation = "auto"` per pack size: among the algorithms that run over the job's
//! transport, each all-reduce takes the one the cost model finds cheapest for its size. The
//! model is the same on every rank (the chief's, broadcast at start-up: `probe.rs`) and fixed
//! for the run, so every rank picks the same algorithm for the same pack and the summation
//! order, hence the bits, is fixed too.

use super::cost::{CostModel, Placement};
use super::{Algorithm, TransportKind};

/// Which algorithm each all-reduce size takes.
#[derive(Debug, Clone, PartialEq)]
pub struct SizeChoice {
    pub model: CostModel,
    pub transport: TransportKind,
    pub placement: Placement,
    /// The algorithms to choose among, in [`Algorithm::ALL`]'s order (ties go to the first).
    pub candidates: Vec<Algorithm>,
}

impl SizeChoice {
    /// Every point-to-point algorithm that runs over `transport`.
    pub fn over(model: CostModel, transport: TransportKind, placement: Placement) -> SizeChoice {
        let candidates =
            Algorithm::ALL.into_iter().filter(|a| a.refuses(transport).is_none() && *a != Algorithm::Direct).collect();
        SizeChoice { model, transport, placement, candidates }
    }

    /// Whether there is anything to choose: over TCP, or shared memory inside hosts and TCP
    /// across, more than one candidate among more than two ranks (at two, every algorithm is
    /// the same single exchange and today's ring stays). On one host `direct` runs, its own
    /// communicator and the cheapest at every size.
    pub fn chooses(&self) -> bool {
        match self.transport {
            TransportKind::Tcp
            | TransportKind::TcpTls
            | TransportKind::SharedMemoryAndTcp
            | TransportKind::SharedMemoryAndTcpTls => self.candidates.len() > 1 && self.placement.ranks > 2,
            TransportKind::SharedMemory => false,
        }
    }

    /// The same choice with `algorithm` its one candidate: it picks that at every size (how the
    /// start-up probe and the bench time one algorithm alone).
    pub fn only(&self, algorithm: Algorithm) -> SizeChoice {
        SizeChoice { candidates: vec![algorithm], ..self.clone() }
    }

    /// The algorithm for an all-reduce of `bytes`: the cheapest by the model, the first
    /// candidate on a tie.
    pub fn pick(&self, bytes: usize) -> Algorithm {
        let cost =
            |a: Algorithm| self.model.estimate(a, self.transport, self.placement, bytes).unwrap_or(f64::INFINITY);
        let mut best = self.candidates.first().copied().unwrap_or(Algorithm::Ring);
        for &a in &self.candidates {
            if cost(a) < cost(best) {
                best = a;
            }
        }
        best
    }

    /// The packs a gradient of `floats` values travels in at `bytes_per_pack`: the full
    /// pack's size and count, then the last (shorter) pack's size if there is one.
    pub fn packs(floats: u64, bytes_per_pack: usize) -> Vec<(usize, u64)> {
        let per = (bytes_per_pack / 4).max(1) as u64;
        let (full, rest) = (floats / per, floats % per);
        let mut out = Vec::new();
        if full > 0 {
            out.push((per as usize * 4, full));
        }
        if rest > 0 {
            out.push((rest as usize * 4, 1));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::cost::LinkCost;

    #[test]
    fn small_packs_leave_the_ring_and_large_ones_keep_what_moves_fewest_bytes() {
        let model = CostModel::default();
        let c = SizeChoice::over(model, TransportKind::Tcp, Placement { ranks: 16, hosts: 16, per_host: 1 });
        assert_eq!(c.candidates, [Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Hierarchical]);
        assert!(c.chooses());
        assert_eq!(c.pick(1 << 10), Algorithm::HalvingDoubling);
        // A slow network with no latency: the ring's 2(N−1)/N·S is the least any moves.
        let bandwidth_only = CostModel { network: LinkCost { alpha: 0.0, beta: 1e-9 }, ..model };
        let c = SizeChoice { model: bandwidth_only, ..c };
        assert_eq!(c.pick(64 << 20), Algorithm::Ring);
    }

    #[test]
    fn across_transports_small_packs_take_hierarchical_and_large_ones_what_moves_fewest_bytes() {
        let model = CostModel::default();
        let two_by_two = Placement { ranks: 4, hosts: 2, per_host: 2 };
        let routed = SizeChoice::over(model, TransportKind::SharedMemoryAndTcp, two_by_two);
        assert_eq!(routed.candidates, [Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Hierarchical]);
        assert!(routed.chooses());
        // Two messages over the network instead of four or six, the rest over shared memory.
        assert_eq!(routed.pick(1 << 10), Algorithm::Hierarchical);
        // A fast network with a slow host inside: the ring's bytes are fewest.
        let slow_inside = CostModel {
            network: LinkCost { alpha: 0.0, beta: 1e-10 },
            shared_memory: LinkCost { alpha: 1e-3, beta: 1e-8 },
            ..model
        };
        let eight_by_eight = Placement { ranks: 64, hosts: 8, per_host: 8 };
        let routed = SizeChoice::over(slow_inside, TransportKind::SharedMemoryAndTcp, eight_by_eight);
        assert_eq!(routed.pick(64 << 20), Algorithm::Ring);
    }

    #[test]
    fn two_ranks_and_one_host_have_nothing_to_choose() {
        let model = CostModel::default();
        assert!(!SizeChoice::over(model, TransportKind::Tcp, Placement { ranks: 2, hosts: 2, per_host: 1 }).chooses());
        let one_host =
            SizeChoice::over(model, TransportKind::SharedMemory, Placement { ranks: 4, hosts: 1, per_host: 4 });
        assert!(!one_host.chooses(), "direct runs on one host");
    }

    #[test]
    fn packs_are_the_full_ones_and_the_rest() {
        assert_eq!(SizeChoice::packs(2_500_000, 4 << 20), [(4 << 20, 2), (2_500_000 * 4 - (8 << 20), 1)]);
        assert_eq!(SizeChoice::packs(1 << 20, 4 << 20), [(4 << 20, 1)]);
        assert_eq!(SizeChoice::packs(10, 4 << 20), [(40, 1)]);
    }
}
