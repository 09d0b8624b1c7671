//! A growable buffer whose first value sits on a 64-byte (cache-line) boundary, for what the
//! bf16 kernels load in whole lines: AMX loads and stores tiles in 64-byte rows and
//! `vdpbf16ps` reads 64-byte vectors. A `Vec<u32>` of a megabyte comes from `mmap` by way of
//! glibc's `malloc`, 16 bytes past a page boundary, so every such row straddled two cache
//! lines: an AMX product measured 0.65× as fast with its operands 16 bytes off (2026-12-01,
//! Intel Xeon with AMX).

use bytemuck::{Pod, Zeroable};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// One cache line of storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([u32; 16]);

// SAFETY: 64 bytes of `u32`s with the alignment equal to the size: no padding, and any bits
// are a valid value.
unsafe impl Zeroable for CacheLine {}
// SAFETY: as above; `CacheLine` is `Copy` and `'static`.
unsafe impl Pod for CacheLine {}

/// `len` values of `T` (4-byte plain data: `u32` or `f32`) in whole cache lines.
pub struct Aligned<T> {
    lines: Vec<CacheLine>,
    len: usize,
    kind: PhantomData<T>,
}

impl<T> Aligned<T> {
    /// An empty buffer (no storage yet).
    pub const fn new() -> Self {
        Self { lines: Vec::new(), len: 0, kind: PhantomData }
    }
}

impl<T> Default for Aligned<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Pod> Aligned<T> {
    const PER_LINE: usize = {
        assert!(std::mem::size_of::<T>() == 4 && std::mem::align_of::<T>() <= 64);
        16
    };

    /// Empties the buffer, keeping its storage.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// As `Vec::resize`: values past the old length become `value`, those before it stay.
    pub fn resize(&mut self, len: usize, value: T) {
        let lines = len.div_ceil(Self::PER_LINE);
        if lines > self.lines.len() {
            self.lines.resize(lines, CacheLine([0; 16]));
        }
        let old = self.len.min(len);
        self.len = len;
        self[old..].fill(value);
    }
}

impl<T: Pod> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl<T: Pod> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_cache_line_and_resizes_like_a_vec() {
        let mut a = Aligned::<u32>::default();
        a.resize(5, 7);
        assert_eq!(&a[..], &[7; 5]);
        a[1] = 1;
        a.resize(40, 9);
        assert_eq!(a.as_ptr() as usize % 64, 0);
        assert_eq!((&a[..2], a.len(), a[39]), (&[7, 1][..], 40, 9));
        a.resize(3, 0);
        assert_eq!(&a[..], &[7, 1, 7]);
        a.clear();
        a.resize(2, 4);
        assert_eq!(&a[..], &[4, 4]);
        let mut f = Aligned::<f32>::default();
        f.resize(17, 0.5);
        assert_eq!((f.as_ptr() as usize % 64, f[16]), (0, 0.5));
    }
}
