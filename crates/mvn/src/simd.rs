//! Φ and Φ⁻¹ for the Genz kernel, written once over kiln's f64 vectors
//! ([`kiln_base::simd::F64s`]: AVX-512F, AVX2+FMA, plain `f64`).
//!
//! The functions are the same approximations as the scalar ones in [`super::normal`] (Hart's
//! rational for Φ, Wichura's AS 241 for Φ⁻¹), rearranged for vectors:
//! * no branches per lane: both branches of a piecewise formula are computed and blended,
//!   and a rare branch (Φ beyond |x| = 7.07, Φ⁻¹ below p = 1.4e−11) only when a lane needs it,
//!   on the same vector path (every function here is `#[inline(always)]`, so that it is
//!   compiled with its caller's instruction set; see `far_tail`);
//! * `exp` and `ln` by range reduction and a polynomial (no libm calls);
//! * divisions by a reciprocal: on AVX-512 `vrcp14pd` and two Newton steps (2⁻¹⁴ → 2⁻⁵⁶),
//!   which costs a quarter of a `vdivpd`; elsewhere a true division.
//!
//! Every function agrees with its scalar counterpart to about 1e−15 relative (tested below
//! on every implementation the CPU supports).

// The published coefficients are kept digit for digit.
#![allow(clippy::excessive_precision)]

use super::normal::{
    AS241_A, AS241_B, AS241_C, AS241_D, AS241_E, AS241_F, AS241_SPLIT1, AS241_SPLIT2, HART_CUTOFF,
    HART_P, HART_Q, HART_SPLIT, INV_SQRT_2PI,
};
use kiln_base::simd::F64s;
use kiln_base::simd::f64x::{LN2_HI, LN2_LO, ROUND_MAGIC, horner_n};

/// 2/(2k+1) for k = 0..=11: ln(m) = Σ 2 s^(2k+1)/(2k+1), s = (m−1)/(m+1), |s| ≤ 0.2.
const LOG_ATANH: [f64; 12] = [
    2.0,
    2.0 / 3.0,
    2.0 / 5.0,
    2.0 / 7.0,
    2.0 / 9.0,
    2.0 / 11.0,
    2.0 / 13.0,
    2.0 / 15.0,
    2.0 / 17.0,
    2.0 / 19.0,
    2.0 / 21.0,
    2.0 / 23.0,
];

/// An all-false mask.
#[inline(always)]
fn no<V: F64s>(tk: V::Token) -> V::M {
    let z = V::splat(tk, 0.0);
    V::lt(z, z)
}

/// Φ(−z) for z ≥ 0 (0 beyond 37.5), for U vectors: relative error about 1e−15 (1e−14 beyond
/// |z| = 7.07).
#[inline(always)]
pub(crate) fn norm_tail<V: F64s, const U: usize>(z: [V; U]) -> [V; U] {
    let tk = z[0].token();
    let zero = V::splat(tk, 0.0);
    norm_tail_where(z, [V::ge(zero, zero); U])
}

/// Φ(−z) for z ≥ 0 as [`norm_tail`], to full relative precision only in the lanes of
/// `relative`: elsewhere, beyond |z| = 7.07, Hart's rational is used past its range (relative
/// error ≤ 3.6e−6 there, measured against SciPy's `ndtr` on z ∈ [7, 38]), which is exact for a
/// caller that wants 1 − Φ(−z): Φ(−7.07) < 7.8e−13, so the difference is below half an ulp of 1
/// and 1 − Φ(−z) rounds to the same double.
#[inline(always)]
fn norm_tail_where<V: F64s, const U: usize>(z: [V; U], relative: [V::M; U]) -> [V; U] {
    let tk = z[0].token();
    let mut zc = z;
    let mut far = [no::<V>(tk); U];
    let mut far_lanes = 0;
    for k in 0..U {
        zc[k] = z[k].min(V::splat(tk, HART_CUTOFF));
        far[k] = V::and(V::ge(zc[k], V::splat(tk, HART_SPLIT)), relative[k]);
        far_lanes += V::bits(far[k]).count_ones() as usize;
    }
    if far_lanes == U * V::LANES {
        // Every lane beyond 7.07 (e.g. a coordinate whose limit is many conditional standard
        // deviations away at every point): the continued fraction only, not Hart's rational
        // as well — the same values at half the cost.
        let mut tail = z;
        for k in 0..U {
            let cutoff = V::ge(z[k], V::splat(tk, HART_CUTOFF));
            tail[k] = V::select(cutoff, V::splat(tk, 0.0), far_tail(zc[k]));
        }
        return tail;
    }
    let mut e = z;
    for k in 0..U {
        e[k] = zc[k].mul(zc[k]).mul(V::splat(tk, -0.5)).exp_neg();
    }
    let p = horner_n(&HART_P, &zc);
    let q = horner_n(&HART_Q, &zc);
    let mut tail = e;
    for k in 0..U {
        tail[k] = e[k].mul(p[k]).mul(q[k].recip());
    }
    if far_lanes > 0 {
        for k in 0..U {
            if V::any(far[k]) {
                let cutoff = V::ge(z[k], V::splat(tk, HART_CUTOFF));
                tail[k] = V::select(far[k], far_tail(zc[k]), tail[k]);
                tail[k] = V::select(cutoff, V::splat(tk, 0.0), tail[k]);
            }
        }
    }
    tail
}

/// Φ(−z) for z ≥ 7.07 by Laplace's continued fraction φ(z)/(z + 1/(z + 2/(z + …))), 16 levels,
/// evaluated forward as a ratio of convergents (one division). exp(−z²/2) is split as
/// exp(−h²/2)·exp(−(z−h)(z+h)/2) with h = z rounded to 1/16, whose square is exact, so the
/// rounding of z² does not cost relative precision.
///
/// Inlined on purpose: a separate (generic) function does not inherit its caller's
/// `target_feature`s, so every AVX-512/AVX2 intrinsic in it became a real call passing vectors
/// through memory, and a block where one lane had |x| ≥ 7.07 cost 10–30× a plain one (issue
/// 11: `perf` put 89% of the slow queries' time here and in the intrinsics it called).
#[inline(always)]
fn far_tail<V: F64s>(z: V) -> V {
    let tk = z.token();
    let magic = V::splat(tk, ROUND_MAGIC);
    let h = z
        .fma(V::splat(tk, 16.0), magic)
        .sub(magic)
        .mul(V::splat(tk, 1.0 / 16.0));
    let e = h
        .mul(h)
        .mul(V::splat(tk, -0.5))
        .exp_neg()
        .mul(z.sub(h).mul(z.add(h)).mul(V::splat(tk, -0.5)).exp_neg());
    // K = b0 + a1/(b1 + a2/(b2 + …)), b_k = z, a_k = k: A_k = z A_{k−1} + k A_{k−2}, same for B.
    let (mut a_prev, mut a) = (V::splat(tk, 1.0), z);
    let (mut b_prev, mut b) = (V::splat(tk, 0.0), V::splat(tk, 1.0));
    for k in 1..=16 {
        let kk = V::splat(tk, k as f64);
        let a_next = z.fma(a, kk.mul(a_prev));
        let b_next = z.fma(b, kk.mul(b_prev));
        a_prev = a;
        a = a_next;
        b_prev = b;
        b = b_next;
        if k % 8 == 0 {
            // Rescale: the convergents grow like z^k.
            let s = a.recip();
            a_prev = a_prev.mul(s);
            b_prev = b_prev.mul(s);
            b = b.mul(s);
            a = V::splat(tk, 1.0);
        }
    }
    // Φ(−z) = φ(z)/K = e/√(2π) · B/A.
    e.mul(V::splat(tk, INV_SQRT_2PI)).mul(b).mul(a.recip())
}

/// Φ(x) for U vectors (x not NaN; ±∞ fine).
#[inline(always)]
pub(crate) fn norm_cdf<V: F64s, const U: usize>(x: [V; U]) -> [V; U] {
    let tk = x[0].token();
    let mut z = x;
    let mut lower = [no::<V>(tk); U];
    for k in 0..U {
        z[k] = x[k].abs();
        lower[k] = V::lt(x[k], V::splat(tk, 0.0));
    }
    // Φ(x) = Φ(−|x|) below 0 (relative precision matters), 1 − Φ(−|x|) above.
    let mut t = norm_tail_where(z, lower);
    for k in 0..U {
        t[k] = V::select(lower[k], t[k], V::splat(tk, 1.0).sub(t[k]));
    }
    t
}

/// Natural log of U vectors of t in [2.2e−308, 1] (about 1 ulp).
#[inline(always)]
pub(crate) fn ln<V: F64s, const U: usize>(t: [V; U]) -> [V; U] {
    let tk = t[0].token();
    let one = V::splat(tk, 1.0);
    let mut e = t;
    let mut s = t;
    let mut z = t;
    for k in 0..U {
        let (m, ek) = t[k].split_exp();
        e[k] = ek;
        s[k] = m.sub(one).mul(m.add(one).recip());
        z[k] = s[k].mul(s[k]);
    }
    let h = horner_n(&LOG_ATANH, &z);
    let mut out = t;
    for k in 0..U {
        let log_m = s[k].mul(h[k]);
        out[k] = e[k].fma(V::splat(tk, LN2_HI), e[k].fma(V::splat(tk, LN2_LO), log_m));
    }
    out
}

/// Φ⁻¹(p) for U vectors of p in [0, 1]; 0 and 1 give about ∓37.5 (p is clamped to
/// [1e−300, 1 − 1e−300]).
///
/// AS 241 has a central formula (|p − ½| ≤ 0.425) and a tail one that needs a logarithm, a
/// square root and two more rational functions, about twice the work. In the Genz kernel
/// nearly every vector has a lane or two in the tails (15% of uniform p), so computing the tail
/// formula on whole vectors costs it on every lane. Instead the tail lanes are packed densely
/// (their p gathered through a small buffer), the tail formula runs on those few vectors, and
/// the results are put back in place: with 64 points about 10 lanes, two vectors instead of
/// eight. When more than half the lanes are in the tails (a limit far in a tail) the whole
/// vectors go through both formulas as before. (Also tried: packing the central lanes when the
/// tails dominate, and skipping the central formula when every lane is in a tail — no
/// measurable gain on the realistic families, so not kept.) Every lane gets exactly the
/// formula it got before, so the answers are bit-identical.
#[inline(always)]
pub(crate) fn norm_ppf<V: F64s, const U: usize>(p: [V; U]) -> [V; U] {
    let tk = p[0].token();
    let mut tail_lane = [no::<V>(tk); U];
    let mut count = 0;
    for k in 0..U {
        let dev = p[k].sub(V::splat(tk, 0.5)).abs();
        tail_lane[k] = V::gt(dev, V::splat(tk, AS241_SPLIT1));
        count += V::bits(tail_lane[k]).count_ones() as usize;
    }
    let lanes = U * V::LANES;
    let center = ppf_center(p);
    if count == 0 {
        return center;
    }
    if V::LANES == 1 || lanes > PACK || 2 * count > lanes {
        let t = ppf_tail(p);
        let mut out = p;
        for k in 0..U {
            out[k] = V::select(tail_lane[k], t[k], center[k]);
        }
        return out;
    }
    packed_tail(p, tail_lane, center)
}

/// Lanes a packed call handles (the Genz kernel's group of points, [`super::normal::BLOCK`]).
const PACK: usize = 64;

/// `base` with the lanes in `mask` (at most half of U·LANES ≤ [`PACK`]) replaced by the tail
/// formula of their `p`: those p are gathered densely, the formula runs two vectors at a time,
/// and the results are scattered back.
#[inline(always)]
fn packed_tail<V: F64s, const U: usize>(p: [V; U], mask: [V::M; U], base: [V; U]) -> [V; U] {
    let tk = p[0].token();
    let mut all = [0.0; PACK];
    for k in 0..U {
        p[k].store(&mut all[k * V::LANES..]);
    }
    // Padding: a p in the tail, so every packed lane is valid.
    let mut dense = [0.01; PACK];
    let mut at = [0u8; PACK];
    let mut n = 0;
    for (k, &m) in mask.iter().enumerate() {
        let mut bits = V::bits(m);
        while bits != 0 {
            let j = k * V::LANES + bits.trailing_zeros() as usize;
            dense[n] = all[j];
            at[n] = j as u8;
            n += 1;
            bits &= bits - 1;
        }
    }
    // n ≤ U·LANES/2, so the pairs read at most PACK/2 + 2·LANES ≤ PACK lanes.
    let mut res = [0.0; PACK];
    let mut c = 0;
    while c < n {
        let x = [
            V::load(tk, &dense[c..]),
            V::load(tk, &dense[c + V::LANES..]),
        ];
        let v = ppf_tail(x);
        v[0].store(&mut res[c..]);
        v[1].store(&mut res[c + V::LANES..]);
        c += 2 * V::LANES;
    }
    for k in 0..U {
        base[k].store(&mut all[k * V::LANES..]);
    }
    for (&j, &r) in at[..n].iter().zip(&res[..n]) {
        all[j as usize] = r;
    }
    let mut out = p;
    for k in 0..U {
        out[k] = V::load(tk, &all[k * V::LANES..]);
    }
    out
}

/// AS 241's central formula for U vectors of p (accurate for |p − ½| ≤ 0.425; other lanes
/// get a finite value that the caller discards).
#[inline(always)]
fn ppf_center<V: F64s, const U: usize>(p: [V; U]) -> [V; U] {
    let tk = p[0].token();
    let mut q = p;
    let mut r = p;
    for k in 0..U {
        q[k] = p[k].sub(V::splat(tk, 0.5));
        r[k] = V::splat(tk, 0.180625).sub(q[k].mul(q[k]));
    }
    let a = horner_n(&AS241_A, &r);
    let b = horner_n(&AS241_B, &r);
    let mut out = p;
    for k in 0..U {
        out[k] = q[k].mul(a[k]).mul(b[k].recip());
    }
    out
}

/// AS 241's tail formulas for U vectors of p (every lane treated as a tail lane: |p − ½| > 0.425
/// gives the documented accuracy; other lanes get a finite value that the caller discards).
#[inline(always)]
fn ppf_tail<V: F64s, const U: usize>(p: [V; U]) -> [V; U] {
    let tk = p[0].token();
    let one = V::splat(tk, 1.0);
    let half = V::splat(tk, 0.5);
    let mut t = p;
    for k in 0..U {
        t[k] = p[k].min(one.sub(p[k])).max(V::splat(tk, 1e-300));
    }
    let lt = ln(t);
    let mut rr = p;
    let mut r1 = p;
    for k in 0..U {
        rr[k] = lt[k].neg().sqrt();
        r1[k] = rr[k].sub(V::splat(tk, 1.6));
    }
    let c = horner_n(&AS241_C, &r1);
    let d = horner_n(&AS241_D, &r1);
    let mut v = p;
    let mut far = [no::<V>(tk); U];
    let mut any_far = false;
    for k in 0..U {
        v[k] = c[k].mul(d[k].recip());
        far[k] = V::gt(rr[k], V::splat(tk, AS241_SPLIT2));
        any_far |= V::any(far[k]);
    }
    if any_far {
        let mut r2 = p;
        for k in 0..U {
            r2[k] = rr[k].sub(V::splat(tk, AS241_SPLIT2));
        }
        let e = horner_n(&AS241_E, &r2);
        let f = horner_n(&AS241_F, &r2);
        for k in 0..U {
            v[k] = V::select(far[k], e[k].mul(f[k].recip()), v[k]);
        }
    }
    for k in 0..U {
        v[k] = V::select(V::lt(p[k], half), v[k].neg(), v[k]);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normal::{norm_cdf as cdf1, norm_ppf as ppf1};

    /// Applies `f` to `xs` in vectors of `V` (the tail that does not fill a vector is padded
    /// with `pad`).
    fn map<V: F64s>(tk: V::Token, xs: &[f64], pad: f64, f: impl Fn([V; 3]) -> [V; 3]) -> Vec<f64> {
        let l = V::LANES;
        let mut out = vec![0.0; xs.len().div_ceil(3 * l) * 3 * l];
        let mut buf = vec![pad; out.len()];
        buf[..xs.len()].copy_from_slice(xs);
        for (i, o) in out.chunks_mut(3 * l).enumerate() {
            let b = &buf[i * 3 * l..];
            let y = f([
                V::load(tk, b),
                V::load(tk, &b[l..]),
                V::load(tk, &b[2 * l..]),
            ]);
            for (k, yk) in y.iter().enumerate() {
                yk.store(&mut o[k * l..]);
            }
        }
        out.truncate(xs.len());
        out
    }

    fn check_all<V: F64s>(tk: V::Token) {
        // Φ against the scalar function: relative in the lower tail.
        let xs: Vec<f64> = (0..12_000)
            .map(|k| -40.0 + k as f64 * 0.006_7)
            .chain((0..300).map(|k| 8.0 + 0.11 * k as f64))
            .chain([
                f64::NEG_INFINITY,
                f64::INFINITY,
                0.0,
                -7.071,
                -7.072,
                37.4,
                -37.6,
            ])
            .collect();
        let got = map::<V>(tk, &xs, 0.0, norm_cdf);
        for (x, g) in xs.iter().zip(&got) {
            let want = cdf1(*x);
            let tol = 2e-15 * want.min(1.0 - want).max(1e-300) + 1e-300;
            let tol = if *x < -7.0 {
                2e-14 * want
            } else {
                tol.max(2.3e-16)
            };
            assert!((g - want).abs() <= tol, "Φ({x}) = {g}, scalar {want}");
        }
        // Φ⁻¹ against the scalar function, over 320 decades in both tails.
        let mut ps = Vec::new();
        let mut lp = -320.0f64;
        while lp < 0.0 {
            let p = 10f64.powf(lp);
            ps.push(p);
            if p < 0.5 {
                ps.push(1.0 - p);
            }
            lp += 0.037;
        }
        ps.extend([0.0, 1.0, 0.5, 0.075, 0.925, 0.074_999, 1.4e-11, 1.3e-11]);
        let got = map::<V>(tk, &ps, 0.5, norm_ppf);
        for (p, g) in ps.iter().zip(&got) {
            if *p <= 0.0 || *p >= 1.0 {
                assert!(g.is_finite() && g.abs() > 8.0, "Φ⁻¹({p}) = {g}");
                continue;
            }
            let want = ppf1(p.max(1e-300));
            assert!(
                (g - want).abs() <= 2e-15 * want.abs().max(1.0),
                "Φ⁻¹({p}) = {g}, scalar {want}"
            );
        }
        // ln over the whole normal range, relative to libm's, and near its reduction points.
        let r = std::f64::consts::FRAC_1_SQRT_2;
        let ts: Vec<f64> = (0..3349)
            .map(|k| 10f64.powf(-307.0 + k as f64 * 0.0917))
            .filter(|t| *t <= 1.0)
            .chain([
                1.0,
                0.5,
                0.75,
                1.5 / 2.0,
                0.999_999_999,
                r,
                r + 1e-16,
                r - 1e-16,
            ])
            .collect();
        let got = map::<V>(tk, &ts, 1.0, ln);
        for (t, g) in ts.iter().zip(&got) {
            let want = t.ln();
            assert!(
                (g - want).abs() <= 1e-16 + 4e-16 * want.abs(),
                "ln({t}) = {g} vs {want}"
            );
        }
        // e^x on [−708, 0], relative to libm's.
        let xs: Vec<f64> = (0..9686).map(|k| -708.0 + k as f64 * 0.0731).collect();
        let got = map::<V>(tk, &xs, 0.0, |v: [V; 3]| {
            [v[0].exp_neg(), v[1].exp_neg(), v[2].exp_neg()]
        });
        for (x, g) in xs.iter().zip(&got) {
            let want = x.exp();
            assert!(
                ((g - want) / want).abs() < 4e-16,
                "exp({x}) = {g} vs {want}"
            );
        }
    }

    /// Φ⁻¹ on groups of 8 vectors (the kernel's shape) whose tail lanes are few, many or
    /// none, at random positions: the packed path and the whole-vector path must both give
    /// every lane the scalar function's value.
    fn check_packed<V: F64s>(tk: V::Token) {
        let mut rng = crate::rng::SplitMix64::new(41);
        let lanes = 8 * V::LANES;
        for round in 0..600 {
            // Tail share from 0 to 100% over the rounds; deep tails in some rounds.
            let share = (round % 21) as f64 / 20.0;
            let ps: Vec<f64> = (0..lanes)
                .map(|_| {
                    let u = rng.next_f64();
                    if rng.next_f64() < share {
                        let t = if round % 3 == 0 {
                            10f64.powf(-300.0 * u)
                        } else {
                            0.075 * u
                        };
                        if rng.next_f64() < 0.5 { t } else { 1.0 - t }
                    } else {
                        0.075 + 0.85 * u
                    }
                })
                .collect();
            let v: [V; 8] = std::array::from_fn(|k| V::load(tk, &ps[k * V::LANES..]));
            let got = norm_ppf(v);
            let mut out = vec![0.0; lanes];
            for (k, g) in got.iter().enumerate() {
                g.store(&mut out[k * V::LANES..]);
            }
            for (p, g) in ps.iter().zip(&out) {
                let want = ppf1(p.clamp(1e-300, 1.0));
                let ok = if *p >= 1.0 {
                    g.is_finite() && *g > 8.0
                } else {
                    (g - want).abs() <= 2e-15 * want.abs().max(1.0)
                };
                assert!(ok, "round {round}: Φ⁻¹({p}) = {g}, scalar {want}");
            }
        }
    }

    #[test]
    fn packed_tails_match_scalar_on_every_supported_isa() {
        check_packed::<f64>(kiln_base::simd::Portable);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = kiln_base::simd::Avx2::new() {
                // SAFETY: the token proves AVX2 and FMA.
                unsafe { avx2_packed(t) };
            }
            if let Some(t) = kiln_base::simd::Avx512::new() {
                // SAFETY: the token proves AVX-512F.
                unsafe { avx512_packed(t) };
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2_packed(t: kiln_base::simd::Avx2) {
        check_packed::<kiln_base::simd::f64x::avx2::V4>(t);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn avx512_packed(t: kiln_base::simd::Avx512) {
        check_packed::<kiln_base::simd::f64x::avx512::V8>(t);
    }

    #[test]
    fn vector_functions_match_scalar_on_every_supported_isa() {
        check_all::<f64>(kiln_base::simd::Portable);
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(t) = kiln_base::simd::Avx2::new() {
                // SAFETY: the token proves AVX2 and FMA.
                unsafe { avx2_check(t) };
            }
            if let Some(t) = kiln_base::simd::Avx512::new() {
                // SAFETY: the token proves AVX-512F.
                unsafe { avx512_check(t) };
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn avx2_check(t: kiln_base::simd::Avx2) {
        check_all::<kiln_base::simd::f64x::avx2::V4>(t);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn avx512_check(t: kiln_base::simd::Avx512) {
        check_all::<kiln_base::simd::f64x::avx512::V8>(t);
    }
}
