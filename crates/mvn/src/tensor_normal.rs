//! Φ, φ and Φ⁻¹ written with Burn tensor operations only, so that they run on any backend
//! (Flex, NdArray, CUDA). Same approximations as [`super::normal`] (Hart/West for Φ, Wichura's
//! AS 241 for Φ⁻¹), evaluated in the backend's float type; every branch is computed and the
//! right one selected with a mask, as a GPU would do anyway.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

use super::normal::{
    AS241_A, AS241_B, AS241_C, AS241_D, AS241_E, AS241_F, HART_P, HART_Q, INV_SQRT_2PI, SQRT_2PI,
};

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
    use crate::normal::{norm_cdf, norm_ppf};
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
            let want = crate::cholesky::truncated_mean(
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
