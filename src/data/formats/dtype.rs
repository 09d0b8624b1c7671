//! [`Dtype`]: the element types the readers understand, their NumPy names and sizes, and the
//! conversion of raw little- or big-endian elements to `f32` (features) or `f64` (labels, where
//! every integer up to 2^53 must stay exact).

use half::f16;

/// The element type of stored values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    F32,
    F64,
}

/// The byte order of multi-byte elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    Little,
    Big,
}

impl Dtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 => 8,
        }
    }

    /// NumPy's name (`uint8`, `float32`, …).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "uint8",
            Dtype::I8 => "int8",
            Dtype::U16 => "uint16",
            Dtype::I16 => "int16",
            Dtype::U32 => "uint32",
            Dtype::I32 => "int32",
            Dtype::U64 => "uint64",
            Dtype::I64 => "int64",
            Dtype::F16 => "float16",
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
        }
    }

    /// True for the floating-point types (whose labels mean regression).
    pub fn is_float(self) -> bool {
        match self {
            Dtype::F16 | Dtype::F32 | Dtype::F64 => true,
            Dtype::U8 | Dtype::I8 | Dtype::U16 | Dtype::I16 | Dtype::U32 | Dtype::I32 | Dtype::U64 | Dtype::I64 => {
                false
            }
        }
    }

    /// The type of a NumPy type code's kind and size (`('f', 4)` is `float32`).
    pub fn from_numpy(kind: char, size: usize) -> Option<Self> {
        Some(match (kind, size) {
            ('u', 1) => Dtype::U8,
            ('i', 1) => Dtype::I8,
            ('u', 2) => Dtype::U16,
            ('i', 2) => Dtype::I16,
            ('u', 4) => Dtype::U32,
            ('i', 4) => Dtype::I32,
            ('u', 8) => Dtype::U64,
            ('i', 8) => Dtype::I64,
            ('f', 2) => Dtype::F16,
            ('f', 4) => Dtype::F32,
            ('f', 8) => Dtype::F64,
            _ => return None,
        })
    }
}

/// Defines a function converting raw elements to `$out`. One body for both outputs: `as` is
/// the exact-or-nearest conversion from every input type to either float type.
macro_rules! converter {
    ($(#[$doc:meta])* $name:ident, $out:ty) => {
        $(#[$doc])*
        pub fn $name(dtype: Dtype, order: ByteOrder, src: &[u8], out: &mut [$out]) {
            let big = order == ByteOrder::Big;
            match dtype {
                Dtype::U8 => each(src, out, |[b]: [u8; 1]| b as $out),
                Dtype::I8 => each(src, out, |[b]: [u8; 1]| b as i8 as $out),
                Dtype::U16 => each(src, out, |b| if big { u16::from_be_bytes(b) } else { u16::from_le_bytes(b) } as $out),
                Dtype::I16 => each(src, out, |b| if big { i16::from_be_bytes(b) } else { i16::from_le_bytes(b) } as $out),
                Dtype::U32 => each(src, out, |b| if big { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) } as $out),
                Dtype::I32 => each(src, out, |b| if big { i32::from_be_bytes(b) } else { i32::from_le_bytes(b) } as $out),
                Dtype::U64 => each(src, out, |b| if big { u64::from_be_bytes(b) } else { u64::from_le_bytes(b) } as $out),
                Dtype::I64 => each(src, out, |b| if big { i64::from_be_bytes(b) } else { i64::from_le_bytes(b) } as $out),
                Dtype::F16 => {
                    each(src, out, |b| if big { f16::from_be_bytes(b) } else { f16::from_le_bytes(b) }.to_f32() as $out)
                }
                Dtype::F32 => each(src, out, |b| if big { f32::from_be_bytes(b) } else { f32::from_le_bytes(b) } as $out),
                Dtype::F64 => each(src, out, |b| if big { f64::from_be_bytes(b) } else { f64::from_le_bytes(b) } as $out),
            }
        }
    };
}

converter!(
    /// Converts `out.len()` elements from the start of `src` to `f32`.
    to_f32,
    f32
);
converter!(
    /// Converts `out.len()` elements from the start of `src` to `f64`.
    to_f64,
    f64
);

/// Widens bytes to `f32` (`out.len()` of them): how every `u8` image becomes values.
pub fn widen_u8(src: &[u8], out: &mut [f32]) {
    each(src, out, |[b]: [u8; 1]| f32::from(b));
}

/// Applies `f` to each `N`-byte element; stops at the shorter of `src` and `out`.
#[inline(always)]
fn each<const N: usize, T>(src: &[u8], out: &mut [T], f: impl Fn([u8; N]) -> T) {
    let (elements, _) = src.as_chunks::<N>();
    for (o, e) in out.iter_mut().zip(elements) {
        *o = f(*e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_converts_in_both_byte_orders() {
        let cases: [(Dtype, Vec<u8>, Vec<u8>, f64); 11] = [
            (Dtype::U8, vec![200], vec![200], 200.0),
            (Dtype::I8, vec![0xfe], vec![0xfe], -2.0),
            (Dtype::U16, 60000u16.to_le_bytes().into(), 60000u16.to_be_bytes().into(), 60000.0),
            (Dtype::I16, (-300i16).to_le_bytes().into(), (-300i16).to_be_bytes().into(), -300.0),
            (Dtype::U32, 4_000_000_000u32.to_le_bytes().into(), 4_000_000_000u32.to_be_bytes().into(), 4e9),
            (Dtype::I32, (-70000i32).to_le_bytes().into(), (-70000i32).to_be_bytes().into(), -70000.0),
            (Dtype::U64, (1u64 << 53).to_le_bytes().into(), (1u64 << 53).to_be_bytes().into(), 9007199254740992.0),
            (Dtype::I64, (-(1i64 << 40)).to_le_bytes().into(), (-(1i64 << 40)).to_be_bytes().into(), -1099511627776.0),
            (Dtype::F16, f16::from_f32(-1.5).to_le_bytes().into(), f16::from_f32(-1.5).to_be_bytes().into(), -1.5),
            (Dtype::F32, 0.25f32.to_le_bytes().into(), 0.25f32.to_be_bytes().into(), 0.25),
            (Dtype::F64, 1e300f64.to_le_bytes().into(), 1e300f64.to_be_bytes().into(), 1e300),
        ];
        for (dtype, le, be, want) in cases {
            assert_eq!(le.len(), dtype.size(), "{dtype:?}");
            for (bytes, order) in [(le, ByteOrder::Little), (be, ByteOrder::Big)] {
                let mut wide = [0f64];
                to_f64(dtype, order, &bytes, &mut wide);
                assert_eq!(wide[0], want, "{dtype:?} {order:?}");
                let mut narrow = [0f32];
                to_f32(dtype, order, &bytes, &mut narrow);
                assert_eq!(narrow[0], want as f32, "{dtype:?} {order:?}");
            }
        }
    }

    #[test]
    fn numpy_codes_map_to_types() {
        assert_eq!(Dtype::from_numpy('f', 2), Some(Dtype::F16));
        assert_eq!(Dtype::from_numpy('i', 8), Some(Dtype::I64));
        assert_eq!(Dtype::from_numpy('c', 8), None);
        assert_eq!(Dtype::from_numpy('b', 1), None);
        assert!(Dtype::F64.is_float() && !Dtype::U8.is_float());
    }
}
