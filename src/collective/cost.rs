//! The α–β–γ cost model of the all-reduce algorithms (Hockney's, as NCCL and MPICH use it to
//! pick one): sending a message of n bytes over a link costs α + n·β, summing n bytes costs
//! n·γ. Links come in two kinds, shared memory inside a host and the network across hosts,
//! each with its own α and β. `implementation = "auto"` picks the algorithm with the lowest
//! estimate for the job's pack size; `trainrun check` prints the estimates.
//! `docs/cost-model.md` derives the formulas and compares them with measurements.

use super::{Algorithm, TransportKind};

/// One kind of link: latency per message and time per byte.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LinkCost {
    /// Seconds per message (α).
    pub alpha: f64,
    /// Seconds per byte (β).
    pub beta: f64,
}

/// The model's parameters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CostModel {
    /// Between ranks of one host, through the shared-memory segment.
    pub shared_memory: LinkCost,
    /// Between hosts (here: loopback TCP).
    pub network: LinkCost,
    /// Seconds per byte summed (γ).
    pub gamma: f64,
}

impl Default for CostModel {
    /// Fitted on the 2-core development machine (`docs/cost-model.md`): loopback TCP
    /// α = 40 µs, 2.5 GB/s; shared memory α = 5 µs, 8 GB/s; sums at 4 GB/s.
    fn default() -> CostModel {
        CostModel {
            shared_memory: LinkCost { alpha: 5e-6, beta: 1.0 / 8e9 },
            network: LinkCost { alpha: 40e-6, beta: 1.0 / 2.5e9 },
            gamma: 1.0 / 4e9,
        }
    }
}

/// Where the ranks are: how many, on how many hosts, and how many on the fullest host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub ranks: usize,
    pub hosts: usize,
    pub per_host: usize,
}

fn log2_floor(n: usize) -> f64 {
    f64::from(n.max(1).ilog2())
}

/// What an algorithm's critical path carries over one kind of link: messages (each costs α),
/// bytes sent (β each) and bytes summed (γ each). Linear in α, β and γ, so a start-up probe
/// that times one algorithm at two sizes solves for α and β ([`CostModel::fitted`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Terms {
    pub messages: f64,
    pub bytes: f64,
    pub summed: f64,
}

impl Terms {
    /// Seconds over `link`, summing at `gamma` seconds a byte.
    pub fn seconds(self, link: LinkCost, gamma: f64) -> f64 {
        self.messages * link.alpha + self.bytes * link.beta + self.summed * gamma
    }

    /// The ring over `n` ranks and `s` bytes: 2(n−1) messages of s/n, (n−1)/n·s summed.
    pub fn ring(n: usize, s: f64) -> Terms {
        if n < 2 {
            return Terms::default();
        }
        let (nf, steps) = (n as f64, 2.0 * (n as f64 - 1.0));
        Terms { messages: steps, bytes: steps / nf * s, summed: (nf - 1.0) / nf * s }
    }

    /// Halving-doubling over `n` ranks: 2·log₂p messages carrying 2(p−1)/p·s over the core
    /// of p = 2^⌊log₂n⌋ ranks, plus the fold and the return (s each) when n is not p.
    pub fn halving_doubling(n: usize, s: f64) -> Terms {
        if n < 2 {
            return Terms::default();
        }
        let p = 1usize << n.ilog2();
        let pf = p as f64;
        let core =
            Terms { messages: 2.0 * log2_floor(p), bytes: 2.0 * (pf - 1.0) / pf * s, summed: (pf - 1.0) / pf * s };
        let fold = if p == n { Terms::default() } else { Terms { messages: 2.0, bytes: 2.0 * s, summed: s } };
        core + fold
    }

    /// A binomial-tree broadcast of s bytes to `n` ranks (hierarchical's last step).
    pub fn broadcast(n: usize, s: f64) -> Terms {
        if n < 2 {
            return Terms::default();
        }
        let rounds = f64::from(n.next_power_of_two().ilog2());
        Terms { messages: rounds, bytes: rounds * s, summed: 0.0 }
    }

    /// `hierarchical`'s two parts: inside the fullest host (halving-doubling, then the
    /// leader's broadcast), and among the hosts' leaders.
    pub fn hierarchical(shape: Placement, s: f64) -> [Terms; 2] {
        let inside = Terms::halving_doubling(shape.per_host, s) + Terms::broadcast(shape.per_host, s);
        [inside, Terms::halving_doubling(shape.hosts, s)]
    }

    /// A point-to-point algorithm's terms with every step on one kind of link (`None` for
    /// `direct`, which sends no messages).
    pub fn of(algorithm: Algorithm, shape: Placement, s: f64) -> Option<Terms> {
        match algorithm {
            Algorithm::Direct => None,
            Algorithm::Ring => Some(Terms::ring(shape.ranks, s)),
            Algorithm::HalvingDoubling => Some(Terms::halving_doubling(shape.ranks, s)),
            Algorithm::Hierarchical => {
                let [inside, among] = Terms::hierarchical(shape, s);
                Some(inside + among)
            }
        }
    }
}

impl std::ops::Add for Terms {
    type Output = Terms;
    fn add(self, o: Terms) -> Terms {
        Terms { messages: self.messages + o.messages, bytes: self.bytes + o.bytes, summed: self.summed + o.summed }
    }
}

impl CostModel {
    /// The link a flat algorithm's messages take over `transport`.
    fn flat_link(&self, transport: TransportKind) -> LinkCost {
        match transport {
            TransportKind::SharedMemory => self.shared_memory,
            TransportKind::Tcp
            | TransportKind::TcpTls
            | TransportKind::SharedMemoryAndTcp
            | TransportKind::SharedMemoryAndTcpTls => self.network,
        }
    }

    /// The ring over `n` ranks and `s` bytes.
    pub fn ring(&self, link: LinkCost, n: usize, s: f64) -> f64 {
        Terms::ring(n, s).seconds(link, self.gamma)
    }

    /// Halving-doubling over `n` ranks and `s` bytes.
    pub fn halving_doubling(&self, link: LinkCost, n: usize, s: f64) -> f64 {
        Terms::halving_doubling(n, s).seconds(link, self.gamma)
    }

    /// The link that explains two timings of `algorithm` with every step on that link:
    /// `secs.0` for `sizes.0` bytes and `secs.1` for `sizes.1` among `shape`'s ranks, given
    /// this model's γ (the start-up probe's fit). `None` when the algorithm sends no messages
    /// or the sizes carry the same bytes. α and β are kept from going below zero (noise can
    /// make the large timing look cheap).
    pub fn fitted(
        &self,
        algorithm: Algorithm,
        shape: Placement,
        sizes: (usize, usize),
        secs: (f64, f64),
    ) -> Option<LinkCost> {
        let small = Terms::of(algorithm, shape, sizes.0 as f64)?;
        let large = Terms::of(algorithm, shape, sizes.1 as f64)?;
        let spread = large.bytes - small.bytes;
        if spread <= 0.0 || small.messages <= 0.0 {
            return None;
        }
        let rest = |t: Terms, secs: f64| secs - t.summed * self.gamma;
        let beta = ((rest(large, secs.1) - rest(small, secs.0)) / spread).max(1e-12);
        let alpha = ((rest(small, secs.0) - small.bytes * beta) / small.messages).max(0.0);
        Some(LinkCost { alpha, beta })
    }

    /// Shared memory's link that explains two timings of `hierarchical` among `shape`'s ranks
    /// (`secs.0` for `sizes.0` bytes, `secs.1` for `sizes.1`), given this model's network and
    /// γ for the part among the hosts' leaders (the start-up probe's fit over shared memory
    /// inside hosts and TCP across). `None` when no host has two ranks or the sizes carry the
    /// same bytes; α and β are kept from going below zero, as in [`CostModel::fitted`].
    pub fn fitted_inside(&self, shape: Placement, sizes: (usize, usize), secs: (f64, f64)) -> Option<LinkCost> {
        let [small, small_among] = Terms::hierarchical(shape, sizes.0 as f64);
        let [large, large_among] = Terms::hierarchical(shape, sizes.1 as f64);
        let spread = large.bytes - small.bytes;
        if spread <= 0.0 || small.messages <= 0.0 {
            return None;
        }
        let rest =
            |t: Terms, among: Terms, secs: f64| secs - t.summed * self.gamma - among.seconds(self.network, self.gamma);
        let (small_rest, large_rest) = (rest(small, small_among, secs.0), rest(large, large_among, secs.1));
        let beta = ((large_rest - small_rest) / spread).max(1e-12);
        let alpha = ((small_rest - small.bytes * beta) / small.messages).max(0.0);
        Some(LinkCost { alpha, beta })
    }

    /// `direct` over shared memory: two phases, each rank copying in and out and summing
    /// its share from every rank.
    pub fn direct(&self, n: usize, s: f64) -> f64 {
        if n < 2 {
            return 0.0;
        }
        let share = (n as f64 - 1.0) / n as f64 * s;
        2.0 * self.shared_memory.alpha + 2.0 * share * self.shared_memory.beta + share * self.gamma
    }

    /// The estimate for `algorithm` over `transport` among `shape`'s ranks, `bytes` each;
    /// `None` where the pair cannot run.
    pub fn estimate(
        &self,
        algorithm: Algorithm,
        transport: TransportKind,
        shape: Placement,
        bytes: usize,
    ) -> Option<f64> {
        algorithm.refuses(transport).is_none().then_some(())?;
        let (s, n) = (bytes as f64, shape.ranks);
        let link = self.flat_link(transport);
        Some(match algorithm {
            Algorithm::Direct => self.direct(n, s),
            Algorithm::Ring => self.ring(link, n, s),
            Algorithm::HalvingDoubling => self.halving_doubling(link, n, s),
            Algorithm::Hierarchical => {
                let inside = if transport.routed() { self.shared_memory } else { link };
                let across = if transport == TransportKind::SharedMemory { self.shared_memory } else { self.network };
                let [within, among] = Terms::hierarchical(shape, s);
                within.seconds(inside, self.gamma) + among.seconds(across, self.gamma)
            }
        })
    }

    /// Every algorithm that runs over `transport` with its estimate, cheapest first; ties keep
    /// [`Algorithm::ALL`]'s order, so two ranks (where ring and halving-doubling are the same
    /// exchange) keep the ring.
    pub fn ranked(&self, transport: TransportKind, shape: Placement, bytes: usize) -> Vec<(Algorithm, f64)> {
        let mut all: Vec<(Algorithm, f64)> =
            Algorithm::ALL.into_iter().filter_map(|a| Some((a, self.estimate(a, transport, shape, bytes)?))).collect();
        all.sort_by(|a, b| a.1.total_cmp(&b.1));
        all
    }

    /// The cheapest algorithm over `transport` (`implementation = "auto"`).
    pub fn cheapest(&self, transport: TransportKind, shape: Placement, bytes: usize) -> Algorithm {
        self.ranked(transport, shape, bytes).first().map_or(Algorithm::fastest_over(transport), |(a, _)| *a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(ranks: usize, hosts: usize) -> Placement {
        Placement { ranks, hosts, per_host: ranks.div_ceil(hosts) }
    }

    #[test]
    fn todays_jobs_keep_todays_choice() {
        let m = CostModel::default();
        for bytes in [1 << 10, 4 << 20, 64 << 20] {
            assert_eq!(m.cheapest(TransportKind::SharedMemory, placement(2, 1), bytes), Algorithm::Direct);
            assert_eq!(m.cheapest(TransportKind::SharedMemory, placement(4, 1), bytes), Algorithm::Direct);
            assert_eq!(m.cheapest(TransportKind::Tcp, placement(2, 2), bytes), Algorithm::Ring);
            assert_eq!(m.cheapest(TransportKind::TcpTls, placement(2, 2), bytes), Algorithm::Ring);
        }
    }

    #[test]
    fn the_fit_recovers_the_link_that_made_the_timings() {
        let truth = CostModel { network: LinkCost { alpha: 73e-6, beta: 1.0 / 1.7e9 }, ..CostModel::default() };
        for algorithm in [Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Hierarchical] {
            for shape in [placement(3, 3), placement(16, 4), placement(64, 8)] {
                let time = |bytes: usize| {
                    Terms::of(algorithm, shape, bytes as f64).map(|t| t.seconds(truth.network, truth.gamma))
                };
                let (small, large) = (time(1024).unwrap_or(0.0), time(524_288).unwrap_or(0.0));
                let fit = truth.fitted(algorithm, shape, (1024, 524_288), (small, large));
                let fit = fit.unwrap_or_else(|| panic!("{algorithm:?} {shape:?}: no fit"));
                assert!((fit.alpha / truth.network.alpha - 1.0).abs() < 1e-9, "{algorithm:?} {shape:?}: {fit:?}");
                assert!((fit.beta / truth.network.beta - 1.0).abs() < 1e-9, "{algorithm:?} {shape:?}: {fit:?}");
            }
        }
        // `direct` sends no messages: nothing to fit.
        assert_eq!(truth.fitted(Algorithm::Direct, placement(4, 1), (1024, 524_288), (1e-5, 1e-4)), None);
    }

    #[test]
    fn the_fit_inside_hosts_recovers_shared_memory_given_the_network() {
        let truth = CostModel {
            shared_memory: LinkCost { alpha: 11e-6, beta: 1.0 / 6e9 },
            network: LinkCost { alpha: 73e-6, beta: 1.0 / 1.7e9 },
            ..CostModel::default()
        };
        for shape in [placement(4, 2), placement(6, 3), placement(64, 8)] {
            let time =
                |bytes: usize| truth.estimate(Algorithm::Hierarchical, TransportKind::SharedMemoryAndTcp, shape, bytes);
            let secs = (time(1024).unwrap_or(0.0), time(524_288).unwrap_or(0.0));
            let fit = truth.fitted_inside(shape, (1024, 524_288), secs).unwrap_or_else(|| panic!("{shape:?}: no fit"));
            assert!((fit.alpha / truth.shared_memory.alpha - 1.0).abs() < 1e-6, "{shape:?}: {fit:?}");
            assert!((fit.beta / truth.shared_memory.beta - 1.0).abs() < 1e-6, "{shape:?}: {fit:?}");
        }
        // One rank a host: nothing inside to fit.
        assert_eq!(truth.fitted_inside(placement(4, 4), (1024, 524_288), (1e-4, 1e-3)), None);
    }

    #[test]
    fn many_ranks_and_small_packs_leave_the_ring() {
        let m = CostModel::default();
        assert_eq!(m.cheapest(TransportKind::Tcp, placement(64, 64), 1 << 10), Algorithm::HalvingDoubling);
        assert_eq!(m.cheapest(TransportKind::SharedMemoryAndTcp, placement(64, 8), 1 << 10), Algorithm::Hierarchical);
        // Two ranks: the same exchange either way.
        let link = m.network;
        assert_eq!(m.ring(link, 2, 1e6), m.halving_doubling(link, 2, 1e6));
    }
}
