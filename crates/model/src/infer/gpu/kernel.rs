//! The whole network as **one CubeCL kernel**: every backbone layer with its activation and
//! both heads, for one row per thread.
//!
//! # Layout
//! * `params`: one packed buffer of `F` holding, layer after layer, the weight matrix
//!   (`fan_in × fan_out`, row-major "in × out", as [`HostLinear`](crate::artifact::HostLinear))
//!   then its bias. The two heads are packed as **one** output layer of `2k` columns (the
//!   mean head's `k` then the log-variance head's `k`), so both are written by the same loop.
//! * `dims`: `[n_features, hidden_1, …, hidden_L, 2k]` (u32): the layer widths, read at run
//!   time, so one compiled kernel serves every batch size (only the dtype, the activation and
//!   the local buffer's width are compile-time).
//! * `x`: `rows × n_features` (row-major); `rows` is `x.len() / n_features`.
//! * `out`: at least `rows × 2k`: row `r` holds its `k` means then its `k` log-variances.
//!
//! # Why one thread per row
//! kiln's networks are narrow (tens to a few hundred units) and shallow: a row's whole forward
//! pass fits in one thread's registers/local memory (two `width`-long buffers, ping-ponged),
//! every thread of a warp reads the same weight at the same time (a broadcast from cache), and
//! nothing needs a barrier or shared memory. A cube per row-tile with the weights in shared
//! memory would pay off only for weight matrices larger than the cache and batches far above
//! the GPU's thread count; at batch 1 both run one thread's worth of serial work.
//!
//! # Numerics
//! Inputs, weights, every layer's outputs and the results are `F` (f32, f16 or bf16: a
//! half-precision engine rounds each layer's activations to half, as a bf16 network does);
//! products are accumulated in f32 and the activations are evaluated in f32 (as PyTorch and
//! cuBLAS do for bf16). The activations are `fused`'s: ReLU, GELU with the exact error
//! function (the same Eigen/XLA rational approximation of `erf` as `fused`), tanh (the same
//! small-argument polynomial and `1 − 2/(e^{2|x|}+1)` form) and SiLU `x/(1+e^{−x})`; only `exp`
//! is the device's.

use cubecl::prelude::*;

/// The activation code of [`crate::model::Activation`] in the kernel (compile-time).
pub fn activation_code(a: crate::model::Activation) -> u32 {
    use crate::model::Activation as A;
    match a {
        A::Relu => 0,
        A::Gelu => 1,
        A::Tanh => 2,
        A::Silu => 3,
    }
}

/// `e^x` with the argument clamped to f32's finite range.
#[cube]
fn exp_clamped(x: f32) -> f32 {
    f32::exp(clamp(x, -87.0f32, 88.0f32))
}

/// `erf(x)`: the Eigen/XLA rational approximation `fused` uses (clamped to [-4, 4]).
#[cube]
#[allow(clippy::excessive_precision)]
fn erf_rational(x: f32) -> f32 {
    let x = clamp(x, -4.0f32, 4.0f32);
    let x2 = x * x;
    let mut p = f32::new(-2.726_142_2e-10);
    p = x2 * p + 2.770_681_4e-8f32;
    p = x2 * p + -2.101_024e-6f32;
    p = x2 * p + -5.692_506_4e-5f32;
    p = x2 * p + -7.349_906_3e-4f32;
    p = x2 * p + -2.954_599_8e-3f32;
    p = x2 * p + -1.609_603_3e-2f32;
    p *= x;
    let mut q = f32::new(-1.456_607_2e-5);
    q = x2 * q + -2.133_740_6e-4f32;
    q = x2 * q + -1.682_827e-3f32;
    q = x2 * q + -7.373_329e-3f32;
    q = x2 * q + -1.426_473_9e-2f32;
    p / q
}

/// `tanh(x)` as `fused` computes it: an odd polynomial below |x| = 0.625, else
/// `±(1 − 2/(e^{2|x|}+1))`.
#[cube]
#[allow(clippy::excessive_precision)]
fn tanh_like_fused(x: f32) -> f32 {
    let ax = min(f32::abs(x), 10.0f32);
    let e = exp_clamped(ax + ax);
    let mut big = 1.0f32 - 2.0f32 / (e + 1.0f32);
    if x < 0.0f32 {
        big = -big;
    }
    let z = x * x;
    let mut p = f32::new(-5.704_988_7e-3);
    p = p * z + 2.063_908_9e-2f32;
    p = p * z + -5.373_971_6e-2f32;
    p = p * z + 1.333_144_2e-1f32;
    p = p * z + -3.333_328_2e-1f32;
    let small = p * z * x + x;
    select(ax < 0.625f32, small, big)
}

/// The activation `act` ([`activation_code`]) of `v`.
#[cube]
fn activate(v: f32, #[comptime] act: u32) -> f32 {
    if comptime!(act == 0) {
        max(v, 0.0f32)
    } else if comptime!(act == 1) {
        0.5f32 * v * (1.0f32 + erf_rational(v * core::f32::consts::FRAC_1_SQRT_2))
    } else if comptime!(act == 2) {
        tanh_like_fused(v)
    } else {
        v / (1.0f32 + exp_clamped(-v))
    }
}

/// The network for rows `ABSOLUTE_POS` (see the module docs for the buffers' layout).
/// `width` (compile-time) is at least every layer's width and the input's; `act` is the
/// backbone's activation ([`activation_code`]).
#[cube(launch)]
pub fn network_kernel<F: Float>(
    x: &Array<F>,
    params: &Array<F>,
    dims: &Array<u32>,
    out: &mut Array<F>,
    #[comptime] width: usize,
    #[comptime] act: u32,
) {
    let n_in = dims[0] as usize;
    let n_layers = dims.len() - 1;
    let n_out = dims[n_layers] as usize;
    let rows = x.len() / n_in;
    let row = ABSOLUTE_POS;
    if row < rows {
        // Two width-long halves: layer l reads one, writes the other.
        let mut buf = Array::<F>::new(comptime!(2 * width));
        for i in 0..n_in {
            buf[i] = x[row * n_in + i];
        }
        let mut off = 0usize;
        let mut src = 0usize;
        for l in 0..n_layers - 1 {
            let fan_in = dims[l] as usize;
            let fan_out = dims[l + 1] as usize;
            let dst = width - src;
            let b_off = off + fan_in * fan_out;
            for j in 0..fan_out {
                let mut acc = f32::cast_from(params[b_off + j]);
                for i in 0..fan_in {
                    acc += f32::cast_from(buf[src + i])
                        * f32::cast_from(params[off + i * fan_out + j]);
                }
                buf[dst + j] = F::cast_from(activate(acc, act));
            }
            off = b_off + fan_out;
            src = dst;
        }
        // Both heads at once: one output layer of 2k columns, no activation.
        let fan_in = dims[n_layers - 1] as usize;
        let b_off = off + fan_in * n_out;
        for j in 0..n_out {
            let mut acc = f32::cast_from(params[b_off + j]);
            for i in 0..fan_in {
                acc += f32::cast_from(buf[src + i]) * f32::cast_from(params[off + i * n_out + j]);
            }
            out[row * n_out + j] = F::cast_from(acc);
        }
    }
}
