//! Inference engines behind one trait.
//!
//! An engine runs the network on normalised feature rows and returns both heads in
//! normalised units; [`crate::predict::Predictor`] adds the manifest's normalisation around
//! it. Engines own their scratch space (`&mut self`), so a serving instance owns one engine.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::artifact::HostWeights;
use crate::model::{RegressionNet, RegressionNetConfig};

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

/// Engine names this build knows.
pub fn engine_names() -> Vec<&'static str> {
    vec!["burn", "burn-ndarray"]
}

/// Build an engine by name for `weights`, using at most `threads` threads per call
/// (0 = the engine's default).
pub fn build_engine(
    name: &str,
    weights: &HostWeights,
    threads: usize,
) -> Result<Box<dyn Engine>, InferError> {
    let _ = threads;
    match name {
        "burn" => Ok(Box::new(BurnEngine::<crate::backend::Cpu>::new(
            weights,
            Default::default(),
            "burn",
        ))),
        "burn-ndarray" => Ok(Box::new(BurnEngine::<crate::backend::CpuNdArray>::new(
            weights,
            Default::default(),
            "burn-ndarray",
        ))),
        other => Err(InferError::Unknown(
            other.to_string(),
            engine_names().join(", "),
        )),
    }
}
