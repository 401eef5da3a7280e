//! Inference engines behind one trait.
//!
//! An engine runs the network on normalised feature rows and returns both heads in
//! normalised units; [`crate::predict::Predictor`] adds the manifest's normalisation around
//! it. Engines own their scratch space (`&mut self`), so a serving instance owns one engine.
//!
//! | name | what | agreement with `burn` (tested in `tests/it/engines.rs`) |
//! |---|---|---|
//! | `burn`, `burn-ndarray` | the Burn module, no autodiff, Flex / NdArray | — |
//! | `fused` | [`FusedEngine`]: compiled once into an allocation-free plan; register-blocked AVX-512 / AVX2 / portable kernels | ≤ 1e-5 absolute |
//! | `int8` | [`Int8Engine`]: int8 weights per channel, int8 activations per row, i32 dot products (AVX-512 VNNI) | `int8::INT8_ABS_TOL` + `int8::INT8_REL_TOL` × abs(y) |
//! | `auto` (default) | [`AutoEngine`]: the fastest *exact* engine: `fused` on this CPU's best instruction set; a row's bits never depend on the batch | that of `fused` (bit for bit) |
//! | `auto-int8` | [`AutoEngine::with_int8`]: per batch-size bucket, the fastest of `fused` and `int8` (when int8's bound holds for the checkpoint), timed at load | that of the chosen engine (bit for bit) |
//! | `cuda-bf16`, `cuda-f32` | `gpu::engine::KernelEngine` (feature `cuda`): the whole network as one fused CubeCL kernel launch per call, weights resident, bf16 / f32 with f32 accumulation; `gpu::GpuEngine` (the Burn module on Burn's CUDA backend, explicit dtype) for networks wider than the kernel takes, when the kernel cannot be built on the device, or with `KILN_GPU_ENGINE=burn`; the kernel compiled (the Burn module: every batch bucket warmed up) at build, the max deviation from `fused` measured at load | ≤ 1e-2 relative |
//!
//! With the `wgpu` feature, both `gpu::engine::KernelEngine` and `gpu::GpuEngine` also run on
//! Burn's wgpu backend (any Vulkan device; Mesa's software lavapipe in CI) in f32 and f16: the
//! tests of the GPU path without a GPU (`crates/core/tests/wgpu.rs`). They are not named
//! engines.
//!
//! Build one by name with [`build_engine`]; [`reference_weights`] gives the benchmarks'
//! reference network.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::artifact::HostWeights;
use crate::model::{RegressionNet, RegressionNetConfig};

pub(crate) mod act;
pub mod auto;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod fused;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod gpu;
pub mod int8;

pub use crate::simd::Isa;
pub use auto::{AutoChoice, AutoEngine};
pub use fused::FusedEngine;
pub use int8::{Int8AccuracyReport, Int8Engine, int8_accuracy_on};

/// Errors from an inference engine.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    /// The input does not have `rows × n_features` values.
    #[error("input has {got} values, expected {rows} rows × {features} features = {}", rows * features)]
    Shape {
        /// Values given.
        got: usize,
        /// Rows requested.
        rows: usize,
        /// Features per row.
        features: usize,
    },
    /// The engine is not available on this machine or build.
    #[error("engine {engine} is unavailable: {reason}")]
    Unavailable {
        /// The engine.
        engine: String,
        /// Why.
        reason: String,
    },
    /// An unknown engine name.
    #[error("unknown engine {0:?} (expected one of: {1})")]
    Unknown(String, String),
    /// The weights do not match their architecture (layer count or shapes).
    #[error("invalid weights: {0}")]
    InvalidWeights(String),
}

/// Both heads for a batch, normalised units, row-major `rows × k`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeadOutput {
    /// Means.
    pub mean: Vec<f32>,
    /// Log-variances.
    pub log_var: Vec<f32>,
}

/// A compiled-once network that answers batches.
pub trait Engine: Send {
    /// The engine's name (`burn`, `fused`, …).
    fn name(&self) -> String;
    /// The architecture it runs.
    fn arch(&self) -> &RegressionNetConfig;
    /// Run `rows` normalised rows `x` (`rows × n_features`) into `out` (resized as needed).
    fn forward(&mut self, x: &[f32], rows: usize, out: &mut HeadOutput) -> Result<(), InferError>;
    /// Threads a call may use (1 unless the engine was built with more).
    fn threads(&self) -> usize {
        1
    }
    /// Run each batch size once on zeros, so that buffers are sized, caches and (on a GPU)
    /// kernels compiled before the first request. Engines that warm up at build time
    /// (`cuda-*`) already have; calling it again is harmless.
    fn warm_up(&mut self, batch_sizes: &[usize]) -> Result<(), InferError> {
        let nf = self.arch().n_features;
        let mut out = HeadOutput::default();
        let mut x = Vec::new();
        for &rows in batch_sizes {
            x.clear();
            x.resize(rows * nf, 0.0);
            self.forward(&x, rows, &mut out)?;
        }
        Ok(())
    }
    /// What an [`AutoEngine`] chose per batch-size bucket (`None` for every other engine).
    fn auto_choice(&self) -> Option<&AutoChoice> {
        None
    }
    /// A line to print when the engine is loaded (the GPU engines: their dtype and measured
    /// deviation from `fused`); `None` for the CPU engines.
    fn load_note(&self) -> Option<String> {
        None
    }
}

/// Check an input's length.
pub fn check_shape(x: &[f32], rows: usize, features: usize) -> Result<(), InferError> {
    if x.len() != rows * features {
        return Err(InferError::Shape {
            got: x.len(),
            rows,
            features,
        });
    }
    Ok(())
}

/// The Burn module without autodiff on a Burn backend.
pub struct BurnEngine<B: Backend> {
    model: RegressionNet<B>,
    arch: RegressionNetConfig,
    device: B::Device,
    label: String,
}

impl<B: Backend> BurnEngine<B> {
    /// Build from host weights on `device`.
    pub fn new(weights: &HostWeights, device: B::Device, label: &str) -> Self {
        Self {
            model: weights.to_model::<B>(&device),
            arch: weights.arch.clone(),
            device,
            label: label.to_string(),
        }
    }

    /// Wrap an in-memory module.
    pub fn from_model(model: RegressionNet<B>, device: B::Device, label: &str) -> Self {
        Self {
            arch: model.architecture(),
            model,
            device,
            label: label.to_string(),
        }
    }
}

impl<B: Backend> Engine for BurnEngine<B> {
    fn name(&self) -> String {
        self.label.clone()
    }

    fn arch(&self) -> &RegressionNetConfig {
        &self.arch
    }

    fn forward(&mut self, x: &[f32], rows: usize, out: &mut HeadOutput) -> Result<(), InferError> {
        check_shape(x, rows, self.arch.n_features)?;
        let t = Tensor::<B, 2>::from_data(
            TensorData::new(x.to_vec(), [rows, self.arch.n_features]),
            &self.device,
        );
        let o = self.model.forward(t);
        out.mean = o
            .mean
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 output");
        out.log_var = o
            .log_var
            .into_data()
            .convert::<f32>()
            .to_vec()
            .expect("f32 output");
        Ok(())
    }
}

pub use crate::records::{EngineKind, engine_names};

/// The CPU engines (the default set of `kiln bench infer`).
pub fn cpu_engine_names() -> Vec<&'static str> {
    crate::records::CPU_ENGINES.to_vec()
}

/// Build an engine by name for `weights`, using at most `threads` threads per call
/// (0 = the engine's default: one thread for the CPU engines).
///
/// * `burn`, `burn-ndarray`: the Burn module without autodiff on Flex / NdArray (Burn's
///   backends manage their own threads; `threads` is ignored);
/// * `fused`: [`FusedEngine`], the compiled f32 plan (≤ 1e-5 absolute of `burn`);
/// * `int8`: [`Int8Engine`], per-channel int8 weights, per-row dynamic int8 activations;
/// * `auto`: [`AutoEngine`], the fastest exact engine (`fused` on this CPU's best
///   instruction set; a row's answer does not depend on the batch it is in);
/// * `auto-int8`: [`AutoEngine::with_int8`], per batch-size bucket the fastest of the above
///   compiled engines whose accuracy bound holds for `weights` (int8 included), timed at
///   build and again at `warm_up`;
/// * `cuda-bf16`, `cuda-f32` (feature `cuda`): one fused CubeCL kernel launch per call
///   (`gpu::engine::KernelEngine`), or the Burn module on Burn's CUDA backend for networks
///   wider than the kernel takes, when the kernel cannot be built on the device, or with
///   `KILN_GPU_ENGINE=burn`; compiled (the Burn module: warmed up for every batch bucket) at
///   build; [`InferError::Unavailable`] without a usable GPU.
pub fn build_engine(
    kind: EngineKind,
    weights: &HostWeights,
    threads: usize,
) -> Result<Box<dyn Engine>, InferError> {
    use crate::records::EngineKind as K;
    match kind {
        K::Burn => Ok(Box::new(BurnEngine::<crate::backend::Cpu>::new(
            weights,
            Default::default(),
            K::Burn.name(),
        ))),
        K::BurnNdArray => Ok(Box::new(BurnEngine::<crate::backend::CpuNdArray>::new(
            weights,
            Default::default(),
            K::BurnNdArray.name(),
        ))),
        K::Fused => Ok(Box::new(FusedEngine::new(weights, threads)?)),
        K::Int8 => Ok(Box::new(Int8Engine::new(weights, threads)?)),
        K::Auto => Ok(Box::new(AutoEngine::new(weights, threads)?)),
        K::AutoInt8 => Ok(Box::new(AutoEngine::with_int8(weights, threads)?)),
        #[cfg(feature = "cuda")]
        K::CudaBf16 => cuda::cuda_engine_for::<crate::backend::CudaBf16, burn::tensor::bf16>(
            weights,
            K::CudaBf16.name(),
        ),
        #[cfg(feature = "cuda")]
        K::CudaF32 => {
            cuda::cuda_engine_for::<crate::backend::CudaF32, f32>(weights, K::CudaF32.name())
        }
        #[cfg(not(feature = "cuda"))]
        K::CudaBf16 | K::CudaF32 => Err(InferError::Unavailable {
            engine: kind.name().to_string(),
            reason: crate::backend::cuda_probe().unwrap_err().to_string(),
        }),
    }
}

/// The engine a user named (`--engine`, `kiln predict`), or [`InferError::Unknown`] listing
/// the engines this build knows.
pub fn parse_engine(name: &str) -> Result<EngineKind, InferError> {
    name.parse()
        .map_err(|e: crate::records::UnknownEngine| InferError::Unknown(e.given, e.known))
}

/// Seeded weights for `arch` (PyTorch's `nn.Linear` initialisation through kiln's generator).
pub fn seeded_weights(arch: &RegressionNetConfig, seed: u64) -> HostWeights {
    HostWeights::from_model(&arch.init::<crate::backend::Cpu>(seed, &Default::default()))
}

/// The reference network of the benchmarks ([`RegressionNetConfig::reference`]: 20 → 48 → 48
/// → (3 + 3), ReLU, 3,654 parameters) with seeded weights.
pub fn reference_weights(seed: u64) -> HostWeights {
    seeded_weights(&RegressionNetConfig::reference(), seed)
}

/// The seed `--reference` uses.
pub const REFERENCE_SEED: u64 = 2024;
