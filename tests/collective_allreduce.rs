//! Every collective algorithm against a plain sequential sum, with ranks as threads: every
//! transport × world 2, 3, 4 × sizes including 0 and 1 element, sizes not divisible by the
//! world, and sizes bigger than a shared-memory staging area (so they go in pieces) and than a
//! TCP segment (so they are pipelined). Also: all ranks get the same bits, two runs give the
//! same bits, f64 all-reduce, broadcast from every root, barrier, and bucketed reduction
//! overlapping a fake backward.

use std::net::TcpListener;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;
use trainrun::collective::reduce::sequential_sum;
use trainrun::collective::{
    BucketReducer, Collective, CollectiveError, CollectiveTimeouts, Communicator, PackReduce, Packs, Peers,
    ShmCommunicator, ShmOptions, TcpOptions, Transport,
};

const HARD_LIMIT: Duration = Duration::from_secs(120);
const TIMEOUTS: CollectiveTimeouts =
    CollectiveTimeouts { connect: Duration::from_secs(20), op: Duration::from_secs(20) };
/// Small on purpose: 1 KiB staging (256 floats) and 1 KiB TCP segments.
const SMALL: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Shared memory through `all_reduce_sum` (copy mode).
    Shm,
    /// Shared memory through the zero-copy arena.
    ShmArena,
    Tcp,
}

/// Runs `body` on `world` ranks as threads, one communicator each; panics past HARD_LIMIT.
fn on_ranks<T: Send + 'static>(
    kind: Kind,
    world: usize,
    label: &str,
    arena_floats: usize,
    body: impl Fn(usize, &mut Collective) -> Result<T, CollectiveError> + Send + Sync + 'static,
) -> Vec<T> {
    let names: Vec<String> = (0..world).map(|r| format!("worker:{r}")).collect();
    let path = format!("/dev/shm/trainrun-test-{}-{label}", std::process::id());
    let listeners: Vec<TcpListener> = (0..world).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr().unwrap()).collect();
    let body = std::sync::Arc::new(body);
    let (tx, rx) = mpsc::channel();
    for (rank, listener) in listeners.into_iter().enumerate() {
        let (tx, body, names, path, addrs) = (tx.clone(), body.clone(), names.clone(), path.clone(), addrs.clone());
        thread::spawn(move || {
            let peers = Peers::new(rank, names).unwrap();
            let transport = match kind {
                Kind::Shm | Kind::ShmArena => Transport::SharedMemory(ShmOptions {
                    path: path.into(),
                    staging_bytes: SMALL,
                    arena_bytes: arena_floats * 4,
                    job_token: 7,
                }),
                Kind::Tcp => Transport::TcpRing(TcpOptions {
                    job_token: 7,
                    segment_bytes: SMALL,
                    ..TcpOptions::new(addrs, listener)
                }),
            };
            let out = Collective::connect(peers, transport, TIMEOUTS).and_then(|mut c| body(rank, &mut c));
            let _ = tx.send((rank, out));
        });
    }
    drop(tx);
    let mut results: Vec<Option<T>> = (0..world).map(|_| None).collect();
    for _ in 0..world {
        let (rank, out) = match rx.recv_timeout(HARD_LIMIT) {
            Ok(x) => x,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("a rank hung past the hard limit of {HARD_LIMIT:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("a rank panicked (see above)"),
        };
        results[rank] = Some(out.unwrap_or_else(|e| panic!("worker:{rank} failed: {e}")));
    }
    assert!(!std::path::Path::new(&path).exists(), "the segment file was left behind");
    results.into_iter().map(|r| r.unwrap()).collect()
}

/// Deterministic, varied floats (different magnitudes, both signs), so summation order shows.
fn input(rank: usize, len: usize, seed: u64) -> Vec<f32> {
    let mut x = seed ^ (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let m = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * 2f32.powi((x % 16) as i32 - 8)
        })
        .collect()
}

/// Asserts bit-identical vectors, naming the first difference instead of printing both.
#[track_caller]
fn same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
        let n = (0..a.len()).filter(|&i| a[i].to_bits() != b[i].to_bits()).count();
        panic!("{what}: {n} elements differ, first at {i}: {} vs {}", a[i], b[i]);
    }
}

/// All-reduces each rank's input twice (the second run must give the same bits).
fn reduce_twice(kind: Kind, c: &mut Collective, mine: &[f32]) -> Result<(Vec<f32>, Vec<f32>), CollectiveError> {
    let mut once = || -> Result<Vec<f32>, CollectiveError> {
        match (kind, &mut *c) {
            (Kind::ShmArena, Collective::SharedMemory(s)) => arena_reduce(s, mine),
            _ => {
                let mut v = mine.to_vec();
                c.all_reduce_sum(&mut v)?;
                Ok(v)
            }
        }
    };
    Ok((once()?, once()?))
}

fn arena_reduce(s: &mut ShmCommunicator, mine: &[f32]) -> Result<Vec<f32>, CollectiveError> {
    // Put the data at an odd offset to check ranges that do not start at 0.
    let at = 3;
    s.arena_mut()[at..at + mine.len()].copy_from_slice(mine);
    s.all_reduce_arena(at..at + mine.len())?;
    Ok(s.arena_mut()[at..at + mine.len()].to_vec())
}

#[test]
fn every_transport_matches_the_sequential_sum() {
    let sizes = [0usize, 1, 2, 3, 5, 17, 255, 1000, 4099, 100_003];
    for kind in [Kind::Shm, Kind::ShmArena, Kind::Tcp] {
        for world in 2..=4 {
            for (si, &len) in sizes.iter().enumerate() {
                let label = format!("table-{kind:?}-{world}-{si}");
                let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, len, 42)).collect();
                let want = sequential_sum(&inputs);
                let shared = inputs.clone();
                let got = on_ranks(kind, world, &label, len + 3, move |rank, c| reduce_twice(kind, c, &shared[rank]));
                let case = format!("{kind:?}, world {world}, {len} floats");
                for (rank, (first, second)) in got.iter().enumerate() {
                    same_bits(first, second, &format!("{case}: worker:{rank}, second run vs first"));
                    same_bits(first, &got[0].0, &format!("{case}: worker:{rank} vs worker:0"));
                }
                let exact = kind != Kind::Tcp || world == 2;
                for (i, (g, w)) in got[0].0.iter().zip(&want).enumerate() {
                    if exact {
                        assert_eq!(g.to_bits(), w.to_bits(), "{case}: element {i}: {g} != {w}");
                    } else {
                        let scale: f32 = inputs.iter().map(|x| x[i].abs()).sum();
                        assert!((g - w).abs() <= scale * 4.0 * f32::EPSILON, "{case}: element {i}: {g} vs {w}");
                    }
                }
                // A second communicator, a second run: the same bits again.
                let shared = inputs.clone();
                let again = on_ranks(kind, world, &format!("{label}-again"), len + 3, move |rank, c| {
                    reduce_twice(kind, c, &shared[rank])
                });
                same_bits(&again[0].0, &got[0].0, &format!("{case}: a fresh run"));
            }
        }
    }
}

#[test]
fn integer_valued_data_is_exact_on_every_transport() {
    // Small integers sum exactly in any order: this checks data movement bit for bit.
    for kind in [Kind::Shm, Kind::ShmArena, Kind::Tcp] {
        for world in [3, 4] {
            let len = 3001;
            let inputs: Vec<Vec<f32>> =
                (0..world).map(|r| (0..len).map(|i| ((i * 31 + r * 7) % 1000) as f32 - 500.0).collect()).collect();
            let want = sequential_sum(&inputs);
            let shared = inputs.clone();
            let got = on_ranks(kind, world, &format!("int-{kind:?}-{world}"), len + 3, move |rank, c| {
                reduce_twice(kind, c, &shared[rank])
            });
            for (first, _) in &got {
                same_bits(first, &want, &format!("{kind:?}, world {world}"));
            }
        }
    }
}

#[test]
fn f64_broadcast_and_barrier_work_on_every_transport() {
    for kind in [Kind::Shm, Kind::Tcp] {
        for world in 2..=4 {
            let label = format!("misc-{kind:?}-{world}");
            let got = on_ranks(kind, world, &label, 0, move |rank, c| {
                let mut stats = [rank as f64 + 0.5, 1e300, -(rank as f64)];
                c.all_reduce_sum_f64(&mut stats)?;
                let mut many: Vec<f64> = (0..1000).map(|i| (i * (rank + 1)) as f64).collect();
                c.all_reduce_sum_f64(&mut many)?;
                let mut roots = Vec::new();
                for root in 0..world {
                    let mut w: Vec<f32> =
                        (0..2000).map(|i| if rank == root { (i + root) as f32 } else { -1.0 }).collect();
                    c.broadcast(&mut w, root)?;
                    roots.push(w);
                }
                c.barrier()?;
                c.barrier()?;
                Ok((stats, many, roots))
            });
            let n = world as f64;
            for (rank, (stats, many, roots)) in got.iter().enumerate() {
                let case = format!("{kind:?}, world {world}, worker:{rank}");
                assert_eq!(stats[0], n * (n - 1.0) / 2.0 + 0.5 * n, "{case}");
                assert_eq!(stats[1], 1e300 * n, "{case}");
                assert_eq!(stats[2], -(n * (n - 1.0) / 2.0), "{case}");
                for (i, x) in many.iter().enumerate() {
                    assert_eq!(*x, (i as f64) * n * (n + 1.0) / 2.0, "{case}");
                }
                for (root, w) in roots.iter().enumerate() {
                    assert!(
                        w.iter().enumerate().all(|(i, x)| *x == (i + root) as f32),
                        "{case}: broadcast from {root}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_world_of_one_is_a_no_op() {
    for kind in [Kind::Shm, Kind::Tcp] {
        let got = on_ranks(kind, 1, &format!("one-{kind:?}"), 0, |_, c| {
            let mut v = vec![1.5f32, -2.0];
            c.all_reduce_sum(&mut v)?;
            c.broadcast(&mut v, 0)?;
            c.barrier()?;
            Ok(v)
        });
        assert_eq!(got[0], vec![1.5, -2.0]);
    }
}

#[test]
fn ranks_out_of_step_are_caught_before_mixing_data() {
    for (kind, want) in [
        (
            Kind::Shm,
            "worker:1 is out of step: it started an all-reduce of 11 f32 while this rank started \
             an all-reduce of 10 f32",
        ),
        (
            Kind::Tcp,
            "worker:1 is out of step: it started collective #1 (an all-reduce of 11 f32) while \
             this rank started collective #1 (an all-reduce of 10 f32)",
        ),
    ] {
        let got = on_ranks(kind, 2, &format!("step-{kind:?}"), 0, |rank, c| {
            let first = c.all_reduce_sum(&mut vec![1.0f32; 10 + rank]).err();
            let then = c.barrier().err();
            Ok((first.map(|e| e.to_string()), then.map(|e| e.to_string())))
        });
        // Whichever rank checks first names the other; that one may see it give up instead.
        let first: Vec<String> = got.iter().map(|(f, _)| f.clone().expect("must fail")).collect();
        assert!(first.iter().any(|e| e == want), "{kind:?}: {first:?}");
        for (_, then) in &got {
            let then = then.as_deref().unwrap_or_default();
            assert!(then.starts_with("the communicator is unusable after an earlier error"), "{kind:?}: {then}");
        }
    }
}

/// A fake backward over uneven layers: writes each layer's gradients (this rank's input) and
/// reports it final, front to back.
fn backward(p: &mut Packs<'_>, mine: &[f32]) {
    let len = mine.len();
    let mut at = 0;
    for layer in [1, 999, 3000, 17, 2500, len] {
        let end = (at + layer).min(len);
        let g = p.get_mut(at..end).expect("backward's own range is still writable");
        g.copy_from_slice(&mine[at..end]);
        p.ready(end);
        at = end;
        if at == len {
            break;
        }
    }
}

#[test]
fn bucketed_reduction_overlapping_backward_matches_the_sequential_sum() {
    let len = 10_007;
    for kind in [Kind::Shm, Kind::ShmArena, Kind::Tcp] {
        for world in [2, 3] {
            let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, len, 7)).collect();
            let want = sequential_sum(&inputs);
            let shared = inputs.clone();
            let got = on_ranks(kind, world, &format!("bucket-{kind:?}-{world}"), len, move |rank, c| {
                let bucket = BucketReducer::new(1000 * 4);
                let mine = &shared[rank];
                match (kind, c) {
                    (Kind::ShmArena, Collective::SharedMemory(s)) => {
                        let (reducer, arena) = s.split_arena();
                        bucket.run(reducer, &mut arena[..len], |p| backward(p, mine))?;
                        Ok(s.arena_mut()[..len].to_vec())
                    }
                    (_, c) => {
                        let mut grads = vec![f32::NAN; len];
                        bucket.run(c.as_dyn(), &mut grads, |p| backward(p, mine))?;
                        Ok(grads)
                    }
                }
            });
            let exact = kind != Kind::Tcp || world == 2;
            for (rank, g) in got.iter().enumerate() {
                same_bits(g, &got[0], &format!("{kind:?}, world {world}: worker:{rank} vs worker:0"));
            }
            if exact {
                same_bits(&got[0], &want, &format!("{kind:?}, world {world}"));
            } else {
                for (i, (g, w)) in got[0].iter().zip(&want).enumerate() {
                    let scale: f32 = inputs.iter().map(|x| x[i].abs()).sum();
                    assert!((g - w).abs() <= scale * 4.0 * f32::EPSILON, "{kind:?}: element {i}");
                }
            }
        }
    }
}

#[test]
fn the_arena_reducer_refuses_a_pack_from_elsewhere_and_stays_usable() {
    let got = on_ranks(Kind::ShmArena, 2, "foreign-pack", 64, |rank, c| {
        let Collective::SharedMemory(s) = c else { unreachable!() };
        let mut elsewhere = vec![1.0f32; 8];
        let refused = s.split_arena().0.reduce_pack(&mut elsewhere).err().map(|e| e.to_string());
        s.arena_mut()[..4].fill(rank as f32 + 1.0);
        s.all_reduce_arena(0..4)?;
        Ok((refused, s.arena_mut()[..4].to_vec()))
    });
    for (refused, sum) in got {
        assert_eq!(refused.as_deref(), Some("the pack is not part of this communicator's arena"));
        assert_eq!(sum, vec![3.0; 4]);
    }
}
