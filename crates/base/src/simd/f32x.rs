//! f32 vectors for the inference kernels ([`F32x`], implemented by the CPU tokens), and
//! vectorised `exp`, `tanh`, `erf`, SiLU and GELU written once over it.
//!
//! The transcendental functions are branch-free polynomial/rational approximations with
//! a maximum error of a few f32 ulps (tested against f64 references through every path the
//! CPU has, in `infer::act`), so the fused engine stays within 1e-5 absolute of Burn's f32
//! forward for every activation.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::Portable;
#[cfg(target_arch = "x86_64")]
use super::{Avx2, Avx512};

/// A vector of f32 lanes, implemented by the CPU tokens ([`Avx512`], [`Avx2`], [`Portable`]):
/// every method takes the token as `self`, so the CPU feature is proven before a kernel can
/// execute an instruction. The methods stay `unsafe` for the pointer arguments of
/// `load`/`store`/`gather`/`scatter`, which must be valid for the lanes they touch.
///
/// # Safety
/// Pointer arguments must be valid for the lanes the method touches; everything else is
/// guaranteed by the token.
#[allow(missing_docs, clippy::missing_safety_doc)] // one method per vector instruction, named after what it computes; the trait's Safety section covers them
pub trait F32x: Copy {
    /// The vector type.
    type V: Copy;
    /// Lanes per vector.
    const LANES: usize;

    unsafe fn splat(self, x: f32) -> Self::V;
    unsafe fn load(self, p: *const f32) -> Self::V;
    unsafe fn store(self, p: *mut f32, v: Self::V);
    unsafe fn add(self, a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(self, a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c`, fused.
    unsafe fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn max(self, a: Self::V, b: Self::V) -> Self::V;
    unsafe fn min(self, a: Self::V, b: Self::V) -> Self::V;
    unsafe fn abs(self, a: Self::V) -> Self::V;
    /// Round to the nearest integer (ties to even), as floats.
    unsafe fn round(self, a: Self::V) -> Self::V;
    /// `2^n` for integral `n` in [-126, 127].
    unsafe fn pow2i(self, n: Self::V) -> Self::V;
    /// `a < b ? t : f` lane-wise.
    unsafe fn select_lt(self, a: Self::V, b: Self::V, t: Self::V, f: Self::V) -> Self::V;
    /// `|mag|` with the sign of `sign`.
    unsafe fn copysign(self, mag: Self::V, sign: Self::V) -> Self::V;
    /// Lanes `l < n` from `p[l · stride]`, the rest 0 (`n ≤ LANES`, `stride · LANES` fits
    /// an i32).
    unsafe fn gather(self, p: *const f32, stride: usize, n: usize) -> Self::V;
    /// Store lanes `l < n` to `p[l · stride]`.
    unsafe fn scatter(self, p: *mut f32, stride: usize, n: usize, v: Self::V);

    #[inline(always)]
    unsafe fn zero(self) -> Self::V {
        unsafe { self.splat(0.0) }
    }
}

#[cfg(target_arch = "x86_64")]
impl F32x for Avx512 {
    type V = __m512;
    const LANES: usize = 16;
    #[inline(always)]
    unsafe fn splat(self, x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m512 {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m512) {
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn add(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn max(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn abs(self, a: __m512) -> __m512 {
        unsafe { _mm512_abs_ps(a) }
    }
    #[inline(always)]
    unsafe fn round(self, a: __m512) -> __m512 {
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn pow2i(self, n: __m512) -> __m512 {
        unsafe {
            let i = _mm512_cvtps_epi32(n);
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                i,
                _mm512_set1_epi32(127),
            )))
        }
    }
    #[inline(always)]
    unsafe fn select_lt(self, a: __m512, b: __m512, t: __m512, f: __m512) -> __m512 {
        unsafe {
            let m = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b);
            _mm512_mask_blend_ps(m, f, t)
        }
    }
    #[inline(always)]
    unsafe fn copysign(self, mag: __m512, sign: __m512) -> __m512 {
        unsafe {
            let s = _mm512_set1_epi32(i32::MIN);
            let r = _mm512_or_si512(
                _mm512_andnot_si512(s, _mm512_castps_si512(mag)),
                _mm512_and_si512(s, _mm512_castps_si512(sign)),
            );
            _mm512_castsi512_ps(r)
        }
    }
    #[inline(always)]
    unsafe fn gather(self, p: *const f32, stride: usize, n: usize) -> __m512 {
        unsafe {
            let idx = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(stride as i32),
            );
            if n >= 16 {
                _mm512_i32gather_ps::<4>(idx, p)
            } else {
                let m = ((1u32 << n) - 1) as __mmask16;
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, idx, p)
            }
        }
    }
    #[inline(always)]
    unsafe fn scatter(self, p: *mut f32, stride: usize, n: usize, v: __m512) {
        unsafe {
            let idx = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(stride as i32),
            );
            if n >= 16 {
                _mm512_i32scatter_ps::<4>(p, idx, v)
            } else {
                let m = ((1u32 << n) - 1) as __mmask16;
                _mm512_mask_i32scatter_ps::<4>(p, m, idx, v)
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl F32x for Avx2 {
    type V = __m256;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn splat(self, x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m256 {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m256) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn add(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn max(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn abs(self, a: __m256) -> __m256 {
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
    }
    #[inline(always)]
    unsafe fn round(self, a: __m256) -> __m256 {
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    unsafe fn pow2i(self, n: __m256) -> __m256 {
        unsafe {
            let i = _mm256_cvtps_epi32(n);
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                i,
                _mm256_set1_epi32(127),
            )))
        }
    }
    #[inline(always)]
    unsafe fn select_lt(self, a: __m256, b: __m256, t: __m256, f: __m256) -> __m256 {
        unsafe {
            let m = _mm256_cmp_ps::<_CMP_LT_OQ>(a, b);
            _mm256_blendv_ps(f, t, m)
        }
    }
    #[inline(always)]
    unsafe fn copysign(self, mag: __m256, sign: __m256) -> __m256 {
        unsafe {
            let s = _mm256_set1_ps(-0.0);
            _mm256_or_ps(_mm256_andnot_ps(s, mag), _mm256_and_ps(s, sign))
        }
    }
    #[inline(always)]
    unsafe fn gather(self, p: *const f32, stride: usize, n: usize) -> __m256 {
        unsafe {
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let idx = _mm256_mullo_epi32(lane, _mm256_set1_epi32(stride as i32));
            if n >= 8 {
                _mm256_i32gather_ps::<4>(p, idx)
            } else {
                let m = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane));
                _mm256_mask_i32gather_ps::<4>(_mm256_setzero_ps(), p, idx, m)
            }
        }
    }
    #[inline(always)]
    unsafe fn scatter(self, p: *mut f32, stride: usize, n: usize, v: __m256) {
        unsafe {
            let mut t = [0f32; 8];
            _mm256_storeu_ps(t.as_mut_ptr(), v);
            for (l, x) in t.iter().enumerate().take(n) {
                *p.add(l * stride) = *x;
            }
        }
    }
}

type P8 = [f32; 8];

#[inline(always)]
fn map2(a: P8, b: P8, f: impl Fn(f32, f32) -> f32) -> P8 {
    let mut r = [0.0; 8];
    for i in 0..8 {
        r[i] = f(a[i], b[i]);
    }
    r
}

impl F32x for Portable {
    type V = P8;
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn splat(self, x: f32) -> P8 {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> P8 {
        unsafe { std::ptr::read_unaligned(p as *const P8) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: P8) {
        unsafe { std::ptr::write_unaligned(p as *mut P8, v) }
    }
    #[inline(always)]
    unsafe fn add(self, a: P8, b: P8) -> P8 {
        map2(a, b, |x, y| x + y)
    }
    #[inline(always)]
    unsafe fn sub(self, a: P8, b: P8) -> P8 {
        map2(a, b, |x, y| x - y)
    }
    #[inline(always)]
    unsafe fn mul(self, a: P8, b: P8) -> P8 {
        map2(a, b, |x, y| x * y)
    }
    #[inline(always)]
    unsafe fn div(self, a: P8, b: P8) -> P8 {
        map2(a, b, |x, y| x / y)
    }
    #[inline(always)]
    unsafe fn fma(self, a: P8, b: P8, c: P8) -> P8 {
        // Separate multiply and add: `mul_add` is a libm call without hardware FMA.
        let mut r = [0.0; 8];
        for i in 0..8 {
            r[i] = a[i] * b[i] + c[i];
        }
        r
    }
    #[inline(always)]
    unsafe fn max(self, a: P8, b: P8) -> P8 {
        map2(a, b, |x, y| if x > y { x } else { y })
    }
    #[inline(always)]
    unsafe fn min(self, a: P8, b: P8) -> P8 {
        map2(a, b, |x, y| if x < y { x } else { y })
    }
    #[inline(always)]
    unsafe fn abs(self, a: P8) -> P8 {
        a.map(f32::abs)
    }
    #[inline(always)]
    unsafe fn round(self, a: P8) -> P8 {
        a.map(f32::round_ties_even)
    }
    #[inline(always)]
    unsafe fn pow2i(self, n: P8) -> P8 {
        n.map(|v| f32::from_bits((((v as i32) + 127) as u32) << 23))
    }
    #[inline(always)]
    unsafe fn select_lt(self, a: P8, b: P8, t: P8, f: P8) -> P8 {
        let mut r = [0.0; 8];
        for i in 0..8 {
            r[i] = if a[i] < b[i] { t[i] } else { f[i] };
        }
        r
    }
    #[inline(always)]
    unsafe fn copysign(self, mag: P8, sign: P8) -> P8 {
        map2(mag, sign, f32::copysign)
    }
    #[inline(always)]
    unsafe fn gather(self, p: *const f32, stride: usize, n: usize) -> P8 {
        let mut r = [0.0; 8];
        for (l, x) in r.iter_mut().enumerate().take(n) {
            *x = unsafe { *p.add(l * stride) };
        }
        r
    }
    #[inline(always)]
    unsafe fn scatter(self, p: *mut f32, stride: usize, n: usize, v: P8) {
        for (l, x) in v.iter().enumerate().take(n) {
            unsafe { *p.add(l * stride) = *x };
        }
    }
}

/// `e^x` (Cephes `expf` polynomial after range reduction; inputs clamped to [-87, 88]).
#[inline(always)]
#[allow(clippy::excessive_precision)]
///
/// # Safety
/// None beyond [`F32x`]'s: the token proves the instruction set.
pub unsafe fn exp<S: F32x>(s: S, x: S::V) -> S::V {
    unsafe {
        let x = s.min(s.max(x, s.splat(-87.0)), s.splat(88.0));
        let n = s.round(s.mul(x, s.splat(std::f32::consts::LOG2_E)));
        let r = s.fma(n, s.splat(-0.693_359_4), x);
        let r = s.fma(n, s.splat(2.121_944_4e-4), r);
        let mut p = s.splat(1.987_569_1e-4);
        p = s.fma(p, r, s.splat(1.398_2e-3));
        p = s.fma(p, r, s.splat(8.333_452e-3));
        p = s.fma(p, r, s.splat(4.166_579_6e-2));
        p = s.fma(p, r, s.splat(1.666_666_5e-1));
        p = s.fma(p, r, s.splat(5.000_000_1e-1));
        let r2 = s.mul(r, r);
        let y = s.add(s.fma(p, r2, r), s.splat(1.0));
        s.mul(y, s.pow2i(n))
    }
}

/// `x · sigmoid(x) = x / (1 + e^{−x})`.
#[inline(always)]
///
/// # Safety
/// None beyond [`F32x`]'s: the token proves the instruction set.
pub unsafe fn silu<S: F32x>(s: S, x: S::V) -> S::V {
    unsafe {
        let e = exp(s, s.sub(s.zero(), x));
        s.div(x, s.add(s.splat(1.0), e))
    }
}

/// `tanh(x)`: an odd polynomial for |x| < 0.625 (Cephes `tanhf`), else `1 − 2/(e^{2|x|}+1)`.
#[inline(always)]
#[allow(clippy::excessive_precision)]
///
/// # Safety
/// None beyond [`F32x`]'s: the token proves the instruction set.
pub unsafe fn tanh<S: F32x>(s: S, x: S::V) -> S::V {
    unsafe {
        let ax = s.min(s.abs(x), s.splat(10.0));
        let e = exp(s, s.add(ax, ax));
        let big = s.sub(s.splat(1.0), s.div(s.splat(2.0), s.add(e, s.splat(1.0))));
        let z = s.mul(x, x);
        let mut p = s.splat(-5.704_988_7e-3);
        p = s.fma(p, z, s.splat(2.063_908_9e-2));
        p = s.fma(p, z, s.splat(-5.373_971_6e-2));
        p = s.fma(p, z, s.splat(1.333_144_2e-1));
        p = s.fma(p, z, s.splat(-3.333_328_2e-1));
        let small = s.fma(s.mul(p, z), x, x);
        s.select_lt(ax, s.splat(0.625), small, s.copysign(big, x))
    }
}

/// `erf(x)`: the rational approximation used by Eigen and XLA (odd degree-13 numerator over
/// even degree-8 denominator on [-4, 4]; |erf(x)| rounds to 1 in f32 beyond).
#[inline(always)]
#[allow(clippy::excessive_precision)]
///
/// # Safety
/// None beyond [`F32x`]'s: the token proves the instruction set.
pub unsafe fn erf<S: F32x>(s: S, x: S::V) -> S::V {
    unsafe {
        let x = s.min(s.max(x, s.splat(-4.0)), s.splat(4.0));
        let x2 = s.mul(x, x);
        let mut p = s.splat(-2.726_142_258_013_06e-10);
        p = s.fma(x2, p, s.splat(2.770_681_424_959_02e-8));
        p = s.fma(x2, p, s.splat(-2.101_024_020_825_08e-6));
        p = s.fma(x2, p, s.splat(-5.692_506_394_623_46e-5));
        p = s.fma(x2, p, s.splat(-7.349_906_303_268_55e-4));
        p = s.fma(x2, p, s.splat(-2.954_599_808_540_25e-3));
        p = s.fma(x2, p, s.splat(-1.609_603_332_624_15e-2));
        p = s.mul(x, p);
        let mut q = s.splat(-1.456_607_184_649_96e-5);
        q = s.fma(x2, q, s.splat(-2.133_740_552_789_05e-4));
        q = s.fma(x2, q, s.splat(-1.682_826_974_382_03e-3));
        q = s.fma(x2, q, s.splat(-7.373_329_167_204_68e-3));
        q = s.fma(x2, q, s.splat(-1.426_473_905_141_89e-2));
        s.div(p, q)
    }
}

/// GELU with the exact error function: `x/2 · (1 + erf(x/√2))` (Burn's `gelu`).
#[inline(always)]
///
/// # Safety
/// None beyond [`F32x`]'s: the token proves the instruction set.
pub unsafe fn gelu<S: F32x>(s: S, x: S::V) -> S::V {
    unsafe {
        let e = erf(s, s.mul(x, s.splat(std::f32::consts::FRAC_1_SQRT_2)));
        s.mul(s.mul(x, s.splat(0.5)), s.add(s.splat(1.0), e))
    }
}

/// `n` rounds of `A` independent FMA chains; returns a value so the work is not removed.
#[inline(always)]
unsafe fn fma_chains<S: F32x, const A: usize>(s: S, n: usize) -> f32 {
    unsafe {
        let mut acc = [s.splat(0.0); A];
        let (x, y) = (s.splat(0.999_999), s.splat(1e-7));
        for _ in 0..n {
            for a in acc.iter_mut() {
                *a = s.fma(*a, x, y);
            }
        }
        let mut t = s.zero();
        for a in acc {
            t = s.add(t, a);
        }
        let mut o = [0f32; 16];
        s.store(o.as_mut_ptr(), t);
        o[0]
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn peak_avx512(t: Avx512, n: usize) -> f32 {
    unsafe { fma_chains::<Avx512, 24>(t, n) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn peak_avx2(t: Avx2, n: usize) -> f32 {
    unsafe { fma_chains::<Avx2, 12>(t, n) }
}

/// One core's f32 FMA throughput in GFLOP/s, measured for about `time` on every vector width
/// this CPU has (the widest is not always the fastest: some cores have a single 512-bit FMA
/// port but two 256-bit ones), the best of them.
pub fn measure_peak_gflops(time: std::time::Duration) -> f64 {
    // (lanes, independent chains, kernel)
    type Candidate = Box<dyn Fn(usize) -> f32>;
    let mut candidates: Vec<(usize, usize, Candidate)> = vec![(
        8,
        8,
        Box::new(|n| unsafe { fma_chains::<Portable, 8>(Portable, n) }),
    )];
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY (both): the token proves the instructions exist on this CPU.
        if let Some(t) = Avx2::new() {
            candidates.push((8, 12, Box::new(move |n| unsafe { peak_avx2(t, n) })));
        }
        if let Some(t) = Avx512::new() {
            candidates.push((16, 24, Box::new(move |n| unsafe { peak_avx512(t, n) })));
        }
    }
    candidates
        .into_iter()
        .map(|(lanes, chains, run)| {
            let mut n = 1000;
            loop {
                let t = std::time::Instant::now();
                std::hint::black_box(run(std::hint::black_box(n)));
                let dt = t.elapsed();
                if dt >= time || n > 1 << 30 {
                    return (n * chains * lanes * 2) as f64 / dt.as_secs_f64() / 1e9;
                }
                n *= 2;
            }
        })
        .fold(0.0, f64::max)
}
