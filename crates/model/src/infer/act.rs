//! Activations applied in the kernels' epilogues, over kiln's f32 vectors
//! ([`crate::simd::F32x`]).

use crate::simd::F32x;
use crate::simd::f32x::{gelu, silu, tanh};

/// An activation applied in a kernel epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// None (the heads).
    Identity,
    /// max(x, 0).
    Relu,
    /// Exact (erf) GELU.
    Gelu,
    /// tanh.
    Tanh,
    /// x · sigmoid(x).
    Silu,
}

impl From<crate::model::Activation> for Act {
    fn from(a: crate::model::Activation) -> Self {
        use crate::model::Activation as A;
        match a {
            A::Relu => Act::Relu,
            A::Gelu => Act::Gelu,
            A::Tanh => Act::Tanh,
            A::Silu => Act::Silu,
        }
    }
}

/// Apply `act` to one vector.
#[inline(always)]
pub(crate) unsafe fn apply<S: F32x>(s: S, act: Act, v: S::V) -> S::V {
    unsafe {
        match act {
            Act::Identity => v,
            Act::Relu => s.max(v, s.zero()),
            Act::Gelu => gelu(s, v),
            Act::Tanh => tanh(s, v),
            Act::Silu => silu(s, v),
        }
    }
}

/// Scalar reference of an activation through the same vector code (portable lanes).
#[cfg(test)]
pub(crate) fn apply_scalar(act: Act, x: f32) -> f32 {
    // SAFETY: the portable implementation has no CPU requirements.
    unsafe { apply(crate::simd::Portable, act, [x; 8])[0] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::f32x::exp;
    #[cfg(target_arch = "x86_64")]
    use crate::simd::{Avx2, Avx512};
    use crate::simd::{Isa, Kernel, Portable};

    /// erf in f64 by its Maclaurin series (|x| ≤ 4.5: ample precision for f32 checks).
    fn erf64(x: f64) -> f64 {
        if x.abs() > 4.5 {
            return x.signum(); // 1 − erf(4.5) < 2e-10
        }
        let (mut term, mut sum, mut n) = (x, x, 0.0f64);
        while term.abs() > 1e-17 * sum.abs().max(1e-300) || n < 5.0 {
            n += 1.0;
            term *= -x * x / n;
            sum += term / (2.0 * n + 1.0);
            if n > 200.0 {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    fn grid() -> impl Iterator<Item = f32> {
        (-12_000..=12_000).map(|i| i as f32 * 1e-3)
    }

    fn check(isa: Isa, name: &str, f: impl Fn(f64) -> f64, act: Act, tol: f64) {
        let mut worst = (0.0f64, 0.0f32);
        for x in grid() {
            let got = run_act(isa, act, x) as f64;
            let want = f(x as f64);
            let err = (got - want).abs() / want.abs().max(1.0);
            if err > worst.0 {
                worst = (err, x);
            }
        }
        assert!(
            worst.0 < tol,
            "{name} on {isa:?}: error {:.3e} at x = {}",
            worst.0,
            worst.1
        );
    }

    fn run_act(isa: Isa, act: Act, x: f32) -> f32 {
        match Kernel::new(isa).expect("only paths this CPU has") {
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512(t) => {
                #[target_feature(enable = "avx512f")]
                unsafe fn f(t: Avx512, act: Act, x: f32) -> f32 {
                    let mut o = [0f32; 16];
                    unsafe { t.store(o.as_mut_ptr(), apply(t, act, t.splat(x))) };
                    o[3]
                }
                unsafe { f(t, act, x) }
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2(t) => {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn f(t: Avx2, act: Act, x: f32) -> f32 {
                    let mut o = [0f32; 8];
                    unsafe { t.store(o.as_mut_ptr(), apply(t, act, t.splat(x))) };
                    o[5]
                }
                unsafe { f(t, act, x) }
            }
            Kernel::Portable(_) => apply_scalar(act, x),
        }
    }

    #[test]
    fn activations_match_f64_references_on_every_isa() {
        for isa in Isa::available() {
            check(isa, "relu", |x| x.max(0.0), Act::Relu, 1e-9);
            check(isa, "tanh", f64::tanh, Act::Tanh, 3e-7);
            check(isa, "silu", |x| x / (1.0 + (-x).exp()), Act::Silu, 3e-7);
            check(
                isa,
                "gelu",
                |x| 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2)),
                Act::Gelu,
                // `1 + erf` cancels for large negative x: even an exact f32 erf leaves
                // |x| · 2⁻²⁴ there (Burn's libm-based GELU included).
                1.5e-6,
            );
        }
    }

    #[test]
    fn exp_is_accurate_and_saturates() {
        for i in -8700..=8800 {
            let x = i as f32 * 0.01;
            let got = unsafe { exp(Portable, [x; 8])[0] } as f64;
            let want = (x as f64).exp();
            assert!(
                (got - want).abs() / want < 3e-7,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert!(unsafe { exp(Portable, [-1000.0; 8])[0] } < 1e-37);
        assert!(unsafe { exp(Portable, [1000.0; 8])[0] }.is_finite());
    }
}
