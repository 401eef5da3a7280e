//! Triton's statistics extension as serde types: the answer of
//! `GET /v2/models[/{m}[/versions/{v}]]/stats` (and, mapped onto protobuf by
//! [`grpc`](crate::grpc), of the `ModelStatistics` RPC), written by the server from the same
//! atomics as the `nv_inference_*` counters of `/metrics`
//! ([`TritonStats`](crate::metrics::TritonStats)) and read back by `kiln loadtest` — from kiln
//! or from Triton itself, so every field defaults when absent and unknown fields (Triton's
//! `response_stats`, `memory_usage`) are ignored.
//!
//! Semantics (Triton's): every figure is cumulative since the version was loaded; `success`
//! and `fail` count requests with their end-to-end time, `queue` and `compute_*` are per
//! request, and a batch's compute time is attributed in full to each request in it;
//! `inference_count` counts rows (a request of 4 rows is 4 inferences), `execution_count`
//! batches; `batch_stats` has one entry per executed batch size (rows), counting executions.
//! kiln has no response cache, so `cache_hit` and `cache_miss` stay zero.

use serde::{Deserialize, Serialize};

/// `{count, ns}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatDuration {
    /// How many.
    pub count: u64,
    /// Their cumulative duration, ns.
    pub ns: u64,
}

/// Per-request statistics of one version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InferenceStats {
    /// Successful requests, end to end.
    pub success: StatDuration,
    /// Failed requests, end to end.
    pub fail: StatDuration,
    /// Time in the batcher's queue.
    pub queue: StatDuration,
    /// Batch assembly and hand-off to the instance.
    pub compute_input: StatDuration,
    /// The instance's execution.
    pub compute_infer: StatDuration,
    /// Handing each request its results.
    pub compute_output: StatDuration,
    /// Response cache hits (kiln has no cache: zero).
    pub cache_hit: StatDuration,
    /// Response cache misses (zero).
    pub cache_miss: StatDuration,
}

/// Executions of one batch size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchStats {
    /// Rows in the batch.
    pub batch_size: u64,
    /// Executions and their assembly time.
    pub compute_input: StatDuration,
    /// Executions and their engine time.
    pub compute_infer: StatDuration,
    /// Executions and their output time.
    pub compute_output: StatDuration,
}

/// The statistics of one model version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelStats {
    /// The model.
    pub name: String,
    /// The version.
    pub version: String,
    /// When the last batch finished, ms since the Unix epoch (0: never).
    pub last_inference: u64,
    /// Rows inferred.
    pub inference_count: u64,
    /// Batches executed.
    pub execution_count: u64,
    /// Per-request statistics.
    pub inference_stats: InferenceStats,
    /// Per batch size, smallest first.
    pub batch_stats: Vec<BatchStats>,
}

/// The statistics answer: `{"model_stats": [...]}`. `model_stats` is required when reading
/// one: an answer without it is not a statistics answer (an error body, say).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsResponse {
    /// One entry per model version.
    pub model_stats: Vec<ModelStats>,
}
