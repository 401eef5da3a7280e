//! Genz's separation-of-variables estimator on the CPU (Genz 1992, "Numerical computation of
//! multivariate normal probabilities"; Genz & Bretz 2009, §4.1).
//!
//! With L the pivoted Cholesky factor (see [`super::cholesky`]) and centred limits a, b in
//! pivot order, write X = L Y with Y standard normal. Then
//!
//! ```text
//! P(a ≤ X ≤ b) = ∫_{[0,1]^{d−1}} Π_i (e_i − d_i) dw,
//!   d_i = Φ((a_i − Σ_{j<i} L_ij y_j)/L_ii),  e_i = Φ((b_i − Σ_{j<i} L_ij y_j)/L_ii),
//!   y_j = Φ⁻¹(d_j + w_j (e_j − d_j)).
//! ```
//!
//! The integrand is smooth and bounded by 1, so quasi-Monte Carlo points integrate it with an
//! error close to O(1/n). A variable with zero residual variance (semi-definite covariance)
//! contributes the indicator a_i ≤ Σ L_ij y_j ≤ b_i instead of a Φ difference.
//!
//! Both limits of a coordinate are reflected to the lower half when the lower one is positive
//! (Φ(x) → 1 − Φ(−x), w → 1 − w): the same value, but Φ differences near 1 keep their digits.
//! One-sided limits (the common case: orthants, picks) cost one Φ per coordinate, not two.
//!
//! The kernel evaluates [`BLOCK`] points at a time, coordinate by coordinate, with branch-free
//! Φ and Φ⁻¹ (see [`super::normal`]), and is compiled twice: with AVX2+FMA (chosen at run time
//! when the CPU has them) and for the baseline target.

use super::bvn::bvn_box;
use super::cholesky::Factor;
use super::constants::HostConstants;
use super::normal::interval_mass;
use super::normal::{BLOCK, norm_cdf};
use super::simd::{norm_cdf as vcdf, norm_ppf as vppf, norm_tail as vtail};
#[cfg(target_arch = "x86_64")]
use kiln_base::simd::f64x::{avx2, avx512};
#[cfg(target_arch = "x86_64")]
use kiln_base::simd::{Avx2, Avx512};
use kiln_base::simd::{F64s, Kernel};

/// What the kernel needs of one factorised query.
#[derive(Debug, Clone)]
pub(crate) struct GenzQuery<'a> {
    f: &'a Factor,
    /// Number of Halton coordinates used (the y's that later rows need).
    int_dim: usize,
    /// Pivot 0 does not depend on the point: its (reflected) lower Φ, width and reflection.
    lo0: f64,
    wid0: f64,
    flip0: bool,
    /// Per pivot i ≥ 1, how its limits enter (the same for every point).
    kind: Vec<Limits>,
    /// Row i of L scaled by 1/L_ii for random pivots (unscaled for deterministic ones),
    /// the first min(i, int_dim) entries, packed row after row.
    coef: Vec<f64>,
    /// Start of row i in `coef`.
    row: Vec<usize>,
    /// Limits scaled by 1/L_ii for random pivots (raw for deterministic ones).
    sa: Vec<f64>,
    sb: Vec<f64>,
}

/// How the limits of a pivot enter the integrand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limits {
    /// (−∞, ∞): a factor 1.
    None,
    /// (−∞, b]: one Φ.
    Upper,
    /// [a, ∞): one Φ, reflected per point where a > s so that the width keeps its digits.
    Lower,
    /// [a, b]: two Φ, reflected per point where the lower limit is positive.
    Both,
    /// A deterministic pivot: the indicator a ≤ s ≤ b.
    Indicator,
}

/// The result for one query before it is combined across randomisations: either exact, or
/// in need of integration.
pub(crate) enum GenzPlan<'a> {
    /// No integration needed (d = 1, independent coordinates reduced to one pivot, all
    /// deterministic, or an empty box).
    Exact(f64),
    /// Integrate with the kernel.
    Integrate(GenzQuery<'a>),
}

/// Decides how to answer a factorised query; with `exact` (the adaptive mode), a query with
/// two random pivots (see [`super::bvn`]) or a one-factor covariance (see
/// [`super::factor1`]) is answered exactly.
pub(crate) fn plan(f: &Factor, exact: bool) -> GenzPlan<'_> {
    let d = f.d;
    if f.random == 0 {
        // X is the (zero) mean: inside iff a ≤ 0 ≤ b everywhere.
        let inside = (0..d).all(|i| f.a[i] <= 0.0 && 0.0 <= f.b[i]);
        return GenzPlan::Exact(if inside { 1.0 } else { 0.0 });
    }
    if exact
        && let Some((one, a, b)) = &f.one_factor
        && let Some((p, _)) = one.probability(a, b)
    {
        // A one-factor covariance: a one-dimensional integral, exact to rounding.
        return GenzPlan::Exact(p.clamp(0.0, 1.0));
    }
    let inv_diag: Vec<f64> = (0..f.random).map(|i| 1.0 / f.l[i * d + i]).collect();
    let xa = f.a[0] * inv_diag[0];
    let xb = f.b[0] * inv_diag[0];
    let flip0 = xa > 0.0;
    let lo0 = norm_cdf(if flip0 { -xb } else { xa });
    let wid0 = interval_mass(xa, xb);
    if wid0 <= 0.0 {
        return GenzPlan::Exact(0.0);
    }
    // Later rows need y_0 … y_{random−1} when deterministic pivots follow, else y_0 … y_{d−2}.
    let int_dim = if f.random < d { f.random } else { d - 1 };
    if int_dim == 0 {
        return GenzPlan::Exact(wid0.min(1.0));
    }
    if exact && d == 2 && f.random == 2 {
        // X = L Y: standard deviations L00 and |row 1|, correlation L10/|row 1|.
        let s1 = f.l[2].hypot(f.l[3]);
        let r = f.l[2] / s1;
        let p = bvn_box([xa, f.a[1] / s1], [xb, f.b[1] / s1], r);
        return GenzPlan::Exact(p);
    }
    // Independent coordinates: no row depends on an earlier y, the product is constant.
    let coupled = (1..d).any(|i| (0..i.min(f.random)).any(|k| f.l[i * d + k] != 0.0));
    if !coupled {
        let mut p = wid0;
        for (i, (&a, &b)) in f.a.iter().zip(&f.b).enumerate().skip(1) {
            if i < f.random {
                p *= interval_mass(a * inv_diag[i], b * inv_diag[i]);
            } else if !(a <= 0.0 && 0.0 <= b) {
                p = 0.0;
            }
        }
        return GenzPlan::Exact(p.clamp(0.0, 1.0));
    }
    let mut kind = vec![Limits::None; d];
    let mut coef = Vec::new();
    let mut row = vec![0; d + 1];
    let mut sa = vec![0.0; d];
    let mut sb = vec![0.0; d];
    for i in 1..d {
        row[i] = coef.len();
        let scale = if i < f.random { inv_diag[i] } else { 1.0 };
        coef.extend((0..i.min(int_dim)).map(|k| f.l[i * d + k] * scale));
        let (a, b) = (f.a[i], f.b[i]);
        sa[i] = a * scale;
        sb[i] = b * scale;
        kind[i] = if i >= f.random {
            Limits::Indicator
        } else {
            match (a == f64::NEG_INFINITY, b == f64::INFINITY) {
                (true, true) => Limits::None,
                (true, false) => Limits::Upper,
                (false, true) => Limits::Lower,
                (false, false) => Limits::Both,
            }
        };
    }
    row[d] = coef.len();
    GenzPlan::Integrate(GenzQuery {
        f,
        int_dim,
        lo0,
        wid0,
        flip0,
        kind,
        coef,
        row,
        sa,
        sb,
    })
}

/// Σ of the integrand over points `start..end` (multiples of [`BLOCK`], `end` ≤ n_pad; points
/// at or past n count 0) of randomisation `r`, with the vector path `kernel`.
pub(crate) fn genz_sum(
    kernel: Kernel,
    q: &GenzQuery<'_>,
    host: &HostConstants,
    r: usize,
    start: usize,
    end: usize,
) -> f64 {
    match kernel {
        // SAFETY (both): the token proves the instructions exist on this CPU.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512(t) => unsafe { genz_sum_avx512(t, q, host, r, start, end) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2(t) => unsafe { genz_sum_avx2(t, q, host, r, start, end) },
        Kernel::Portable(t) => genz_sum_v::<f64, 4>(t, q, host, r, start, end),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn genz_sum_avx512(
    t: Avx512,
    q: &GenzQuery<'_>,
    host: &HostConstants,
    r: usize,
    start: usize,
    end: usize,
) -> f64 {
    genz_sum_v::<avx512::V8, 8>(t, q, host, r, start, end)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn genz_sum_avx2(
    t: Avx2,
    q: &GenzQuery<'_>,
    host: &HostConstants,
    r: usize,
    start: usize,
    end: usize,
) -> f64 {
    // Eight vectors (32 points) in flight, as on AVX-512: measured on a Zen 3 AVX2 core
    // (issue 29), d = 12 at 4,096 × 8 points took 5.1 ms a query with eight, 6.8 with four,
    // and d = 4 the same with eight or four (1.37 / 1.34 ms); two were 1.4× slower than four.
    // The register spills of eight cost less than the latency they hide.
    genz_sum_v::<avx2::V4, 8>(t, q, host, r, start, end)
}

/// The kernel over `U` vectors of `V` at a time (U·LANES points, a divisor of [`BLOCK`]),
/// coordinate by coordinate; Φ and Φ⁻¹ run on all U vectors interleaved.
#[inline(always)]
fn genz_sum_v<V: F64s, const U: usize>(
    tk: V::Token,
    q: &GenzQuery<'_>,
    host: &HostConstants,
    r: usize,
    start: usize,
    end: usize,
) -> f64 {
    let g = U * V::LANES;
    debug_assert_eq!(BLOCK % g, 0);
    let d = q.f.d;
    let n = host.n;
    let zero = V::splat(tk, 0.0);
    let one = V::splat(tk, 1.0);
    let mut y: Vec<[V; U]> = vec![[zero; U]; q.int_dim];
    let mut acc = [zero; U];
    let mut last = 0.0;
    let mut base = start;
    while base < end {
        let mut prod = [V::splat(tk, q.wid0); U];
        // Pivot 0: the same interval for every point.
        {
            let u = &host.u(r, 0)[base..base + g];
            let (lo, wid) = (V::splat(tk, q.lo0), V::splat(tk, q.wid0));
            let mut t = [zero; U];
            for k in 0..U {
                let uk = V::load(tk, &u[k * V::LANES..]);
                let w = if q.flip0 { one.sub(uk) } else { uk };
                t[k] = w.fma(wid, lo);
            }
            let y0 = vppf(t);
            for k in 0..U {
                y[0][k] = if q.flip0 { y0[k].neg() } else { y0[k] };
            }
        }
        for i in 1..d {
            let c = &q.coef[q.row[i]..q.row[i + 1]];
            let mut s = [zero; U];
            for (kk, &cik) in c.iter().enumerate() {
                let cv = V::splat(tk, cik);
                for k in 0..U {
                    s[k] = cv.fma(y[kk][k], s[k]);
                }
            }
            let (sa, sb) = (V::splat(tk, q.sa[i]), V::splat(tk, q.sb[i]));
            let mut lo = [zero; U];
            let mut wid = [one; U];
            let mut flip: Option<[V::M; U]> = None;
            match q.kind[i] {
                Limits::None => {}
                Limits::Upper => {
                    let mut x = [zero; U];
                    for k in 0..U {
                        x[k] = sb.sub(s[k]);
                    }
                    wid = vcdf(x);
                }
                Limits::Lower => {
                    // Φ(xa) = c: where xa > 0 reflect (lo 0, width Φ(−xa)), else lo c,
                    // width 1 − c; both from Φ(−|xa|).
                    let mut fl = [V::lt(zero, zero); U];
                    let mut z = [zero; U];
                    for k in 0..U {
                        let xa = sa.sub(s[k]);
                        fl[k] = V::gt(xa, zero);
                        z[k] = xa.abs();
                    }
                    let t = vtail(z);
                    for k in 0..U {
                        lo[k] = V::select(fl[k], zero, t[k]);
                        wid[k] = V::select(fl[k], t[k], one.sub(t[k]));
                    }
                    flip = Some(fl);
                }
                Limits::Both => {
                    let mut fl = [V::lt(zero, zero); U];
                    let mut la = [zero; U];
                    let mut hb = [zero; U];
                    for k in 0..U {
                        let xa = sa.sub(s[k]);
                        let xb = sb.sub(s[k]);
                        fl[k] = V::gt(xa, zero);
                        la[k] = V::select(fl[k], xb.neg(), xa);
                        hb[k] = V::select(fl[k], xa.neg(), xb);
                    }
                    lo = vcdf(la);
                    let hi = vcdf(hb);
                    for k in 0..U {
                        wid[k] = hi[k].sub(lo[k]).max(zero);
                    }
                    flip = Some(fl);
                }
                Limits::Indicator => {
                    for k in 0..U {
                        let inside = V::and(V::ge(s[k], sa), V::le(s[k], sb));
                        wid[k] = V::select(inside, one, zero);
                    }
                }
            }
            for k in 0..U {
                prod[k] = prod[k].mul(wid[k]);
            }
            if i < q.int_dim {
                let u = &host.u(r, i)[base..base + g];
                let mut t = [zero; U];
                for k in 0..U {
                    let uk = V::load(tk, &u[k * V::LANES..]);
                    let w = match flip {
                        None => uk,
                        Some(fl) => V::select(fl[k], one.sub(uk), uk),
                    };
                    t[k] = w.fma(wid[k], lo[k]);
                }
                let yi = vppf(t);
                for k in 0..U {
                    y[i][k] = match flip {
                        None => yi[k],
                        Some(fl) => V::select(fl[k], yi[k].neg(), yi[k]),
                    };
                }
            }
        }
        if base + g <= n {
            for k in 0..U {
                acc[k] = acc[k].add(prod[k]);
            }
        } else {
            let live = n.saturating_sub(base);
            let mut buf = [0.0; BLOCK];
            for k in 0..U {
                prod[k].store(&mut buf[k * V::LANES..]);
            }
            last += buf[..live.min(g)].iter().sum::<f64>();
        }
        base += g;
    }
    let mut total = acc[0];
    for a in &acc[1..] {
        total = total.add(*a);
    }
    total.hsum() + last
}

#[cfg(test)]
mod kernel_tests {
    use super::*;
    use crate::cholesky::factor;
    use crate::constants::RawConstants;
    use crate::query::prepare;
    use crate::rng::SplitMix64;
    use kiln_base::simd::Isa;

    /// Every vector path this CPU has gives the same sums (to rounding) on random
    /// correlation structures with limits in the tails, where Φ and Φ⁻¹ take their rare
    /// branches.
    #[test]
    fn every_cpu_path_agrees_on_random_queries() {
        let kernels: Vec<Kernel> = [Isa::Avx512, Isa::Avx2, Isa::Portable]
            .into_iter()
            .filter_map(Kernel::new)
            .collect();
        let raw = RawConstants::generate(2 * BLOCK, 8, 2, 7, false);
        let host = HostConstants::from_raw(&raw, false);
        let mut rng = SplitMix64::new(11);
        let mut checked = 0;
        for case in 0..40 {
            let d = 2 + case % 7;
            // A random correlation matrix: normalised W·Wᵀ + a ridge.
            let w: Vec<f64> = (0..d * d).map(|_| rng.next_f64() * 2.0 - 1.0).collect();
            let mut cov = vec![0.0; d * d];
            for i in 0..d {
                for j in 0..d {
                    let ridge = if i == j { 0.05 } else { 0.0 };
                    cov[i * d + j] =
                        (0..d).map(|k| w[i * d + k] * w[j * d + k]).sum::<f64>() + ridge;
                }
            }
            let diag: Vec<f64> = (0..d).map(|i| cov[i * d + i].sqrt()).collect();
            for i in 0..d {
                for j in 0..d {
                    cov[i * d + j] /= diag[i] * diag[j];
                }
            }
            // Upper limits from deep lower tail to far upper tail.
            let upper: Vec<f64> = (0..d).map(|_| rng.next_f64() * 16.0 - 9.0).collect();
            let p = prepare(case, 8, &upper, None, None, &cov).expect("valid query");
            let f = factor(case, &p).expect("positive definite");
            let GenzPlan::Integrate(q) = plan(&f, false) else {
                continue;
            };
            let sums: Vec<f64> = kernels
                .iter()
                .map(|&k| genz_sum(k, &q, &host, 1, 0, host.n_pad))
                .collect();
            // The portable path is last.
            let portable = sums[sums.len() - 1];
            for (k, got) in kernels.iter().zip(&sums) {
                assert!(
                    (got - portable).abs() <= 1e-11 * portable.abs() + 1e-300,
                    "case {case} (d = {d}): {:?} sums to {got:e}, portable {portable:e}",
                    k.isa()
                );
            }
            checked += 1;
        }
        assert!(checked > 20, "only {checked} queries needed integration");
    }
}
