//! What a served model is: its input and output tensors, how a request's tensors decode into
//! a batchable input, and the per-instance executors that run batches.
//!
//! Two kinds live in a repository:
//! * **regression** — a version directory holding an exported checkpoint
//!   (`manifest.json` + `model.safetensors`). One FP32 input `features` `[B, F]` (the
//!   manifest's features in order, original units) → FP32 `mean` and `std` `[B, k]` in
//!   original units, computed by [`Predictor`](crate::predict::Predictor) exactly as
//!   `kiln predict` does.
//! * **pick** — a version directory holding `pick.json` ([`PickConfig`]). B picks of L legs
//!   → FP64 `p` (P(all legs hit)), `se` (its standard error) and `independent_p`, each `[B]`,
//!   computed by [`pick_probabilities`](kiln_model::model::mvn::pick_probabilities). With
//!   `"legs_from": "moments"` (the default) the legs carry their outcome's distribution:
//!   FP64 `mean`, `std`, `line`, BOOL `over`, INT32 `target`, INT32 `group`, each `[B, L]`.
//!   With `"legs_from": "features"` they carry a row of features instead, as `kiln pick`
//!   does: FP32 `features` `[B, L, F]`, INT32 `target`, FP64 `line`, BOOL `over` `[B, L]`;
//!   the checkpoint's network predicts mean and std, and legs of a pick with identical
//!   feature rows correlate through the residual correlation.
//!
//! This file holds what both kinds share: the loaded-model types ([`ModelSpec`],
//! [`ModelKind`], [`ModelInput`]), loading a version ([`load_spec`]), the request checks
//! common to both, and the instance plumbing ([`Instance`], [`build_instance`],
//! [`buckets`]). Each kind's interface, decoding and executor live in [`regression`] and
//! [`pick`]; the pick model's `pick.json` in [`pick_config`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::artifact::{ArtifactError, Checkpoint};
use crate::infer::{EngineKind, InferError};
use crate::protocol::{Datatype, InputTensor, OutputTensor, ProtocolError};
use crate::records::{ConfigTensor, ModelDescription, TensorMetadata};
use kiln_model::model::mvn::{Leg, MvnError};

pub mod pick;
pub mod pick_config;
pub mod regression;

pub use pick_config::{LegsFrom, PICK_FILE, PickConfig, PickKind, PickModel};

/// The regression model's input name.
pub const FEATURES_INPUT: &str = "features";

/// Why a version could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The checkpoint is missing, corrupt, or does not match its manifest.
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// The engine could not be built.
    #[error(transparent)]
    Engine(#[from] InferError),
    /// The pick model's config is invalid.
    #[error("{path}: {message}")]
    Pick {
        /// The config file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// Warm-up failed.
    #[error("warm-up failed: {0}")]
    Warmup(String),
    /// Reading the directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// A tensor in a model's metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// Its name.
    pub name: String,
    /// Its datatype.
    pub datatype: Datatype,
    /// Its shape, -1 for the batch dimension (and any variable dimension).
    pub shape: Vec<i64>,
    /// Extra description (scalars only, as the protocol's parameters allow).
    pub parameters: serde_json::Map<String, Value>,
}

impl TensorSpec {
    fn new(name: &str, datatype: Datatype, shape: &[i64]) -> Self {
        Self {
            name: name.into(),
            datatype,
            shape: shape.to_vec(),
            parameters: Default::default(),
        }
    }

    /// As the model metadata lists it.
    pub fn metadata(&self) -> TensorMetadata {
        TensorMetadata {
            name: self.name.clone(),
            datatype: self.datatype.name().to_string(),
            shape: self.shape.clone(),
            parameters: self.parameters.clone(),
        }
    }

    /// As the model configuration lists it (dims without the batch dimension).
    pub fn config(&self) -> ConfigTensor {
        ConfigTensor {
            name: self.name.clone(),
            data_type: self.datatype.config_name(),
            dims: self.shape.get(1..).unwrap_or_default().to_vec(),
        }
    }
}

/// What a loaded version serves.
#[derive(Debug, Clone)]
pub enum ModelKind {
    /// A regression checkpoint.
    Regression(Arc<Checkpoint>),
    /// A pick model.
    Pick(Arc<PickModel>),
}

/// A model version's interface and contents, shared by the HTTP layer and the instances.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// What it serves.
    pub kind: ModelKind,
    /// Inputs in order.
    pub inputs: Vec<TensorSpec>,
    /// Outputs in order.
    pub outputs: Vec<TensorSpec>,
}

/// A request's decoded input: batchable rows.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelInput {
    /// Raw feature rows, `rows × F`.
    Regression {
        /// The values.
        x: Vec<f32>,
        /// Rows.
        rows: usize,
    },
    /// Picks.
    Pick(Vec<Vec<Leg>>),
    /// Picks whose legs carry feature rows.
    PickRows {
        /// Raw features, `picks × legs × F`.
        x: Vec<f32>,
        /// Target per leg.
        target: Vec<usize>,
        /// Line per leg.
        line: Vec<f64>,
        /// Side per leg.
        over: Vec<bool>,
        /// Picks.
        picks: usize,
        /// Legs per pick.
        legs: usize,
    },
}

impl ModelInput {
    /// Batch rows this input contributes.
    pub fn rows(&self) -> usize {
        match self {
            ModelInput::Regression { rows, .. } => *rows,
            ModelInput::Pick(p) => p.len(),
            ModelInput::PickRows { picks, .. } => *picks,
        }
    }
}

/// Detect the kind of a version directory and load it.
pub fn load_spec(dir: &Path) -> Result<ModelSpec, LoadError> {
    if dir.join(PICK_FILE).exists() {
        let pick = PickConfig::load(dir)?;
        Ok(ModelSpec::pick(Arc::new(pick)))
    } else {
        let ckpt = Checkpoint::load(dir)?;
        Ok(ModelSpec::regression(Arc::new(ckpt)))
    }
}

impl ModelSpec {
    /// The training run the served weights came from (a pick model's network's run).
    pub fn run_id(&self) -> Option<&str> {
        match &self.kind {
            ModelKind::Regression(c) => Some(c.manifest.run_id.as_str()),
            ModelKind::Pick(p) => p.network.as_ref().map(|c| c.manifest.run_id.as_str()),
        }
    }

    /// The platform string in metadata.
    pub fn platform(&self) -> &'static str {
        match self.kind {
            ModelKind::Regression(_) => "kiln_regression",
            ModelKind::Pick(_) => "kiln_pick",
        }
    }

    /// kiln's description of the model in its configuration (feature names and
    /// normalisation, targets, …).
    pub fn describe(&self) -> ModelDescription {
        match &self.kind {
            ModelKind::Regression(c) => ModelDescription::Regression(regression::describe(c)),
            ModelKind::Pick(p) => ModelDescription::Pick(pick::describe(p)),
        }
    }

    fn take<'a>(
        &self,
        inputs: &'a [InputTensor],
        model: &str,
    ) -> Result<Vec<&'a InputTensor>, ProtocolError> {
        let names = || {
            self.inputs
                .iter()
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        for i in inputs {
            if !self.inputs.iter().any(|s| s.name == i.name) {
                return Err(ProtocolError(format!(
                    "unknown input `{}`; model `{model}` takes: {}",
                    i.name,
                    names()
                )));
            }
        }
        self.inputs
            .iter()
            .map(|s| {
                inputs.iter().find(|i| i.name == s.name).ok_or_else(|| {
                    ProtocolError(format!(
                        "missing input `{}`; model `{model}` takes: {}",
                        s.name,
                        names()
                    ))
                })
            })
            .collect()
    }

    /// Check a request's inputs against this model and decode them.
    pub fn decode(
        &self,
        inputs: &[InputTensor],
        model: &str,
        max_batch: usize,
    ) -> Result<ModelInput, ProtocolError> {
        self.decode_counted(inputs, model, max_batch, None)
    }

    /// [`ModelSpec::decode`], counting per raw input column the missing cells (imputed, or
    /// sent to the unknown bucket) and the categories the training split did not have.
    pub fn decode_counted(
        &self,
        inputs: &[InputTensor],
        model: &str,
        max_batch: usize,
        counts: Option<&mut kiln_model::preprocess::EncodeCounts>,
    ) -> Result<ModelInput, ProtocolError> {
        let given = self.take(inputs, model)?;
        match &self.kind {
            ModelKind::Regression(c) => match c.manifest.preprocessing.as_ref() {
                Some(pre) if !pre.is_plain() => {
                    regression::decode_columns(pre, &given, max_batch, counts)
                }
                _ => regression::decode(c, given[0], max_batch, counts),
            },
            ModelKind::Pick(p) => pick::decode(p, &given, max_batch),
        }
    }
}

/// Refuse an empty batch, or one larger than `max_batch`.
fn check_batch(name: &str, b: usize, max_batch: usize) -> Result<(), ProtocolError> {
    if b == 0 {
        Err(ProtocolError(format!(
            "input `{name}` has batch size 0; expected at least one row"
        )))
    } else if b > max_batch {
        Err(ProtocolError(format!(
            "input `{name}` has batch size {b}, more than the max_batch_size {max_batch}; split the request"
        )))
    } else {
        Ok(())
    }
}

/// Why an instance could not warm up or run a batch.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// The engine or the network failed.
    #[error(transparent)]
    Engine(#[from] InferError),
    /// The pick estimator refused the batch.
    #[error(transparent)]
    Estimator(#[from] MvnError),
    /// An input of the other model kind reached this instance.
    #[error("{0}")]
    WrongInput(&'static str),
    /// Warm-up produced non-finite outputs.
    #[error("{0}")]
    NonFinite(String),
}

/// The batcher reports failures as text; this keeps its `?` working.
impl From<InstanceError> for String {
    fn from(e: InstanceError) -> Self {
        e.to_string()
    }
}

/// Runs batches on one inference instance (owned by one worker thread).
pub trait Instance: Send {
    /// Run one batch of `rows` placeholder rows, before the model is marked ready.
    fn warm_up(&mut self, rows: usize) -> Result<(), InstanceError>;
    /// Run a batch of inputs; one output list per input, in order.
    fn execute(&mut self, inputs: &[&ModelInput]) -> Result<Vec<Vec<OutputTensor>>, InstanceError>;
    /// Whether a request's own thread may run this instance (the `idle` batching policy's
    /// fast path) instead of its worker thread. Engines bound to their thread say no.
    fn inline_ok(&self) -> bool {
        true
    }
    /// How long the engine itself computed the last batch (what the checkpoint's recorded
    /// latency measures: no input assembly, no output tensors); `None` when not measured.
    fn engine_time(&self) -> Option<std::time::Duration> {
        None
    }
}

/// Build one instance of a model; a regression engine also runs its own warm-up over
/// `buckets` (kernels compiled, buffers sized) before the instance is returned.
pub fn build_instance(
    spec: &ModelSpec,
    engine: EngineKind,
    threads: usize,
    buckets: &[usize],
) -> Result<Box<dyn Instance>, LoadError> {
    match &spec.kind {
        ModelKind::Regression(c) => regression::build(c, engine, threads, buckets),
        ModelKind::Pick(p) => pick::build(p, engine, threads, buckets),
    }
}

/// Batch-size buckets warmed at load: powers of two below `max_batch`, and `max_batch`.
pub fn buckets(max_batch: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut b = 1;
    while b < max_batch {
        v.push(b);
        b *= 2;
    }
    v.push(max_batch.max(1));
    v
}
