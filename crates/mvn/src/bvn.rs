//! Exact bivariate normal probabilities (to about 1e−15): Genz's BVNU, the method behind
//! mvtnorm's, SciPy's and Matlab's bivariate normal CDF (Drezner & Wesolowsky 1989, "On the
//! computation of the bivariate normal integral", J. Stat. Comput. Simul. 35, with Genz's
//! double-precision modifications; Genz 2004, "Numerical computation of rectangular bivariate
//! and trivariate normal and t probabilities", Statistics and Computing 14). Gauss–Legendre
//! rules of 6, 12 or 20 points in the correlation integral, chosen by |ρ|, and for |ρ| ≥ 0.925
//! an asymptotic expansion around ρ = ±1 plus a correction integral.

#![allow(clippy::excessive_precision)]

use super::normal::norm_cdf;

/// Gauss–Legendre weights and (negative) nodes on [−1, 1], half of each symmetric rule:
/// 6, 12 and 20 points.
const GL_W: [&[f64]; 3] = [
    &[0.1713244923791705, 0.3607615730481384, 0.4679139345726904],
    &[
        0.04717533638651177,
        0.1069393259953183,
        0.1600783285433464,
        0.2031674267230659,
        0.2334925365383547,
        0.2491470458134029,
    ],
    &[
        0.01761400713915212,
        0.04060142980038694,
        0.06267204833410906,
        0.08327674157670475,
        0.1019301198172404,
        0.1181945319615184,
        0.1316886384491766,
        0.1420961093183821,
        0.1491729864726037,
        0.1527533871307259,
    ],
];
const GL_X: [&[f64]; 3] = [
    &[
        -0.9324695142031522,
        -0.6612093864662647,
        -0.2386191860831970,
    ],
    &[
        -0.9815606342467191,
        -0.9041172563704750,
        -0.7699026741943050,
        -0.5873179542866171,
        -0.3678314989981802,
        -0.1252334085114692,
    ],
    &[
        -0.9931285991850949,
        -0.9639719272779138,
        -0.9122344282513259,
        -0.8391169718222188,
        -0.7463319064601508,
        -0.6360536807265150,
        -0.5108670019508271,
        -0.3737060887154196,
        -0.2277858511416451,
        -0.07652652113349733,
    ],
];

const TWO_PI: f64 = std::f64::consts::TAU;

/// P(X > h, Y > k) for a standard bivariate normal with correlation r (|r| ≤ 1; h, k finite
/// or infinite).
pub(crate) fn bvn_upper(h: f64, k: f64, r: f64) -> f64 {
    if h == f64::INFINITY || k == f64::INFINITY {
        return 0.0;
    }
    if h == f64::NEG_INFINITY {
        return norm_cdf(-k);
    }
    if k == f64::NEG_INFINITY {
        return norm_cdf(-h);
    }
    let rule = if r.abs() < 0.3 {
        0
    } else if r.abs() < 0.75 {
        1
    } else {
        2
    };
    let (w, x) = (GL_W[rule], GL_X[rule]);
    let mut hk = h * k;
    let mut bvn = 0.0;
    if r.abs() < 0.925 {
        let hs = (h * h + k * k) / 2.0;
        let asr = r.asin();
        for (&wi, &xi) in w.iter().zip(x) {
            for s in [xi + 1.0, 1.0 - xi] {
                let sn = (asr * s / 2.0).sin();
                bvn += wi * ((sn * hk - hs) / (1.0 - sn * sn)).exp();
            }
        }
        return (bvn * asr / (2.0 * TWO_PI) + norm_cdf(-h) * norm_cdf(-k)).clamp(0.0, 1.0);
    }
    let mut k = k;
    if r < 0.0 {
        k = -k;
        hk = -hk;
    }
    if r.abs() < 1.0 {
        let a_s = (1.0 - r) * (1.0 + r);
        let mut a = a_s.sqrt();
        let bs = (h - k) * (h - k);
        let c = (4.0 - hk) / 8.0;
        let d = (12.0 - hk) / 16.0;
        bvn = a
            * (-(bs / a_s + hk) / 2.0).exp()
            * (1.0 - c * (bs - a_s) * (1.0 - d * bs / 5.0) / 3.0 + c * d * a_s * a_s / 5.0);
        if hk > -160.0 {
            let b = bs.sqrt();
            bvn -= (-hk / 2.0).exp()
                * TWO_PI.sqrt()
                * norm_cdf(-b / a)
                * b
                * (1.0 - c * bs * (1.0 - d * bs / 5.0) / 3.0);
        }
        a /= 2.0;
        for (&wi, &xi) in w.iter().zip(x) {
            let xs = (a * (xi + 1.0)) * (a * (xi + 1.0));
            let rs = (1.0 - xs).sqrt();
            bvn += a
                * wi
                * ((-bs / (2.0 * xs) - hk / (1.0 + rs)).exp() / rs
                    - (-(bs / xs + hk) / 2.0).exp() * (1.0 + c * xs * (1.0 + d * xs)));
            let xs = a_s * (1.0 - xi) * (1.0 - xi) / 4.0;
            let rs = (1.0 - xs).sqrt();
            bvn += a
                * wi
                * (-(bs / xs + hk) / 2.0).exp()
                * ((-hk * (1.0 - rs) / (2.0 * (1.0 + rs))).exp() / rs
                    - (1.0 + c * xs * (1.0 + d * xs)));
        }
        bvn = -bvn / TWO_PI;
    }
    if r > 0.0 {
        bvn += norm_cdf(-h.max(k));
    } else {
        bvn = -bvn + (norm_cdf(-h) - norm_cdf(-k)).max(0.0);
    }
    bvn.clamp(0.0, 1.0)
}

/// P(a ≤ X ≤ b) for a standard bivariate normal with correlation r; limits may be infinite
/// (a ≤ b). As in Genz's MVBVN, a coordinate bounded only above is reflected (X → −X, which
/// flips the sign of r) so that every coordinate reads [h, ∞) or [h, b], and the answer is
/// one upper-orthant probability, or a difference of two or four of them for finite upper
/// limits; a one-sided query thus keeps its relative precision in the tails.
pub(crate) fn bvn_box(a: [f64; 2], b: [f64; 2], r: f64) -> f64 {
    let free = |i: usize| a[i] == f64::NEG_INFINITY && b[i] == f64::INFINITY;
    let mass = |i: usize| super::normal::interval_mass(a[i], b[i]);
    match (free(0), free(1)) {
        (true, true) => return 1.0,
        (true, false) => return mass(1),
        (false, true) => return mass(0),
        _ => {}
    }
    let mut h = [0.0; 2];
    let mut top = [f64::INFINITY; 2];
    let mut r = r;
    for i in 0..2 {
        if a[i] == f64::NEG_INFINITY {
            // (−∞, b] → [−b, ∞).
            h[i] = -b[i];
            r = -r;
        } else if a[i] > 0.0 && b[i] < f64::INFINITY {
            // [a, b] with a > 0 → [−b, −a]: Φ differences in the lower tail keep their digits.
            h[i] = -b[i];
            top[i] = -a[i];
            r = -r;
        } else {
            h[i] = a[i];
            top[i] = b[i];
        }
    }
    let mut p = bvn_upper(h[0], h[1], r);
    if top[0] < f64::INFINITY {
        p -= bvn_upper(top[0], h[1], r);
    }
    if top[1] < f64::INFINITY {
        p -= bvn_upper(h[0], top[1], r);
    }
    if top[0] < f64::INFINITY && top[1] < f64::INFINITY {
        p += bvn_upper(top[0], top[1], r);
    }
    p.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn orthant(rho: f64) -> f64 {
        0.25 + rho.asin() / TWO_PI
    }

    /// P(X ≤ b₁, Y ≤ b₂) by Simpson's rule on ∫ φ(t) Φ((b₂ − ρt)/√(1−ρ²)) dt over t ≤ b₁.
    fn lower_reference(b1: f64, b2: f64, rho: f64) -> f64 {
        let sc = (1.0 - rho * rho).sqrt();
        let lo = -40.0f64;
        let hi = b1.min(40.0);
        let steps = 40_000;
        let h = (hi - lo) / steps as f64;
        let f = |t: f64| super::super::normal::norm_pdf(t) * norm_cdf((b2 - rho * t) / sc);
        let mut s = f(lo) + f(hi);
        for i in 1..steps {
            s += f(lo + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0
    }

    #[test]
    fn orthants_match_the_closed_form() {
        for i in 0..=200 {
            let rho = -0.999_999 + i as f64 * (2.0 * 0.999_999) / 200.0;
            let got = bvn_upper(0.0, 0.0, rho);
            assert!(
                (got - orthant(rho)).abs() < 1e-15,
                "ρ={rho}: {got} vs {}",
                orthant(rho)
            );
            let got = bvn_box([f64::NEG_INFINITY; 2], [0.0; 2], rho);
            assert!((got - orthant(rho)).abs() < 1e-15, "ρ={rho}: {got}");
        }
        assert_eq!(bvn_upper(0.0, 0.0, 1.0), 0.5);
        assert!(bvn_upper(0.0, 0.0, -1.0).abs() < 1e-15);
    }

    #[test]
    fn general_limits_match_a_quadrature() {
        let mut rng = super::super::halton::SplitMix64::new(4);
        for _ in 0..30 {
            let rho = -0.99 + 1.98 * rng.next_f64();
            let b1 = -3.0 + 6.0 * rng.next_f64();
            let b2 = -3.0 + 6.0 * rng.next_f64();
            let want = lower_reference(b1, b2, rho);
            let got = bvn_box([f64::NEG_INFINITY; 2], [b1, b2], rho);
            assert!(
                (got - want).abs() < 1e-13,
                "ρ={rho} b=({b1},{b2}): {got} vs {want}"
            );
            // Two-sided in the first coordinate: F(b₁, b₂) − F(a₁, b₂).
            let a1 = b1 - 1.5 * rng.next_f64();
            let want2 = want - lower_reference(a1, b2, rho);
            let got2 = bvn_box([a1, f64::NEG_INFINITY], [b1, b2], rho);
            assert!((got2 - want2).abs() < 1e-13, "ρ={rho}: {got2} vs {want2}");
        }
        // Independence and unbounded coordinates.
        let got = bvn_box([-1.0, f64::NEG_INFINITY], [0.5, 0.3], 0.0);
        let want = (norm_cdf(0.5) - norm_cdf(-1.0)) * norm_cdf(0.3);
        assert!((got - want).abs() < 1e-15);
        let got = bvn_box([f64::NEG_INFINITY; 2], [0.7, f64::INFINITY], 0.8);
        assert!((got - norm_cdf(0.7)).abs() < 1e-15);
        // Small probabilities keep their relative precision for ρ ≥ 0 (for ρ < 0 the
        // correction cancels Φ(−h)Φ(−k) and only the absolute error stays ~1e−16).
        let got = bvn_box([f64::NEG_INFINITY; 2], [-6.0, -5.5], -0.5);
        assert!(got.abs() < 1e-16, "{got:e}");
        for &rho in &[0.0, 0.3, 0.6, 0.95] {
            let got = bvn_box([f64::NEG_INFINITY; 2], [-6.0, -5.5], rho);
            let want = lower_reference(-6.0, -5.5, rho);
            assert!(
                ((got - want) / want).abs() < 1e-9,
                "ρ={rho}: {got:e} vs {want:e}"
            );
        }
    }
}
