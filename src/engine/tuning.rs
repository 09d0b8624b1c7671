//! What the engine's speed thresholds are on the CPU it runs on: one row per CPU family.
//!
//! The dense layer walks a ReLU's nonzeros instead of calling gemm below a density
//! ([`super::sparse`]), and `mixed_bfloat16` takes `vdpbf16ps` only where it beats gemm's
//! fp32 kernel ([`super::bf16`]). Where those cross over depends on the CPU: the sparse walk's
//! gather and gemm's AVX-512 kernel scale differently from one core design to the next
//! (`trainrun bench --only sparse` prints both sides), and `vdpbf16ps` runs at 1.5× gemm's
//! fp32 rate on AMD's Zen 5 but at half of it on Intel's AMX Xeons.
//!
//! A table, not a measurement at start-up, because a sparse threshold decides the order of a
//! sum: one measured at each start would move with the machine's load, and so would a run's
//! bits from one run to the next on the same computer. A row per family keeps "same spec, same
//! seed, same CPU ⇒ same bits"; `trainrun check` prints the row a run takes and `trainrun
//! bench --only sparse` measures this CPU's crossovers beside it, which is how a row is added.
//! The family is read from CPUID's vendor, family and features rather than its model number,
//! which virtual machines rewrite (this Xeon reports model 167).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

/// The CPU families the table has a row for (`run.cpu_tuning` names one to take its row on any
/// CPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CpuFamily {
    /// Intel with AMX (Sapphire Rapids and later Xeons).
    IntelAmx,
    /// Intel with AVX-512 and no AMX (Skylake-SP to Ice Lake and Cooper Lake Xeons).
    IntelAvx512,
    /// AMD Zen 4 (family 0x19 with AVX-512: EPYC 9004, Ryzen 7000).
    AmdZen4,
    /// AMD Zen 5 and later (family 0x1A: EPYC 9005, Ryzen 9000).
    AmdZen5,
    /// Anything else: AVX2-only, older, or not x86-64.
    Other,
}

/// Every family, in the order of [`PINNED`]'s codes (0 is "not pinned").
const FAMILIES: [CpuFamily; 5] =
    [CpuFamily::IntelAmx, CpuFamily::IntelAvx512, CpuFamily::AmdZen4, CpuFamily::AmdZen5, CpuFamily::Other];

/// The family `run.cpu_tuning` pinned for this process (an index into [`FAMILIES`] plus one),
/// or 0 for this CPU's own.
static PINNED: AtomicU8 = AtomicU8::new(0);

/// Takes `family`'s row from now on in this process, or this CPU's own row for `None`
/// (`run.cpu_tuning`, applied when a spec is planned, before any layer runs).
pub fn pin(family: Option<CpuFamily>) {
    let code = family.and_then(|f| FAMILIES.iter().position(|&g| g == f)).map_or(0, |i| i as u8 + 1);
    PINNED.store(code, Ordering::Relaxed);
}

impl CpuFamily {
    /// This CPU's family, from CPUID (detected once).
    pub fn here() -> Self {
        static FAMILY: OnceLock<CpuFamily> = OnceLock::new();
        *FAMILY.get_or_init(detect)
    }

    /// The family's name as `check` and `bench` print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::IntelAmx => "Intel with AMX",
            Self::IntelAvx512 => "Intel with AVX-512",
            Self::AmdZen4 => "AMD Zen 4",
            Self::AmdZen5 => "AMD Zen 5",
            Self::Other => "other",
        }
    }

    /// The family of a CPU with this CPUID vendor string, display family (base plus extended)
    /// and features.
    pub fn classify(vendor: &str, family: u32, avx512f: bool, amx: bool) -> Self {
        match (vendor, family) {
            ("GenuineIntel", _) if amx => Self::IntelAmx,
            ("GenuineIntel", 6) if avx512f => Self::IntelAvx512,
            ("AuthenticAMD", 0x19) if avx512f => Self::AmdZen4,
            ("AuthenticAMD", f) if f >= 0x1A && avx512f => Self::AmdZen5,
            _ => Self::Other,
        }
    }
}

/// "At most `nonzeros` in `per`": a density the sparse walk pays at or below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Density {
    /// Nonzero values …
    pub nonzeros: usize,
    /// … in this many.
    pub per: usize,
}

impl Density {
    /// Whether `nonzeros` of `total` values is at most this density.
    pub fn admits(self, nonzeros: usize, total: usize) -> bool {
        // In u128: exact for any two counts a slice can hold.
        nonzeros as u128 * self.per as u128 <= total as u128 * self.nonzeros as u128
    }

    /// The density as a fraction.
    pub fn fraction(self) -> f64 {
        self.nonzeros as f64 / self.per as f64
    }
}

/// How `vdpbf16ps` compares with gemm's fp32 kernel on a CPU family, by layer width (the
/// smaller of a layer's two model dimensions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Vdpbf16ps {
    /// Slower at every width measured: `mixed_bfloat16` without AMX keeps fp32 products.
    Slower,
    /// Faster for layers at least this wide; narrower ones keep fp32 products.
    PaysFrom(usize),
}

/// The thresholds of one CPU family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Tuning {
    /// The family the row is for.
    pub family: CpuFamily,
    /// Forward's `x · kernel` walks `x`'s nonzeros at or below this density.
    pub sparse_forward: Density,
    /// Backward's products for a block of kernel rows walk the block's nonzeros at or below
    /// this density.
    pub sparse_backward: Density,
    /// Kernel rows per block of the forward walk (a block stays in L2 while every row of the
    /// batch takes its nonzeros in it). It does not change any sum's order.
    pub forward_block: usize,
    /// Whether, and from what layer width, `vdpbf16ps` beats gemm's fp32 kernel
    /// ([`super::bf16::ProductPath::pays_from`]); where it never does, `mixed_bfloat16` keeps
    /// fp32 products on a CPU without AMX.
    pub vdpbf16ps: Vdpbf16ps,
    /// Where the row's figures come from.
    pub measured: &'static str,
}

impl Tuning {
    /// The row this process takes: the family `run.cpu_tuning` pinned ([`pin`]), or this
    /// CPU's.
    pub fn here() -> Tuning {
        match PINNED.load(Ordering::Relaxed) {
            0 => Tuning::of(CpuFamily::here()),
            code => Tuning::of(FAMILIES[usize::from(code - 1).min(FAMILIES.len() - 1)]),
        }
    }

    /// The row of `family`.
    pub const fn of(family: CpuFamily) -> Tuning {
        match family {
            // `bench --only sparse` (1 thread, the tutorial's 64 × 21,632 · 21,632 × 128 with its
            // zeros spread evenly, the walk's worst case), two sittings, 2026-11-30, Intel Xeon
            // with AMX: forward sparse/gemm 0.60–0.61, 0.77–0.85, 0.99–1.06 and 1.25–1.26 at 10,
            // 15, 20 and 25 %, so it stops paying at 19–20 %; both backward products together
            // 0.66–0.67, 0.79, 0.91–0.92 and 1.03–1.04 at 15, 20, 25 and 30 %, stopping at
            // 28–29 %. The Zen 4's 1/3 would walk backward at 1.1× gemm's time here. The
            // forward block made no difference from 128 to 512 rows (1.39–1.52 ms at 10 %).
            // `vdpbf16ps` ran at 146–183 GFLOP/s against gemm's fp32 301–345 at nanoGPT's
            // shapes (`bench --only products`, 2026-11-29).
            CpuFamily::IntelAmx => Tuning {
                family,
                sparse_forward: Density { nonzeros: 1, per: 6 },
                sparse_backward: Density { nonzeros: 1, per: 4 },
                forward_block: 256,
                vdpbf16ps: Vdpbf16ps::Slower,
                measured: "measured on an Intel Xeon with AMX, 2026-11-30",
            },
            // Not measured on one: the AMX Xeon's row, whose cores are the same design lineage.
            CpuFamily::IntelAvx512 => Tuning {
                measured: "not measured: the row of Intel with AMX, the nearest measured core",
                family,
                ..Tuning::of(CpuFamily::IntelAmx)
            },
            // The walk against gemm on one thread, as above, on a Zen 4 (2026-11-25): forward
            // 0.44, 0.74, 0.93, 1.14 at 5, 13, 20, 30 %; the kernel's gradient 0.49, 0.59, 0.76,
            // 0.92, 1.14 and dx 0.46, 0.54, 0.73, 0.86, 0.98 at 5, 13, 20, 30, 40 %. Again on a
            // Zen 4 (AMD EPYC, 2026-11-30): forward 0.94, 1.00, 1.17 at 20, 25, 30 %, both
            // backward products 0.88, 0.95, 0.99, 1.10 at 20, 25, 30, 35 %, so the row stands.
            // `vdpbf16ps` on that Zen 4, 2 threads (`bench --only products`), once its operands
            // were converted a row at a time (a6e7c6d): 1.5–1.8× gemm's fp32 at nanoGPT's
            // widths (384 and more); at the Shakespeare GPT's 128-wide layers 1.36–1.85× (three
            // runs, 2026-11-30 19:59–20:01 UTC: 170–369 GFLOP/s against 104–224), 65-wide LM
            // heads 1.14–1.35×, one 64-wide head's products 0.68–1.35×, so 128. Before that
            // change, converting value by value, 128-wide layers ran at 0.63–0.66×: 256 until then.
            CpuFamily::AmdZen4 => Tuning {
                family,
                sparse_forward: Density { nonzeros: 1, per: 5 },
                sparse_backward: Density { nonzeros: 1, per: 3 },
                forward_block: 256,
                vdpbf16ps: Vdpbf16ps::PaysFrom(128),
                measured: "measured on an AMD Zen 4, 2026-11-25 and 2026-11-30",
            },
            // `bench --only products`, 2 threads, AMD EPYC family 26 (2026-11-29): `vdpbf16ps`
            // 655–700 GFLOP/s against gemm's fp32 440–458 where the output is 1,152–1,536 wide,
            // 475–490 against 443–454 at 384; fp32 faster (up to 2×) at 128 and below (with the
            // value-by-value conversion the Zen 4 has since dropped: not measured again).
            CpuFamily::AmdZen5 => Tuning {
                family,
                vdpbf16ps: Vdpbf16ps::PaysFrom(256),
                measured: "measured on an AMD Zen 5, 2026-11-29; sparse walk: the Zen 4 row",
                ..Tuning::of(CpuFamily::AmdZen4)
            },
            // No AVX-512 for the walk's compress or for bf16: the Zen 4's thresholds, which
            // are the most conservative of the measured rows for the backward walk.
            CpuFamily::Other => Tuning {
                family,
                vdpbf16ps: Vdpbf16ps::Slower,
                measured: "not measured: the Zen 4's sparse thresholds",
                ..Tuning::of(CpuFamily::AmdZen4)
            },
        }
    }

    /// One line for `check` and `bench`.
    pub fn describe(&self) -> String {
        let bf16 = match self.vdpbf16ps {
            Vdpbf16ps::PaysFrom(width) => format!("vdpbf16ps for layers {width} wide or more"),
            Vdpbf16ps::Slower => "no vdpbf16ps (fp32 is faster)".to_string(),
        };
        let pinned = if PINNED.load(Ordering::Relaxed) != 0 { ", pinned by run.cpu_tuning" } else { "" };
        format!(
            "CPU family {}{pinned}: sparse walk forward at density ≤ {}/{}, backward ≤ {}/{}, forward block {} rows; {bf16} ({})",
            self.family.name(),
            self.sparse_forward.nonzeros,
            self.sparse_forward.per,
            self.sparse_backward.nonzeros,
            self.sparse_backward.per,
            self.forward_block,
            self.measured
        )
    }
}

fn detect() -> CpuFamily {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        let leaf0 = __cpuid(0);
        let vendor: Vec<u8> = [leaf0.ebx, leaf0.edx, leaf0.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        let leaf1 = __cpuid(1);
        let base = (leaf1.eax >> 8) & 0xF;
        let family = if base == 0xF { base + ((leaf1.eax >> 20) & 0xFF) } else { base };
        // AMX-BF16 and AMX-TILE in leaf 7 (the CPU's, whether or not this process may use them:
        // the family is the silicon, the path is [`super::bf16::Bf16Support`]).
        let amx = leaf0.eax >= 7 && {
            let leaf7 = __cpuid_count(7, 0);
            leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0
        };
        CpuFamily::classify(&String::from_utf8_lossy(&vendor), family, is_x86_feature_detected!("avx512f"), amx)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        CpuFamily::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_come_from_vendor_family_and_features_not_the_model() {
        assert_eq!(CpuFamily::classify("GenuineIntel", 6, true, true), CpuFamily::IntelAmx);
        assert_eq!(CpuFamily::classify("GenuineIntel", 6, true, false), CpuFamily::IntelAvx512);
        assert_eq!(CpuFamily::classify("GenuineIntel", 6, false, false), CpuFamily::Other);
        assert_eq!(CpuFamily::classify("AuthenticAMD", 0x19, true, false), CpuFamily::AmdZen4);
        // Zen 3 is family 0x19 too, without AVX-512.
        assert_eq!(CpuFamily::classify("AuthenticAMD", 0x19, false, false), CpuFamily::Other);
        assert_eq!(CpuFamily::classify("AuthenticAMD", 0x1A, true, false), CpuFamily::AmdZen5);
        assert_eq!(CpuFamily::classify("HygonGenuine", 0x18, false, false), CpuFamily::Other);
    }

    #[test]
    fn every_row_is_its_own_family_and_its_densities_are_fractions() {
        for family in FAMILIES {
            let row = Tuning::of(family);
            assert_eq!(row.family, family);
            for d in [row.sparse_forward, row.sparse_backward] {
                assert!(d.nonzeros > 0 && d.nonzeros < d.per, "{family:?}: {d:?}");
            }
            assert!(row.forward_block >= 16, "{family:?}");
            assert!(row.describe().contains(family.name()));
        }
        // This machine's row is the row of its family, every time it is asked.
        assert_eq!(Tuning::here(), Tuning::of(CpuFamily::here()));
    }

    #[test]
    fn a_density_admits_up_to_and_including_its_fraction() {
        let fifth = Density { nonzeros: 1, per: 5 };
        assert!(fifth.admits(0, 0) && fifth.admits(20, 100) && !fifth.admits(21, 100));
        assert!(fifth.admits(usize::MAX / 5, usize::MAX) && !fifth.admits(usize::MAX / 2, usize::MAX), "huge counts");
    }
}
