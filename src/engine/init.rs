//! Keras's initializers, seeded per tensor so each tensor's values depend only on the run
//! seed and the tensor's name.

use super::layer::Init;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Separates per-step randomness (dropout) from the run seed's other uses: step `s` draws from
/// `derive_seed(&[seed, STEP_DOMAIN, s])` under every strategy, so a step means the same draws
/// wherever it runs.
pub const STEP_DOMAIN: u64 = 0x5354_4550; // "STEP"

/// Mixes `words` into one well-spread seed (SplitMix64 steps), to derive independent streams
/// (per tensor, per step, per layer) from the run seed without keeping any random state.
pub fn derive_seed(words: &[u64]) -> u64 {
    let mut h = 0x9E37_79B9_7F4A_7C15u64;
    for w in words {
        h ^= w.wrapping_add(0x9E37_79B9_7F4A_7C15).wrapping_add(h << 6).wrapping_add(h >> 2);
        h = splitmix(h);
    }
    h
}

fn splitmix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A stable id for a tensor name (FNV-1a), so adding a layer elsewhere does not reseed it.
pub fn tensor_id(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A generator for `words`.
pub fn rng(words: &[u64]) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(derive_seed(words))
}

/// Fills `out` as `init` prescribes.
pub fn fill(out: &mut [f32], init: Init, seed: u64, tensor: u64) {
    match init {
        Init::Zeros => out.fill(0.0),
        Init::Ones => out.fill(1.0),
        Init::GlorotUniform { fan_in, fan_out } => {
            let limit = (6.0 / (fan_in + fan_out).max(1) as f64).sqrt() as f32;
            let mut r = rng(&[seed, tensor]);
            out.iter_mut().for_each(|v| *v = r.random_range(-limit..limit));
        }
        Init::Normal { std } => {
            let mut r = rng(&[seed, tensor]);
            out.iter_mut().for_each(|v| *v = (standard_normal(&mut r) * f64::from(std)) as f32);
        }
        Init::HeNormal { fan_in } => {
            // Keras's truncated normal: redraw beyond 2 std, then correct the std the
            // truncation loses (0.8796…).
            let std = (2.0 / fan_in.max(1) as f64).sqrt() / 0.879_625_661_034_239_8;
            let mut r = rng(&[seed, tensor]);
            for v in out.iter_mut() {
                let z = loop {
                    let z = standard_normal(&mut r);
                    if z.abs() <= 2.0 {
                        break z;
                    }
                };
                *v = (z * std) as f32;
            }
        }
    }
}

/// One standard normal draw (Box–Muller, cosine branch).
fn standard_normal(r: &mut ChaCha8Rng) -> f64 {
    let (u1, u2): (f64, f64) = (r.random_range(f64::EPSILON..1.0), r.random());
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}
