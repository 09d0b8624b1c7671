//! The AMX product: `tdpbf16ps` multiplies a 16 × 32 tile of bf16 by a 32 × 16 one into a
//! 16 × 16 tile of fp32 sums, 16,384 FLOP an instruction (AMX's peak is 1,024 bf16 FLOP a
//! cycle a core, against 64 for fp32 AVX-512 FMA). The micro-kernel keeps a 32 × 32 block of
//! the output in four tiles (`tmm0`–`tmm3`) over the whole summed axis, loading two tiles of
//! the left operand (`tmm4`, `tmm5`) and two of the right (`tmm6`, `tmm7`) for every 32
//! values of `k`. Each output value is one tile's sum over all of `k`, in `k`'s order, so the
//! bits do not depend on how rows are split across threads.
//!
//! Hand-written in stable `asm!` because no crate offers AMX products for training: the AMX
//! intrinsics and `amx-*` target features are unstable in Rust (tracking issue 126622),
//! `gemm` has no bf16 type, and tract-linalg's AMX kernels serve its own inference formats.
//! Linux hands a process the tile state only when asked (`arch_prctl`), done once, in
//! [`available`].

use super::pack::{self, NR, pairs};
use super::{ProductPath, scratch};
use crate::engine::strided::{MatMut, MatRef};
use rayon::prelude::*;
use std::sync::OnceLock;

/// The smallest model dimension (inputs and units of a layer) at which this kernel beat
/// `gemm`'s fp32 kernel on the CPU it was measured on ([`super::Bf16Support::mixed_path`]).
pub const PAYS_FROM: usize = 64;

/// Pairs of `k` one tile row holds (64 bytes), and rows of a tile.
pub const TILE: usize = 16;
/// Rows of the left operand one task packs and multiplies (its tiles stay in L2), where the
/// product has rows enough for [`TASKS_PER_THREAD`] tasks a thread; else half of it.
const MC: usize = 128;
/// Tasks a thread should get before a task grows to [`MC`] rows (for the balance).
const TASKS_PER_THREAD: usize = 4;
/// Output rows and columns of one micro-kernel call (two tiles each way).
const BLOCK: usize = 2 * TILE;
/// Tiles of `k` one micro-kernel call sums at most: the left and right operands' 8 tiles
/// (16 KB each) stay in L1 while the call runs, and the right one while the task's row pairs
/// take turns over it. Between calls the sums wait in a buffer, exactly (fp32 stored and
/// loaded), so the bits do not depend on this.
const KC: usize = 8;
/// Tiles of `k` up to which [`TileOrder::RowPairs`] holds a row pair's left operand (two groups
/// of this many 1 KB tiles: 24 KB, half of L1) over all of `k`: `k` ≤ 384.
const ROW_PAIR_BLOCKS: usize = 12;
/// Bytes of packed right operand up to which [`TileOrder::RowPairs`] streams it from L2 (2 MB a
/// core on the Xeons with AMX).
const ROW_PAIR_RIGHT_BYTES: usize = 3 << 19;
const _: () = assert!(NR == BLOCK && MC.is_multiple_of(2 * BLOCK));

/// Whether this process can run AMX's bf16 products: the CPU has AMX-BF16 and AMX-TILE, the
/// kernel enables their state (XCR0), and Linux granted this process the tile data. Asked
/// once; every thread of the process may use the tiles after.
pub fn available() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    // AVX-512F writes the sums out; every CPU with AMX has it.
    *READY.get_or_init(|| cpu_has_amx() && avx512f() && os::request_tile_data())
}

fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// CPUID leaf 7 EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), and XCR0 bits 17–18 (the tile
/// configuration and data state the kernel saves).
fn cpu_has_amx() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
        // CPUID exists on every x86-64 CPU; leaf 7 reads as zeros where absent.
        let (leaf1, leaf7) = (__cpuid(1), __cpuid_count(7, 0));
        let amx = leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0;
        let osxsave = leaf1.ecx & (1 << 27) != 0;
        // SAFETY: XGETBV is enabled exactly when OSXSAVE is set (checked first).
        amx && osxsave && unsafe { _xgetbv(0) } & (0b11 << 17) == 0b11 << 17
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_os = "linux")]
mod os {
    /// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile
    /// instruction raises SIGILL.
    pub fn request_tile_data() -> bool {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: a plain system call with integer arguments.
        unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
    }
}

#[cfg(not(target_os = "linux"))]
mod os {
    /// Other kernels: not wired up, so AMX is not used.
    pub fn request_tile_data() -> bool {
        false
    }
}

/// `c = keep·c + scale · a · b` (`c` overwritten when `keep` is `None`) with bf16 inputs and
/// fp32 sums. Panics where [`available`] is false: the plan picks this path only where it is.
pub fn product(c: MatMut<'_>, a: MatRef<'_>, b: MatRef<'_>, keep: Option<f32>, scale: f32, threads: usize) {
    product_in(None, c, a, b, keep, scale, threads);
}

/// [`product`] with the tasks' loops in `order`, or as [`TileOrder::for_operands`] picks.
fn product_in(
    order: Option<TileOrder>,
    c: MatMut<'_>,
    a: MatRef<'_>,
    b: MatRef<'_>,
    keep: Option<f32>,
    scale: f32,
    threads: usize,
) {
    assert!(available(), "the AMX product was planned where this process cannot use AMX");
    let Some((m, k, n)) = super::product_shape(ProductPath::Amx, &c, &a, &b) else { return };
    // `k` padded with zero pairs to whole tiles: zeros add nothing to any sum.
    let blocks = pairs(k).div_ceil(TILE).max(1);
    scratch::with_words(1, |packed_b| {
        pack::pack_b(b, blocks * TILE, threads, packed_b);
        let order = order.unwrap_or_else(|| TileOrder::for_operands(blocks, packed_b.len()));
        let job = TileJob { a, packed_b, m, n, blocks, threads, order };
        super::into_rows(c, keep, scale, |data, rs, keep, scale| job.run(data, rs, keep, scale));
    });
}

/// One product's operands, packed right-hand side and sizes.
struct TileJob<'a> {
    a: MatRef<'a>,
    packed_b: &'a [u32],
    m: usize,
    n: usize,
    /// Tiles along `k` (16 pairs each).
    blocks: usize,
    threads: usize,
    order: TileOrder,
}

impl TileJob<'_> {
    /// Writes the product into the row-major `data` (row stride `rs` ≥ `n`), in tasks of
    /// whole rows.
    fn run(&self, data: &mut [f32], rs: usize, keep: Option<f32>, scale: f32) {
        let mc = if self.m >= MC * TASKS_PER_THREAD * self.threads { MC } else { MC / 2 };
        let tasks = self.m.div_ceil(mc);
        let task = |(task, rows): (usize, &mut [f32])| {
            self.block(task * mc..((task + 1) * mc).min(self.m), rows, rs, keep, scale)
        };
        if self.threads > 1 {
            data.par_chunks_mut(mc * rs).take(tasks).enumerate().for_each(task);
        } else {
            data.chunks_mut(mc * rs).take(tasks).enumerate().for_each(task);
        }
    }

    /// Rows `rows` of the product into `out` (those rows of the destination).
    fn block(&self, rows: std::ops::Range<usize>, out: &mut [f32], rs: usize, keep: Option<f32>, scale: f32) {
        let live_rows = rows.len();
        let (blocks, pairs_of_rows) = (self.blocks, live_rows.div_ceil(BLOCK));
        let tiles = Tiles::configure();
        scratch::with_words(0, |packed_a| {
            pack::pack_a_tiles(self.a, rows, blocks, packed_a);
            // Groups of 16 rows come in pairs: an odd last one multiplies a zero group.
            let group = blocks * TILE * TILE;
            packed_a.resize(pairs_of_rows * 2 * group, 0);
            let panels = self.n.div_ceil(NR);
            // Tiles `ks` of `k` of row pair `g` times those of panel `q`, into `sums` (added to
            // them where `add`).
            let multiply = |g: usize, q: usize, ks: std::ops::Range<usize>, add: bool, sums: TileSums<'_>| {
                let a = &packed_a[2 * g * group..2 * (g + 1) * group];
                let a = [&a[ks.start * TILE * TILE..], &a[group + ks.start * TILE * TILE..]];
                let b = &self.packed_b[(q * blocks + ks.start) * TILE * NR..(q * blocks + ks.end) * TILE * NR];
                tiles.multiply(ks.len(), a, b, add, sums);
            };
            // Every call starts from zeroed tiles or from sums a call of this block stored,
            // so the buffer's old contents never count.
            let mut sums = scratch::take_floats();
            match self.order {
                TileOrder::RowPairs => {
                    sums.resize(BLOCK * BLOCK, 0.0);
                    for g in 0..pairs_of_rows {
                        let rows_here = (live_rows - g * BLOCK).min(BLOCK);
                        for q in 0..panels {
                            let (cols, at) = ((self.n - q * NR).min(NR), g * BLOCK * rs + q * NR);
                            if keep.is_none() && scale == 1.0 && rows_here == BLOCK && cols == NR {
                                multiply(g, q, 0..blocks, false, TileSums { at: &mut out[at..], rs });
                            } else {
                                multiply(g, q, 0..blocks, false, TileSums { at: &mut sums, rs: BLOCK });
                                Epilogue { rows: rows_here, cols, rs, keep, scale }.write(&sums, &mut out[at..]);
                            }
                        }
                    }
                }
                TileOrder::Panels => {
                    let chunks = blocks.div_ceil(KC);
                    let chunk = blocks.div_ceil(chunks);
                    sums.resize(pairs_of_rows * BLOCK * BLOCK, 0.0);
                    for q in 0..panels {
                        for c in 0..chunks {
                            let ks = c * chunk..((c + 1) * chunk).min(blocks);
                            for (g, sums) in sums.chunks_exact_mut(BLOCK * BLOCK).enumerate() {
                                multiply(g, q, ks.clone(), c > 0, TileSums { at: sums, rs: BLOCK });
                            }
                        }
                        let cols = (self.n - q * NR).min(NR);
                        Epilogue { rows: live_rows, cols, rs, keep, scale }.write(&sums, &mut out[q * NR..]);
                    }
                }
            }
            scratch::give_floats(sums);
        });
    }
}

/// The loops of one task ([`TileOrder::for_operands`] picks them). Either way each output
/// value is one tile's sum over all of `k` in `k`'s order (sums stored between chunks are
/// fp32, exactly), so the bits do not depend on the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TileOrder {
    /// Row pair by row pair, each over every panel with all of `k` in one call: the pair's
    /// left tiles stay in L1 while the right operand streams from L2, and whole 32 × 32
    /// blocks of a plain product store their sums straight into the destination.
    RowPairs,
    /// Panel by panel, `k` in chunks of at most [`KC`] tiles, the task's row pairs in turn
    /// over each chunk, whose right tiles stay in L1; the sums wait in a buffer (L1) and go
    /// to the destination a panel at a time.
    Panels,
}

impl TileOrder {
    /// How the tasks of a product of `blocks` tiles of `k` and a right operand packed into
    /// `packed_b_words` walk their blocks: [`TileOrder::RowPairs`] where a row pair's
    /// left tiles fit in half of L1 and the packed right operand in a core's L2, else
    /// [`TileOrder::Panels`]. Measured on the GPT at nanoGPT's size (2 threads, 2026-12-01,
    /// Intel Xeon with AMX, 4 rounds in turn, steady tokens/s): 5,832 with row pairs where
    /// they fit against 5,091 with panels everywhere (medians; 4,266 before the packing
    /// buffers were aligned); in the products' own table the MLP projection (`k` = 1,536)
    /// and the weight gradients (a packed `dy` of 2.4–9.4 MB) ran faster by panels.
    fn for_operands(blocks: usize, packed_b_words: usize) -> Self {
        if blocks <= ROW_PAIR_BLOCKS && packed_b_words * 4 <= ROW_PAIR_RIGHT_BYTES {
            Self::RowPairs
        } else {
            Self::Panels
        }
    }
}

/// Where a micro-kernel call keeps its 32 × 32 sums: 32 rows of 32 floats at row stride `rs`
/// from the start of `at`.
struct TileSums<'a> {
    at: &'a mut [f32],
    rs: usize,
}

/// This thread's tile configuration, loaded for one task and released after it (the state
/// then costs no save and restore on a context switch). Not `Send`: the tiles are the
/// thread's.
struct Tiles(std::marker::PhantomData<*const ()>);

/// `ldtilecfg`'s 64-byte operand: palette 1, eight tiles of 16 rows × 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    const ALL_FULL: Self = {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = TILE as u8;
            t += 1;
        }
        Self(c)
    };
}

impl Tiles {
    fn configure() -> Self {
        debug_assert!(available());
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the process holds the tile state ([`available`], checked by `product`), and
        // the configuration is a valid palette-1 layout.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) TileConfig::ALL_FULL.0.as_ptr(), options(nostack, readonly));
        }
        Self(std::marker::PhantomData)
    }

    /// `sums` (32 × 32) = (`sums` where `add`, else 0) + the two 16-row groups `a` times the
    /// 32-column panel `b`, over `blocks` tiles of `k`.
    fn multiply(&self, blocks: usize, a: [&[u32]; 2], b: &[u32], add: bool, sums: TileSums<'_>) {
        assert!(blocks > 0 && a.iter().all(|a| a.len() >= blocks * TILE * TILE) && b.len() >= blocks * TILE * NR);
        assert!(sums.rs >= BLOCK && sums.at.len() >= (BLOCK - 1) * sums.rs + BLOCK);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: tiles are configured (`self` exists only after `configure`); each `a` holds
        // `blocks` 16 × 16-word tiles (64-byte rows), `b` `blocks` tiles of 16 pair rows × 32
        // columns (128-byte rows, two 64-byte tiles side by side), `sums` 32 rows of 32
        // floats at stride `rs`: every load and store stays inside them (checked just above).
        unsafe {
            std::arch::asm!(
                "test {add}, {add}",
                "jz 3f",
                "tileloadd tmm0, [{c0} + {sc}*1]",
                "tileloadd tmm1, [{c0} + {sc}*1 + 64]",
                "tileloadd tmm2, [{c1} + {sc}*1]",
                "tileloadd tmm3, [{c1} + {sc}*1 + 64]",
                "jmp 2f",
                "3:",
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "2:",
                "tileloadd tmm4, [{a0} + {s64}*1]",
                "tileloadd tmm6, [{b} + {s128}*1]",
                "tileloadd tmm7, [{b} + {s128}*1 + 64]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm5, [{a1} + {s64}*1]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a0}, 1024",
                "add {a1}, 1024",
                "add {b}, 2048",
                "dec {blocks}",
                "jnz 2b",
                "tilestored [{c0} + {sc}*1], tmm0",
                "tilestored [{c0} + {sc}*1 + 64], tmm1",
                "tilestored [{c1} + {sc}*1], tmm2",
                "tilestored [{c1} + {sc}*1 + 64], tmm3",
                add = in(reg) usize::from(add),
                a0 = inout(reg) a[0].as_ptr() => _,
                a1 = inout(reg) a[1].as_ptr() => _,
                b = inout(reg) b.as_ptr() => _,
                blocks = inout(reg) blocks => _,
                c0 = in(reg) sums.at.as_mut_ptr(),
                c1 = in(reg) sums.at.as_mut_ptr().add(TILE * sums.rs),
                sc = in(reg) 4 * sums.rs,
                s64 = in(reg) 64usize,
                s128 = in(reg) 128usize,
                options(nostack),
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("AMX off x86-64: `available` is false there")
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: releasing a configured tile state is always valid.
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem));
        }
    }
}

/// Where a panel's sums go: `rows × cols` (at most 32 columns) values at row stride `rs`, as
/// `keep·c + scale·sum`.
#[derive(Clone, Copy)]
struct Epilogue {
    rows: usize,
    cols: usize,
    rs: usize,
    keep: Option<f32>,
    scale: f32,
}

impl Epilogue {
    fn write(self, sums: &[f32], out: &mut [f32]) {
        assert!(sums.len() >= self.rows * BLOCK && self.cols <= BLOCK);
        assert!(self.rows == 0 || out.len() >= (self.rows - 1) * self.rs + self.cols);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F is part of `available` (checked by `product`); the bounds of both
        // slices are checked just above.
        unsafe {
            self.write_avx512(sums, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("AMX off x86-64: `available` is false there")
    }

    /// # Safety
    /// The CPU must have AVX-512F; `sums` holds `rows` rows of 32, `out` `rows` rows of `cols`
    /// at stride `rs`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn write_avx512(self, sums: &[f32], out: &mut [f32]) {
        use std::arch::x86_64::*;
        let masks = [super::dot::lanes(self.cols.min(16)), super::dot::lanes(self.cols.saturating_sub(16))];
        let scale = _mm512_set1_ps(self.scale);
        for r in 0..self.rows {
            for (half, &mask) in masks.iter().enumerate() {
                if mask == 0 {
                    continue;
                }
                // SAFETY: row `r` and the masked columns lie in both slices (contract).
                unsafe {
                    let at = out.as_mut_ptr().add(r * self.rs + 16 * half);
                    let mut v = _mm512_mul_ps(_mm512_loadu_ps(sums.as_ptr().add(r * BLOCK + 16 * half)), scale);
                    if let Some(f) = self.keep {
                        v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, at), _mm512_set1_ps(f), v);
                    }
                    _mm512_mask_storeu_ps(at, mask, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::bf16::round::{reference, tolerance};

    fn skip() -> bool {
        let skip = !available();
        if skip {
            eprintln!("skipped: this CPU or kernel gives no AMX (the packing is tested in pack.rs)");
        }
        skip
    }

    #[test]
    fn both_orders_give_the_same_bits() {
        if skip() {
            return;
        }
        // Whole and ragged 32 × 32 blocks, one and several chunks of `k`, plain and scaled.
        for (m, n, k) in [(64, 64, 64), (70, 45, 300), (96, 96, 700)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 17.0 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 13.0 - 3.5).collect();
            for (keep, scale) in [(None, 1.0), (Some(0.5), 0.25)] {
                let run = |order| {
                    let mut c = vec![1.5; m * n];
                    let (a, b) = (MatRef::rows(&a, m, k), MatRef::rows(&b, k, n));
                    product_in(Some(order), MatMut::rows(&mut c, m, n), a, b, keep, scale, 2);
                    c
                };
                assert_eq!(run(TileOrder::RowPairs), run(TileOrder::Panels), "{m}×{n}×{k}, {keep:?}, {scale}");
            }
        }
    }

    #[test]
    fn matches_the_reference_in_every_transpose_and_edge() {
        if skip() {
            return;
        }
        // Odd k, k below one tile, ragged rows and columns, several tasks, tiles and chunks
        // of k.
        for (m, n, k) in
            [(1, 1, 1), (7, 33, 5), (64, 32, 64), (130, 70, 131), (9, 65, 384), (33, 31, 33), (96, 64, 600)]
        {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 37) % 101) as f32 / 17.0 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 53) % 89) as f32 / 13.0 - 3.5).collect();
            let (want, tol) = (reference(m, n, k, &a, &b), tolerance(m, n, k, &a, &b));
            let at: Vec<f32> = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
            let bt: Vec<f32> = (0..k * n).map(|i| b[(i % k) * n + i / k]).collect();
            let lefts = [MatRef::rows(&a, m, k), MatRef::rows(&at, k, m).t()];
            let rights = [MatRef::rows(&b, k, n), MatRef::rows(&bt, n, k).t()];
            for (a_m, b_m, threads) in [(lefts[0], rights[0], 1), (lefts[1], rights[1], 2), (lefts[0], rights[1], 3)] {
                let mut c = vec![0.5; m * n];
                product(MatMut::rows(&mut c, m, n), a_m, b_m, None, 1.0, threads);
                for i in 0..m * n {
                    assert!((c[i] - want[i]).abs() <= tol[i], "{m}×{n}×{k} at {i}: {} vs {}", c[i], want[i]);
                }
                // c + ab (a gradient accumulating).
                product(MatMut::rows(&mut c, m, n), a_m, b_m, Some(1.0), 1.0, threads);
                for i in 0..m * n {
                    assert!((c[i] - 2.0 * want[i]).abs() <= 2.0 * tol[i] + 1e-6, "accumulated {m}×{n}×{k} at {i}");
                }
                // keep·c + scale·ab, into a strided (column-major) destination.
                let mut d = vec![2.0; m * n];
                product(MatMut::new(&mut d, m, n, 1, m), a_m, b_m, Some(0.5), -2.0, threads);
                for i in 0..m {
                    for j in 0..n {
                        let (got, w) = (d[j * m + i], 1.0 - 2.0 * want[i * n + j]);
                        assert!((got - w).abs() <= 2.0 * tol[i * n + j] + 1e-6, "strided {m}×{n}×{k}");
                    }
                }
            }
        }
    }
}
