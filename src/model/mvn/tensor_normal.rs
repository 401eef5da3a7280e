//! Φ, φ and Φ⁻¹ written with Burn tensor operations only, so that they run on any backend
//! (Flex, NdArray, CUDA). Same approximations as [`super::normal`] (Hart/West for Φ, Wichura's
//! AS 241 for Φ⁻¹), evaluated in the backend's float type; every branch is computed and the
//! right one selected with a mask, as a GPU would do anyway.

// The published coefficients are kept digit for digit.
#![allow(clippy::excessive_precision)]

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use super::normal::{INV_SQRT_2PI, SQRT_2PI};

const HART_P: [f64; 7] = [
    220.206_867_912_376,
    221.213_596_169_931,
    112.079_291_497_871,
    33.912_866_078_383,
    6.373_962_203_531_65,
    0.700_383_064_443_688,
    3.526_249_659_989_11e-2,
];
const HART_Q: [f64; 8] = [
    440.413_735_824_752,
    793.826_512_519_948,
    637.333_633_378_831,
    296.564_248_779_674,
    86.780_732_202_946_1,
    16.064_177_579_207,
    1.755_667_163_182_64,
    8.838_834_764_831_84e-2,
];
const AS241_A: [f64; 8] = [
    3.387_132_872_796_366_608,
    1.331_416_678_917_843_774_5e2,
    1.971_590_950_306_551_442_7e3,
    1.373_169_376_550_946_112_5e4,
    4.592_195_393_154_987_145_7e4,
    6.726_577_092_700_870_085_3e4,
    3.343_057_558_358_812_810_5e4,
    2.509_080_928_730_122_672_7e3,
];
const AS241_B: [f64; 8] = [
    1.0,
    4.231_333_070_160_091_125_2e1,
    6.871_870_074_920_579_083e2,
    5.394_196_021_424_751_107_7e3,
    2.121_379_430_158_659_586_7e4,
    3.930_789_580_009_271_061e4,
    2.872_908_573_572_194_267_4e4,
    5.226_495_278_852_854_561e3,
];
const AS241_C: [f64; 8] = [
    1.423_437_110_749_683_577_34,
    4.630_337_846_156_545_295_9,
    5.769_497_221_460_691_405_5,
    3.647_848_324_763_204_605_04,
    1.270_458_252_452_368_382_58,
    2.417_807_251_774_506_117_7e-1,
    2.272_384_498_926_918_458_33e-2,
    7.745_450_142_783_414_076_4e-4,
];
const AS241_D: [f64; 8] = [
    1.0,
    2.053_191_626_637_758_821_87,
    1.676_384_830_183_803_849_4,
    6.897_673_349_851_000_045_5e-1,
    1.481_039_764_274_800_745_9e-1,
    1.519_866_656_361_645_719_66e-2,
    5.475_938_084_995_344_946e-4,
    1.050_750_071_644_416_843_24e-9,
];
const AS241_E: [f64; 8] = [
    6.657_904_643_501_103_777_2,
    5.463_784_911_164_114_369_9,
    1.784_826_539_917_291_335_8,
    2.965_605_718_285_048_912_3e-1,
    2.653_218_952_657_612_309_3e-2,
    1.242_660_947_388_078_438_6e-3,
    2.711_555_568_743_487_578_15e-5,
    2.010_334_399_292_288_132_65e-7,
];
const AS241_F: [f64; 8] = [
    1.0,
    5.998_322_065_558_879_376_9e-1,
    1.369_298_809_227_358_053_1e-1,
    1.487_536_129_085_061_485_25e-2,
    7.868_691_311_456_132_591e-4,
    1.846_318_317_510_054_681_8e-5,
    1.421_511_758_316_445_888_7e-7,
    2.044_263_103_389_939_785_64e-15,
];

/// Σ c[i] x^i by Horner's rule on tensors.
fn horner<B: Backend, const D: usize, const N: usize>(
    c: &[f64; N],
    x: &Tensor<B, D>,
) -> Tensor<B, D> {
    let mut acc = x.clone().mul_scalar(c[N - 1]).add_scalar(c[N - 2]);
    for &ci in c[..N - 2].iter().rev() {
        acc = acc.mul(x.clone()).add_scalar(ci);
    }
    acc
}

/// Φ(x) elementwise (x must not be NaN; ±∞ are fine).
pub(crate) fn phi<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let negative = x.clone().lower_elem(0.0);
    let z = x.abs().clamp_max(37.5);
    let e = z.clone().square().mul_scalar(-0.5).exp();
    let near = e.clone().mul(horner(&HART_P, &z)).div(horner(&HART_Q, &z));
    // Continued fraction for z ≥ 7.07 (z + 1/(z + 2/(z + 3/(z + 4/(z + 0.65))))).
    let mut cf = z.clone().add_scalar(0.65);
    for k in [4.0, 3.0, 2.0, 1.0] {
        cf = z.clone().add(cf.recip().mul_scalar(k));
    }
    let far = e.div(cf).div_scalar(SQRT_2PI);
    let tail = near.mask_where(z.greater_equal_elem(7.071_067_811_865_47), far);
    let upper = tail.clone().neg().add_scalar(1.0);
    upper.mask_where(negative, tail)
}

/// φ(x) elementwise; 0 at ±∞.
pub(crate) fn pdf<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clamp(-40.0, 40.0)
        .square()
        .mul_scalar(-0.5)
        .exp()
        .mul_scalar(INV_SQRT_2PI)
}

/// Φ⁻¹(p) elementwise for p in [0, 1]; p is clamped to [1e−37, 1 − 6e−8] (the f32 range) so
/// the result is always finite.
pub(crate) fn phi_inv<B: Backend, const D: usize>(p: Tensor<B, D>) -> Tensor<B, D> {
    let p = p.clamp(1e-37, 1.0 - 6e-8);
    let q = p.clone().sub_scalar(0.5);
    let r = q.clone().square().neg().add_scalar(0.180625);
    let central = q
        .clone()
        .mul(horner(&AS241_A, &r))
        .div(horner(&AS241_B, &r));
    let lower_half: Tensor<B, D, Bool> = q.clone().lower_elem(0.0);
    let t = p
        .clone()
        .neg()
        .add_scalar(1.0)
        .mask_where(lower_half.clone(), p);
    let rt = t.log().neg().sqrt();
    let r1 = rt.clone().sub_scalar(1.6);
    let mid = horner(&AS241_C, &r1).div(horner(&AS241_D, &r1));
    let r2 = rt.clone().sub_scalar(5.0);
    let far = horner(&AS241_E, &r2).div(horner(&AS241_F, &r2));
    let tail_abs = mid.mask_where(rt.greater_elem(5.0), far);
    let tail = tail_abs.clone().mask_where(lower_half, tail_abs.neg());
    central.mask_where(q.abs().greater_elem(0.425), tail)
}

/// Φ(hi) − Φ(lo) (lo ≤ hi), computed in the lower half for precision.
pub(crate) fn interval_mass<B: Backend, const D: usize>(
    lo: Tensor<B, D>,
    hi: Tensor<B, D>,
) -> Tensor<B, D> {
    let flip = lo.clone().greater_elem(0.0);
    let lo_r = lo.clone().mask_where(flip.clone(), hi.clone().neg());
    let hi_r = hi.mask_where(flip, lo.neg());
    phi(hi_r).sub(phi(lo_r)).clamp_min(0.0)
}

/// Mean of a standard normal truncated to [lo, hi] elementwise (limits clamped to ±40).
pub(crate) fn truncated_mean<B: Backend, const D: usize>(
    lo: Tensor<B, D>,
    hi: Tensor<B, D>,
) -> Tensor<B, D> {
    let lo = lo.clamp(-40.0, 40.0);
    let hi = hi.clamp(-40.0, 40.0);
    let flip = lo.clone().greater_elem(0.0);
    let lo_r = lo.clone().mask_where(flip.clone(), hi.clone().neg());
    let hi_r = hi.clone().mask_where(flip.clone(), lo.clone().neg());
    let mass = phi(hi_r.clone()).sub(phi(lo_r.clone()));
    let m = pdf(lo_r.clone())
        .sub(pdf(hi_r.clone()))
        .div(mass.clone().clamp_min(1e-30))
        .max_pair(lo_r)
        .min_pair(hi_r);
    let m = m.clone().mask_where(flip, m.neg());
    // Where the mass underflows, the mean is the limit nearest to 0.
    let fallback = Tensor::zeros_like(&lo)
        .mask_where(hi.clone().lower_elem(0.0), hi)
        .mask_where(lo.clone().greater_elem(0.0), lo);
    m.mask_where(mass.lower_elem(1e-30), fallback)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mvn::normal::{norm_cdf, norm_ppf};
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    fn t(v: &[f32]) -> Tensor<Flex, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    fn vals(x: Tensor<Flex, 1>) -> Vec<f32> {
        x.into_data().convert::<f32>().into_vec::<f32>().unwrap()
    }

    #[test]
    fn tensor_phi_and_inverse_match_double_precision() {
        let xs: Vec<f32> = (-120..=120).map(|i| i as f32 * 0.1).collect();
        let got = vals(phi(t(&xs)));
        for (x, g) in xs.iter().zip(&got) {
            let want = norm_cdf(*x as f64);
            assert!(
                (*g as f64 - want).abs() < 2e-7 + 2e-6 * want,
                "Φ({x}) = {g} vs {want}"
            );
        }
        let inf = vals(phi(t(&[f32::NEG_INFINITY, f32::INFINITY])));
        assert_eq!(inf, vec![0.0, 1.0]);
        let ps: Vec<f32> = (1..1000)
            .map(|i| i as f32 / 1000.0)
            .chain([1e-30, 1e-10, 1e-5])
            .collect();
        let got = vals(phi_inv(t(&ps)));
        for (p, g) in ps.iter().zip(&got) {
            let want = norm_ppf(*p as f64);
            assert!(
                (*g as f64 - want).abs() < 2e-5 * want.abs().max(1.0),
                "Φ⁻¹({p}) = {g} vs {want}"
            );
        }
        let ends = vals(phi_inv(t(&[0.0, 1.0])));
        assert!(ends.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn tensor_truncated_mean_matches_host() {
        let lo = [f32::NEG_INFINITY, -1.0, 0.5, 45.0, -3.0];
        let hi = [0.0f32, 2.0, f32::INFINITY, 50.0, -2.0];
        let got = vals(truncated_mean(t(&lo), t(&hi)));
        for i in 0..lo.len() {
            let want = crate::model::mvn::cholesky::truncated_mean(
                (lo[i] as f64).clamp(-40.0, 40.0),
                (hi[i] as f64).clamp(-40.0, 40.0),
            );
            assert!(
                (got[i] as f64 - want).abs() < 1e-4 * want.abs().max(1.0),
                "{i}: {} vs {want}",
                got[i]
            );
        }
    }
}
