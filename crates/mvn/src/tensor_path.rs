//! The tensor path: the same estimators written with Burn tensor operations only, for a batch
//! of B queries of one dimension d held in tensors (on Flex, NdArray, CUDA, …).
//!
//! 1. **Validation** on the device reduces the inputs to one flag per query (NaN limits,
//!    non-finite means or covariances, lower > upper, asymmetry, negative variances, and the
//!    positive-semi-definiteness checks of the factorisation); the flags come back to the host
//!    in one read. If a query is bad, only that query is read back and validated on the host,
//!    which gives the same precise error as the CPU path.
//! 2. **Pivoted Cholesky with Genz–Bretz reordering**, batched: d steps, each choosing the
//!    narrowest conditional interval per query with `argmin` and a one-hot vector, so the
//!    permutation never leaves the device. Thresholds are those of the CPU path scaled to f32
//!    ([`ZERO_PIVOT_REL_F32`], [`NEG_PIVOT_REL_F32`]).
//! 3. **Integration** in chunks of queries (bounded memory): the Genz product over the R × n
//!    points, or the naive inside-the-box fraction from the module's quantile tensor.
//!
//! The arithmetic is in the backend's float type (f32 on the CPU backends); the CPU path
//! computes in f64 and both agree to about 1e-6 (tested).

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::MvnMethod;
use super::cholesky::factor;
use super::error::MvnError;
use super::query::{MvnEstimate, MvnQueryBatch, SYMMETRY_TOLERANCE, prepare, prepare_queries};
use super::tensor_normal::{interval_mass, phi, phi_inv, truncated_mean};

/// Residual variance (relative to the variance) at or below which a pivot is deterministic,
/// on the tensor path (f32 arithmetic; the CPU path uses 1e-10).
pub const ZERO_PIVOT_REL_F32: f64 = 1e-5;
/// Residual variance (relative) below whose negative a pivot is an error, on the tensor path.
pub const NEG_PIVOT_REL_F32: f64 = 1e-4;
/// Limits are clamped to ±this before the one-hot products (∞ · 0 would be NaN).
const LIMIT_CLAMP: f64 = 1e30;
/// Elements per intermediate tensor the integration aims for.
const CHUNK_ELEMENTS: usize = 1 << 20;

/// A batch of B queries of dimension d as tensors.
#[derive(Debug, Clone)]
pub struct MvnTensorBatch<B: Backend> {
    /// Upper limits, [B, d]; +∞ allowed.
    pub upper: Tensor<B, 2>,
    /// Lower limits, [B, d]; `None` means −∞.
    pub lower: Option<Tensor<B, 2>>,
    /// Means, [B, d] or [1, d] (shared); `None` means 0.
    pub mean: Option<Tensor<B, 2>>,
    /// Covariances, [B, d, d] or [1, d, d] (shared).
    pub cov: Tensor<B, 3>,
}

impl<B: Backend> MvnTensorBatch<B> {
    /// Upper limits [B, d] and covariance [B or 1, d, d]; no lower limits, zero mean.
    pub fn new(upper: Tensor<B, 2>, cov: Tensor<B, 3>) -> Self {
        Self {
            upper,
            lower: None,
            mean: None,
            cov,
        }
    }

    /// Sets the lower limits, [B, d].
    pub fn with_lower(mut self, lower: Tensor<B, 2>) -> Self {
        self.lower = Some(lower);
        self
    }

    /// Sets the means, [B, d] or [1, d].
    pub fn with_mean(mut self, mean: Tensor<B, 2>) -> Self {
        self.mean = Some(mean);
        self
    }
}

/// The tensor path's answers: probability and standard error per query, each [B].
#[derive(Debug, Clone)]
pub struct MvnTensorEstimates<B: Backend> {
    /// Probabilities, [B], in [0, 1].
    pub p: Tensor<B, 1>,
    /// Standard errors, [B].
    pub se: Tensor<B, 1>,
}

impl<B: Backend> MvnTensorEstimates<B> {
    /// Reads the answers back to the host.
    pub fn to_host(&self) -> Result<Vec<MvnEstimate>, MvnError> {
        let p = tensor_to_vec(self.p.clone())?;
        let se = tensor_to_vec(self.se.clone())?;
        Ok(p.into_iter()
            .zip(se)
            .map(|(p, se)| MvnEstimate {
                p: p as f64,
                se: se as f64,
            })
            .collect())
    }
}

/// A host batch of mixed dimensions to be answered on the tensor path (on the module's
/// device): queries are validated on the host, grouped by dimension into tensor batches, and
/// the answers come back in input order.
#[derive(Debug, Clone, Copy)]
pub struct OnDevice<'a>(pub &'a MvnQueryBatch);

/// The factorised batch: L in pivot order, centred limits in pivot order, and which pivots
/// are deterministic.
struct TensorFactor<B: Backend> {
    l: Tensor<B, 3>,
    a: Tensor<B, 2>,
    b: Tensor<B, 2>,
    det: Tensor<B, 2>,
}

fn dims_text(d: &[usize]) -> String {
    let parts: Vec<String> = d.iter().map(|v| v.to_string()).collect();
    format!("shape [{}]", parts.join(", "))
}

/// What the tensor path needs of the estimator module: its constants and their sizes.
/// [`super::HaltonMvnCdf`] implements it; the trait keeps this file from importing the module
/// that calls it (one direction: `module` → `tensor_path`).
pub(crate) trait PointSets<B: Backend> {
    /// The estimator.
    fn method(&self) -> MvnMethod;
    /// The scrambled Halton point sets, R × n × max_dim.
    fn halton_points(&self) -> Tensor<B, 3>;
    /// Their normal quantiles (naive method only).
    fn normal_quantiles(&self) -> Option<Tensor<B, 3>>;
    /// The largest dimension answered.
    fn max_dim(&self) -> usize;
    /// Points per randomisation.
    fn points(&self) -> usize;
    /// Randomisations.
    fn randomizations(&self) -> usize;
    /// The device the constants live on.
    fn device(&self) -> B::Device;
}

/// Read a 1-D tensor back to the host as f32.
pub(crate) fn tensor_to_vec<B: Backend>(t: Tensor<B, 1>) -> Result<Vec<f32>, MvnError> {
    let data = t.try_into_data().map_err(|e| MvnError::Backend {
        context: "reading a tensor back to the host",
        message: format!("{e:?}"),
    })?;
    data.convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| MvnError::Backend {
            context: "converting tensor data to f32",
            message: format!("{e:?}"),
        })
}

/// Runs the tensor path on a batch.
pub(crate) fn estimate_tensor<B: Backend>(
    model: &impl PointSets<B>,
    batch: MvnTensorBatch<B>,
) -> Result<MvnTensorEstimates<B>, MvnError> {
    let device = model.device();
    let [n_q, d] = batch.upper.dims();
    if n_q == 0 || d == 0 {
        return Err(MvnError::batch_shape(
            "upper",
            dims_text(&[n_q, d]),
            "[B, d] with B >= 1 and d >= 1",
        ));
    }
    if d > model.max_dim() {
        return Err(MvnError::DimensionTooLarge {
            query: 0,
            dim: d,
            max_dim: model.max_dim(),
        });
    }
    if let Some(lower) = &batch.lower
        && lower.dims() != [n_q, d]
    {
        return Err(MvnError::batch_shape(
            "lower",
            dims_text(&lower.dims()),
            format!("shape [{n_q}, {d}] (like `upper`)"),
        ));
    }
    if let Some(mean) = &batch.mean {
        let md = mean.dims();
        if md[1] != d || (md[0] != n_q && md[0] != 1) {
            return Err(MvnError::batch_shape(
                "mean",
                dims_text(&md),
                format!("shape [{n_q}, {d}] or [1, {d}]"),
            ));
        }
    }
    let cd = batch.cov.dims();
    if cd[1] != d || cd[2] != d || (cd[0] != n_q && cd[0] != 1) {
        return Err(MvnError::batch_shape(
            "cov",
            dims_text(&cd),
            format!("shape [{n_q}, {d}, {d}] or [1, {d}, {d}]"),
        ));
    }

    let upper = batch.upper.to_device(&device);
    let lower = batch
        .lower
        .map(|l| l.to_device(&device))
        .unwrap_or_else(|| Tensor::full([n_q, d], f32::NEG_INFINITY, &device));
    let mean = batch
        .mean
        .map(|m| m.to_device(&device).expand([n_q, d]))
        .unwrap_or_else(|| Tensor::zeros([n_q, d], &device));
    let cov = batch.cov.to_device(&device).expand([n_q, d, d]);

    let input_bad = validate_inputs(&upper, &lower, &mean, &cov);
    let a0 = lower
        .clone()
        .sub(mean.clone())
        .clamp(-LIMIT_CLAMP, LIMIT_CLAMP);
    let b0 = upper
        .clone()
        .sub(mean.clone())
        .clamp(-LIMIT_CLAMP, LIMIT_CLAMP);
    let sym = cov.clone().add(cov.clone().swap_dims(1, 2)).mul_scalar(0.5);
    let (fac, psd_bad) = factorize(sym, a0, b0);

    // One read: a flag per query.
    let flags = tensor_to_vec(input_bad.add(psd_bad).reshape([-1]))?;
    if let Some(q) = flags.iter().position(|&f| f != 0.0) {
        return Err(explain_bad_query(
            q,
            model.max_dim(),
            &upper,
            &lower,
            &mean,
            &cov,
        ));
    }

    let (p, se) = match model.method() {
        MvnMethod::Genz => integrate_genz(model, &fac),
        MvnMethod::Naive => integrate_naive(model, &fac)?,
    };
    Ok(MvnTensorEstimates { p, se })
}

/// 1.0 per query whose inputs are invalid, else 0.0; [B, 1].
fn validate_inputs<B: Backend>(
    upper: &Tensor<B, 2>,
    lower: &Tensor<B, 2>,
    mean: &Tensor<B, 2>,
    cov: &Tensor<B, 3>,
) -> Tensor<B, 2> {
    let [n_q, d] = upper.dims();
    let bad_limits = upper
        .clone()
        .is_nan()
        .bool_or(lower.clone().is_nan())
        .bool_or(lower.clone().greater(upper.clone()))
        .bool_or(mean.clone().is_finite().bool_not())
        .float()
        .sum_dim(1);
    let bad_cov = cov
        .clone()
        .is_finite()
        .bool_not()
        .float()
        .reshape([n_q, d * d])
        .sum_dim(1);
    let eye = Tensor::<B, 2>::eye(d, &upper.device()).unsqueeze::<3>();
    let diag = cov.clone().mul(eye.clone()).sum_dim(2); // [B, d, 1]
    let scale = diag
        .clone()
        .matmul(diag.clone().swap_dims(1, 2))
        .abs()
        .sqrt(); // √(c_ii c_jj)
    let asym = cov
        .clone()
        .sub(cov.clone().swap_dims(1, 2))
        .abs()
        .greater(scale.mul_scalar(SYMMETRY_TOLERANCE * 1.01))
        .float()
        .reshape([n_q, d * d])
        .sum_dim(1);
    let neg = diag.lower_elem(0.0).float().reshape([n_q, d]).sum_dim(1);
    bad_limits.add(bad_cov).add(asym).add(neg).clamp_max(1.0)
}

/// The batched pivoted Cholesky (see the module docs). Returns the factor and a [B, 1] flag
/// of queries whose covariance is not positive semi-definite.
fn factorize<B: Backend>(
    cov: Tensor<B, 3>,
    a0: Tensor<B, 2>,
    b0: Tensor<B, 2>,
) -> (TensorFactor<B>, Tensor<B, 2>) {
    let device = cov.device();
    let [n_q, d, _] = cov.dims();
    let eye = Tensor::<B, 2>::eye(d, &device).unsqueeze::<3>();
    let var0 = cov.clone().mul(eye.clone()).sum_dim(2).reshape([n_q, d]);
    let index = Tensor::<B, 1, Int>::arange(0..d as i64, &device)
        .float()
        .unsqueeze::<2>()
        .expand([n_q, d]);
    let mut work = cov;
    let mut cond_mean = Tensor::<B, 2>::zeros([n_q, d], &device);
    let mut done = Tensor::<B, 2>::zeros([n_q, d], &device);
    let mut bad = Tensor::<B, 2>::zeros([n_q, 1], &device);
    let mut picks = Vec::with_capacity(d);
    let mut cols = Vec::with_capacity(d);
    let mut dets = Vec::with_capacity(d);

    for _step in 0..d {
        let diag = work.clone().mul(eye.clone()).sum_dim(2).reshape([n_q, d]);
        let open = done.clone().neg().add_scalar(1.0);
        // Negative residual variance among the open variables → not PSD.
        let negative = diag
            .clone()
            .lower(var0.clone().mul_scalar(-NEG_PIVOT_REL_F32))
            .float()
            .mul(open.clone())
            .sum_dim(1);
        bad = bad.add(negative);
        let candidate = diag
            .clone()
            .greater(var0.clone().mul_scalar(ZERO_PIVOT_REL_F32))
            .float()
            .mul(diag.clone().greater_elem(0.0).float())
            .mul(open.clone());
        let sigma = diag.clone().clamp_min(1e-30).sqrt();
        let za = a0
            .clone()
            .sub(cond_mean.clone())
            .div(sigma.clone())
            .clamp(-40.0, 40.0);
        let zb = b0
            .clone()
            .sub(cond_mean.clone())
            .div(sigma.clone())
            .clamp(-40.0, 40.0);
        let width = interval_mass(za.clone(), zb.clone());
        // Candidates score their width (≤ 1), open deterministic ones 2, chosen ones 4.
        let score = width
            .mul(candidate.clone())
            .add(candidate.clone().neg().add_scalar(1.0).mul_scalar(2.0))
            .add(done.clone().mul_scalar(2.0));
        let pick = score.argmin(1).float().expand([n_q, d]);
        let onehot = index.clone().equal(pick).float(); // [B, d]
        let is_random = candidate.mul(onehot.clone()).sum_dim(1); // [B, 1]
        let sigma_j = sigma.mul(onehot.clone()).sum_dim(1);
        let row_j = work
            .clone()
            .matmul(onehot.clone().unsqueeze_dim::<3>(2))
            .reshape([n_q, d]); // cov(k, j) for every k
        let col = row_j
            .clone()
            .div(sigma_j.clone().clamp_min(1e-30))
            .mul(open.clone())
            .mul(is_random.clone());
        // A deterministic pivot must have no residual covariance with the open variables.
        let diag_pos = diag.clone().clamp_min(0.0);
        let diag_j = diag_pos.clone().mul(onehot.clone()).sum_dim(1);
        let var0_j = var0.clone().mul(onehot.clone()).sum_dim(1);
        let tol = diag_pos.mul(diag_j).sqrt().add(
            var0.clone()
                .mul(var0_j)
                .sqrt()
                .mul_scalar(NEG_PIVOT_REL_F32),
        );
        let coupled = row_j
            .abs()
            .greater(tol)
            .float()
            .mul(open.clone().sub(onehot.clone()))
            .sum_dim(1)
            .mul(is_random.clone().neg().add_scalar(1.0));
        bad = bad.add(coupled);

        let col3 = col.clone().unsqueeze_dim::<3>(2); // [B, d, 1]
        work = work.sub(col3.clone().matmul(col3.swap_dims(1, 2)));
        let za_j = za.mul(onehot.clone()).sum_dim(1);
        let zb_j = zb.mul(onehot.clone()).sum_dim(1);
        let y = truncated_mean(za_j, zb_j).mul(is_random.clone());
        cond_mean = cond_mean.add(col.clone().mul(y));
        done = done.add(onehot.clone());
        picks.push(onehot);
        cols.push(col);
        dets.push(is_random.neg().add_scalar(1.0));
    }

    let perm = Tensor::stack::<3>(picks, 1); // [B, step, orig]
    let colmat = Tensor::stack::<3>(cols, 2); // [B, orig, step]
    let l = perm.clone().matmul(colmat).tril(0);
    let a = perm
        .clone()
        .matmul(a0.unsqueeze_dim::<3>(2))
        .reshape([n_q, d]);
    let b = perm.matmul(b0.unsqueeze_dim::<3>(2)).reshape([n_q, d]);
    let det = Tensor::cat(dets, 1);
    (TensorFactor { l, a, b, det }, bad.clamp_max(1.0))
}

/// The precise error for query `q`, found by reading that query back and validating it on
/// the host; a generic message if the host (f64) accepts what the device (f32) rejected.
fn explain_bad_query<B: Backend>(
    q: usize,
    max_dim: usize,
    upper: &Tensor<B, 2>,
    lower: &Tensor<B, 2>,
    mean: &Tensor<B, 2>,
    cov: &Tensor<B, 3>,
) -> MvnError {
    let [_, d] = upper.dims();
    let row = |t: &Tensor<B, 2>| tensor_to_vec(t.clone().narrow(0, q, 1).reshape([-1]));
    let read = || -> Result<MvnError, MvnError> {
        let up = row(upper)?;
        let lo = row(lower)?;
        let mu = row(mean)?;
        let c = tensor_to_vec(cov.clone().narrow(0, q, 1).reshape([-1]))?;
        let prepared = prepare(q, max_dim, &up, Some(&lo), Some(&mu), &c)?;
        factor(q, &prepared)?;
        Ok(MvnError::NotPositiveSemiDefinite {
            query: q,
            pivot: d.saturating_sub(1),
            variable: 0,
            detail: format!(
                "the f32 factorisation on the tensor path found a residual variance below \
                 −{NEG_PIVOT_REL_F32:e} × the variance (the matrix is nearly singular)"
            ),
        })
    };
    match read() {
        Ok(e) | Err(e) => e,
    }
}

/// The first `d_use` coordinates of the points, randomisation-major, as [d_use, R·n]
/// (row i = coordinate i).
fn point_rows<B: Backend>(model: &impl PointSets<B>, d_use: usize) -> Tensor<B, 2> {
    let points = model.halton_points(); // [R, n, m]
    let [rr, n, _] = points.dims();
    points
        .narrow(2, 0, d_use)
        .reshape([rr * n, d_use])
        .transpose()
}

/// Mean and standard error across randomisations of per-point values `values` [C, R·n].
fn combine<B: Backend>(values: Tensor<B, 2>, rr: usize, n: usize) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let [c, _] = values.dims();
    let per_r = values.reshape([c, rr, n]).mean_dim(2).reshape([c, rr]);
    let p = per_r.clone().mean_dim(1); // [C, 1]
    let dev = per_r.sub(p.clone());
    let var = dev.square().sum_dim(1).div_scalar(((rr - 1) * rr) as f64);
    (p.clamp(0.0, 1.0).reshape([c]), var.sqrt().reshape([c]))
}

fn integrate_genz<B: Backend>(
    model: &impl PointSets<B>,
    fac: &TensorFactor<B>,
) -> (Tensor<B, 1>, Tensor<B, 1>) {
    let [n_q, d] = fac.a.dims();
    let n = model.points();
    let rr = model.randomizations();
    let m = n * rr;
    let u = if d > 1 {
        Some(point_rows(model, d - 1))
    } else {
        None
    };
    let chunk = (CHUNK_ELEMENTS / m).clamp(1, n_q);
    let mut ps = Vec::new();
    let mut ses = Vec::new();
    let mut start = 0;
    while start < n_q {
        let c = chunk.min(n_q - start);
        let l = fac.l.clone().narrow(0, start, c);
        let a = fac.a.clone().narrow(0, start, c);
        let b = fac.b.clone().narrow(0, start, c);
        let det = fac.det.clone().narrow(0, start, c);
        let mut prod = Tensor::<B, 2>::ones([c, m], &l.device());
        let mut ys: Vec<Tensor<B, 2>> = Vec::with_capacity(d);
        for i in 0..d {
            let mut s = Tensor::<B, 2>::zeros([c, m], &l.device());
            for (k, yk) in ys.iter().enumerate() {
                let lik = l.clone().slice([0..c, i..i + 1, k..k + 1]).reshape([c, 1]);
                s = s.add(yk.clone().mul(lik));
            }
            let det_i = det.clone().narrow(1, i, 1); // [C, 1]
            let is_det = det_i.clone().greater_elem(0.5);
            let lii = l.clone().slice([0..c, i..i + 1, i..i + 1]).reshape([c, 1]);
            let inv = lii.mask_fill(is_det.clone(), 1.0).recip();
            let ai = a.clone().narrow(1, i, 1);
            let bi = b.clone().narrow(1, i, 1);
            let xa = ai.clone().sub(s.clone()).mul(inv.clone());
            let xb = bi.clone().sub(s.clone()).mul(inv);
            let flip = xa.clone().greater_elem(0.0);
            let la = xa.clone().mask_where(flip.clone(), xb.clone().neg());
            let hb = xb.mask_where(flip.clone(), xa.neg());
            let lo = phi(la);
            let wid = phi(hb).sub(lo.clone()).clamp_min(0.0);
            let inside = s
                .clone()
                .greater_equal(ai.expand([c, m]))
                .bool_and(s.lower_equal(bi.expand([c, m])))
                .float();
            let factor = wid.clone().mask_where(is_det.expand([c, m]), inside);
            prod = prod.mul(factor);
            if i + 1 < d
                && let Some(u) = &u
            {
                let ui = u.clone().narrow(0, i, 1).expand([c, m]);
                let w = ui
                    .clone()
                    .mask_where(flip.clone(), ui.neg().add_scalar(1.0));
                let t = lo.add(w.mul(wid));
                let y = phi_inv(t);
                let y = y.clone().mask_where(flip, y.neg());
                ys.push(y);
            }
        }
        let (p, se) = combine(prod, rr, n);
        ps.push(p);
        ses.push(se);
        start += c;
    }
    (Tensor::cat(ps, 0), Tensor::cat(ses, 0))
}

fn integrate_naive<B: Backend>(
    model: &impl PointSets<B>,
    fac: &TensorFactor<B>,
) -> Result<(Tensor<B, 1>, Tensor<B, 1>), MvnError> {
    let [n_q, d] = fac.a.dims();
    let n = model.points();
    let rr = model.randomizations();
    let m = n * rr;
    let quantiles = model.normal_quantiles().ok_or(MvnError::InvalidConfig {
        field: "normal_quantiles",
        value: "absent".into(),
        expected: "the quantile tensor of a module built with method naive".into(),
    })?;
    let z = quantiles.narrow(2, 0, d).reshape([m, d]);
    let chunk = (CHUNK_ELEMENTS / (m * d)).clamp(1, n_q);
    let mut ps = Vec::new();
    let mut ses = Vec::new();
    let mut start = 0;
    while start < n_q {
        let c = chunk.min(n_q - start);
        let l = fac.l.clone().narrow(0, start, c);
        let a = fac
            .a
            .clone()
            .narrow(0, start, c)
            .unsqueeze_dim::<3>(1)
            .expand([c, m, d]);
        let b = fac
            .b
            .clone()
            .narrow(0, start, c)
            .unsqueeze_dim::<3>(1)
            .expand([c, m, d]);
        let x = z
            .clone()
            .unsqueeze::<3>()
            .expand([c, m, d])
            .matmul(l.swap_dims(1, 2)); // [C, m, d]
        let inside = x
            .clone()
            .greater_equal(a)
            .bool_and(x.lower_equal(b))
            .all_dim(2)
            .float()
            .reshape([c, m]);
        let (p, se) = combine(inside, rr, n);
        ps.push(p);
        ses.push(se);
        start += c;
    }
    Ok((Tensor::cat(ps, 0), Tensor::cat(ses, 0)))
}

/// Runs a mixed-dimension host batch on the tensor path (see [`OnDevice`]).
pub(crate) fn estimate_on_device<B: Backend>(
    model: &impl PointSets<B>,
    batch: &MvnQueryBatch,
) -> Result<Vec<MvnEstimate>, MvnError> {
    let prepared = prepare_queries(&batch.queries, model.max_dim())?;
    for (q, p) in prepared.iter().enumerate() {
        factor(q, p)?;
    }
    let device = model.device();
    let mut out = vec![MvnEstimate { p: 0.0, se: 0.0 }; prepared.len()];
    let mut dims: Vec<usize> = prepared.iter().map(|p| p.d).collect();
    dims.sort_unstable();
    dims.dedup();
    for d in dims {
        let members: Vec<usize> = (0..prepared.len())
            .filter(|&q| prepared[q].d == d)
            .collect();
        let g = members.len();
        let mut lo = Vec::with_capacity(g * d);
        let mut up = Vec::with_capacity(g * d);
        let mut cv = Vec::with_capacity(g * d * d);
        for &q in &members {
            // Prepared limits are already centred; infinities survive the f32 cast.
            lo.extend(prepared[q].a.iter().map(|&v| v as f32));
            up.extend(prepared[q].b.iter().map(|&v| v as f32));
            cv.extend(prepared[q].cov.iter().map(|&v| v as f32));
        }
        let tb = MvnTensorBatch::new(
            Tensor::from_data(TensorData::new(up, [g, d]), &device),
            Tensor::from_data(TensorData::new(cv, [g, d, d]), &device),
        )
        .with_lower(Tensor::from_data(TensorData::new(lo, [g, d]), &device));
        let est = estimate_tensor(model, tb)
            .map_err(|e| e.map_query(|local| members[local]))?
            .to_host()?;
        for (k, &q) in members.iter().enumerate() {
            out[q] = est[k];
        }
    }
    Ok(out)
}
