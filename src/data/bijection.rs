//! A seeded bijection on `0..n`, evaluated one position at a time: the whole-set shuffle of a
//! split of token windows ([`WholeShuffle::Bijection`](super::examples::WholeShuffle)), whose
//! `n` is one window per token, so a listed permutation would cost 8 bytes per token (gigabytes
//! for a gigabyte corpus) where this costs a few words.
//!
//! A balanced Feistel network permutes the `2h`-bit numbers, `2h` the smallest even width
//! that holds `n - 1`; cycle-walking (applying it again until the value falls below `n`)
//! restricts it to `0..n`, which stays a bijection because every cycle through a value
//! below `n` comes back to it. The domain is under `4n`, so a position takes fewer than four
//! passes on average, each a few multiplies per round.

use rand_chacha::rand_core::Rng;

/// Rounds of the network: four make a pseudorandom permutation out of a pseudorandom round
/// function (Luby–Rackoff); two more leave margin for the small domains of short corpora.
const ROUNDS: usize = 6;

/// A keyed permutation of `0..n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bijection {
    n: u64,
    /// Bits in each half of the network's numbers.
    half: u32,
    keys: [u64; ROUNDS],
}

impl Bijection {
    /// The permutation of `0..n` keyed by the next draws of `rng`.
    pub(crate) fn new(n: usize, rng: &mut impl Rng) -> Self {
        let n = n as u64;
        // Bits to write `n - 1`, rounded up to an even number (none for `n` of 0 or 1).
        let bits = u64::BITS - n.saturating_sub(1).leading_zeros();
        let keys = std::array::from_fn(|_| rng.next_u64());
        Self { n, half: bits.div_ceil(2), keys }
    }

    /// The element at position `p` (below `n`).
    pub(crate) fn at(&self, p: usize) -> usize {
        debug_assert!((p as u64) < self.n, "position {p} of a permutation of {}", self.n);
        let mut x = p as u64;
        loop {
            x = self.encrypt(x);
            if x < self.n {
                return x as usize;
            }
        }
    }

    /// One pass of the Feistel network over the `2 × half`-bit numbers.
    fn encrypt(&self, x: u64) -> u64 {
        // `half` is at most 32, so neither shift overflows.
        let mask = (1u64 << self.half) - 1;
        let (mut left, mut right) = (x >> self.half, x & mask);
        for &key in &self.keys {
            (left, right) = (right, left ^ (mix(right ^ key) & mask));
        }
        (left << self.half) | right
    }
}

/// The round function: SplitMix64's finalizer, a bijective mixer of 64 bits in which every
/// input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_chacha::rand_core::SeedableRng;

    fn keyed(n: usize, seed: u64, stream: u64) -> Bijection {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Bijection::new(n, &mut rng)
    }

    fn listed(b: &Bijection, n: usize) -> Vec<usize> {
        (0..n).map(|p| b.at(p)).collect()
    }

    #[test]
    fn is_a_permutation_of_every_size() {
        let mut sizes: Vec<usize> = (1..=70).chain([1000, 1023, 4095, 4096, 4097]).collect();
        sizes.extend((7..=16).flat_map(|k| [(1 << k) - 1, 1 << k, (1 << k) + 1]));
        for n in sizes {
            for seed in 0..3 {
                let mut seen = listed(&keyed(n, seed, 0), n);
                seen.sort_unstable();
                assert!(seen.iter().copied().eq(0..n), "n = {n}, seed {seed}");
            }
        }
    }

    #[test]
    fn differs_across_keys_and_repeats_for_the_same_key() {
        let n = 1000;
        let a = listed(&keyed(n, 1, 0), n);
        assert_eq!(a, listed(&keyed(n, 1, 0), n));
        assert_ne!(a, listed(&keyed(n, 1, 1), n), "another epoch");
        assert_ne!(a, listed(&keyed(n, 2, 0), n), "another seed");
        assert_ne!(a, (0..n).collect::<Vec<_>>());
        // Neighbours are scattered: few consecutive positions hold consecutive windows.
        let adjacent = a.windows(2).filter(|w| w[0].abs_diff(w[1]) == 1).count();
        assert!(adjacent < 10, "{adjacent} adjacent pairs");
    }

    #[test]
    fn a_large_domain_needs_no_memory_and_stays_in_range() {
        // One window per token of a 100 GB corpus: nothing is listed.
        let n = 100_000_000_007;
        let b = keyed(n, 7, 3);
        assert!(std::mem::size_of_val(&b) <= 64);
        assert!((0..10_000).map(|p| b.at(p * 9_999_991)).all(|x| x < n));
    }

    #[test]
    fn positions_are_roughly_uniform() {
        // Where element 0 lands over many keys: each of 8 positions about 1/8 of the time.
        let mut counts = [0u32; 8];
        for stream in 0..8000 {
            let b = keyed(8, 3, stream);
            counts[(0..8).position(|p| b.at(p) == 0).unwrap_or(8)] += 1;
        }
        assert!(counts.iter().all(|&c| (850..1150).contains(&c)), "{counts:?}");
    }
}
