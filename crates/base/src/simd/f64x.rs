//! f64 vectors ([`F64s`]) for the MVN estimator's Genz kernel: AVX-512F (8 lanes), AVX2+FMA
//! (4 lanes) and plain `f64` (1 lane, the portable fallback), with `exp` and the
//! mantissa/exponent split by range reduction and polynomials (no libm calls). Divisions go
//! through [`F64s::recip`]: on AVX-512 `vrcp14pd` and two Newton steps (2⁻¹⁴ → 2⁻⁵⁶), a
//! quarter of a `vdivpd`; elsewhere a true division.

// The published coefficients are kept digit for digit.
#![allow(clippy::excessive_precision)]

use super::Portable;

/// A vector of f64 lanes. A value can be made only from the CPU token of its instruction set
/// ([`F64s::splat`], [`F64s::load`]); every other operation starts from an existing value, so
/// holding a value proves the CPU runs its instructions and the methods are safe.
#[allow(missing_docs)] // one method per vector instruction, named after what it computes
pub trait F64s: Copy {
    /// Lanes per vector.
    const LANES: usize;
    /// A lane mask.
    type M: Copy;
    /// The CPU token that proves this vector's instructions exist.
    type Token: Copy;

    /// `x` in every lane.
    fn splat(t: Self::Token, x: f64) -> Self;
    /// Loads `LANES` values from `s[0..LANES]`.
    fn load(t: Self::Token, s: &[f64]) -> Self;
    /// The token this value was made with.
    fn token(self) -> Self::Token;
    /// Stores `LANES` values into `s[0..LANES]`.
    fn store(self, s: &mut [f64]);
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// self·a + b.
    fn fma(self, a: Self, b: Self) -> Self;
    /// 1/self to about 1 ulp.
    fn recip(self) -> Self;
    fn sqrt(self) -> Self;
    fn min(self, o: Self) -> Self;
    fn max(self, o: Self) -> Self;
    fn abs(self) -> Self;
    fn neg(self) -> Self;
    fn lt(self, o: Self) -> Self::M;
    fn le(self, o: Self) -> Self::M;
    fn gt(self, o: Self) -> Self::M;
    fn ge(self, o: Self) -> Self::M;
    fn and(a: Self::M, b: Self::M) -> Self::M;
    fn any(m: Self::M) -> bool;
    /// The mask as bits, lane i in bit i.
    fn bits(m: Self::M) -> u32;
    /// `m ? a : b` per lane.
    fn select(m: Self::M, a: Self, b: Self) -> Self;
    /// e^x for x in [−708, 0] (smaller x are clamped to −708).
    fn exp_neg(self) -> Self;
    /// (m, e) with self = m·2^e, m in [0.70, 1.5), for positive normal self.
    fn split_exp(self) -> (Self, Self);
    /// Sum of the lanes.
    fn hsum(self) -> f64;
}

/// log2(e).
pub const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// ln 2 split so that n·LN2_HI is exact for |n| < 2^11.
pub const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-1;
/// The low part of ln 2 (see [`LN2_HI`]).
pub const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
/// 1.5 · 2^52: adding it rounds to an integer held in the low mantissa bits.
pub const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;
/// 1/k! for k = 0..=12, the Taylor coefficients of e^r on |r| ≤ ln2/2.
pub const EXP_TAYLOR: [f64; 13] = [
    1.0,
    1.0,
    0.5,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
    1.0 / 39_916_800.0,
    1.0 / 479_001_600.0,
];
/// Polynomials at U vectors at once, interleaved so that U independent chains hide the
/// latency of the fused multiply-adds.
#[inline(always)]
pub fn horner_n<V: F64s, const N: usize, const U: usize>(c: &[f64; N], x: &[V; U]) -> [V; U] {
    let tk = x[0].token();
    let mut acc = [V::splat(tk, c[N - 1]); U];
    let mut i = N - 1;
    while i > 0 {
        i -= 1;
        let ci = V::splat(tk, c[i]);
        for k in 0..U {
            acc[k] = acc[k].fma(x[k], ci);
        }
    }
    acc
}

/// e^r for |r| ≤ ln2/2 (Taylor to degree 12), used by the `exp_neg` implementations.
#[inline(always)]
pub fn exp_reduced<V: F64s>(r: V) -> V {
    horner_n(&EXP_TAYLOR, &[r])[0]
}

// ---------------------------------------------------------------------------------------------
// Plain f64: the portable fallback.
// ---------------------------------------------------------------------------------------------

impl F64s for f64 {
    const LANES: usize = 1;
    type M = bool;
    type Token = Portable;

    #[inline(always)]
    fn splat(_: Portable, x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn load(_: Portable, s: &[f64]) -> Self {
        s[0]
    }
    #[inline(always)]
    fn token(self) -> Portable {
        Portable
    }
    #[inline(always)]
    fn store(self, s: &mut [f64]) {
        s[0] = self;
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn fma(self, a: Self, b: Self) -> Self {
        self * a + b
    }
    #[inline(always)]
    fn recip(self) -> Self {
        1.0 / self
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        f64::min(self, o)
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        f64::max(self, o)
    }
    #[inline(always)]
    fn abs(self) -> Self {
        f64::abs(self)
    }
    #[inline(always)]
    fn neg(self) -> Self {
        -self
    }
    #[inline(always)]
    fn lt(self, o: Self) -> bool {
        self < o
    }
    #[inline(always)]
    fn le(self, o: Self) -> bool {
        self <= o
    }
    #[inline(always)]
    fn gt(self, o: Self) -> bool {
        self > o
    }
    #[inline(always)]
    fn ge(self, o: Self) -> bool {
        self >= o
    }
    #[inline(always)]
    fn and(a: bool, b: bool) -> bool {
        a & b
    }
    #[inline(always)]
    fn any(m: bool) -> bool {
        m
    }
    #[inline(always)]
    fn bits(m: bool) -> u32 {
        m as u32
    }
    #[inline(always)]
    fn select(m: bool, a: Self, b: Self) -> Self {
        if m { a } else { b }
    }
    #[inline(always)]
    fn exp_neg(self) -> Self {
        let x = self.max(-708.0);
        let shifted = x * LOG2_E + ROUND_MAGIC;
        let n = shifted - ROUND_MAGIC;
        let r = (-n).fma(LN2_LO, (-n).fma(LN2_HI, x));
        let n_int = (shifted.to_bits() as i64).wrapping_sub(ROUND_MAGIC.to_bits() as i64);
        exp_reduced(r) * f64::from_bits(((n_int + 1023) as u64) << 52)
    }
    #[inline(always)]
    fn split_exp(self) -> (Self, Self) {
        let bits = self.to_bits();
        let e = ((bits >> 52) & 0x7ff) as f64 - 1023.0;
        let m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
        if m > std::f64::consts::SQRT_2 {
            (m * 0.5, e + 1.0)
        } else {
            (m, e)
        }
    }
    #[inline(always)]
    fn hsum(self) -> f64 {
        self
    }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA: 4 lanes.
// ---------------------------------------------------------------------------------------------

/// The AVX2+FMA vector of four f64 lanes.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use super::*;
    use crate::simd::Avx2;
    use std::arch::x86_64::*;

    /// Four f64 lanes in a `__m256d`. Made only from an [`Avx2`] token.
    #[derive(Clone, Copy)]
    #[repr(transparent)]
    pub struct V4(__m256d);

    // SAFETY (all methods): a `V4` is made only by `splat`/`load`, which take an `Avx2` token,
    // and a token exists only when run-time detection found AVX2 and FMA. The methods are
    // inlined into `#[target_feature(enable = "avx2,fma")]` kernels for speed; correctness
    // does not depend on it. Loads and stores check the slice length first.
    impl F64s for V4 {
        const LANES: usize = 4;
        type M = __m256d;
        type Token = Avx2;

        #[inline(always)]
        fn splat(_: Avx2, x: f64) -> Self {
            unsafe { V4(_mm256_set1_pd(x)) }
        }
        #[inline(always)]
        fn token(self) -> Avx2 {
            // A `V4` exists only if `splat` or `load` was given the token.
            Avx2 { _proof: () }
        }
        #[inline(always)]
        fn load(_: Avx2, s: &[f64]) -> Self {
            assert!(s.len() >= 4);
            unsafe { V4(_mm256_loadu_pd(s.as_ptr())) }
        }
        #[inline(always)]
        fn store(self, s: &mut [f64]) {
            assert!(s.len() >= 4);
            unsafe { _mm256_storeu_pd(s.as_mut_ptr(), self.0) }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            unsafe { V4(_mm256_add_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            unsafe { V4(_mm256_sub_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            unsafe { V4(_mm256_mul_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn fma(self, a: Self, b: Self) -> Self {
            unsafe { V4(_mm256_fmadd_pd(self.0, a.0, b.0)) }
        }
        #[inline(always)]
        fn recip(self) -> Self {
            unsafe { V4(_mm256_div_pd(_mm256_set1_pd(1.0), self.0)) }
        }
        #[inline(always)]
        fn sqrt(self) -> Self {
            unsafe { V4(_mm256_sqrt_pd(self.0)) }
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            unsafe { V4(_mm256_min_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            unsafe { V4(_mm256_max_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn abs(self) -> Self {
            unsafe { V4(_mm256_andnot_pd(_mm256_set1_pd(-0.0), self.0)) }
        }
        #[inline(always)]
        fn neg(self) -> Self {
            unsafe { V4(_mm256_xor_pd(_mm256_set1_pd(-0.0), self.0)) }
        }
        #[inline(always)]
        fn lt(self, o: Self) -> __m256d {
            unsafe { _mm256_cmp_pd::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn le(self, o: Self) -> __m256d {
            unsafe { _mm256_cmp_pd::<_CMP_LE_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn gt(self, o: Self) -> __m256d {
            unsafe { _mm256_cmp_pd::<_CMP_GT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn ge(self, o: Self) -> __m256d {
            unsafe { _mm256_cmp_pd::<_CMP_GE_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn and(a: __m256d, b: __m256d) -> __m256d {
            unsafe { _mm256_and_pd(a, b) }
        }
        #[inline(always)]
        fn any(m: __m256d) -> bool {
            unsafe { _mm256_movemask_pd(m) != 0 }
        }
        #[inline(always)]
        fn bits(m: __m256d) -> u32 {
            unsafe { _mm256_movemask_pd(m) as u32 }
        }
        #[inline(always)]
        fn select(m: __m256d, a: Self, b: Self) -> Self {
            unsafe { V4(_mm256_blendv_pd(b.0, a.0, m)) }
        }
        #[inline(always)]
        fn exp_neg(self) -> Self {
            unsafe {
                let x = _mm256_max_pd(self.0, _mm256_set1_pd(-708.0));
                let magic = _mm256_set1_pd(ROUND_MAGIC);
                let shifted = _mm256_fmadd_pd(x, _mm256_set1_pd(LOG2_E), magic);
                let n = _mm256_sub_pd(shifted, magic);
                let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_HI), x);
                let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_LO), r);
                let p = exp_reduced(V4(r));
                let n_int =
                    _mm256_sub_epi64(_mm256_castpd_si256(shifted), _mm256_castpd_si256(magic));
                let scale =
                    _mm256_slli_epi64::<52>(_mm256_add_epi64(n_int, _mm256_set1_epi64x(1023)));
                V4(_mm256_mul_pd(p.0, _mm256_castsi256_pd(scale)))
            }
        }
        #[inline(always)]
        fn split_exp(self) -> (Self, Self) {
            unsafe {
                let bits = _mm256_castpd_si256(self.0);
                let exp_bits =
                    _mm256_and_si256(_mm256_srli_epi64::<52>(bits), _mm256_set1_epi64x(0x7ff));
                // 2^52 + k as a double holds k in its low bits.
                let e = _mm256_sub_pd(
                    _mm256_castsi256_pd(_mm256_or_si256(
                        exp_bits,
                        _mm256_set1_epi64x(0x4330_0000_0000_0000),
                    )),
                    _mm256_set1_pd(4_503_599_627_370_496.0 + 1023.0),
                );
                let mant = _mm256_castsi256_pd(_mm256_or_si256(
                    _mm256_and_si256(bits, _mm256_set1_epi64x(0x000f_ffff_ffff_ffff)),
                    _mm256_set1_epi64x(0x3ff0_0000_0000_0000),
                ));
                let big =
                    _mm256_cmp_pd::<_CMP_GT_OQ>(mant, _mm256_set1_pd(std::f64::consts::SQRT_2));
                let m = _mm256_blendv_pd(mant, _mm256_mul_pd(mant, _mm256_set1_pd(0.5)), big);
                let e = _mm256_add_pd(e, _mm256_and_pd(big, _mm256_set1_pd(1.0)));
                (V4(m), V4(e))
            }
        }
        #[inline(always)]
        fn hsum(self) -> f64 {
            let mut a = [0.0; 4];
            self.store(&mut a);
            (a[0] + a[1]) + (a[2] + a[3])
        }
    }
}

// ---------------------------------------------------------------------------------------------
// AVX-512F: 8 lanes.
// ---------------------------------------------------------------------------------------------

/// The AVX-512F vector of eight f64 lanes.
#[cfg(target_arch = "x86_64")]
pub mod avx512 {
    use super::*;
    use crate::simd::Avx512;
    use std::arch::x86_64::*;

    /// Eight f64 lanes in a `__m512d`. Made only from an [`Avx512`] token.
    #[derive(Clone, Copy)]
    #[repr(transparent)]
    pub struct V8(__m512d);

    // SAFETY (all methods): a `V8` is made only by `splat`/`load`, which take an `Avx512`
    // token, and a token exists only when run-time detection found AVX-512F. The methods are
    // inlined into `#[target_feature(enable = "avx512f")]` kernels for speed. Loads and stores
    // check the slice length first.
    impl F64s for V8 {
        const LANES: usize = 8;
        type M = __mmask8;
        type Token = Avx512;

        #[inline(always)]
        fn splat(_: Avx512, x: f64) -> Self {
            unsafe { V8(_mm512_set1_pd(x)) }
        }
        #[inline(always)]
        fn token(self) -> Avx512 {
            // A `V8` exists only if `splat` or `load` was given the token.
            Avx512 { _proof: () }
        }
        #[inline(always)]
        fn load(_: Avx512, s: &[f64]) -> Self {
            assert!(s.len() >= 8);
            unsafe { V8(_mm512_loadu_pd(s.as_ptr())) }
        }
        #[inline(always)]
        fn store(self, s: &mut [f64]) {
            assert!(s.len() >= 8);
            unsafe { _mm512_storeu_pd(s.as_mut_ptr(), self.0) }
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            unsafe { V8(_mm512_add_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            unsafe { V8(_mm512_sub_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            unsafe { V8(_mm512_mul_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn fma(self, a: Self, b: Self) -> Self {
            unsafe { V8(_mm512_fmadd_pd(self.0, a.0, b.0)) }
        }
        #[inline(always)]
        fn recip(self) -> Self {
            unsafe {
                // 14-bit estimate, two Newton steps: r ← r + r(1 − x r).
                let one = _mm512_set1_pd(1.0);
                let mut r = _mm512_rcp14_pd(self.0);
                let e = _mm512_fnmadd_pd(self.0, r, one);
                r = _mm512_fmadd_pd(r, e, r);
                let e = _mm512_fnmadd_pd(self.0, r, one);
                V8(_mm512_fmadd_pd(r, e, r))
            }
        }
        #[inline(always)]
        fn sqrt(self) -> Self {
            unsafe {
                // √x = x·(1/√x): 14-bit estimate, then two Goldschmidt steps on
                // (s, h) = (x·y, y/2), each squaring the relative error.
                let y = _mm512_rsqrt14_pd(self.0);
                let half = _mm512_set1_pd(0.5);
                let mut s = _mm512_mul_pd(self.0, y);
                let mut h = _mm512_mul_pd(y, half);
                let r = _mm512_fnmadd_pd(s, h, half);
                s = _mm512_fmadd_pd(s, r, s);
                h = _mm512_fmadd_pd(h, r, h);
                let r = _mm512_fnmadd_pd(s, h, half);
                s = _mm512_fmadd_pd(s, r, s);
                // A last Newton step on s itself for a correctly rounded-ish result.
                let e = _mm512_fnmadd_pd(s, s, self.0);
                h = _mm512_fmadd_pd(h, r, h);
                V8(_mm512_fmadd_pd(e, h, s))
            }
        }
        #[inline(always)]
        fn min(self, o: Self) -> Self {
            unsafe { V8(_mm512_min_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn max(self, o: Self) -> Self {
            unsafe { V8(_mm512_max_pd(self.0, o.0)) }
        }
        #[inline(always)]
        fn abs(self) -> Self {
            unsafe { V8(_mm512_abs_pd(self.0)) }
        }
        #[inline(always)]
        fn neg(self) -> Self {
            unsafe {
                V8(_mm512_castsi512_pd(_mm512_xor_si512(
                    _mm512_castpd_si512(self.0),
                    _mm512_set1_epi64(i64::MIN),
                )))
            }
        }
        #[inline(always)]
        fn lt(self, o: Self) -> __mmask8 {
            unsafe { _mm512_cmp_pd_mask::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn le(self, o: Self) -> __mmask8 {
            unsafe { _mm512_cmp_pd_mask::<_CMP_LE_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn gt(self, o: Self) -> __mmask8 {
            unsafe { _mm512_cmp_pd_mask::<_CMP_GT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn ge(self, o: Self) -> __mmask8 {
            unsafe { _mm512_cmp_pd_mask::<_CMP_GE_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn and(a: __mmask8, b: __mmask8) -> __mmask8 {
            a & b
        }
        #[inline(always)]
        fn any(m: __mmask8) -> bool {
            m != 0
        }
        #[inline(always)]
        fn bits(m: __mmask8) -> u32 {
            m as u32
        }
        #[inline(always)]
        fn select(m: __mmask8, a: Self, b: Self) -> Self {
            unsafe { V8(_mm512_mask_blend_pd(m, b.0, a.0)) }
        }
        #[inline(always)]
        fn exp_neg(self) -> Self {
            unsafe {
                let x = _mm512_max_pd(self.0, _mm512_set1_pd(-708.0));
                let n = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_mul_pd(x, _mm512_set1_pd(LOG2_E)),
                );
                let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_HI), x);
                let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_LO), r);
                let p = exp_reduced(V8(r));
                V8(_mm512_scalef_pd(p.0, n))
            }
        }
        #[inline(always)]
        fn split_exp(self) -> (Self, Self) {
            unsafe {
                // Mantissa in [0.75, 1.5); the exponent moves up by one when it was halved.
                let m = _mm512_getmant_pd::<_MM_MANT_NORM_P75_1P5, _MM_MANT_SIGN_SRC>(self.0);
                let e = _mm512_getexp_pd(self.0);
                let halved = _mm512_cmp_pd_mask::<_CMP_LT_OQ>(m, _mm512_set1_pd(1.0));
                let e = _mm512_mask_add_pd(e, halved, e, _mm512_set1_pd(1.0));
                (V8(m), V8(e))
            }
        }
        #[inline(always)]
        fn hsum(self) -> f64 {
            unsafe { _mm512_reduce_add_pd(self.0) }
        }
    }
}
