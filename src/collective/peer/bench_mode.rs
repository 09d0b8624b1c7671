//! A peer's bench mode ([`super::PeerMode::Bench`]): timed all-reduces of each size, the slowest
//! rank's time a round, and under `auto` every candidate algorithm timed beside it in the same
//! processes, the turns taking blocks of calls in a rotating order.

use super::{AutoRun, PeerEnv, PeerFailure, Wire, collective, say};
use crate::collective::{Algorithm, Collective, Communicator};
use std::time::Instant;

/// What one timed all-reduce runs: as connected (or as `auto` chose), or one candidate alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchTurn {
    AsConnected,
    Alone(Algorithm),
}

/// Untimed all-reduces of each turn first.
const WARM_UP: usize = 3;

/// Timings a turn takes in a row before the next turn's: alternating at every call, a turn's
/// links sat idle while the others ran, and `hierarchical` beside `auto` ran 1.2–1.3× its own
/// group's time at 4 ranks (1 and 16 MB).
const BLOCK: usize = 5;

/// The order of one size's all-reduces among `turns` turns that each take `iters` timings:
/// [`WARM_UP`] untimed calls of each, then blocks of [`BLOCK`] timed ones (`Some(i)`: the turn's
/// i-th timing), each after one untimed call, the first turn of each round of blocks moving on
/// by one so that no turn always follows the same one. A single turn times all its calls in a
/// row.
fn schedule(turns: usize, iters: usize) -> Vec<(usize, Option<usize>)> {
    let mut steps: Vec<(usize, Option<usize>)> = (0..turns).flat_map(|k| [(k, None); WARM_UP]).collect();
    let block = if turns > 1 { BLOCK } else { iters.max(1) };
    let mut taken = vec![0usize; turns];
    for round in 0.. {
        if taken.iter().all(|&n| n >= iters) {
            break;
        }
        for k in (0..turns).map(|j| (round + j) % turns) {
            let n = block.min(iters - taken[k]);
            if turns > 1 && n > 0 {
                steps.push((k, None));
            }
            steps.extend((taken[k]..taken[k] + n).map(|i| (k, Some(i))));
            taken[k] += n;
        }
    }
    steps
}

pub(super) fn bench(env: &PeerEnv, c: &mut Collective, auto: Option<&AutoRun>) -> Result<(), PeerFailure> {
    let world = env.world;
    // Under `auto`, every candidate in turn with it (`PeerMode::Bench`): one group of processes
    // started afresh moves by more than the 10 % `auto` is judged by (`docs/cost-model.md`), so
    // only rows timed beside it compare its choice.
    let turns: Vec<BenchTurn> = std::iter::once(BenchTurn::AsConnected)
        .chain(auto.iter().flat_map(|a| a.beside.iter().map(|&x| BenchTurn::Alone(x))))
        .collect();
    for &len in &env.sizes {
        let mut data = vec![1.0f32; len];
        if let Collective::SharedMemory(s) = &mut *c {
            s.arena_mut().fill(1.0);
        }
        // Slot (turn, iteration, rank).
        let mut mine = vec![0.0f64; turns.len() * env.iters * world];
        let mut current = None;
        for (turn, slot) in schedule(turns.len(), env.iters) {
            if let (Some(auto), true) = (auto, current != Some(turn)) {
                // One candidate alone, or as `auto` runs.
                let choice = match turns[turn] {
                    BenchTurn::Alone(a) => auto.runs.only(a),
                    BenchTurn::AsConnected => auto.runs.clone(),
                };
                c.choose_by_size(choice).map_err(collective)?;
            }
            current = Some(turn);
            c.barrier().map_err(collective)?;
            let t = Instant::now();
            match (env.wire, &mut *c) {
                // Zero-copy: the trainer writes gradients into the arena; only the reduction counts.
                (Wire::ShmArena, Collective::SharedMemory(s)) => s.all_reduce_arena(0..len).map_err(collective)?,
                _ => c.all_reduce_sum(&mut data).map_err(collective)?,
            }
            let dt = t.elapsed().as_secs_f64();
            if let Some(i) = slot {
                mine[(turn * env.iters + i) * world + env.rank] = dt;
            }
            // Keep values finite and normal however many rounds run.
            if data.first().is_some_and(|x| *x > 1e20) {
                data.fill(1.0);
            }
            if let Collective::SharedMemory(s) = &mut *c
                && s.arena_mut().first().is_some_and(|x| *x > 1e20)
            {
                s.arena_mut().fill(1.0);
            }
        }
        if let Some(auto) = auto {
            // The gathering below runs as `auto` would.
            c.choose_by_size(auto.runs.clone()).map_err(collective)?;
        }
        // Each slot is written by one rank, so the sum gathers everyone's times.
        c.all_reduce_sum_f64(&mut mine).map_err(collective)?;
        for (turn, times) in turns.iter().zip(mine.chunks(env.iters * world)) {
            let mut per_iter: Vec<f64> = times.chunks(world).map(|t| t.iter().copied().fold(0.0, f64::max)).collect();
            per_iter.sort_by(f64::total_cmp);
            if env.rank != 0 || per_iter.is_empty() {
                continue;
            }
            let (median, min) = (per_iter[per_iter.len() / 2], per_iter[0]);
            match turn {
                BenchTurn::AsConnected => say(&format!("TRAINRUN-RESULT {} {median:e} {min:e}", len * 4)),
                BenchTurn::Alone(a) => say(&format!("TRAINRUN-BESIDE {} {} {median:e} {min:e}", a.name(), len * 4)),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_turn_takes_its_timings_in_blocks_after_a_warm_up() {
        // One turn: the warm-up, then every timing in a row, as before there were turns.
        let one = schedule(1, 4);
        assert_eq!(one, [(0, None), (0, None), (0, None), (0, Some(0)), (0, Some(1)), (0, Some(2)), (0, Some(3))]);
        let steps = schedule(3, 7);
        for k in 0..3 {
            let timed: Vec<usize> = steps.iter().filter(|s| s.0 == k).filter_map(|s| s.1).collect();
            assert_eq!(timed, (0..7).collect::<Vec<_>>(), "turn {k}");
        }
        // Blocks of five after an untimed call; the second round starts at the second turn.
        let heads: Vec<usize> = steps[9..].iter().filter(|s| s.1 == Some(0) || s.1 == Some(5)).map(|s| s.0).collect();
        assert_eq!(heads, [0, 1, 2, 1, 2, 0]);
        assert_eq!(
            steps[9..16],
            [(0, None), (0, Some(0)), (0, Some(1)), (0, Some(2)), (0, Some(3)), (0, Some(4)), (1, None)]
        );
    }
}
