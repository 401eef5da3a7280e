//! kiln's own answers, as serde types: what the [`Service`](crate::service::Service) answers
//! about the server and its models, independent of the transport. The HTTP routes write them
//! as JSON (through a `serde_json::Value`, so keys come out sorted, as they always have); the
//! gRPC adapter maps them onto protobuf; the load generator (`kiln-loadgen`) reads them back
//! into the same types instead of picking keys out of JSON.
//!
//! Reading is lenient where a server other than kiln may answer (`kiln loadtest` also measures
//! Triton): fields default when absent and unknown fields are ignored.
//!
//! * this file — server metadata, model metadata, readiness;
//! * [`config`] — the model configuration (Triton's `config` endpoint), one view for both
//!   transports;
//! * [`stats`] — Triton's statistics extension.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub mod config;
pub mod stats;

pub use config::{
    ConfigTensor, DynamicBatching, InstanceGroup, LatestPolicy, ModelConfig, ModelDescription,
    PickDescription, QueuePolicy, RegressionDescription, VersionPolicy,
};
pub use stats::{BatchStats, InferenceStats, ModelStats, StatDuration, StatsResponse};

/// The protocol extensions this server implements, as `GET /v2` and `ServerMetadata` list
/// them.
pub const EXTENSIONS: [&str; 4] = [
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "model_repository",
];

/// The server's metadata (`GET /v2`, gRPC `ServerMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerMetadata {
    /// The server's name (`kiln`).
    pub name: String,
    /// Its version.
    pub version: String,
    /// The protocol extensions it implements.
    pub extensions: Vec<String>,
}

impl ServerMetadata {
    /// This server's metadata.
    pub fn kiln() -> Self {
        Self {
            name: "kiln".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: EXTENSIONS.map(String::from).to_vec(),
        }
    }
}

/// A tensor in a model's metadata.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorMetadata {
    /// Its name.
    pub name: String,
    /// Its datatype's protocol name (`FP32`, …).
    pub datatype: String,
    /// Its shape, -1 for the batch dimension (and any variable dimension).
    pub shape: Vec<i64>,
    /// Extra description (scalars only, as the protocol's parameters allow); left out when
    /// empty.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub parameters: Map<String, Value>,
}

/// A model's metadata (`GET /v2/models/{m}[/versions/{v}]`, gRPC `ModelMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelMetadata {
    /// The model.
    pub name: String,
    /// The version that answered (kiln serves one at a time).
    pub versions: Vec<String>,
    /// `kiln_regression` or `kiln_pick`.
    pub platform: String,
    /// Inputs in order.
    pub inputs: Vec<TensorMetadata>,
    /// Outputs in order.
    pub outputs: Vec<TensorMetadata>,
}

/// Whether a model (or version) is ready (`GET /v2/models/{m}[/versions/{v}]/ready`, gRPC
/// `ModelReady`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelReadiness {
    /// The model.
    pub name: String,
    /// Whether it serves requests.
    pub ready: bool,
    /// Why it does not (left out when ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests;
