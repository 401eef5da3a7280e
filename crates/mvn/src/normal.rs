//! The standard normal distribution in double precision: density, CDF Φ, quantile Φ⁻¹ and
//! erfinv as plain scalar functions. The hot loops use the same approximations written over
//! SIMD vectors, in [`super::simd`].
//!
//! * Φ uses Hart's (1968) double-precision rational approximation as published by West (2005,
//!   "Better approximations to cumulative normal functions") for |x| < 7.07 and Laplace's
//!   continued fraction beyond: absolute error below 1e-16 everywhere; relative error in the
//!   lower tail below 1e-13 for x ≥ −4, growing to 3e-9 at x = −7 (where Φ ≈ 1e-12), and
//!   about 1e-15 beyond −7.07, so tail probabilities keep their significant digits.
//! * Φ⁻¹ uses Wichura's algorithm AS 241 (PPND16, Applied Statistics 37, 1988): relative
//!   error about 1e-16.
//! * erfinv(x) = Φ⁻¹((1 + x)/2)/√2, evaluated through the tail that keeps precision.
//!
//! Tests at the end of the file check every function against independent reference values;
//! the vector versions are checked against these.

// The published coefficients are kept digit for digit.
#![allow(clippy::excessive_precision)]

/// The CPU kernels' unit of work in points: point ranges start and end at multiples of it,
/// and the host copy of the point sets is padded to one.
pub const BLOCK: usize = 64;

/// √(2π).
pub const SQRT_2PI: f64 = 2.506_628_274_631_000_7;
/// 1/√(2π).
pub const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// |x| at and beyond which Φ(−|x|) is evaluated with Hart's continued fraction.
pub(crate) const HART_SPLIT: f64 = 7.071_067_811_865_47;
/// |x| beyond which Φ(−|x|) underflows (is taken as 0).
pub(crate) const HART_CUTOFF: f64 = 37.5;

// Hart (1968) / West (2005): Φ(−z) = exp(−z²/2)·P(z)/Q(z) for 0 ≤ z < 7.07.
pub(crate) const HART_P: [f64; 7] = [
    220.206_867_912_376,
    221.213_596_169_931,
    112.079_291_497_871,
    33.912_866_078_383,
    6.373_962_203_531_65,
    0.700_383_064_443_688,
    3.526_249_659_989_11e-2,
];
pub(crate) const HART_Q: [f64; 8] = [
    440.413_735_824_752,
    793.826_512_519_948,
    637.333_633_378_831,
    296.564_248_779_674,
    86.780_732_202_946_1,
    16.064_177_579_207,
    1.755_667_163_182_64,
    8.838_834_764_831_84e-2,
];

// Wichura (1988), AS 241 PPND16.
pub(crate) const AS241_A: [f64; 8] = [
    3.387_132_872_796_366_608,
    1.331_416_678_917_843_774_5e2,
    1.971_590_950_306_551_442_7e3,
    1.373_169_376_550_946_112_5e4,
    4.592_195_393_154_987_145_7e4,
    6.726_577_092_700_870_085_3e4,
    3.343_057_558_358_812_810_5e4,
    2.509_080_928_730_122_672_7e3,
];
pub(crate) const AS241_B: [f64; 8] = [
    1.0,
    4.231_333_070_160_091_125_2e1,
    6.871_870_074_920_579_083e2,
    5.394_196_021_424_751_107_7e3,
    2.121_379_430_158_659_586_7e4,
    3.930_789_580_009_271_061e4,
    2.872_908_573_572_194_267_4e4,
    5.226_495_278_852_854_561e3,
];
pub(crate) const AS241_C: [f64; 8] = [
    1.423_437_110_749_683_577_34,
    4.630_337_846_156_545_295_9,
    5.769_497_221_460_691_405_5,
    3.647_848_324_763_204_605_04,
    1.270_458_252_452_368_382_58,
    2.417_807_251_774_506_117_7e-1,
    2.272_384_498_926_918_458_33e-2,
    7.745_450_142_783_414_076_4e-4,
];
pub(crate) const AS241_D: [f64; 8] = [
    1.0,
    2.053_191_626_637_758_821_87,
    1.676_384_830_183_803_849_4,
    6.897_673_349_851_000_045_5e-1,
    1.481_039_764_274_800_745_9e-1,
    1.519_866_656_361_645_719_66e-2,
    5.475_938_084_995_344_946e-4,
    1.050_750_071_644_416_843_24e-9,
];
pub(crate) const AS241_E: [f64; 8] = [
    6.657_904_643_501_103_777_2,
    5.463_784_911_164_114_369_9,
    1.784_826_539_917_291_335_8,
    2.965_605_718_285_048_912_3e-1,
    2.653_218_952_657_612_309_3e-2,
    1.242_660_947_388_078_438_6e-3,
    2.711_555_568_743_487_578_15e-5,
    2.010_334_399_292_288_132_65e-7,
];
pub(crate) const AS241_F: [f64; 8] = [
    1.0,
    5.998_322_065_558_879_376_9e-1,
    1.369_298_809_227_358_053_1e-1,
    1.487_536_129_085_061_485_25e-2,
    7.868_691_311_456_132_591e-4,
    1.846_318_317_510_054_681_8e-5,
    1.421_511_758_316_445_888_7e-7,
    2.044_263_103_389_939_785_64e-15,
];
pub(crate) const AS241_SPLIT1: f64 = 0.425;
pub(crate) const AS241_SPLIT2: f64 = 5.0;

/// Polynomial Σ c[i]·x^i by Horner's rule; `FMA` selects fused multiply-adds (only worth it
/// where the target has them).
#[inline(always)]
fn horner<const FMA: bool, const N: usize>(c: &[f64; N], x: f64) -> f64 {
    let mut acc = c[N - 1];
    let mut i = N - 1;
    while i > 0 {
        i -= 1;
        acc = madd::<FMA>(acc, x, c[i]);
    }
    acc
}

/// a·b + c, fused when `FMA`.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f64, b: f64, c: f64) -> f64 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// The standard normal density φ(x).
pub fn norm_pdf(x: f64) -> f64 {
    INV_SQRT_2PI * (-0.5 * x * x).exp()
}

/// Φ(−z) for z ≥ 7.07 by Laplace's continued fraction for the Mills ratio,
/// Φ(−z) = φ(z)/(z + 1/(z + 2/(z + 3/(z + …)))), evaluated backwards from depth 16 (relative
/// error below 2e−16 for z ≥ 7.07). exp(−z²/2) is split as exp(−h²/2)·exp(−(z−h)(z+h)/2)
/// with h = z rounded down to 1/16, whose square is exact, so the rounding of z² does not
/// cost relative precision far in the tail.
#[inline]
fn far_tail(z: f64) -> f64 {
    let mut f = z;
    for k in (1..=16).rev() {
        f = z + k as f64 / f;
    }
    let h = (z * 16.0).trunc() / 16.0;
    let e = (-0.5 * h * h).exp() * (-0.5 * (z - h) * (z + h)).exp();
    e / f / SQRT_2PI
}

/// The standard normal CDF Φ(x) = P(Z ≤ x), with full relative precision in the lower tail.
/// Φ(±∞) = 1 or 0; Φ(NaN) = NaN.
pub fn norm_cdf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let z = x.abs();
    let tail = if z > HART_CUTOFF {
        0.0
    } else if z < HART_SPLIT {
        (-0.5 * z * z).exp() * horner::<false, 7>(&HART_P, z) / horner::<false, 8>(&HART_Q, z)
    } else {
        far_tail(z)
    };
    if x < 0.0 { tail } else { 1.0 - tail }
}

/// The standard normal quantile Φ⁻¹(p). Returns −∞ for p ≤ 0, +∞ for p ≥ 1, NaN for NaN.
pub fn norm_ppf(p: f64) -> f64 {
    if p.is_nan() {
        return f64::NAN;
    }
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let q = p - 0.5;
    if q.abs() <= AS241_SPLIT1 {
        let r = 0.180625 - q * q;
        return q * horner::<false, 8>(&AS241_A, r) / horner::<false, 8>(&AS241_B, r);
    }
    let t = if q < 0.0 { p } else { 1.0 - p };
    let r = (-t.ln()).sqrt();
    let v = if r <= AS241_SPLIT2 {
        let r = r - 1.6;
        horner::<false, 8>(&AS241_C, r) / horner::<false, 8>(&AS241_D, r)
    } else {
        let r = r - AS241_SPLIT2;
        horner::<false, 8>(&AS241_E, r) / horner::<false, 8>(&AS241_F, r)
    };
    if q < 0.0 { -v } else { v }
}

/// The inverse error function: erf(erfinv(x)) = x for x in (−1, 1); ±∞ at ±1, NaN outside.
///
/// Uses erfinv(x) = −Φ⁻¹((1 − x)/2)/√2 for x ≥ 0 (and symmetry), so that 1 − x is exact near 1.
pub fn erfinv(x: f64) -> f64 {
    if x.is_nan() || x.abs() > 1.0 {
        return f64::NAN;
    }
    let v = -norm_ppf(0.5 * (1.0 - x.abs())) * std::f64::consts::FRAC_1_SQRT_2;
    if x < 0.0 { -v } else { v }
}

/// Φ(hi) − Φ(lo), evaluated in the tail that keeps precision.
pub(crate) fn interval_mass(lo: f64, hi: f64) -> f64 {
    if lo > 0.0 {
        (norm_cdf(-lo) - norm_cdf(-hi)).max(0.0)
    } else {
        (norm_cdf(hi) - norm_cdf(lo)).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Φ(x) by an independent method: the series of erf for |x| ≤ 3 and the Laplace continued
    /// fraction of the Mills ratio beyond, both summed in f64 far past convergence.
    fn reference_cdf(x: f64) -> f64 {
        let z = x.abs();
        let upper_tail = if z <= 3.0 {
            // Φ(z) − 1/2 = φ(z)·Σ z^(2k+1)/(1·3·5···(2k+1))
            let mut term = z;
            let mut sum = z;
            let mut k = 1.0;
            while term.abs() > 1e-30 * sum.abs().max(1e-300) {
                term *= z * z / (2.0 * k + 1.0);
                sum += term;
                k += 1.0;
            }
            0.5 - norm_pdf(z) * sum
        } else {
            // Q(z) = φ(z)/(z + 1/(z + 2/(z + 3/(z + ...)))) evaluated backwards from depth 400.
            let mut f = z;
            for k in (1..400).rev() {
                f = z + k as f64 / f;
            }
            norm_pdf(z) / f
        };
        if x < 0.0 {
            upper_tail
        } else {
            1.0 - upper_tail
        }
    }

    #[test]
    fn cdf_matches_reference_with_relative_tail_precision() {
        let mut x = -37.0;
        while x <= 8.0 {
            let got = norm_cdf(x);
            let want = reference_cdf(x);
            let rel = ((got - want) / want).abs();
            // Far in the tail the rounding of x²/2 inside exp alone costs ~|x|²·1e-16.
            let tol = if x.abs() <= 4.0 { 1e-12 } else { 4e-9 };
            assert!(rel < tol, "Φ({x}) = {got}, reference {want}, rel err {rel}");
            x += 0.0137;
        }
        assert_eq!(norm_cdf(f64::NEG_INFINITY), 0.0);
        assert_eq!(norm_cdf(f64::INFINITY), 1.0);
        assert!((norm_cdf(0.0) - 0.5).abs() < 1e-16);
        // Φ(−1.959963984540054) = 0.025 (a textbook value).
        assert!((norm_cdf(-1.959_963_984_540_054) - 0.025).abs() < 1e-15);
    }

    #[test]
    fn ppf_inverts_cdf() {
        // p from 1e-300 up to 1 − 1e-16 on a log scale, both tails.
        let mut lp = -300.0f64;
        while lp < -1e-3 {
            let p = 10f64.powf(lp);
            let x = norm_ppf(p);
            let back = norm_cdf(x);
            // Relative error in p is about |x| times the error in x, plus Φ's own.
            let tol = if p > 1e-4 { 1e-12 } else { 1e-8 };
            assert!(((back - p) / p).abs() < tol, "Φ(Φ⁻¹({p})) = {back}");
            let x2 = norm_ppf(1.0 - p);
            if p > 1e-8 {
                assert!(
                    (x + x2).abs() < 1e-7 * x.abs().max(1.0),
                    "symmetry at {p}: {x} {x2}"
                );
            }
            lp += 0.173;
        }
        assert_eq!(norm_ppf(0.5), 0.0);
        assert!((norm_ppf(0.975) - 1.959_963_984_540_054).abs() < 1e-14);
        assert_eq!(norm_ppf(0.0), f64::NEG_INFINITY);
        assert_eq!(norm_ppf(1.0), f64::INFINITY);
    }

    #[test]
    fn erfinv_matches_definition() {
        // erf(y) = 2Φ(y√2) − 1
        for &x in &[
            -0.999_999,
            -0.9,
            -0.5,
            -1e-9,
            0.0,
            1e-9,
            0.3,
            0.7,
            0.99,
            0.999_999_9,
        ] {
            let y = erfinv(x);
            let erf_y = 2.0 * norm_cdf(y * std::f64::consts::SQRT_2) - 1.0;
            assert!((erf_y - x).abs() < 1e-14, "erf(erfinv({x})) = {erf_y}");
        }
        assert_eq!(erfinv(1.0), f64::INFINITY);
        assert!(erfinv(1.5).is_nan());
    }
}
