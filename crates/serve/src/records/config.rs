//! The model configuration (Triton's model configuration extension), one transport-neutral
//! view: the [`Service`](crate::service::Service) builds a [`ModelConfig`] from the loaded
//! version and the server's settings; `GET /v2/models/{m}[/versions/{v}]/config` writes it as
//! JSON and the gRPC `ModelConfig` RPC maps it onto Triton's protobuf `ModelConfig`
//! (`grpc::wire`), where what the protobuf has no field for travels as parameters: kiln's
//! description ([`ModelDescription`]) as the JSON string of parameter `kiln`, the engine as
//! `engine`, the batching policy as `batching`.

use kiln_model::infer::AutoChoice;
use kiln_model::model::regression::RegressionNetConfig;
use kiln_model::preprocess::InputColumn;
use kiln_model::records::EngineKind;
use kiln_model::stats::ColumnStats;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A model's configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelConfig {
    /// The model.
    pub name: String,
    /// `kiln_regression` or `kiln_pick`.
    pub platform: String,
    /// `kiln`.
    pub backend: String,
    /// Which versions are served (kiln: the latest one).
    pub version_policy: VersionPolicy,
    /// Most rows per batch (the server's `--max-batch-size`).
    pub max_batch_size: usize,
    /// Inputs, in order.
    pub input: Vec<ConfigTensor>,
    /// Outputs, in order.
    pub output: Vec<ConfigTensor>,
    /// The batcher's settings.
    pub dynamic_batching: DynamicBatching,
    /// The instances (kiln: one group of CPU instances).
    pub instance_group: Vec<InstanceGroup>,
    /// The engine of regression models (`--engine`).
    pub engine: EngineKind,
    /// What the `auto` engine chose per batch-size bucket (`None`: another engine, or a pick
    /// model).
    pub engine_choice: Option<AutoChoice>,
    /// The version that answered.
    pub version: u64,
    /// kiln's own description of the model.
    pub kiln: ModelDescription,
}

/// Triton's version policy; kiln serves the latest version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VersionPolicy {
    /// Serve the latest `num_versions` versions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest: Option<LatestPolicy>,
}

/// Triton's `latest` version policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatestPolicy {
    /// How many of the latest versions are served.
    pub num_versions: u32,
}

/// An input or output in the configuration: dims without the batch dimension.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConfigTensor {
    /// Its name.
    pub name: String,
    /// Triton's configuration datatype name (`TYPE_FP32`, `TYPE_STRING` for BYTES, …).
    pub data_type: String,
    /// Its shape without the batch dimension.
    pub dims: Vec<i64>,
}

/// The batcher's settings, as Triton's `dynamic_batching` (with kiln's `batching` policy).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DynamicBatching {
    /// The batching policy (`idle` or `delay`).
    pub batching: String,
    /// How long the oldest request may wait for a fuller batch (`delay` policy).
    pub max_queue_delay_microseconds: u64,
    /// The batch sizes warmed at load.
    pub preferred_batch_size: Vec<usize>,
    /// The queue's limits.
    pub default_queue_policy: QueuePolicy,
    /// What another server's configuration holds beyond these (kept when read, written back
    /// as read).
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// The queue's limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueuePolicy {
    /// Most requests waiting.
    pub max_queue_size: usize,
    /// A request's deadline when it names none.
    pub default_timeout_microseconds: u64,
}

/// A group of instances.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InstanceGroup {
    /// Instances (worker threads, each owning an engine).
    pub count: usize,
    /// Triton's kind name (kiln: `KIND_CPU`).
    pub kind: String,
    /// Threads per instance.
    pub threads: usize,
}

/// kiln's description of a model beyond Triton's fields (parameter `kiln` over gRPC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ModelDescription {
    /// A regression checkpoint.
    Regression(RegressionDescription),
    /// A pick model.
    Pick(PickDescription),
    /// Any other description (another kiln version's, say), as read.
    Other(Value),
}

impl Default for ModelDescription {
    fn default() -> Self {
        ModelDescription::Other(Value::Null)
    }
}

impl ModelDescription {
    /// The features a request's rows carry, with their training statistics (none for a pick
    /// model whose legs carry moments, or a description not understood).
    pub fn features(&self) -> &[ColumnStats] {
        match self {
            ModelDescription::Regression(r) => &r.features,
            ModelDescription::Pick(p) => p.features.as_deref().unwrap_or_default(),
            ModelDescription::Other(_) => &[],
        }
    }
}

/// A regression checkpoint's description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RegressionDescription {
    /// The network's input features, with their training normalisation.
    pub features: Vec<ColumnStats>,
    /// The raw input columns, when the checkpoint preprocesses its inputs.
    pub preprocessing: Option<Vec<InputColumn>>,
    /// The targets, with their training normalisation.
    pub targets: Vec<ColumnStats>,
    /// The network's architecture.
    pub architecture: RegressionNetConfig,
    /// SHA-256 of the weights file.
    pub weights_sha256: String,
    /// The training run the weights came from.
    pub run_id: String,
}

/// A pick model's description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PickDescription {
    /// Target names (their order indexes the correlations).
    pub targets: Vec<String>,
    /// Correlation between targets on the same row (k × k, row-major).
    pub target_corr: Vec<f64>,
    /// Correlation between targets on different rows (`None`: independent).
    pub cross_row_corr: Option<Vec<f64>>,
    /// Halton points per randomisation.
    pub points: usize,
    /// Randomisations.
    pub randomizations: usize,
    /// The estimator (`genz`, `naive`).
    pub method: String,
    /// Most legs per pick.
    pub max_legs: usize,
    /// What a leg carries: `moments` or `features`.
    pub legs_from: String,
    /// The network's features (`legs_from: features`).
    pub features: Option<Vec<ColumnStats>>,
}
