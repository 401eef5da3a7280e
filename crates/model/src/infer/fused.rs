//! The `fused` engine: the network compiled once, at load, into an allocation-free plan.
//!
//! At build time every layer is packed for the kernels that run it, the two heads are merged
//! into one `[h, 2k]` matrix (one product instead of two), and scratch buffers are allocated
//! for the largest block. A forward pass then only runs kernels; bias and activation are
//! applied in each kernel's epilogue while the accumulators are still in registers.
//!
//! Two register-blocked micro-kernels, both generic over the [`F32x`] SIMD abstraction and
//! compiled for AVX-512, AVX2+FMA and portable code (picked by runtime detection):
//!
//! * **rows in lanes** (`layer_t`, batches of ≥ [`Plan::small_rows`] rows). A block of up to
//!   `RV × LANES` rows (64 with AVX-512) is transposed once to feature-major order; each
//!   layer then computes a tile of `NB = 6` outputs × `RV` row vectors held in `6 × RV`
//!   accumulator registers, one FMA per weight per row vector, with the weight broadcast
//!   straight from L1. Any layer width keeps all lanes busy (the 6-wide merged head too), and
//!   the activations stay feature-major from layer to layer, so only the input (20 values per
//!   row) and the output (6 per row) are ever transposed.
//! * **outputs in lanes** (`tile_r`, 1 to `small_rows − 1` rows, and short tails of big
//!   batches). Each layer computes `MR` rows × `NV` output vectors.
//!
//! **Batch invariance.** Both kernels compute every output the same way: start from the
//! bias, add `w[k] · x[k]` for `k = 0, 1, …` with one fused multiply-add each, then the
//! activation (lane by lane, the same code in both). So on one instruction set a row's
//! result is bit-identical whatever the batch size, the row's position in the batch, the
//! kernel, tile or lane it lands in, and the thread count (`tests/it/exact.rs` checks it on
//! every instruction set of the CPU). Different instruction sets may differ in the last
//! bits (the portable path multiplies and adds separately).
//!
//! With `threads > 1`, batches of at least [`PAR_MIN_ROWS`] rows are split into contiguous
//! row ranges (multiples of the block) run on a per-engine rayon pool, each range with its
//! own scratch.

use std::sync::Arc;

use super::act::{self, Act};
use super::{Engine, HeadOutput, InferError, check_shape};
use crate::artifact::HostWeights;
use crate::model::RegressionNetConfig;
#[cfg(target_arch = "x86_64")]
use crate::simd::{Avx2, Avx512};
use crate::simd::{F32x, Isa, Kernel, Portable};

/// Outputs per rows-in-lanes tile.
pub(crate) const NB: usize = 6;
/// Column width the outputs-in-lanes kernel packs to (the widest vector).
const RPAD: usize = 16;
/// Scratch row stride of the rows-in-lanes kernel (the largest block).
pub(crate) const MAX_BLOCK: usize = 64;
/// Smallest batch split across threads.
pub const PAR_MIN_ROWS: usize = 2048;

/// One linear layer packed for both kernels.
#[derive(Debug, Clone)]
pub(crate) struct PackedLayer {
    /// Inputs.
    pub k: usize,
    /// Outputs.
    #[allow(dead_code)]
    pub n: usize,
    /// `n` rounded up to [`RPAD`] (outputs-in-lanes width).
    pub nr: usize,
    /// `n` rounded up to [`NB`] (rows-in-lanes width).
    pub nt: usize,
    /// `[k][nr]` row-major, zero-padded columns.
    pub w_r: Vec<f32>,
    /// `[k][nt]` row-major, zero-padded columns.
    pub w_t: Vec<f32>,
    /// Bias, zero-padded to `max(nr, nt)`.
    pub b: Vec<f32>,
    /// Epilogue activation.
    pub act: Act,
}

fn round_up(v: usize, m: usize) -> usize {
    v.div_ceil(m) * m
}

impl PackedLayer {
    /// Pack `w` (`[k][n]` row-major) and `b`.
    pub fn new(k: usize, n: usize, w: &[f32], b: &[f32], act: Act) -> Self {
        assert_eq!(w.len(), k * n);
        assert_eq!(b.len(), n);
        let nr = round_up(n, RPAD);
        let nt = round_up(n, NB);
        let mut w_r = vec![0.0; k * nr];
        let mut w_t = vec![0.0; k * nt];
        for i in 0..k {
            w_r[i * nr..i * nr + n].copy_from_slice(&w[i * n..(i + 1) * n]);
            w_t[i * nt..i * nt + n].copy_from_slice(&w[i * n..(i + 1) * n]);
        }
        let mut bias = vec![0.0; nr.max(nt)];
        bias[..n].copy_from_slice(b);
        Self {
            k,
            n,
            nr,
            nt,
            w_r,
            w_t,
            b: bias,
            act,
        }
    }
}

/// One layer as the kernels see it: `(k, n, w [k][n] row-major, b [n], activation)`.
pub(crate) type LoweredLayer = (usize, usize, Vec<f32>, Vec<f32>, Act);

/// Layers in the order the kernels run them: backbone…, then the merged `[h, 2k]` head.
pub(crate) fn lowered_layers(weights: &HostWeights) -> Result<Vec<LoweredLayer>, InferError> {
    let arch = &weights.arch;
    let bad = |m: String| InferError::InvalidWeights(m);
    let shapes = arch.layer_shapes();
    let layers: Vec<_> = weights
        .backbone
        .iter()
        .chain([&weights.mean_head, &weights.logvar_head])
        .collect();
    if layers.len() != shapes.len() {
        return Err(bad(format!(
            "{} layers, but the architecture has {}",
            layers.len(),
            shapes.len()
        )));
    }
    for (i, (l, &(fi, fo))) in layers.iter().zip(&shapes).enumerate() {
        if l.fan_in != fi || l.fan_out != fo || l.w.len() != fi * fo || l.b.len() != fo {
            return Err(bad(format!(
                "layer {i} is {}×{} with {} weights and {} biases, expected {fi}×{fo}",
                l.fan_in,
                l.fan_out,
                l.w.len(),
                l.b.len()
            )));
        }
    }
    let act = Act::from(arch.activation);
    let mut out: Vec<_> = weights
        .backbone
        .iter()
        .map(|l| (l.fan_in, l.fan_out, l.w.clone(), l.b.clone(), act))
        .collect();
    let (m, v) = (&weights.mean_head, &weights.logvar_head);
    let (h, k) = (m.fan_in, m.fan_out);
    let mut w = vec![0.0; h * 2 * k];
    for i in 0..h {
        w[i * 2 * k..i * 2 * k + k].copy_from_slice(&m.w[i * k..(i + 1) * k]);
        w[i * 2 * k + k..(i + 1) * 2 * k].copy_from_slice(&v.w[i * k..(i + 1) * k]);
    }
    let b: Vec<f32> = m.b.iter().chain(&v.b).copied().collect();
    out.push((h, 2 * k, w, b, Act::Identity));
    Ok(out)
}

/// The compiled network.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Packed layers; the last is the merged head.
    pub layers: Vec<PackedLayer>,
    /// Input features.
    pub nf: usize,
    /// Targets per head.
    pub k: usize,
    /// Widest activation (f32 values per row) any layer reads or writes, padded.
    pub max_width: usize,
    /// Batches below this many rows use the outputs-in-lanes kernel.
    pub small_rows: usize,
}

impl Plan {
    pub fn new(weights: &HostWeights, isa: Isa) -> Result<Self, InferError> {
        let layers: Vec<PackedLayer> = lowered_layers(weights)?
            .into_iter()
            .map(|(k, n, w, b, act)| PackedLayer::new(k, n, &w, &b, act))
            .collect();
        let nf = weights.arch.n_features;
        let max_width = layers
            .iter()
            .map(|l| l.k.max(l.nr).max(l.nt))
            .max()
            .unwrap_or(nf)
            .max(nf);
        Ok(Self {
            layers,
            nf,
            k: weights.arch.n_targets,
            max_width,
            small_rows: match isa {
                Isa::Avx512 => 24,
                _ => 8,
            },
        })
    }
}

/// An f32 buffer whose first element is 64-byte aligned (one cache line, one AVX-512
/// vector): the kernels' row stride is a multiple of 16 floats, so no vector load or
/// store splits a cache line.
#[derive(Debug, Clone)]
pub(crate) struct AlignedBuf<T = f32> {
    buf: Vec<T>,
    off: usize,
}

impl<T: Copy + Default> AlignedBuf<T> {
    /// `len` zeros (4-byte elements).
    pub fn new(len: usize) -> Self {
        debug_assert_eq!(std::mem::size_of::<T>(), 4);
        let buf = vec![T::default(); len + 16];
        let off = buf.as_ptr().align_offset(64).min(16);
        Self { buf, off }
    }

    pub fn as_ptr(&self) -> *const T {
        self.buf[self.off..].as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.buf[self.off..].as_mut_ptr()
    }
}

/// Per-thread scratch: two ping-pong activation buffers of `max_width × MAX_BLOCK` floats.
#[derive(Debug, Clone)]
pub(crate) struct Scratch {
    a: AlignedBuf,
    b: AlignedBuf,
}

impl Scratch {
    pub fn new(plan: &Plan) -> Self {
        let len = plan.max_width * MAX_BLOCK;
        Self {
            a: AlignedBuf::new(len),
            b: AlignedBuf::new(len),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Kernels.
// ---------------------------------------------------------------------------------------

/// Apply `act` in place to `rows` runs of `len` floats, `stride` apart (a tile just stored,
/// still in L1). Kept out of the register-blocked loops: a large activation body there
/// stops LLVM from keeping the accumulators in registers.
#[inline(always)]
pub(crate) unsafe fn act_in_place<S: F32x>(
    s: S,
    act: Act,
    p: *mut f32,
    rows: usize,
    stride: usize,
    len: usize,
) {
    macro_rules! pass {
        ($a:expr) => {
            for j in 0..rows {
                let mut o = 0;
                while o < len {
                    unsafe {
                        let q = p.add(j * stride + o);
                        s.store(q, act::apply(s, $a, s.load(q)));
                    }
                    o += S::LANES;
                }
            }
        };
    }
    match act {
        Act::Identity | Act::Relu => {}
        Act::Gelu => pass!(Act::Gelu),
        Act::Tanh => pass!(Act::Tanh),
        Act::Silu => pass!(Act::Silu),
    }
}

/// Store a tile `acc[j][v]` (output `c + j`, row vector `v`) and apply the activation:
/// ReLU in registers, the others in a second pass over the stored tile.
#[inline(always)]
unsafe fn store_tile_t<S: F32x, const RV: usize>(
    s: S,
    act: Act,
    acc: &[[S::V; RV]; NB],
    out: *mut f32,
    rs: usize,
) {
    unsafe {
        if act == Act::Relu {
            for (j, row) in acc.iter().enumerate() {
                for (v, a) in row.iter().enumerate() {
                    s.store(out.add(j * rs + v * S::LANES), s.max(*a, s.zero()));
                }
            }
        } else {
            for (j, row) in acc.iter().enumerate() {
                for (v, a) in row.iter().enumerate() {
                    s.store(out.add(j * rs + v * S::LANES), *a);
                }
            }
            act_in_place(s, act, out, NB, rs, RV * S::LANES);
        }
    }
}

/// One layer, rows in lanes: `xout[n][r] = act(b[n] + Σ_k w[k][n] · xin[k][r])` for `RV`
/// row vectors; `rs` is the row stride of both buffers.
#[inline(always)]
unsafe fn layer_t<S: F32x, const RV: usize>(
    s: S,
    l: &PackedLayer,
    xin: *const f32,
    xout: *mut f32,
    rs: usize,
) {
    unsafe {
        let mut c = 0;
        while c < l.nt {
            let mut acc = [[s.zero(); RV]; NB];
            for (j, row) in acc.iter_mut().enumerate() {
                let bj = s.splat(*l.b.get_unchecked(c + j));
                for a in row.iter_mut() {
                    *a = bj;
                }
            }
            let mut wp = l.w_t.as_ptr().add(c);
            let mut xp = xin;
            for _ in 0..l.k {
                let mut xv = [s.zero(); RV];
                for (v, x) in xv.iter_mut().enumerate() {
                    *x = s.load(xp.add(v * S::LANES));
                }
                for (j, row) in acc.iter_mut().enumerate() {
                    let w = s.splat(*wp.add(j));
                    for (a, x) in row.iter_mut().zip(xv.iter()) {
                        *a = s.fma(w, *x, *a);
                    }
                }
                wp = wp.add(l.nt);
                xp = xp.add(rs);
            }
            store_tile_t::<S, RV>(s, l.act, &acc, xout.add(c * rs), rs);
            c += NB;
        }
    }
}

#[inline(always)]
unsafe fn layer_t_dispatch<S: F32x>(
    s: S,
    rv: usize,
    l: &PackedLayer,
    xin: *const f32,
    xout: *mut f32,
    rs: usize,
) {
    unsafe {
        match rv {
            1 => layer_t::<S, 1>(s, l, xin, xout, rs),
            2 => layer_t::<S, 2>(s, l, xin, xout, rs),
            3 => layer_t::<S, 3>(s, l, xin, xout, rs),
            _ => layer_t::<S, 4>(s, l, xin, xout, rs),
        }
    }
}

/// One tile, outputs in lanes: `MR` rows × `NV` vectors of outputs starting at column
/// `col`; `xin` rows have stride `xs`, `xout` rows stride `os`.
#[inline(always)]
unsafe fn tile_r<S: F32x, const MR: usize, const NV: usize>(
    s: S,
    l: &PackedLayer,
    xin: *const f32,
    xs: usize,
    xout: *mut f32,
    os: usize,
    col: usize,
) {
    unsafe {
        let wbase = l.w_r.as_ptr().add(col);
        // Every output starts from its bias and adds `x[k] · w[k]` for k = 0, 1, … with one
        // FMA each: the order `layer_t` uses too, so a row's bits do not depend on which
        // kernel, tile or lane it lands in (batch invariance; see the module docs).
        let mut acc = [[s.zero(); NV]; MR];
        for row in acc.iter_mut() {
            for (v, a) in row.iter_mut().enumerate() {
                *a = s.load(l.b.as_ptr().add(col + v * S::LANES));
            }
        }
        for kk in 0..l.k {
            let wp = wbase.add(kk * l.nr);
            let mut w = [s.zero(); NV];
            for (v, x) in w.iter_mut().enumerate() {
                *x = s.load(wp.add(v * S::LANES));
            }
            for (m, row) in acc.iter_mut().enumerate() {
                let xb = s.splat(*xin.add(m * xs + kk));
                for (a, wv) in row.iter_mut().zip(w.iter()) {
                    *a = s.fma(xb, *wv, *a);
                }
            }
        }
        let out = xout.add(col);
        if l.act == Act::Relu {
            for (m, row) in acc.iter().enumerate() {
                for (v, a) in row.iter().enumerate() {
                    s.store(out.add(m * os + v * S::LANES), s.max(*a, s.zero()));
                }
            }
        } else {
            for (m, row) in acc.iter().enumerate() {
                for (v, a) in row.iter().enumerate() {
                    s.store(out.add(m * os + v * S::LANES), *a);
                }
            }
            act_in_place(s, l.act, out, MR, os, NV * S::LANES);
        }
    }
}

/// One layer, outputs in lanes, for `MR` rows: column blocks of `NVB` vectors, then the tail.
#[inline(always)]
unsafe fn layer_r<S: F32x, const MR: usize, const NVB: usize>(
    s: S,
    l: &PackedLayer,
    xin: *const f32,
    xs: usize,
    xout: *mut f32,
    os: usize,
) {
    unsafe {
        let nv = l.nr / S::LANES;
        let mut cv = 0;
        while cv + NVB <= nv {
            tile_r::<S, MR, NVB>(s, l, xin, xs, xout, os, cv * S::LANES);
            cv += NVB;
        }
        let col = cv * S::LANES;
        match nv - cv {
            0 => {}
            1 => tile_r::<S, MR, 1>(s, l, xin, xs, xout, os, col),
            2 => tile_r::<S, MR, 2>(s, l, xin, xs, xout, os, col),
            _ => tile_r::<S, MR, 3>(s, l, xin, xs, xout, os, col),
        }
    }
}

/// `MR` rows through every layer, outputs in lanes.
#[inline(always)]
unsafe fn rows_r<S: F32x, const MR: usize, const NVB: usize>(
    s: S,
    plan: &Plan,
    x: *const f32,
    scratch: &mut Scratch,
    mean: *mut f32,
    lv: *mut f32,
) {
    unsafe {
        let w = plan.max_width;
        let (mut a, mut b) = (scratch.a.as_mut_ptr(), scratch.b.as_mut_ptr());
        let (mut xin, mut xs) = (x, plan.nf);
        for l in &plan.layers {
            layer_r::<S, MR, NVB>(s, l, xin, xs, a, w);
            xin = a;
            xs = w;
            std::mem::swap(&mut a, &mut b);
        }
        let k = plan.k;
        for m in 0..MR {
            let h = xin.add(m * w);
            std::ptr::copy_nonoverlapping(h, mean.add(m * k), k);
            std::ptr::copy_nonoverlapping(h.add(k), lv.add(m * k), k);
        }
    }
}

/// One block of `rows ≤ RVMAX × LANES` rows through every layer, rows in lanes.
#[inline(always)]
unsafe fn block_t<S: F32x>(
    s: S,
    plan: &Plan,
    x: *const f32,
    rows: usize,
    scratch: &mut Scratch,
    mean: *mut f32,
    lv: *mut f32,
) {
    unsafe {
        let rs = MAX_BLOCK;
        let nf = plan.nf;
        let (mut a, mut b) = (scratch.a.as_mut_ptr(), scratch.b.as_mut_ptr());
        let rv = rows.div_ceil(S::LANES);
        for v in 0..rv {
            let n = (rows - v * S::LANES).min(S::LANES);
            let xr = x.add(v * S::LANES * nf);
            for i in 0..nf {
                s.store(a.add(i * rs + v * S::LANES), s.gather(xr.add(i), nf, n));
            }
        }
        for l in &plan.layers {
            layer_t_dispatch(s, rv, l, a, b, rs);
            std::mem::swap(&mut a, &mut b);
        }
        let k = plan.k;
        for v in 0..rv {
            let n = (rows - v * S::LANES).min(S::LANES);
            let (m, o) = (mean.add(v * S::LANES * k), lv.add(v * S::LANES * k));
            for j in 0..k {
                s.scatter(m.add(j), k, n, s.load(a.add(j * rs + v * S::LANES)));
                s.scatter(o.add(j), k, n, s.load(a.add((k + j) * rs + v * S::LANES)));
            }
        }
    }
}

/// A contiguous range of rows on one thread.
#[inline(always)]
unsafe fn forward_rows<S: F32x, const RVMAX: usize, const NVB: usize, const MRMAX: usize>(
    s: S,
    plan: &Plan,
    x: &[f32],
    rows: usize,
    scratch: &mut Scratch,
    mean: &mut [f32],
    lv: &mut [f32],
) {
    let (nf, k) = (plan.nf, plan.k);
    let (xp, mp, lp) = (x.as_ptr(), mean.as_mut_ptr(), lv.as_mut_ptr());
    unsafe {
        if rows < plan.small_rows {
            small_rows::<S, NVB, MRMAX>(s, plan, xp, 0, rows, scratch, mp, lp);
            return;
        }
        let block = RVMAX * S::LANES;
        let mut r = 0;
        while r < rows {
            let n = block.min(rows - r);
            if n < plan.small_rows {
                small_rows::<S, NVB, MRMAX>(s, plan, xp, r, n, scratch, mp, lp);
            } else {
                block_t(
                    s,
                    plan,
                    xp.add(r * nf),
                    n,
                    scratch,
                    mp.add(r * k),
                    lp.add(r * k),
                );
            }
            r += n;
        }
    }
}

/// Rows `start..start + n` with the outputs-in-lanes kernel: groups of `MRMAX` (8 or 4),
/// then 4, then single rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn small_rows<S: F32x, const NVB: usize, const MRMAX: usize>(
    s: S,
    plan: &Plan,
    xp: *const f32,
    start: usize,
    n: usize,
    scratch: &mut Scratch,
    mp: *mut f32,
    lp: *mut f32,
) {
    let (nf, k) = (plan.nf, plan.k);
    unsafe {
        let mut r = start;
        let end = start + n;
        if MRMAX == 8 {
            while r + 8 <= end {
                rows_r::<S, 8, NVB>(
                    s,
                    plan,
                    xp.add(r * nf),
                    scratch,
                    mp.add(r * k),
                    lp.add(r * k),
                );
                r += 8;
            }
        }
        while r + 4 <= end {
            rows_r::<S, 4, NVB>(
                s,
                plan,
                xp.add(r * nf),
                scratch,
                mp.add(r * k),
                lp.add(r * k),
            );
            r += 4;
        }
        while r < end {
            rows_r::<S, 1, NVB>(
                s,
                plan,
                xp.add(r * nf),
                scratch,
                mp.add(r * k),
                lp.add(r * k),
            );
            r += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn forward_avx512(
    t: Avx512,
    plan: &Plan,
    x: &[f32],
    rows: usize,
    scratch: &mut Scratch,
    mean: &mut [f32],
    lv: &mut [f32],
) {
    unsafe { forward_rows::<Avx512, 4, 4, 8>(t, plan, x, rows, scratch, mean, lv) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn forward_avx2(
    t: Avx2,
    plan: &Plan,
    x: &[f32],
    rows: usize,
    scratch: &mut Scratch,
    mean: &mut [f32],
    lv: &mut [f32],
) {
    unsafe { forward_rows::<Avx2, 2, 3, 4>(t, plan, x, rows, scratch, mean, lv) }
}

fn forward_portable(
    plan: &Plan,
    x: &[f32],
    rows: usize,
    scratch: &mut Scratch,
    mean: &mut [f32],
    lv: &mut [f32],
) {
    // SAFETY: portable lanes need no CPU feature; buffers are sized by the caller.
    unsafe { forward_rows::<Portable, 2, 2, 4>(Portable, plan, x, rows, scratch, mean, lv) }
}

/// Run `rows` rows on the calling thread with `kernel`.
pub(crate) fn run_range(
    kernel: Kernel,
    plan: &Plan,
    x: &[f32],
    rows: usize,
    scratch: &mut Scratch,
    mean: &mut [f32],
    lv: &mut [f32],
) {
    assert!(x.len() >= rows * plan.nf && mean.len() >= rows * plan.k && lv.len() >= rows * plan.k);
    match kernel {
        // SAFETY (both): the token proves the instructions exist on this CPU.
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512(t) => unsafe { forward_avx512(t, plan, x, rows, scratch, mean, lv) },
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2(t) => unsafe { forward_avx2(t, plan, x, rows, scratch, mean, lv) },
        Kernel::Portable(_) => forward_portable(plan, x, rows, scratch, mean, lv),
    }
}

/// Split `rows` into per-thread ranges of whole blocks and run them with `rayon::join`
/// (no heap allocation); `parts` holds one scratch per range.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_parallel<T: Send>(
    parts: &mut [T],
    x: &[f32],
    rows: usize,
    nf: usize,
    k: usize,
    chunk: usize,
    mean: &mut [f32],
    lv: &mut [f32],
    run: &(impl Fn(&mut T, &[f32], usize, &mut [f32], &mut [f32]) + Sync),
) {
    if parts.len() == 1 || rows <= chunk {
        run(&mut parts[0], x, rows, mean, lv);
        return;
    }
    let (p0, rest) = parts.split_at_mut(1);
    let (x0, x1) = x.split_at(chunk * nf);
    let (m0, m1) = mean.split_at_mut(chunk * k);
    let (l0, l1) = lv.split_at_mut(chunk * k);
    rayon::join(
        || run(&mut p0[0], x0, chunk, m0, l0),
        || run_parallel(rest, x1, rows - chunk, nf, k, chunk, m1, l1, run),
    );
}

/// Rows per thread for a parallel call: an equal share rounded up to whole blocks.
pub(crate) fn chunk_rows(rows: usize, threads: usize) -> usize {
    rows.div_ceil(threads).div_ceil(MAX_BLOCK) * MAX_BLOCK
}

/// The forward pass shared by the planned engines: check the input's shape, size the outputs,
/// then `run` the rows, split into contiguous ranges on the engine's pool (one scratch per
/// thread) when the batch is large enough, else inline with the first scratch.
pub(crate) fn run_engine<T: Send>(
    pool: Option<&rayon::ThreadPool>,
    scratch: &mut [T],
    x: &[f32],
    rows: usize,
    (nf, k): (usize, usize),
    out: &mut HeadOutput,
    run: &(impl Fn(&mut T, &[f32], usize, &mut [f32], &mut [f32]) + Sync),
) -> Result<(), InferError> {
    check_shape(x, rows, nf)?;
    fit(&mut out.mean, rows * k);
    fit(&mut out.log_var, rows * k);
    let (mean, lv) = (&mut out.mean, &mut out.log_var);
    match pool {
        Some(pool) if rows >= PAR_MIN_ROWS => {
            let chunk = chunk_rows(rows, scratch.len());
            pool.install(|| run_parallel(scratch, x, rows, nf, k, chunk, mean, lv, run));
        }
        _ => run(&mut scratch[0], x, rows, mean, lv),
    }
    Ok(())
}

/// A per-engine rayon pool (`None` for one thread).
pub(crate) fn make_pool(
    threads: usize,
    name: &str,
) -> Result<Option<rayon::ThreadPool>, InferError> {
    if threads <= 1 {
        return Ok(None);
    }
    let prefix = name.to_string();
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("kiln-{prefix}-{i}"))
        .build()
        .map(Some)
        .map_err(|e| InferError::Unavailable {
            engine: name.to_string(),
            reason: format!("cannot start a {threads}-thread pool: {e}"),
        })
}

/// Resize an output buffer to `n` values without touching it when it already fits.
pub(crate) fn fit(v: &mut Vec<f32>, n: usize) {
    if v.len() != n {
        v.resize(n, 0.0);
    }
}

/// The `fused` engine.
pub struct FusedEngine {
    plan: Arc<Plan>,
    arch: RegressionNetConfig,
    kernel: Kernel,
    threads: usize,
    pool: Option<rayon::ThreadPool>,
    scratch: Vec<Scratch>,
}

impl FusedEngine {
    /// Compile `weights` for the best instruction set of this CPU, running batches of at
    /// least [`PAR_MIN_ROWS`] rows on `threads` threads (0 or 1 = the calling thread only).
    pub fn new(weights: &HostWeights, threads: usize) -> Result<Self, InferError> {
        Self::with_isa(weights, threads, Isa::detect())
    }

    /// Like [`FusedEngine::new`] with an explicit instruction set (tests run every one the
    /// CPU supports); fails when the CPU lacks it.
    pub fn with_isa(weights: &HostWeights, threads: usize, isa: Isa) -> Result<Self, InferError> {
        let Some(kernel) = Kernel::new(isa) else {
            return Err(InferError::Unavailable {
                engine: "fused".into(),
                reason: format!("this CPU does not support {}", isa.name()),
            });
        };
        let threads = threads.max(1);
        let plan = Plan::new(weights, isa)?;
        let scratch = (0..threads).map(|_| Scratch::new(&plan)).collect();
        Ok(Self {
            plan: Arc::new(plan),
            arch: weights.arch.clone(),
            kernel,
            threads,
            pool: make_pool(threads, "fused")?,
            scratch,
        })
    }

    /// The instruction set the kernels run with.
    pub fn isa(&self) -> Isa {
        self.kernel.isa()
    }
}

impl Engine for FusedEngine {
    fn name(&self) -> String {
        "fused".into()
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
            &|s: &mut Scratch, x: &[f32], n, m: &mut [f32], l: &mut [f32]| {
                run_range(kernel, plan, x, n, s, m, l)
            },
        )
    }
}
