//! Every point-to-point algorithm's schedule at N = 2…64 ranks, in one process: each rank is
//! a thread, and a transport of channels checks that every exchange opens with the same
//! collective on both ends and that every segment a rank sends is exactly the segment its
//! partner expects (same length, same order). Each all-reduce must give the same bits on
//! every rank and in a second run, within N·ε·Σ|x| of the f64 sum; each broadcast the root's
//! bits; each barrier must return everywhere. The real transports are tested with real
//! processes in `tests/collective_*.rs`.

use super::*;
use crate::collective::error::ALL_REDUCE;
use crate::collective::peer::seeded;
use crate::collective::transport::{combine, internal};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

/// What travels between two threads.
enum Msg {
    /// Kind, length, aux and sequence number of the collective.
    Header([u64; 4]),
    Segment(Vec<u8>),
}

/// A transport of unbounded channels, one per ordered pair of ranks.
struct Channels {
    peers: Peers,
    outs: Vec<Sender<Msg>>,
    ins: Vec<Receiver<Msg>>,
    segment_bytes: usize,
}

impl Channels {
    fn recv(&self, from: usize) -> Result<Msg, CollectiveError> {
        self.ins[from].recv_timeout(Duration::from_secs(20)).map_err(|_| internal("no message within 20 s: a deadlock"))
    }
}

impl PointToPoint for Channels {
    fn peers(&self) -> &Peers {
        &self.peers
    }
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }
    fn segment_bytes(&self) -> usize {
        self.segment_bytes
    }
    fn exchange(&mut self, x: super::super::transport::Exchange<'_>, data: &mut [u8]) -> Result<(), CollectiveError> {
        let header = [x.desc.kind, x.desc.len, x.desc.aux, x.seq];
        if let Some(to) = x.to {
            let _ = self.outs[to].send(Msg::Header(header));
            for r in &x.schedule.sends {
                let _ = self.outs[to].send(Msg::Segment(data[r.clone()].to_vec()));
            }
        }
        if let Some(from) = x.from {
            match self.recv(from)? {
                Msg::Header(h) if h == header => {}
                Msg::Header(h) => return Err(internal(&format!("out of step: {h:?} against {header:?}"))),
                Msg::Segment(_) => return Err(internal("a segment where the header was due")),
            }
            let mut staging = Vec::<u64>::new();
            for item in &x.schedule.recvs {
                let Msg::Segment(bytes) = self.recv(from)? else {
                    return Err(internal("a header where a segment was due"));
                };
                if bytes.len() != item.range.len() {
                    return Err(internal(&format!("sent {} bytes where {:?} was expected", bytes.len(), item.range)));
                }
                staging.resize(bytes.len().div_ceil(8), 0);
                let aligned = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut staging)[..bytes.len()];
                aligned.copy_from_slice(&bytes);
                combine(&mut data[item.range.clone()], aligned, item.combine)?;
                if item.forward {
                    let to = x.to.ok_or_else(|| internal("a forward without a rank to send to"))?;
                    let _ = self.outs[to].send(Msg::Segment(data[item.range.clone()].to_vec()));
                }
            }
        }
        Ok(())
    }
    fn abandon(&mut self) {}
    fn overlaps_backward(&self) -> bool {
        false
    }
}

/// Runs `f` on every rank of `world` (on `hosts`) as a thread over channels; each rank's
/// result by rank.
fn on_threads<T: Send>(
    world: usize,
    hosts: &[usize],
    f: impl Fn(&dyn PointToPointAlgorithm, &mut Exchanges<'_>) -> Result<T, CollectiveError> + Sync,
    algorithm: Algorithm,
) -> Vec<T> {
    let mut senders: Vec<Vec<Option<Sender<Msg>>>> = (0..world).map(|_| (0..world).map(|_| None).collect()).collect();
    let mut receivers: Vec<Vec<Receiver<Msg>>> = (0..world).map(|_| Vec::new()).collect();
    for to in 0..world {
        for slot in senders.iter_mut() {
            let (tx, rx) = channel();
            slot[to] = Some(tx);
            receivers[to].push(rx);
        }
    }
    let names: Vec<String> = (0..world).map(|r| format!("worker:{r}")).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = senders
            .into_iter()
            .zip(receivers)
            .enumerate()
            .map(|(rank, (outs, ins))| {
                let (names, f) = (names.clone(), &f);
                s.spawn(move || {
                    let peers = Peers::new(rank, names)?.on_hosts(hosts.to_vec())?;
                    let steps = algorithm.point_to_point(&peers).ok_or_else(|| internal("not point to point"))?;
                    let outs = outs.into_iter().flatten().collect();
                    let mut t = Channels { peers, outs, ins, segment_bytes: 28 };
                    let group = Group::all(t.peers());
                    let desc = OpDesc { kind: ALL_REDUCE, len: 0, aux: 0 };
                    let mut x = Exchanges { transport: &mut t, group: &group, desc, seq: 1, route: steps.route() };
                    f(&*steps, &mut x)
                })
            })
            .collect();
        let results = handles.into_iter().enumerate().map(|(rank, h)| match h.join() {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => panic!("{} at {world} ranks, worker:{rank}: {e}", algorithm.name()),
            Err(_) => panic!("{} at {world} ranks, worker:{rank} panicked", algorithm.name()),
        });
        results.collect()
    })
}

const WORLDS: [usize; 20] = [2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16, 17, 24, 31, 32, 33, 48, 63, 64];

/// The layouts each algorithm runs on: one host, and for `hierarchical` blocks of 2, 3 and 8
/// ranks per host and ranks dealt round-robin over 3 hosts.
fn layouts(algorithm: Algorithm, world: usize) -> Vec<Vec<usize>> {
    let mut all = vec![vec![0; world]];
    if algorithm == Algorithm::Hierarchical {
        all.extend([2, 3, 8].map(|k| (0..world).map(|r| r / k).collect::<Vec<_>>()));
        all.push((0..world).map(|r| r % 3).collect());
    }
    all
}

fn point_to_point() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL.into_iter().filter(|a| a.point_to_point(&Peers::new(0, vec!["w".into()]).unwrap()).is_some())
}

#[test]
fn every_schedule_sums_to_the_same_bits_everywhere_within_tolerance_of_f64() {
    for algorithm in point_to_point() {
        for world in WORLDS {
            for hosts in layouts(algorithm, world) {
                let case = format!("{} at {world} ranks on hosts {hosts:?}", algorithm.name());
                for elems in [1, 5, 1000] {
                    let reduce = |a: &dyn PointToPointAlgorithm, x: &mut Exchanges<'_>| {
                        let mut data = seeded(x.group().rank(), elems);
                        a.all_reduce(x, bytemuck::cast_slice_mut(&mut data), Combine::SumF32)?;
                        Ok(data)
                    };
                    let first = on_threads(world, &hosts, reduce, algorithm);
                    let inputs: Vec<Vec<f32>> = (0..world).map(|r| seeded(r, elems)).collect();
                    for i in 0..elems {
                        let exact: f64 = inputs.iter().map(|x| f64::from(x[i])).sum();
                        let scale: f64 = inputs.iter().map(|x| f64::from(x[i].abs())).sum();
                        let got = f64::from(first[0][i]);
                        assert!((got - exact).abs() <= scale * world as f64 * f64::from(f32::EPSILON), "{case}: {i}");
                    }
                    let bits = |d: &Vec<f32>| d.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(first.iter().all(|d| bits(d) == bits(&first[0])), "{case}, {elems}: ranks disagree");
                    let again = on_threads(world, &hosts, reduce, algorithm);
                    assert_eq!(bits(&again[0]), bits(&first[0]), "{case}, {elems}: a second run differs");
                }
            }
        }
    }
}

#[test]
fn every_schedule_broadcasts_from_any_root_sums_f64_and_meets_at_barriers() {
    for algorithm in point_to_point() {
        for world in WORLDS {
            for hosts in layouts(algorithm, world) {
                let case = format!("{} at {world} ranks on hosts {hosts:?}", algorithm.name());
                for root in [0, 1, world / 2, world - 1] {
                    let run = |a: &dyn PointToPointAlgorithm, x: &mut Exchanges<'_>| {
                        let rank = x.group().rank();
                        let mut data = if rank == root { seeded(root, 100) } else { vec![f32::NAN; 100] };
                        a.broadcast(x, bytemuck::cast_slice_mut(&mut data), root)?;
                        let mut stats = [rank as f64 + 0.5, 1.0];
                        a.all_reduce(x, bytemuck::cast_slice_mut(&mut stats), Combine::SumF64)?;
                        a.barrier(x)?;
                        Ok((data, stats))
                    };
                    let want: Vec<u32> = seeded(root, 100).iter().map(|x| x.to_bits()).collect();
                    let n = world as f64;
                    for (rank, (data, stats)) in on_threads(world, &hosts, run, algorithm).into_iter().enumerate() {
                        let got: Vec<u32> = data.iter().map(|x| x.to_bits()).collect();
                        assert_eq!(got, want, "{case}: worker:{rank} did not get root {root}'s data");
                        assert_eq!(stats, [n * n / 2.0, n], "{case}: worker:{rank}'s f64 sums");
                    }
                }
            }
        }
    }
}
