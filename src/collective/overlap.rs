//! Does overlapping gradient reduction with backward pay? A synthetic backward (12 layers,
//! each a few memory-heavy passes over its gradients, reported with `ready` as it finishes)
//! is timed alone, followed by a plain all-reduce, and overlapped through
//! [`BucketReducer`] with several pack sizes, on whichever transport the peer runs.

use super::bench::Wire;
use super::{BucketReducer, Collective, CollectiveError, Communicator, Packs};
use std::time::Instant;

const LAYERS: usize = 12;
/// Passes per layer: about 17 ms of backward for 11 MB on one core here, the order of a
/// reference-model step.
const PASSES: usize = 72;

/// One layer's worth of fake gradient math on `g`.
fn layer_math(g: &mut [f32], step: usize) {
    let a = 0.999 + step as f32 * 1e-6;
    for _ in 0..PASSES {
        for x in g.iter_mut() {
            *x = *x * a + 1e-3;
        }
    }
}

fn layer_bounds(len: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    (0..LAYERS).map(move |l| len * l / LAYERS..len * (l + 1) / LAYERS)
}

fn backward_plain(g: &mut [f32], step: usize) {
    let len = g.len();
    for r in layer_bounds(len) {
        layer_math(&mut g[r], step);
    }
}

fn backward_packs(p: &mut Packs<'_>, len: usize, step: usize) {
    for r in layer_bounds(len) {
        let end = r.end;
        if let Some(g) = p.get_mut(r) {
            layer_math(g, step);
        }
        p.ready(end);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rows of (label, median seconds per step) for rank 0 to print: `backward-alone`,
/// `then-all-reduce`, and `overlap-<pack bytes>` per pack size in `sizes[1..]`.
pub(crate) fn measure(
    rank: usize,
    world: usize,
    wire: Wire,
    sizes: &[usize],
    iters: usize,
    c: &mut Collective,
) -> Result<Vec<(String, f64)>, CollectiveError> {
    let len = sizes.first().copied().unwrap_or(0);
    let mut own = vec![0.5f32; len];
    let mut rows = Vec::new();
    let warmup = 2;
    // The slowest rank's time per step, gathered by summing one-hot vectors.
    let timed = |c: &mut Collective, f: &mut dyn FnMut(&mut Collective, usize) -> Result<(), CollectiveError>| {
        let mut all = vec![0.0f64; iters * world];
        for i in 0..warmup + iters {
            c.barrier()?;
            let t = Instant::now();
            f(c, i)?;
            if i >= warmup {
                all[(i - warmup) * world + rank] = t.elapsed().as_secs_f64();
            }
        }
        c.all_reduce_sum_f64(&mut all)?;
        Ok::<f64, CollectiveError>(median(all.chunks(world).map(|t| t.iter().copied().fold(0.0, f64::max)).collect()))
    };
    let arena = wire == Wire::ShmArena;
    let alone = timed(c, &mut |_, i| {
        backward_plain(&mut own, i);
        Ok(())
    })?;
    rows.push(("backward-alone".to_string(), alone));
    let then = timed(c, &mut |c, i| match c {
        Collective::SharedMemory(s) if arena => {
            backward_plain(&mut s.arena_mut()[..len], i);
            s.all_reduce_arena(0..len)
        }
        c => {
            backward_plain(&mut own, i);
            c.all_reduce_sum(&mut own)
        }
    })?;
    rows.push(("then-all-reduce".to_string(), then));
    for &pack in sizes.iter().skip(1) {
        let bucket = BucketReducer::new(pack * 4);
        let t = timed(c, &mut |c, i| match c {
            Collective::SharedMemory(s) if arena => {
                let (reducer, grads) = s.split_arena();
                bucket.run(reducer, &mut grads[..len], |p| backward_packs(p, len, i))
            }
            c => bucket.run(c.as_dyn(), &mut own, |p| backward_packs(p, len, i)),
        })?;
        rows.push((format!("overlap-{}", pack * 4), t));
    }
    // Keep the values bounded across steps.
    own.fill(0.5);
    Ok(rows)
}
