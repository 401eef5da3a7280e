//! Triton's statistics extension, protocol-neutral: the answer of
//! `GET /v2/models[/{m}[/versions/{v}]]/stats` (and of the gRPC `ModelStatistics` RPC) as a
//! serializable value, read from the same atomics as the `nv_inference_*` counters of
//! `/metrics` ([`super::metrics::TritonStats`]).
//!
//! Semantics (Triton's): every figure is cumulative since the version was loaded; `success`
//! and `fail` count requests with their end-to-end time, `queue` and `compute_*` are per
//! request, and a batch's compute time is attributed in full to each request in it;
//! `inference_count` counts rows (a request of 4 rows is 4 inferences), `execution_count`
//! batches; `batch_stats` has one entry per executed batch size (rows), counting executions.
//! kiln has no response cache, so `cache_hit` and `cache_miss` stay zero.

use serde::Serialize;

use super::metrics::{DurationStat, VersionMetrics};
use super::repository::{LoadedVersion, RepoError, RepoErrorKind, Repository};

/// `{count, ns}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatDuration {
    /// How many.
    pub count: u64,
    /// Their cumulative duration, ns.
    pub ns: u64,
}

impl From<&DurationStat> for StatDuration {
    fn from(d: &DurationStat) -> Self {
        Self {
            count: d.count(),
            ns: d.ns(),
        }
    }
}

/// Per-request statistics of one version.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
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

/// The statistics answer: `{"model_stats": [...]}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StatsResponse {
    /// One entry per model version.
    pub model_stats: Vec<ModelStats>,
}

/// The statistics of a version's metrics.
pub fn version_stats(model: &str, version: u64, vm: &VersionMetrics) -> ModelStats {
    use std::sync::atomic::Ordering::Relaxed;
    let s = &vm.stats;
    let batch_stats = s
        .batches
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(size, b)| BatchStats {
            batch_size: *size,
            compute_input: StatDuration {
                count: b.count,
                ns: b.input_ns,
            },
            compute_infer: StatDuration {
                count: b.count,
                ns: b.infer_ns,
            },
            compute_output: StatDuration {
                count: b.count,
                ns: b.output_ns,
            },
        })
        .collect();
    ModelStats {
        name: model.to_string(),
        version: version.to_string(),
        last_inference: s.last_inference_ms.load(Relaxed),
        inference_count: vm.inference_count.load(Relaxed),
        execution_count: vm.exec_count.load(Relaxed),
        inference_stats: InferenceStats {
            success: (&s.success).into(),
            fail: (&s.fail).into(),
            queue: (&s.queue).into(),
            compute_input: (&s.compute_input).into(),
            compute_infer: (&s.compute_infer).into(),
            compute_output: (&s.compute_output).into(),
            cache_hit: StatDuration::default(),
            cache_miss: StatDuration::default(),
        },
        batch_stats,
    }
}

fn loaded_stats(lv: &LoadedVersion) -> ModelStats {
    version_stats(&lv.model, lv.version, &lv.metrics)
}

/// Statistics of the loaded versions: of every model (`name` None), of one model, or of one
/// version of it. An unknown model or a version that is not loaded is
/// [`RepoErrorKind::NotFound`]; a version that is not a number,
/// [`RepoErrorKind::InvalidArgument`].
pub fn model_stats(
    repo: &Repository,
    name: Option<&str>,
    version: Option<&str>,
) -> Result<StatsResponse, RepoError> {
    let Some(name) = name else {
        let model_stats = repo
            .names()
            .iter()
            .filter_map(|n| repo.get(n)?.current())
            .map(|lv| loaded_stats(&lv))
            .collect();
        return Ok(StatsResponse { model_stats });
    };
    let slot = repo.get(name).ok_or_else(|| {
        RepoError::new(
            RepoErrorKind::NotFound,
            format!(
                "unknown model `{}`: it is not loaded",
                super::protocol::clip(name)
            ),
        )
    })?;
    let current = slot.current();
    let lv = match version {
        None => current.ok_or_else(|| {
            RepoError::new(
                RepoErrorKind::NotFound,
                format!("model `{name}` has no version loaded"),
            )
        })?,
        Some(v) => {
            let Ok(v) = v.parse::<u64>() else {
                return Err(RepoError::new(
                    RepoErrorKind::InvalidArgument,
                    format!(
                        "model `{name}` has no version `{}` (versions are numbers)",
                        super::protocol::clip(v)
                    ),
                ));
            };
            current.filter(|c| c.version == v).ok_or_else(|| {
                RepoError::new(
                    RepoErrorKind::NotFound,
                    format!("model `{name}` version {v} is not loaded"),
                )
            })?
        }
    };
    Ok(StatsResponse {
        model_stats: vec![loaded_stats(&lv)],
    })
}
