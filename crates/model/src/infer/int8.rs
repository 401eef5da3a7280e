//! The `int8` engine: int8 weights per output channel, int8 activations per row, integer dot
//! products accumulated in i32.
//!
//! ## Scheme
//! * **Weights**, at load: symmetric per output channel `n`: `s_w[n] = max_k |W[k][n]| / 127`,
//!   `q_w = round(W / s_w) ∈ [−127, 127]`.
//! * **Activations**, per call, dynamically per row `r` of each layer's input:
//!   - inputs that can be negative (the features; hidden layers after GELU/tanh/SiLU):
//!     `a_r = max_k |x_rk| / 127`, `q = round(x / a_r) + 128 ∈ [1, 255]` (zero point 128);
//!   - inputs that cannot (hidden layers after ReLU): `a_r = max_k x_rk / 255`,
//!     `q = round(x / a_r) ∈ [0, 255]` — a full 8 bits for the common case.
//! * **Product**: `acc = Σ_k q_x · q_w − zp · Σ_k q_w` in i32 (the zero-point term is the
//!   accumulator's initial value, precomputed per channel), then one fused epilogue:
//!   `y = acc · (a_r · s_w[n]) + b[n]`, the activation, and the row maximum that quantises
//!   the next layer. The merged `[h, 2k]` head is dequantised straight into the outputs.
//!
//! ## Kernels
//! With AVX-512 VNNI (`vpdpbusd`: 64 u8×i8 products summed into 16 i32 lanes per
//! instruction) the layout is the fused engine's rows-in-lanes one: a block of 64 rows, each
//! i32 lane holding four consecutive int8 activations of one row, a tile of 6 outputs × 4 row
//! vectors in 24 accumulators, the four int8 weights of an output broadcast from L1. The row
//! maxima are vertical (lane-wise) maxima, and packing four quantised outputs into one lane
//! is three shifts and ORs, so requantisation between layers costs no shuffles.
//!
//! With AVX2 only, the same layout runs on 8-lane vectors with `vpmaddubsw` (32 u8×i8
//! products summed in pairs into 16 **i16** lanes) + `vpmaddwd` by ones (→ 8 i32) +
//! `vpaddd`. `vpmaddubsw` saturates its i16 pair sums: with the VNNI scheme's 8-bit
//! activations (up to 255) a pair reaches 2·255·127 = 64,770 > 32,767. The AVX2 kernel
//! therefore quantises every activation **symmetrically to [−127, 127] (step `a_r = m/127`,
//! no zero point)**: post-ReLU inputs land in [0, 127] and go straight in as the unsigned
//! operand; signed inputs move their sign onto the weight (`vpsignb w, x`; `vpabsb x` is
//! the unsigned operand), so every product is `|x|·(±w)` with `|x|, |w| ≤ 127` and every
//! pair sum is at most 2·127·127 = 32,258 — no saturation, the i32 results are exact. We
//! chose this over 7-bit activations with a zero point (`[1, 127]` around 64) because that
//! halves the signed resolution to `m/63` and breaks the documented bound (measured ×1.3
//! on a linear GELU network); the cost is one `vpsignb` per product vector on signed
//! layers. Post-ReLU layers get step `m/127` instead of VNNI's `m/255`, i.e. the precision
//! the VNNI path already has on signed layers. Around the dot products the AVX2 path keeps
//! the overheads small (measured with `perf record`, they were a third of its time): full
//! 8-row vectors of the input are transposed by 8 × 8 shuffles instead of per-feature
//! gathers, four quantised vectors are interleaved into packed lanes by two saturating packs
//! and one byte shuffle, and the row maxima of a tile of outputs are merged once per tile. The portable kernel (8-bit, the VNNI
//! arithmetic, row by row) runs elsewhere; it is correct but far slower than `fused`.
//!
//! ## Error bound
//! Each product's error is bounded by the two rounding steps: `|Δx| ≤ a_r/2` and
//! `|Δw| ≤ s_w/2`. The agreement tests (`tests/it/engines.rs`) check, per output,
//! `|y_int8 − y_f32| ≤ INT8_ABS_TOL + INT8_REL_TOL · |y_f32|` on seeded networks of several
//! shapes and every activation, and [`int8_accuracy_report`] measures the change of the
//! test-split MSE per target against the f32 model.

use std::sync::Arc;

use super::act::{self, Act};
use super::fused::{AlignedBuf, MAX_BLOCK, lowered_layers, make_pool, run_engine};
use super::{Engine, HeadOutput, InferError, check_shape};
use crate::artifact::HostWeights;
use crate::model::RegressionNetConfig;
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512Vnni};
use crate::simd::{F32x, Isa, Portable};

/// Absolute part of the documented int8 agreement bound (normalised output units).
pub const INT8_ABS_TOL: f32 = 0.03;
/// Relative part of the documented int8 agreement bound.
pub const INT8_REL_TOL: f32 = 0.03;

/// Output padding of an int8 layer: a multiple of the tile width and of the four int8
/// values packed per lane, so the next layer's packed inputs only read computed rows.
const QPAD: usize = 12;

/// One layer quantised and packed.
#[derive(Debug, Clone)]
struct QLayer {
    /// Inputs.
    #[allow(dead_code)]
    k: usize,
    /// Outputs.
    n: usize,
    /// Packed input groups: `ceil(k / 4)`.
    kq: usize,
    /// `n` rounded up to [`QPAD`].
    nt: usize,
    /// `[kq][nt]`: four int8 weights `w[4q..4q+4][n]` per i32 (the VNNI layout).
    wq: Vec<i32>,
    /// `[k][nt]` int8 weights, row-major (the portable layout).
    w8: Vec<i8>,
    /// `−zp · Σ_k q_w[k][n]`, the accumulators' initial value (8-bit activations).
    comp: Vec<i32>,
    /// Weight scales `s_w[n]` (0 for padding).
    sw: Vec<f32>,
    /// Biases (0 for padding).
    b: Vec<f32>,
    /// Epilogue activation.
    act: Act,
    /// The input is non-negative (post-ReLU): unsigned quantisation with zero point 0.
    unsigned_in: bool,
}

impl QLayer {
    fn new(k: usize, n: usize, w: &[f32], b: &[f32], act: Act, unsigned_in: bool) -> Self {
        let kq = k.div_ceil(4);
        let nt = n.div_ceil(QPAD) * QPAD;
        let mut wq = vec![0i32; kq * nt];
        let mut w8 = vec![0i8; k * nt];
        let mut comp = vec![0i32; nt];
        let mut sw = vec![0f32; nt];
        let mut bias = vec![0f32; nt];
        let zp = if unsigned_in { 0 } else { 128 };
        for j in 0..n {
            let m = (0..k).map(|i| w[i * n + j].abs()).fold(0f32, f32::max);
            let s = if m > 0.0 { m / 127.0 } else { 0.0 };
            sw[j] = s;
            bias[j] = b[j];
            let mut colsum = 0i32;
            for i in 0..k {
                let q = if s > 0.0 {
                    (w[i * n + j] / s).round().clamp(-127.0, 127.0) as i32
                } else {
                    0
                };
                colsum += q;
                w8[i * nt + j] = q as i8;
                let (g, t) = (i / 4, i % 4);
                wq[g * nt + j] |= (q & 0xff) << (8 * t);
            }
            comp[j] = -zp * colsum;
        }
        Self {
            k,
            n,
            kq,
            nt,
            wq,
            w8,
            comp,
            sw,
            b: bias,
            act,
            unsigned_in,
        }
    }
}

/// The quantised network.
#[derive(Debug, Clone)]
struct QPlan {
    layers: Vec<QLayer>,
    nf: usize,
    k: usize,
    /// Rows of the f32 buffer: the widest layer input or (padded) output.
    max_rows: usize,
    /// Rows of the packed buffer.
    max_kq: usize,
}

impl QPlan {
    fn new(weights: &HostWeights) -> Result<Self, InferError> {
        let lowered = lowered_layers(weights)?;
        let mut layers = Vec::with_capacity(lowered.len());
        let mut unsigned_in = false; // the features are signed
        for (k, n, w, b, act) in lowered {
            layers.push(QLayer::new(k, n, &w, &b, act, unsigned_in));
            unsigned_in = act == Act::Relu;
        }
        let nf = weights.arch.n_features;
        let max_rows = layers
            .iter()
            .map(|l| l.nt.max(l.kq * 4))
            .max()
            .unwrap_or(0)
            .max(nf.div_ceil(4) * 4);
        let max_kq = layers.iter().map(|l| l.kq).max().unwrap_or(0);
        Ok(Self {
            layers,
            nf,
            k: weights.arch.n_targets,
            max_rows,
            max_kq,
        })
    }
}

/// Per-thread scratch.
#[derive(Debug, Clone)]
struct QScratch {
    /// f32 activations, `[max_rows][MAX_BLOCK]`.
    f: AlignedBuf<f32>,
    /// Packed int8 activations, `[max_kq][MAX_BLOCK]`.
    q: AlignedBuf<i32>,
    /// Row scales of the current layer input.
    a: Vec<f32>,
    /// Row maxima of the current layer output.
    m: Vec<f32>,
    /// The portable kernel's rows.
    rows: PortableScratch,
}

impl QScratch {
    fn new(p: &QPlan) -> Self {
        Self {
            f: AlignedBuf::new(p.max_rows * MAX_BLOCK),
            q: AlignedBuf::new(p.max_kq.max(1) * MAX_BLOCK),
            a: vec![0.0; MAX_BLOCK],
            m: vec![0.0; MAX_BLOCK],
            rows: PortableScratch::new(p),
        }
    }
}

/// Transpose a block of input rows into `f` (`[nf][MAX_BLOCK]`), zero the padding rows up to
/// a multiple of four, and record each row's max |x| in `m` (lanes past `rows` get 0).
#[inline(always)]
unsafe fn load_block<S: F32x>(s: S, p: &QPlan, x: *const f32, rows: usize, sc: &mut QScratch) {
    unsafe { load_block_cols(s, p, x, rows, sc, 0) }
}

/// [`load_block`], except that full vectors (`S::LANES` rows) skip features `0..skip`
/// (their values and maxima), which the caller fills in.
#[inline(always)]
unsafe fn load_block_cols<S: F32x>(
    s: S,
    p: &QPlan,
    x: *const f32,
    rows: usize,
    sc: &mut QScratch,
    skip: usize,
) {
    let rs = MAX_BLOCK;
    let nf = p.nf;
    let f = sc.f.as_mut_ptr();
    unsafe {
        for v in 0..rows.div_ceil(S::LANES) {
            let n = (rows - v * S::LANES).min(S::LANES);
            let xr = x.add(v * S::LANES * nf);
            let fv = f.add(v * S::LANES);
            if n < 4 {
                // A few rows: plain copies beat masked gathers.
                for i in 0..nf.div_ceil(4) * 4 {
                    s.store(fv.add(i * rs), s.zero());
                }
                let m = sc.m.as_mut_ptr().add(v * S::LANES);
                s.store(m, s.zero());
                for r in 0..n {
                    let mut mx = 0f32;
                    for i in 0..nf {
                        let val = *xr.add(r * nf + i);
                        *fv.add(i * rs + r) = val;
                        mx = mx.max(val.abs());
                    }
                    *m.add(r) = mx;
                }
                continue;
            }
            let mut mx = s.zero();
            let from = if n == S::LANES { skip } else { 0 };
            for i in from..nf {
                let g = s.gather(xr.add(i), nf, n);
                mx = s.max(mx, s.abs(g));
                s.store(fv.add(i * rs), g);
            }
            s.store(sc.m.as_mut_ptr().add(v * S::LANES), mx);
            for i in nf..nf.div_ceil(4) * 4 {
                s.store(fv.add(i * rs), s.zero());
            }
        }
    }
}

/// Copy the head's dequantised outputs (`f`, `[2k][MAX_BLOCK]`) to the caller's buffers.
#[inline(always)]
unsafe fn store_block<S: F32x>(
    s: S,
    p: &QPlan,
    rows: usize,
    sc: &QScratch,
    mean: *mut f32,
    lv: *mut f32,
) {
    let (rs, k) = (MAX_BLOCK, p.k);
    let f = sc.f.as_ptr();
    unsafe {
        for v in 0..rows.div_ceil(S::LANES) {
            let n = (rows - v * S::LANES).min(S::LANES);
            let (m, o) = (mean.add(v * S::LANES * k), lv.add(v * S::LANES * k));
            for j in 0..k {
                s.scatter(m.add(j), k, n, s.load(f.add(j * rs + v * S::LANES)));
                s.scatter(o.add(j), k, n, s.load(f.add((k + j) * rs + v * S::LANES)));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Portable kernels: row by row, outputs in the inner loop (i32 arrays the compiler
// vectorises for the baseline target). Same arithmetic as the VNNI path.
// ---------------------------------------------------------------------------------------

/// Quantise one row `h` (`k` values) into `q` with row maximum `m`; returns the row scale.
#[inline(always)]
fn quantize_row(h: &[f32], unsigned: bool, q: &mut [i32]) -> f32 {
    let m = h.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (c, off) = if unsigned {
        (255.0, 0.0)
    } else {
        (127.0, 128.0)
    };
    let inv = if m > 0.0 { c / m } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(h) {
        *q = (v * inv + off).round_ties_even().clamp(0.0, 255.0) as i32;
    }
    m / c
}

/// One row through every layer; `h` and `g` are f32 scratch rows, `q` an i32 scratch row.
#[inline(always)]
fn row_portable(p: &QPlan, x: &[f32], sc: &mut PortableScratch, mean: &mut [f32], lv: &mut [f32]) {
    let PortableScratch { h, q, acc } = sc;
    h[..p.nf].copy_from_slice(x);
    let mut width = p.nf;
    for l in &p.layers {
        let a = quantize_row(&h[..width], l.unsigned_in, &mut q[..l.k]);
        // Blocks of QPAD outputs held in registers across the whole K loop.
        for c in (0..l.nt).step_by(QPAD) {
            let mut blk = [0i32; QPAD];
            blk.copy_from_slice(&l.comp[c..c + QPAD]);
            for (i, &xq) in q[..l.k].iter().enumerate() {
                let w = &l.w8[i * l.nt + c..i * l.nt + c + QPAD];
                for (b, &wv) in blk.iter_mut().zip(w) {
                    *b += xq * wv as i32;
                }
            }
            acc[c..c + QPAD].copy_from_slice(&blk);
        }
        for c in (0..l.n).step_by(8) {
            let n = (l.n - c).min(8);
            let mut y = [0f32; 8];
            for t in 0..n {
                y[t] = acc[c + t] as f32 * (a * l.sw[c + t]) + l.b[c + t];
            }
            // SAFETY: the portable lanes have no CPU requirement.
            let y = unsafe { act::apply(Portable, l.act, y) };
            h[c..c + n].copy_from_slice(&y[..n]);
        }
        width = l.n;
    }
    let k = p.k;
    mean.copy_from_slice(&h[..k]);
    lv.copy_from_slice(&h[k..2 * k]);
}

/// Scratch rows of the portable kernel.
#[derive(Debug, Clone)]
struct PortableScratch {
    h: Vec<f32>,
    q: Vec<i32>,
    acc: Vec<i32>,
}

impl PortableScratch {
    fn new(p: &QPlan) -> Self {
        Self {
            h: vec![0.0; p.max_rows],
            q: vec![0; p.max_rows],
            acc: vec![0; p.max_rows],
        }
    }
}

#[inline(always)]
fn range_portable(
    p: &QPlan,
    x: &[f32],
    rows: usize,
    sc: &mut QScratch,
    mean: &mut [f32],
    lv: &mut [f32],
) {
    let (nf, k) = (p.nf, p.k);
    for r in 0..rows {
        row_portable(
            p,
            &x[r * nf..(r + 1) * nf],
            &mut sc.rows,
            &mut mean[r * k..(r + 1) * k],
            &mut lv[r * k..(r + 1) * k],
        );
    }
}

// ---------------------------------------------------------------------------------------
// AVX2 kernels: `vpmaddubsw` + `vpmaddwd` on 7-bit activations.
// ---------------------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::act::Act;
    use super::super::fused::{MAX_BLOCK, act_in_place};
    use super::{QLayer, QPlan, QScratch};
    use crate::simd::{Avx2, F32x};

    const L: usize = 8;
    const _: () = assert!(super::QPAD.is_multiple_of(4) && super::QPAD.is_multiple_of(6));
    // No `vpmaddubsw` pair sum can saturate: 2 · 127 · 127 = 32,258 ≤ i16::MAX.
    const _: () = assert!(2 * 127 * 127 <= i16::MAX as i32);

    /// Quantise `sc.f` rows `0..4·kq` of `rv` row vectors (maxima in `sc.m`) with step
    /// `m/127` and no zero point: `[−127, 127]` (`[0, 127]` for post-ReLU inputs); four
    /// bytes per i32 lane.
    #[inline(always)]
    unsafe fn quantize(kq: usize, rv: usize, sc: &mut QScratch) {
        unsafe {
            let rs = MAX_BLOCK;
            let cv = _mm256_set1_ps(127.0);
            // Bytes `[q0 r0..r3, q1 r0..r3, q2 …, q3 …]` of each 128-bit half (after the
            // packs) → `[q0 q1 q2 q3]` of row r in dword r.
            let interleave = _mm256_setr_epi8(
                0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2,
                6, 10, 14, 3, 7, 11, 15,
            );
            let f = sc.f.as_ptr();
            let q = sc.q.as_mut_ptr();
            for v in 0..rv {
                let m = _mm256_loadu_ps(sc.m.as_ptr().add(v * L));
                let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(m, _mm256_setzero_ps());
                let inv = _mm256_and_ps(pos, _mm256_div_ps(cv, m));
                _mm256_storeu_ps(sc.a.as_mut_ptr().add(v * L), _mm256_div_ps(m, cv));
                for g in 0..kq {
                    let base = f.add(4 * g * rs + v * L);
                    macro_rules! qb {
                        ($i:expr) => {
                            _mm256_cvtps_epi32(_mm256_mul_ps(
                                _mm256_loadu_ps(base.add($i * rs)),
                                inv,
                            ))
                        };
                    }
                    let (q0, q1, q2, q3) = (qb!(0), qb!(1), qb!(2), qb!(3));
                    // |q| ≤ 127, so the saturating packs are exact; three packs and one
                    // in-lane byte shuffle instead of ten masks, shifts and ORs.
                    let bytes =
                        _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
                    let packed = _mm256_shuffle_epi8(bytes, interleave);
                    _mm256_storeu_si256(q.add(g * rs + v * L) as *mut __m256i, packed);
                }
            }
        }
    }

    /// One layer for the `RV` row vectors from `v0`, tiles of `NBT` outputs: per packed
    /// input group, `vpmaddubsw` (|x| × ±w pairs → i16, exact), `vpmaddwd` by ones (→ i32)
    /// and `vpaddd` into `NBT × RV` accumulators held in the 16 ymm registers. `SIGNED`
    /// inputs move their sign onto the weight (`vpsignb`) so the unsigned operand is |x|.
    #[inline(always)]
    unsafe fn layer<const RV: usize, const NBT: usize, const SIGNED: bool>(
        s: Avx2,
        l: &QLayer,
        sc: &mut QScratch,
        v0: usize,
    ) {
        unsafe {
            let rs = MAX_BLOCK;
            let qin = sc.q.as_ptr().add(v0 * L);
            let fout = sc.f.as_mut_ptr().add(v0 * L);
            let ones = _mm256_set1_epi16(1);
            let mut av = [_mm256_setzero_ps(); RV];
            let mut mx = [_mm256_setzero_ps(); RV];
            for (v, a) in av.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(sc.a.as_ptr().add((v0 + v) * L));
            }
            let relu = l.act == Act::Relu;
            let mut c = 0;
            // Tiles up to `n` only (not `nt`): rows `n..` of the output may keep stale
            // values, which the next layer multiplies by its zero padding weights (exact,
            // whatever byte they quantise to: |q| ≤ 255 × 0) and the head never reads.
            while c < l.n {
                let mut acc = [[_mm256_setzero_si256(); RV]; NBT];
                let mut wp = l.wq.as_ptr().add(c);
                let mut xp = qin;
                for _ in 0..l.kq {
                    let mut xv = [_mm256_setzero_si256(); RV];
                    let mut xa = [_mm256_setzero_si256(); RV];
                    for (v, (x, a)) in xv.iter_mut().zip(xa.iter_mut()).enumerate() {
                        *x = _mm256_loadu_si256(xp.add(v * L) as *const __m256i);
                        *a = if SIGNED { _mm256_abs_epi8(*x) } else { *x };
                    }
                    for (j, row) in acc.iter_mut().enumerate() {
                        let w = _mm256_set1_epi32(*wp.add(j));
                        for (v, a) in row.iter_mut().enumerate() {
                            let ws = if SIGNED {
                                _mm256_sign_epi8(w, xv[v])
                            } else {
                                w
                            };
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(xa[v], ws), ones);
                            *a = _mm256_add_epi32(*a, p);
                        }
                    }
                    wp = wp.add(l.nt);
                    xp = xp.add(rs);
                }
                // The tile's own maxima, merged into `mx` once per tile: `mx` lives on the
                // stack (the K loop needs the registers), and a store→load→max chain per
                // output was the epilogue's critical path.
                let mut tm = [_mm256_setzero_ps(); RV];
                for (j, row) in acc.iter().enumerate() {
                    let sw = _mm256_set1_ps(*l.sw.get_unchecked(c + j));
                    let b = _mm256_set1_ps(*l.b.get_unchecked(c + j));
                    for (v, a) in row.iter().enumerate() {
                        let y =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(*a), _mm256_mul_ps(av[v], sw), b);
                        let out = fout.add((c + j) * rs + v * L);
                        if relu {
                            let y = _mm256_max_ps(y, _mm256_setzero_ps());
                            s.store(out, y);
                            tm[v] = _mm256_max_ps(tm[v], y);
                        } else {
                            s.store(out, y);
                        }
                    }
                }
                if relu {
                    for (m, t) in mx.iter_mut().zip(tm) {
                        *m = _mm256_max_ps(*m, t);
                    }
                } else {
                    let tile = fout.add(c * rs);
                    act_in_place(s, l.act, tile, NBT, rs, RV * L);
                    for (v, m) in mx.iter_mut().enumerate() {
                        for j in 0..NBT {
                            *m = _mm256_max_ps(*m, s.abs(s.load(tile.add(j * rs + v * L))));
                        }
                    }
                }
                c += NBT;
            }
            for (v, m) in mx.iter().enumerate() {
                _mm256_storeu_ps(sc.m.as_mut_ptr().add((v0 + v) * L), *m);
            }
        }
    }

    /// [`super::load_block`] with full 8-row vectors transposed 8 features at a time by
    /// shuffles (8 row loads, 24 shuffles) instead of one 8-element gather per feature;
    /// the last `nf % 8` features and short vectors take the generic path.
    #[inline(always)]
    unsafe fn load_block(t: Avx2, p: &QPlan, x: *const f32, rows: usize, sc: &mut QScratch) {
        let full = rows / L;
        let (rs, nf) = (MAX_BLOCK, p.nf);
        let c8 = nf / 8 * 8;
        if full == 0 || c8 == 0 {
            return unsafe { super::load_block(t, p, x, rows, sc) };
        }
        unsafe {
            // The generic loader does the rest columns and short vectors (and the padding and
            // maxima); then the first `c8` features of the full vectors are overwritten with
            // the same values and their maxima folded in.
            super::load_block_cols(t, p, x, rows, sc, c8);
            let f = sc.f.as_mut_ptr();
            let sign = _mm256_set1_ps(-0.0);
            for v in 0..full {
                let xr = x.add(v * L * nf);
                let fv = f.add(v * L);
                let mut m0 = _mm256_loadu_ps(sc.m.as_ptr().add(v * L));
                let mut m1 = _mm256_setzero_ps();
                let mut c = 0;
                while c < c8 {
                    let ld = |i: usize| xr.add(i * nf + c);
                    let r = [
                        _mm256_loadu_ps(ld(0)),
                        _mm256_loadu_ps(ld(1)),
                        _mm256_loadu_ps(ld(2)),
                        _mm256_loadu_ps(ld(3)),
                        _mm256_loadu_ps(ld(4)),
                        _mm256_loadu_ps(ld(5)),
                        _mm256_loadu_ps(ld(6)),
                        _mm256_loadu_ps(ld(7)),
                    ];
                    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                    let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
                    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                    let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
                    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                    let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
                    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                    let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
                    let cols = [
                        _mm256_permute2f128_ps::<0x20>(u0, u4),
                        _mm256_permute2f128_ps::<0x20>(u1, u5),
                        _mm256_permute2f128_ps::<0x20>(u2, u6),
                        _mm256_permute2f128_ps::<0x20>(u3, u7),
                        _mm256_permute2f128_ps::<0x31>(u0, u4),
                        _mm256_permute2f128_ps::<0x31>(u1, u5),
                        _mm256_permute2f128_ps::<0x31>(u2, u6),
                        _mm256_permute2f128_ps::<0x31>(u3, u7),
                    ];
                    for (i, col) in cols.into_iter().enumerate() {
                        _mm256_storeu_ps(fv.add((c + i) * rs), col);
                        let a = _mm256_andnot_ps(sign, col);
                        if i % 2 == 0 {
                            m0 = _mm256_max_ps(m0, a);
                        } else {
                            m1 = _mm256_max_ps(m1, a);
                        }
                    }
                    c += 8;
                }
                _mm256_storeu_ps(sc.m.as_mut_ptr().add(v * L), _mm256_max_ps(m0, m1));
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn range(
        t: Avx2,
        p: &QPlan,
        x: &[f32],
        rows: usize,
        sc: &mut QScratch,
        mean: &mut [f32],
        lv: &mut [f32],
    ) {
        let (nf, k) = (p.nf, p.k);
        let mut r = 0;
        while r < rows {
            let n = MAX_BLOCK.min(rows - r);
            let rv = n.div_ceil(L);
            unsafe { load_block(t, p, x.as_ptr().add(r * nf), n, sc) };
            for l in &p.layers {
                unsafe {
                    quantize(l.kq, rv, sc);
                    let mut v = 0;
                    if l.unsigned_in {
                        while v + 2 <= rv {
                            layer::<2, 4, false>(t, l, sc, v);
                            v += 2;
                        }
                        if v < rv {
                            layer::<1, 6, false>(t, l, sc, v);
                        }
                    } else {
                        while v + 2 <= rv {
                            layer::<2, 4, true>(t, l, sc, v);
                            v += 2;
                        }
                        if v < rv {
                            layer::<1, 6, true>(t, l, sc, v);
                        }
                    }
                }
            }
            unsafe {
                super::store_block(
                    t,
                    p,
                    n,
                    sc,
                    mean.as_mut_ptr().add(r * k),
                    lv.as_mut_ptr().add(r * k),
                )
            };
            r += n;
        }
    }
}

// ---------------------------------------------------------------------------------------
// AVX-512 VNNI kernels.
// ---------------------------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::super::fused::{MAX_BLOCK, NB, act_in_place};

    const _: () = assert!(super::QPAD.is_multiple_of(12) && super::QPAD.is_multiple_of(NB));
    use super::super::act::Act;
    use super::{QLayer, QPlan, QScratch};
    use crate::simd::{Avx512, Avx512Vnni, F32x};

    const L: usize = 16;

    /// Quantise `sc.f` rows `0..4·kq` of `rv` row vectors with the maxima in `sc.m`.
    #[inline(always)]
    unsafe fn quantize(kq: usize, unsigned: bool, rv: usize, sc: &mut QScratch) {
        unsafe {
            let rs = MAX_BLOCK;
            let (c, off) = if unsigned {
                (255.0f32, 0.0f32)
            } else {
                (127.0, 128.0)
            };
            let (cv, offv) = (_mm512_set1_ps(c), _mm512_set1_ps(off));
            let f = sc.f.as_ptr();
            let q = sc.q.as_mut_ptr();
            for v in 0..rv {
                let m = _mm512_loadu_ps(sc.m.as_ptr().add(v * L));
                let pos = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(m, _mm512_setzero_ps());
                let inv = _mm512_maskz_div_ps(pos, cv, m);
                _mm512_storeu_ps(sc.a.as_mut_ptr().add(v * L), _mm512_div_ps(m, cv));
                for g in 0..kq {
                    let base = f.add(4 * g * rs + v * L);
                    let q0 = _mm512_cvtps_epi32(_mm512_fmadd_ps(_mm512_loadu_ps(base), inv, offv));
                    let q1 = _mm512_cvtps_epi32(_mm512_fmadd_ps(
                        _mm512_loadu_ps(base.add(rs)),
                        inv,
                        offv,
                    ));
                    let q2 = _mm512_cvtps_epi32(_mm512_fmadd_ps(
                        _mm512_loadu_ps(base.add(2 * rs)),
                        inv,
                        offv,
                    ));
                    let q3 = _mm512_cvtps_epi32(_mm512_fmadd_ps(
                        _mm512_loadu_ps(base.add(3 * rs)),
                        inv,
                        offv,
                    ));
                    let packed = _mm512_or_si512(
                        _mm512_or_si512(q0, _mm512_slli_epi32::<8>(q1)),
                        _mm512_or_si512(_mm512_slli_epi32::<16>(q2), _mm512_slli_epi32::<24>(q3)),
                    );
                    _mm512_storeu_si512(q.add(g * rs + v * L) as *mut __m512i, packed);
                }
            }
        }
    }

    #[inline(always)]
    /// One layer for `RV` row vectors with tiles of `NBT` outputs (12 for a single row
    /// vector, so that twelve independent accumulator chains hide the `vpdpbusd` latency).
    unsafe fn layer<const RV: usize, const NBT: usize>(s: Avx512, l: &QLayer, sc: &mut QScratch) {
        unsafe {
            let rs = MAX_BLOCK;
            let qin = sc.q.as_ptr();
            let fout = sc.f.as_mut_ptr();
            let mut av = [_mm512_setzero_ps(); RV];
            let mut mx = [_mm512_setzero_ps(); RV];
            for (v, a) in av.iter_mut().enumerate() {
                *a = _mm512_loadu_ps(sc.a.as_ptr().add(v * L));
            }
            let mut c = 0;
            while c < l.nt {
                let mut acc = [[_mm512_setzero_si512(); RV]; NBT];
                for (j, row) in acc.iter_mut().enumerate() {
                    let init = _mm512_set1_epi32(*l.comp.get_unchecked(c + j));
                    for a in row.iter_mut() {
                        *a = init;
                    }
                }
                let mut wp = l.wq.as_ptr().add(c);
                let mut xp = qin;
                for _ in 0..l.kq {
                    let mut xv = [_mm512_setzero_si512(); RV];
                    for (v, x) in xv.iter_mut().enumerate() {
                        *x = _mm512_loadu_si512(xp.add(v * L) as *const __m512i);
                    }
                    for (j, row) in acc.iter_mut().enumerate() {
                        let w = _mm512_set1_epi32(*wp.add(j));
                        for (a, x) in row.iter_mut().zip(xv.iter()) {
                            *a = _mm512_dpbusd_epi32(*a, *x, w);
                        }
                    }
                    wp = wp.add(l.nt);
                    xp = xp.add(rs);
                }
                // Dequantise (+ ReLU and the row maxima) in registers; other activations in
                // a second pass over the stored tile, so the K loop keeps its accumulators
                // in registers.
                let relu = l.act == Act::Relu;
                for (j, row) in acc.iter().enumerate() {
                    let sw = _mm512_set1_ps(*l.sw.get_unchecked(c + j));
                    let b = _mm512_set1_ps(*l.b.get_unchecked(c + j));
                    for (v, a) in row.iter().enumerate() {
                        let y =
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(*a), _mm512_mul_ps(av[v], sw), b);
                        let out = fout.add((c + j) * rs + v * L);
                        if relu {
                            let y = _mm512_max_ps(y, _mm512_setzero_ps());
                            s.store(out, y);
                            mx[v] = _mm512_max_ps(mx[v], y);
                        } else {
                            s.store(out, y);
                        }
                    }
                }
                if !relu {
                    let tile = fout.add(c * rs);
                    act_in_place(s, l.act, tile, NBT, rs, RV * L);
                    for (v, m) in mx.iter_mut().enumerate() {
                        for j in 0..NBT {
                            *m = _mm512_max_ps(*m, s.abs(s.load(tile.add(j * rs + v * L))));
                        }
                    }
                }
                c += NBT;
            }
            for (v, m) in mx.iter().enumerate() {
                _mm512_storeu_ps(sc.m.as_mut_ptr().add(v * L), *m);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn range(
        t: Avx512Vnni,
        p: &QPlan,
        x: &[f32],
        rows: usize,
        sc: &mut QScratch,
        mean: &mut [f32],
        lv: &mut [f32],
    ) {
        let (nf, k) = (p.nf, p.k);
        let s = t.avx512();
        let mut r = 0;
        while r < rows {
            let n = MAX_BLOCK.min(rows - r);
            let rv = n.div_ceil(L);
            unsafe { super::load_block(s, p, x.as_ptr().add(r * nf), n, sc) };
            for l in &p.layers {
                unsafe {
                    quantize(l.kq, l.unsigned_in, rv, sc);
                    match rv {
                        1 => layer::<1, 12>(s, l, sc),
                        2 => layer::<2, NB>(s, l, sc),
                        3 => layer::<3, NB>(s, l, sc),
                        _ => layer::<4, NB>(s, l, sc),
                    }
                }
            }
            unsafe {
                super::store_block(
                    s,
                    p,
                    n,
                    sc,
                    mean.as_mut_ptr().add(r * k),
                    lv.as_mut_ptr().add(r * k),
                )
            };
            r += n;
        }
    }
}

/// Whether this CPU has the AVX-512 VNNI integer path.
pub fn has_vnni() -> bool {
    QKernel::new(Isa::Avx512).is_some()
}

/// A proven int8 path: the CPU token of its instruction set.
#[derive(Clone, Copy)]
enum QKernel {
    /// AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    Vnni(Avx512Vnni),
    /// AVX2 + FMA: `vpmaddubsw`/`vpmaddwd` on 7-bit activations.
    #[cfg(target_arch = "x86_64")]
    Avx2(Avx2),
    /// The portable kernel.
    Portable,
}

impl QKernel {
    /// The int8 path `isa` (`Avx512` means AVX-512 VNNI), when this CPU can run it.
    fn new(isa: Isa) -> Option<Self> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Avx512Vnni::new().map(QKernel::Vnni),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Avx2::new().map(QKernel::Avx2),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx512 | Isa::Avx2 => None,
            Isa::Portable => Some(QKernel::Portable),
        }
    }

    fn isa(self) -> Isa {
        match self {
            #[cfg(target_arch = "x86_64")]
            QKernel::Vnni(_) => Isa::Avx512,
            #[cfg(target_arch = "x86_64")]
            QKernel::Avx2(_) => Isa::Avx2,
            QKernel::Portable => Isa::Portable,
        }
    }
}

fn run_range(
    kernel: QKernel,
    p: &QPlan,
    x: &[f32],
    rows: usize,
    sc: &mut QScratch,
    mean: &mut [f32],
    lv: &mut [f32],
) {
    assert!(x.len() >= rows * p.nf && mean.len() >= rows * p.k && lv.len() >= rows * p.k);
    match kernel {
        // SAFETY (both): the token proves the instructions exist on this CPU.
        #[cfg(target_arch = "x86_64")]
        QKernel::Vnni(t) => unsafe { vnni::range(t, p, x, rows, sc, mean, lv) },
        #[cfg(target_arch = "x86_64")]
        QKernel::Avx2(t) => unsafe { avx2::range(t, p, x, rows, sc, mean, lv) },
        QKernel::Portable => range_portable(p, x, rows, sc, mean, lv),
    }
}

/// The `int8` engine.
pub struct Int8Engine {
    plan: Arc<QPlan>,
    arch: RegressionNetConfig,
    kernel: QKernel,
    threads: usize,
    pool: Option<rayon::ThreadPool>,
    scratch: Vec<QScratch>,
}

impl Int8Engine {
    /// Quantise `weights` for the best integer path of this CPU (AVX-512 VNNI, else AVX2,
    /// else the portable kernel); batches of at least 2,048 rows run on `threads` threads.
    pub fn new(weights: &HostWeights, threads: usize) -> Result<Self, InferError> {
        let isa = [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|&isa| QKernel::new(isa).is_some())
            .unwrap_or(Isa::Portable);
        Self::with_isa(weights, threads, isa)
    }

    /// With an explicit path: `Avx512` (needs AVX-512 VNNI), `Avx2` (`vpmaddubsw`, needs
    /// AVX2 + FMA) or `Portable`.
    pub fn with_isa(weights: &HostWeights, threads: usize, isa: Isa) -> Result<Self, InferError> {
        let Some(kernel) = QKernel::new(isa) else {
            return Err(InferError::Unavailable {
                engine: "int8".into(),
                reason: format!(
                    "this CPU does not support the {} int8 path{}",
                    isa.name(),
                    if isa == Isa::Avx512 {
                        " (AVX-512 VNNI)"
                    } else {
                        ""
                    }
                ),
            });
        };
        let threads = threads.max(1);
        let plan = QPlan::new(weights)?;
        let scratch = (0..threads).map(|_| QScratch::new(&plan)).collect();
        Ok(Self {
            plan: Arc::new(plan),
            arch: weights.arch.clone(),
            kernel,
            threads,
            pool: make_pool(threads, "int8")?,
            scratch,
        })
    }

    /// The path the kernels run with.
    pub fn isa(&self) -> Isa {
        self.kernel.isa()
    }
}

impl Engine for Int8Engine {
    fn name(&self) -> String {
        "int8".into()
    }

    fn arch(&self) -> &RegressionNetConfig {
        &self.arch
    }

    fn threads(&self) -> usize {
        self.threads
    }

    fn forward(&mut self, x: &[f32], rows: usize, out: &mut HeadOutput) -> Result<(), InferError> {
        let (plan, kernel) = (&*self.plan, self.kernel);
        run_engine(
            self.pool.as_ref(),
            &mut self.scratch,
            x,
            rows,
            (plan.nf, plan.k),
            out,
            &|s: &mut QScratch, x: &[f32], n, m: &mut [f32], l: &mut [f32]| {
                run_range(kernel, plan, x, n, s, m, l)
            },
        )
    }
}

pub use crate::records::metrics::{Int8AccuracyReport, Int8TargetDelta};

/// Compare int8 with f32 (the `fused` engine, ≤ 1e-5 of Burn) on rows `x_raw` (original
/// units, `rows × nf`) with targets `y_raw` (`rows × k`), normalising with `features` and
/// un-normalising with `targets` as a checkpoint's manifest does.
pub fn int8_accuracy_on(
    weights: &HostWeights,
    features: &[crate::stats::ColumnStats],
    targets: &[crate::stats::ColumnStats],
    x_raw: &[f32],
    y_raw: &[f32],
) -> Result<Int8AccuracyReport, InferError> {
    let nf = weights.arch.n_features;
    let k = weights.arch.n_targets;
    let rows = x_raw.len() / nf.max(1);
    check_shape(x_raw, rows, nf)?;
    check_shape(y_raw, rows, k)?;
    let mut x = x_raw.to_vec();
    crate::stats::Affine::new(features).apply(&mut x);
    let mut f32_engine = super::FusedEngine::new(weights, 1)?;
    let mut i8_engine = Int8Engine::new(weights, 1)?;
    let (mut a, mut b) = (HeadOutput::default(), HeadOutput::default());
    f32_engine.forward(&x, rows, &mut a)?;
    i8_engine.forward(&x, rows, &mut b)?;
    let max_diff = |u: &[f32], v: &[f32]| {
        u.iter()
            .zip(v)
            .map(|(p, q)| (p - q).abs() as f64)
            .fold(0.0, f64::max)
    };
    let metrics = |o: &HeadOutput, j: usize| {
        let t = &targets[j];
        let (mut se, mut nll) = (0.0, 0.0);
        for r in 0..rows {
            let mu = o.mean[r * k + j] as f64 * t.std + t.mean;
            let lv = o.log_var[r * k + j] as f64 + 2.0 * t.std.ln();
            let y = y_raw[r * k + j] as f64;
            // A transformed target is scored in original units: the predictive mean, and
            // the density of y (the transformed NLL minus ln |dz/dy|).
            let (point, z, jac) = match t.transform.forward(y) {
                Some(z) if !t.transform.is_none() => (
                    t.transform.moments(mu, (0.5 * lv).exp()).0,
                    z,
                    t.transform.log_jacobian(y),
                ),
                _ => (mu, y, 0.0),
            };
            let d = y - point;
            se += d * d;
            nll += crate::util::gaussian_nll(z, mu, lv) + crate::util::HALF_LN_2PI - jac;
        }
        let n = rows.max(1) as f64;
        (se / n, nll / n)
    };
    let targets_out = (0..k)
        .map(|j| {
            let (mse_f32, nll_f32) = metrics(&a, j);
            let (mse_int8, nll_int8) = metrics(&b, j);
            Int8TargetDelta {
                target: targets[j].name.clone(),
                mse_f32,
                mse_int8,
                mse_rel_change: if mse_f32 > 0.0 {
                    (mse_int8 - mse_f32) / mse_f32
                } else {
                    0.0
                },
                nll_f32,
                nll_int8,
            }
        })
        .collect();
    Ok(Int8AccuracyReport {
        rows,
        kernel: i8_engine.isa().name().to_string(),
        targets: targets_out,
        max_abs_diff_mean: max_diff(&a.mean, &b.mean),
        max_abs_diff_log_var: max_diff(&a.log_var, &b.log_var),
    })
}
