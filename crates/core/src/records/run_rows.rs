//! What a run tells its observers (the registry, the MLflow mirror) when it starts and ends,
//! and the environment record stored with it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The environment a run trained in, as stored with it (the registry's `runs.environment`):
/// versions, CPU, threads, device, backend, precision and build features. Every field has a
/// serde default, so a record written by an earlier release (or by hand, with fewer keys)
/// still loads; keys this release does not know are kept in [`RunEnvironment::other`] and
/// written back unchanged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunEnvironment {
    /// kiln's version.
    pub kiln: String,
    /// Burn's version.
    pub burn: String,
    /// The rustc that built kiln.
    pub rustc: String,
    /// Target triple.
    pub target: String,
    /// CPU model name.
    pub cpu: String,
    /// Logical cores available to the process.
    pub cores: usize,
    /// rayon's thread count.
    pub rayon_threads: usize,
    /// Thread-related environment variables that were set (`NAME=value`).
    pub thread_env: Vec<String>,
    /// The config's device (`cpu`, `cuda`).
    pub device: String,
    /// The config's CPU backend (`flex`, `ndarray`).
    pub backend: String,
    /// The config's precision (`f32`, `bf16`).
    pub precision: String,
    /// Enabled cargo features.
    pub features: Vec<String>,
    /// Keys this release does not know (written by a later one, or by hand): kept as they are.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

impl RunEnvironment {
    /// The record as one line of JSON with its keys in alphabetical order (as the registry
    /// has always shown it).
    pub fn to_json_line(&self) -> String {
        // Through a `Value`: its object keeps keys sorted, whatever the field order here.
        serde_json::to_value(self)
            .expect("an environment record serialises")
            .to_string()
    }
}

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
    /// The environment it runs in.
    pub environment: RunEnvironment,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environments_of_any_release_load_and_keep_unknown_keys() {
        // As the previous release stored it (keys sorted, one line).
        let stored = r#"{"backend":"flex","burn":"0.21.0","cores":2,"cpu":"AMD EPYC","device":"cpu","features":[],"kiln":"0.1.0","precision":"f32","rayon_threads":2,"rustc":"rustc 1.95.0","target":"x86_64-unknown-linux-gnu","thread_env":["RAYON_NUM_THREADS=2"]}"#;
        let e: RunEnvironment = serde_json::from_str(stored).unwrap();
        assert_eq!(
            (e.burn.as_str(), e.cores, e.rayon_threads),
            ("0.21.0", 2, 2)
        );
        assert_eq!(e.thread_env, ["RAYON_NUM_THREADS=2"]);
        assert!(e.other.is_empty());
        assert_eq!(e.to_json_line(), stored, "written back as it was read");
        // Fewer keys (a hand-made row), and a key from a later release.
        let e: RunEnvironment =
            serde_json::from_str(r#"{"burn":"0.21.0","gpu":{"name":"H200"}}"#).unwrap();
        assert_eq!(e.burn, "0.21.0");
        assert_eq!(e.cores, 0);
        assert_eq!(e.other["gpu"], serde_json::json!({"name": "H200"}));
        let again: RunEnvironment = serde_json::from_str(&e.to_json_line()).unwrap();
        assert_eq!(again, e);
    }
}
