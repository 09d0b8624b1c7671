//! The α–β–γ cost model of the all-reduce algorithms (Hockney's, as NCCL and MPICH use it to
//! pick one): sending a message of n bytes over a link costs α + n·β, summing n bytes costs
//! n·γ. Links come in two kinds, shared memory inside a host and the network across hosts,
//! each with its own α and β. `implementation = "auto"` picks the algorithm with the lowest
//! estimate for the job's pack size; `trainrun check` prints the estimates. Measured at
//! start-up, the network is priced per algorithm ([`AlgorithmLinks`]): the same wire costs a
//! halving-doubling step, where every rank sends at once, more than a ring step, whose
//! neighbours take turns, wherever ranks share cores or links.
//! `docs/cost-model.md` derives the formulas and compares them with measurements.

use super::{Algorithm, HierarchicalPart, TransportKind};

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
    /// The links as each algorithm's own steps met them, where the start-up probe timed each
    /// (`None`: the spec's or the default figures, one network for every algorithm).
    pub measured: Option<AlgorithmLinks>,
}

/// The links each algorithm's steps were measured at, at the job's own ranks, hosts and cores.
/// One network figure cannot price them all: halving-doubling's steps, where every rank sends
/// at once, queue for the cores (and a shared link) that a ring's steps, where neighbours take
/// turns and only the ranks at a host boundary cross the network, share out; on 64 ranks and 2
/// cores a halving-doubling message measured 4× a ring message. Fitted per algorithm, that
/// contention (the "cores per rank" term the fixed figures lack) is in each algorithm's α and β.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct AlgorithmLinks {
    /// The ring over the network (every exchange over TCP where the transport routes by host).
    pub ring: LinkCost,
    /// Halving-doubling over the network.
    pub halving_doubling: LinkCost,
    /// `hierarchical`'s steps inside each host, timed alone: halving-doubling among one host's
    /// ranks, every host at once (over shared memory where the transport routes by host).
    pub inside_hosts: LinkCost,
    /// `hierarchical`'s step among the hosts' leaders, timed alone.
    pub among_leaders: LinkCost,
}

impl Default for CostModel {
    /// Fitted on the 2-core development machine (`docs/cost-model.md`): loopback TCP
    /// α = 40 µs, 2.5 GB/s; shared memory α = 5 µs, 8 GB/s; sums at 4 GB/s.
    fn default() -> CostModel {
        CostModel {
            shared_memory: LinkCost { alpha: 5e-6, beta: 1.0 / 8e9 },
            network: LinkCost { alpha: 40e-6, beta: 1.0 / 2.5e9 },
            gamma: 1.0 / 4e9,
            measured: None,
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

    /// One part of `hierarchical` as the start-up probe times it alone: halving-doubling among
    /// the fullest host's ranks, or among the hosts' leaders.
    pub fn part(part: HierarchicalPart, shape: Placement, s: f64) -> Terms {
        match part {
            HierarchicalPart::InsideHosts => Terms::halving_doubling(shape.per_host, s),
            HierarchicalPart::AmongLeaders => Terms::halving_doubling(shape.hosts, s),
        }
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
    /// or the sizes carry the same bytes.
    pub fn fitted(
        &self,
        algorithm: Algorithm,
        shape: Placement,
        sizes: (usize, usize),
        secs: (f64, f64),
    ) -> Option<LinkCost> {
        let small = Terms::of(algorithm, shape, sizes.0 as f64)?;
        let large = Terms::of(algorithm, shape, sizes.1 as f64)?;
        self.fitted_terms((small, large), secs)
    }

    /// The link that explains two timings of one part of `hierarchical` timed alone
    /// ([`Terms::part`]), as [`CostModel::fitted`] does for a whole algorithm. `None` when the
    /// part has one rank (one task a host, or one host): it sends nothing.
    pub fn fitted_part(
        &self,
        part: HierarchicalPart,
        shape: Placement,
        sizes: (usize, usize),
        secs: (f64, f64),
    ) -> Option<LinkCost> {
        let terms = |bytes: usize| Terms::part(part, shape, bytes as f64);
        self.fitted_terms((terms(sizes.0), terms(sizes.1)), secs)
    }

    /// The link among the hosts' leaders that explains two timings of the whole `hierarchical`
    /// (`secs.0` for `sizes.0` bytes, `secs.1` for `sizes.1`) once its steps inside the hosts
    /// are priced at `inside`, the link they were timed at alone ([`CostModel::fitted_part`]).
    /// What is subtracted is the small, separately measured part, so the leaders' figure carries
    /// what the whole measured, and the model reproduces the whole at the probe's sizes. `None`
    /// when there is one host (no leaders' step).
    pub fn fitted_among_leaders(
        &self,
        shape: Placement,
        sizes: (usize, usize),
        secs: (f64, f64),
        inside: LinkCost,
    ) -> Option<LinkCost> {
        let parts = |bytes: usize| Terms::hierarchical(shape, bytes as f64);
        let ([in_small, small], [in_large, large]) = (parts(sizes.0), parts(sizes.1));
        let less = (secs.0 - in_small.seconds(inside, self.gamma), secs.1 - in_large.seconds(inside, self.gamma));
        self.fitted_terms((small, large), less)
    }

    /// α and β from the terms of two sizes and their timings, given γ. They are kept from
    /// going below zero (noise can make the large timing look cheap).
    fn fitted_terms(&self, (small, large): (Terms, Terms), secs: (f64, f64)) -> Option<LinkCost> {
        let spread = large.bytes - small.bytes;
        if spread <= 0.0 || small.messages <= 0.0 {
            return None;
        }
        let rest = |t: Terms, secs: f64| secs - t.summed * self.gamma;
        let beta = ((rest(large, secs.1) - rest(small, secs.0)) / spread).max(1e-12);
        let alpha = ((rest(small, secs.0) - small.bytes * beta) / small.messages).max(0.0);
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
        let measured =
            |pick: fn(&AlgorithmLinks) -> LinkCost, otherwise: LinkCost| self.measured.as_ref().map_or(otherwise, pick);
        Some(match algorithm {
            Algorithm::Direct => self.direct(n, s),
            Algorithm::Ring => self.ring(measured(|m| m.ring, link), n, s),
            Algorithm::HalvingDoubling => self.halving_doubling(measured(|m| m.halving_doubling, link), n, s),
            Algorithm::Hierarchical => {
                let inside = if transport.routed() { self.shared_memory } else { link };
                let across = if transport == TransportKind::SharedMemory { self.shared_memory } else { self.network };
                let (inside, across) = (measured(|m| m.inside_hosts, inside), measured(|m| m.among_leaders, across));
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
    fn each_part_of_hierarchical_fits_its_own_link_and_prices_the_whole() {
        let truth = AlgorithmLinks {
            ring: LinkCost { alpha: 90e-6, beta: 1.0 / 1.1e9 },
            halving_doubling: LinkCost { alpha: 300e-6, beta: 1.0 / 0.2e9 },
            inside_hosts: LinkCost { alpha: 11e-6, beta: 1.0 / 6e9 },
            among_leaders: LinkCost { alpha: 120e-6, beta: 1.0 / 0.8e9 },
        };
        let base = CostModel::default();
        for shape in [placement(4, 2), placement(6, 3), placement(64, 8)] {
            let fit = |part: HierarchicalPart, link: LinkCost| {
                let time = |bytes: usize| Terms::part(part, shape, bytes as f64).seconds(link, base.gamma);
                let got = base.fitted_part(part, shape, (1024, 524_288), (time(1024), time(524_288)));
                let got = got.unwrap_or_else(|| panic!("{part:?} {shape:?}: no fit"));
                assert!((got.alpha / link.alpha - 1.0).abs() < 1e-6, "{part:?} {shape:?}: {got:?}");
                assert!((got.beta / link.beta - 1.0).abs() < 1e-6, "{part:?} {shape:?}: {got:?}");
                got
            };
            let inside_hosts = fit(HierarchicalPart::InsideHosts, truth.inside_hosts);
            let among_leaders = fit(HierarchicalPart::AmongLeaders, truth.among_leaders);
            // The leaders' link from the whole's timings, less the inside part at its own link.
            let whole = |bytes: usize| {
                let [within, among] = Terms::hierarchical(shape, bytes as f64);
                within.seconds(truth.inside_hosts, base.gamma) + among.seconds(truth.among_leaders, base.gamma)
            };
            let secs = (whole(1024), whole(524_288));
            let from_whole = base.fitted_among_leaders(shape, (1024, 524_288), secs, inside_hosts);
            let from_whole = from_whole.unwrap_or_else(|| panic!("{shape:?}: no fit"));
            assert!((from_whole.alpha / truth.among_leaders.alpha - 1.0).abs() < 1e-6, "{shape:?}: {from_whole:?}");
            assert!((from_whole.beta / truth.among_leaders.beta - 1.0).abs() < 1e-6, "{shape:?}: {from_whole:?}");
            let fitted = CostModel { measured: Some(AlgorithmLinks { inside_hosts, among_leaders, ..truth }), ..base };
            // The whole: both parts at their own links, plus the broadcast inside the host.
            let [within, among] = Terms::hierarchical(shape, 4e6);
            let whole = within.seconds(truth.inside_hosts, base.gamma) + among.seconds(truth.among_leaders, base.gamma);
            let estimate =
                fitted.estimate(Algorithm::Hierarchical, TransportKind::SharedMemoryAndTcp, shape, 4_000_000);
            assert!(
                estimate.is_some_and(|e| (e / whole - 1.0).abs() < 1e-6),
                "{shape:?}: {estimate:?} against {whole}"
            );
        }
        // One task a host: nothing inside to fit; one host: no leaders to fit.
        assert_eq!(
            base.fitted_part(HierarchicalPart::InsideHosts, placement(4, 4), (1024, 524_288), (1e-4, 1e-3)),
            None
        );
        assert_eq!(
            base.fitted_part(HierarchicalPart::AmongLeaders, placement(4, 1), (1024, 524_288), (1e-4, 1e-3)),
            None
        );
    }

    #[test]
    fn measured_links_price_each_algorithm_apart() {
        // The 16-rank, 16 MB cell of the scale bench: halving-doubling's all-at-once steps
        // measured far dearer per message and byte than the ring's, so the ring wins at 16 MB
        // although one network figure (halving-doubling's) would price its bytes out.
        let hd = LinkCost { alpha: 200e-6, beta: 1.0 / 0.07e9 };
        let measured = AlgorithmLinks {
            ring: LinkCost { alpha: 100e-6, beta: 1.0 / 0.6e9 },
            halving_doubling: hd,
            inside_hosts: LinkCost { alpha: 30e-6, beta: 1.0 / 1.0e9 },
            among_leaders: LinkCost { alpha: 150e-6, beta: 1.0 / 0.15e9 },
        };
        let shape = Placement { ranks: 16, hosts: 8, per_host: 2 };
        let one_network = CostModel { network: hd, ..CostModel::default() };
        let per_algorithm = CostModel { measured: Some(measured), ..one_network };
        let routed = TransportKind::SharedMemoryAndTcp;
        assert_ne!(one_network.cheapest(routed, shape, 16 << 20), Algorithm::Ring);
        assert_eq!(per_algorithm.cheapest(routed, shape, 16 << 20), Algorithm::Ring);
        let ring = per_algorithm.estimate(Algorithm::Ring, routed, shape, 1 << 20);
        assert_eq!(ring, Some(Terms::ring(16, f64::from(1 << 20)).seconds(measured.ring, per_algorithm.gamma)));
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
