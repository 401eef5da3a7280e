//! The GPU engines' common part (cargo feature `cuda` or `wgpu`): the Burn module on a CubeCL
//! backend (CUDA, or wgpu/Vulkan — Mesa's software lavapipe in CI), with an **explicit float
//! dtype**, bucketed and pre-warmed shapes, and its measured deviation from `fused`.
//!
//! # Why the dtype is explicit
//! Burn 0.21 keeps the default float dtype per *device*, not per backend type: whichever
//! backend creates the first tensor on a device fixes it for the process, and
//! `Tensor::<Cuda<bf16>, _>::from_data(data, &device)` afterwards silently makes an f32 tensor.
//! The CUDA probe created an f32 tensor first, so `cuda-bf16` computed in f32 (bit-identical to
//! `cuda-f32` on an H200). Here every device tensor — the weights and each request's input — is
//! created with `(&device, dtype)`, and the operations keep their inputs' dtype: a `bf16`
//! engine computes in bf16 whatever the device's default, and [`GpuEngine::dtype`] reads the
//! weights' dtype back from the device tensors.
//!
//! # Buckets
//! CubeCL compiles (and may autotune) a kernel the first time each shape runs, so the engine
//! runs every batch bucket of [`BUCKETS`] once at build time and pads each request up to the
//! next bucket: the request path never meets a new shape. Requests above the largest bucket
//! run in chunks of it.
//!
//! # Deviation from `fused`
//! At build, [`GpuEngine::on_device`] runs [`PROBE_ROWS`] seeded rows through the engine and
//! through [`FusedEngine`] (exact f32) and keeps the largest absolute difference per head
//! ([`GpuDeviation`]); [`Engine::load_note`] reports it, and `kiln bench`/`kiln serve` print it
//! at load, as `int8`'s accuracy change is.

pub mod engine;
// The `#[cube(launch)]` macro generates undocumented public items (the launch module).
#[allow(missing_docs)]
pub mod kernel;

#[cfg(feature = "wgpu")]
pub use engine::WgpuKernelEngine;
pub use engine::{KernelEngine, KernelFloat};

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use super::{Engine, FusedEngine, HeadOutput, InferError, check_shape};
use crate::artifact::{HostLinear, HostWeights};
use crate::model::{RegressionNet, RegressionNetConfig};

/// Batch buckets compiled at load; requests are padded up to the next one.
pub const BUCKETS: [usize; 7] = [1, 8, 32, 128, 1024, 8192, 65536];

/// Rows of the seeded probe batch compared with `fused` at build.
pub const PROBE_ROWS: usize = 256;

/// The smallest bucket holding `rows` (the largest when none does).
pub fn bucket_for(rows: usize) -> usize {
    BUCKETS
        .iter()
        .copied()
        .find(|&b| b >= rows)
        .unwrap_or(BUCKETS[BUCKETS.len() - 1])
}

/// A GPU engine's measured largest absolute difference from `fused` (exact f32), on
/// [`PROBE_ROWS`] seeded rows of standard-normal-like features.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuDeviation {
    /// Rows compared.
    pub rows: usize,
    /// Largest |engine − fused| of the mean head.
    pub max_abs_diff_mean: f32,
    /// Largest |engine − fused| of the log-variance head.
    pub max_abs_diff_log_var: f32,
}

/// The Burn module on a CubeCL backend with an explicit float dtype and bucketed, pre-warmed
/// shapes.
pub struct GpuEngine<B: Backend> {
    model: RegressionNet<B>,
    arch: RegressionNetConfig,
    device: B::Device,
    dtype: DType,
    label: String,
    staging: Vec<f32>,
    deviation: Option<GpuDeviation>,
    fallback: Option<String>,
}

/// `weights` on `device` as `dtype` tensors (never the device's default dtype).
pub fn model_with_dtype<B: Backend>(
    weights: &HostWeights,
    device: &B::Device,
    dtype: DType,
) -> RegressionNet<B> {
    let mk = |l: &HostLinear| Linear {
        weight: Param::from_tensor(Tensor::from_data(
            TensorData::new(l.w.clone(), [l.fan_in, l.fan_out]),
            (device, dtype),
        )),
        bias: Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(l.b.clone(), [l.fan_out]),
            (device, dtype),
        ))),
    };
    RegressionNet {
        backbone: weights.backbone.iter().map(mk).collect(),
        mean_head: mk(&weights.mean_head),
        logvar_head: mk(&weights.logvar_head),
        activation: weights.arch.activation,
        members: 1,
    }
}

impl<B: Backend> GpuEngine<B> {
    /// Upload `weights` to `device` as `dtype`, warm up every bucket and measure the deviation
    /// from `fused`. The caller has checked that the device is usable (a CubeCL device thread
    /// panics otherwise); a panic of the backend while building is caught and returned as
    /// [`InferError::Unavailable`].
    pub fn on_device(
        weights: &HostWeights,
        label: &str,
        device: B::Device,
        dtype: DType,
    ) -> Result<Self, InferError> {
        let build = || -> Result<Self, InferError> {
            let model = model_with_dtype::<B>(weights, &device, dtype);
            let mut engine = Self {
                model,
                arch: weights.arch.clone(),
                device: device.clone(),
                dtype,
                label: label.to_string(),
                staging: Vec::new(),
                deviation: None,
                fallback: None,
            };
            let mut out = HeadOutput::default();
            for &b in &BUCKETS {
                let x = vec![0.0f32; b * engine.arch.n_features];
                engine.forward(&x, b, &mut out)?;
            }
            engine.deviation = Some(engine.measure_deviation(weights)?);
            if let Some(note) = engine.load_note() {
                // Every place that loads a GPU engine (`kiln serve`'s log, `kiln bench`)
                // shows what it computes in and how far from `fused`, as for int8.
                tracing::info!(target: "kiln::infer::gpu", "{note}");
            }
            Ok(engine)
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(build)).unwrap_or_else(|p| {
            Err(InferError::Unavailable {
                engine: label.to_string(),
                reason: format!(
                    "the GPU backend panicked: {}",
                    crate::backend::panic_text(&*p)
                ),
            })
        })
    }

    /// The float dtype of the weights on the device (read back from the device tensors, not
    /// the one asked for).
    pub fn dtype(&self) -> DType {
        self.model.mean_head.weight.val().dtype()
    }

    /// The float dtype asked for at build.
    pub fn requested_dtype(&self) -> DType {
        self.dtype
    }

    /// The deviation from `fused` measured at build.
    pub fn deviation(&self) -> Option<GpuDeviation> {
        self.deviation
    }

    /// Records why this engine stands in for the fused kernel ([`engine::kernel_or_module`]);
    /// the load note says it.
    pub fn with_fallback_reason(mut self, why: impl Into<String>) -> Self {
        self.fallback = Some(why.into());
        self
    }

    /// Why this engine stands in for the fused kernel, when it does.
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    fn measure_deviation(&mut self, weights: &HostWeights) -> Result<GpuDeviation, InferError> {
        let rows = PROBE_ROWS;
        let x = probe_rows(rows, weights.arch.n_features);
        let mut fused = FusedEngine::new(weights, 1)?;
        let (mut a, mut b) = (HeadOutput::default(), HeadOutput::default());
        fused.forward(&x, rows, &mut a)?;
        self.forward(&x, rows, &mut b)?;
        Ok(GpuDeviation {
            rows,
            max_abs_diff_mean: max_abs_diff(&a.mean, &b.mean),
            max_abs_diff_log_var: max_abs_diff(&a.log_var, &b.log_var),
        })
    }

    fn run_bucket(&mut self, x: &[f32], rows: usize, mean: &mut Vec<f32>, lv: &mut Vec<f32>) {
        let nf = self.arch.n_features;
        let bucket = bucket_for(rows);
        self.staging.clear();
        self.staging.extend_from_slice(x);
        self.staging.resize(bucket * nf, 0.0);
        let t = Tensor::<B, 2>::from_data(
            TensorData::new(self.staging.clone(), [bucket, nf]),
            (&self.device, self.dtype),
        );
        let o = self.model.forward(t);
        let k = self.arch.n_targets;
        let m: Vec<f32> = o
            .mean
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 output");
        let l: Vec<f32> = o
            .log_var
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 output");
        mean.extend_from_slice(&m[..rows * k]);
        lv.extend_from_slice(&l[..rows * k]);
    }
}

/// `rows × n_features` seeded values in about [-2.5, 2.5] (normalised features' range), with
/// fractional parts that half-precision rounding changes.
pub fn probe_rows(rows: usize, n_features: usize) -> Vec<f32> {
    let mut rng = crate::rng::SplitMix64::new(0x006b_696c_6e67_7075);
    (0..rows * n_features)
        .map(|_| rng.uniform(-2.5, 2.5) as f32)
        .collect()
}

/// The largest |a − b| (0 for empty slices).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    // NaN propagates (`f32::max` would drop it): a NaN answer is the worst deviation.
    a.iter().zip(b).fold(0f32, |m, (x, y)| {
        let d = (x - y).abs();
        if m.is_nan() || d.is_nan() {
            f32::NAN
        } else {
            m.max(d)
        }
    })
}

impl<B: Backend> Engine for GpuEngine<B> {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn arch(&self) -> &RegressionNetConfig {
        &self.arch
    }

    fn forward(&mut self, x: &[f32], rows: usize, out: &mut HeadOutput) -> Result<(), InferError> {
        let nf = self.arch.n_features;
        check_shape(x, rows, nf)?;
        out.mean.clear();
        out.log_var.clear();
        let (mut mean, mut lv) = (
            std::mem::take(&mut out.mean),
            std::mem::take(&mut out.log_var),
        );
        let max = BUCKETS[BUCKETS.len() - 1];
        let mut r = 0;
        while r < rows {
            let n = max.min(rows - r);
            self.run_bucket(&x[r * nf..(r + n) * nf], n, &mut mean, &mut lv);
            r += n;
        }
        out.mean = mean;
        out.log_var = lv;
        Ok(())
    }

    fn warm_up(&mut self, _batch_sizes: &[usize]) -> Result<(), InferError> {
        // Every bucket ran at build time; any batch size maps onto one of them.
        Ok(())
    }

    fn load_note(&self) -> Option<String> {
        let d = self.deviation?;
        let mut note = format!(
            "{}: computes in {:?} on the device; max |Δ| from fused on {} seeded rows: mean {:.3e}, log_var {:.3e}",
            self.label,
            self.dtype(),
            d.rows,
            d.max_abs_diff_mean,
            d.max_abs_diff_log_var
        );
        if let Some(why) = &self.fallback {
            note.push_str(&format!(
                "; the Burn module instead of the fused kernel: {why}"
            ));
        }
        Some(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_answer_is_the_worst_deviation() {
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 2.0]), 0.5);
        assert!(max_abs_diff(&[1.0, 2.0], &[f32::NAN, 2.0]).is_nan());
        assert!(max_abs_diff(&[1.0, 2.0], &[1.0, f32::NAN]).is_nan());
    }

    #[test]
    fn buckets_cover_every_size() {
        assert_eq!(bucket_for(1), 1);
        assert_eq!(bucket_for(2), 8);
        assert_eq!(bucket_for(1000), 1024);
        assert_eq!(bucket_for(65536), 65536);
        assert_eq!(bucket_for(70000), 65536);
    }

    #[test]
    fn probe_rows_are_seeded_and_in_range() {
        let a = probe_rows(4, 3);
        assert_eq!(a, probe_rows(4, 3));
        assert_eq!(a.len(), 12);
        assert!(a.iter().all(|v| v.abs() <= 2.5));
        assert_eq!(max_abs_diff(&[1.0, 2.0], &[1.5, 1.0]), 1.0);
    }
}
