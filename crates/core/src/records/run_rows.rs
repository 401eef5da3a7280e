//! What a run tells its observers (the registry, the MLflow mirror) when it starts and ends.

use std::path::Path;

/// What is known when a run starts.
#[derive(Debug, Clone)]
pub struct NewRun<'a> {
    /// Run id.
    pub id: &'a str,
    /// Config name.
    pub name: &'a str,
    /// Run directory.
    pub run_dir: &'a Path,
    /// Effective config text.
    pub config_text: &'a str,
    /// Its SHA-256.
    pub config_sha256: &'a str,
    /// Start time.
    pub started_at: &'a str,
    /// Environment JSON.
    pub environment: serde_json::Value,
}

/// What is known when a run ends.
#[derive(Debug, Clone, Default)]
pub struct RunEnd {
    /// Finished or failed.
    pub status: super::RunState,
    /// Why it failed.
    pub reason: Option<String>,
    /// Dataset SHA-256.
    pub dataset_sha256: Option<String>,
    /// Parameter count.
    pub param_count: Option<i64>,
    /// Export directory.
    pub artifact_path: Option<String>,
    /// Final metrics (the manifest's).
    pub final_metrics: Option<kiln_model::records::metrics::ManifestMetrics>,
    /// Right-sizing metric.
    pub val_metric: Option<f64>,
    /// The exported model's latency.
    pub latency: Option<kiln_model::records::metrics::LatencyReport>,
    /// Batch-1 p50 µs.
    pub latency_b1_p50_us: Option<f64>,
    /// Batch-128 p50 µs.
    pub latency_b128_p50_us: Option<f64>,
}
