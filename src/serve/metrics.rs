//! Prometheus metrics: lock-free counters and histograms updated on the request path, and
//! their text exposition for `GET /metrics`.
//!
//! Per model and version (Triton's `nv_inference_*` family, renamed): request success and
//! failure (by reason), inference count (rows) and execution count (batches) — their ratio is
//! the average batch size —, queue, compute and request-duration histograms, and a batch-size
//! histogram. Per model: queue depth, loaded version, readiness, reloads and reload failures.
//! Per server: responses of the infer route by HTTP status.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Duration buckets in microseconds (rendered in seconds).
const DURATION_BOUNDS_US: [u64; 18] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];
/// Batch-size buckets.
const BATCH_BOUNDS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// A cumulative histogram with fixed bounds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// Rendered value = recorded unit / scale.
    scale: f64,
    buckets: Vec<AtomicU64>,
    sum: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [u64], scale: f64) -> Self {
        Self {
            bounds,
            scale,
            buckets: (0..bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    fn durations() -> Self {
        Self::new(&DURATION_BOUNDS_US, 1e6)
    }

    /// Record a value in the histogram's unit.
    pub fn observe(&self, v: u64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.sum.fetch_add(v, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// Record a duration (duration histograms).
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_micros() as u64);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cum = 0;
        for (b, n) in self.bounds.iter().zip(&self.buckets) {
            cum += n.load(Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{}\"}} {cum}",
                *b as f64 / self.scale
            );
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {}",
            self.sum.load(Relaxed) as f64 / self.scale
        );
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// 400.
    BadRequest,
    /// 503: the queue was full.
    QueueFull,
    /// 503: the request timed out.
    Timeout,
    /// 503: no ready version.
    NotReady,
    /// 500.
    Internal,
}

impl Failure {
    const ALL: [Failure; 5] = [
        Failure::BadRequest,
        Failure::QueueFull,
        Failure::Timeout,
        Failure::NotReady,
        Failure::Internal,
    ];

    fn label(self) -> &'static str {
        match self {
            Failure::BadRequest => "bad_request",
            Failure::QueueFull => "queue_full",
            Failure::Timeout => "timeout",
            Failure::NotReady => "not_ready",
            Failure::Internal => "internal",
        }
    }
}

/// Metrics of one model version.
#[derive(Debug)]
pub struct VersionMetrics {
    /// Successful requests.
    pub success: AtomicU64,
    failures: [AtomicU64; 5],
    /// Rows inferred.
    pub inference_count: AtomicU64,
    /// Batches executed.
    pub exec_count: AtomicU64,
    /// Time each request waited in the queue.
    pub queue: Histogram,
    /// Time each batch computed.
    pub compute: Histogram,
    /// End-to-end request time (parse to encoded response).
    pub request: Histogram,
    /// Rows per executed batch.
    pub batch_size: Histogram,
}

impl VersionMetrics {
    fn new() -> Self {
        Self {
            success: AtomicU64::new(0),
            failures: Default::default(),
            inference_count: AtomicU64::new(0),
            exec_count: AtomicU64::new(0),
            queue: Histogram::durations(),
            compute: Histogram::durations(),
            request: Histogram::durations(),
            batch_size: Histogram::new(&BATCH_BOUNDS, 1.0),
        }
    }

    /// Count a failed request.
    pub fn fail(&self, why: Failure) {
        let i = Failure::ALL.iter().position(|f| *f == why).expect("listed");
        self.failures[i].fetch_add(1, Relaxed);
    }

    /// Failed requests for a reason.
    pub fn failures(&self, why: Failure) -> u64 {
        let i = Failure::ALL.iter().position(|f| *f == why).expect("listed");
        self.failures[i].load(Relaxed)
    }
}

/// Metrics of one model, across its versions.
#[derive(Debug)]
pub struct ModelMetrics {
    versions: Mutex<BTreeMap<u64, Arc<VersionMetrics>>>,
    /// Requests waiting in the queues of this model's versions.
    pub queue_depth: Arc<AtomicUsize>,
    /// The served version (-1: none).
    pub loaded_version: AtomicI64,
    /// Whether a version is ready.
    pub ready: AtomicBool,
    /// Versions loaded and swapped in.
    pub reloads: AtomicU64,
    /// Versions rejected (failed to load or warm up).
    pub reload_failures: AtomicU64,
    /// Requests refused because no version was ready.
    pub not_ready: AtomicU64,
}

impl ModelMetrics {
    fn new() -> Self {
        Self {
            versions: Mutex::default(),
            queue_depth: Arc::default(),
            loaded_version: AtomicI64::new(-1),
            ready: AtomicBool::new(false),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            not_ready: AtomicU64::new(0),
        }
    }

    /// The metrics of a version (created on first use).
    pub fn version(&self, v: u64) -> Arc<VersionMetrics> {
        self.versions
            .lock()
            .expect("metrics lock")
            .entry(v)
            .or_insert_with(|| Arc::new(VersionMetrics::new()))
            .clone()
    }
}

/// All metrics of a server.
#[derive(Debug, Default)]
pub struct Metrics {
    models: Mutex<BTreeMap<String, Arc<ModelMetrics>>>,
    infer_codes: Mutex<BTreeMap<u16, u64>>,
}

impl Metrics {
    /// The metrics of a model (created on first use).
    pub fn model(&self, name: &str) -> Arc<ModelMetrics> {
        self.models
            .lock()
            .expect("metrics lock")
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(ModelMetrics::new()))
            .clone()
    }

    /// Count a response of the infer route.
    pub fn infer_response(&self, code: u16) {
        *self
            .infer_codes
            .lock()
            .expect("metrics lock")
            .entry(code)
            .or_default() += 1;
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let models: Vec<(String, Arc<ModelMetrics>)> = self
            .models
            .lock()
            .expect("metrics lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let versions: Vec<(String, u64, Arc<VersionMetrics>)> = models
            .iter()
            .flat_map(|(name, m)| {
                m.versions
                    .lock()
                    .expect("metrics lock")
                    .iter()
                    .map(|(v, vm)| (name.clone(), *v, vm.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut out = String::with_capacity(8192);
        let family = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
        };
        let vlabels = |m: &str, v: u64| format!("model=\"{}\",version=\"{v}\"", escape(m));
        let mlabels = |m: &str| format!("model=\"{}\"", escape(m));

        family(
            &mut out,
            "kiln_inference_request_success_total",
            "counter",
            "Inference requests answered successfully.",
        );
        for (m, v, vm) in &versions {
            let _ = writeln!(
                out,
                "kiln_inference_request_success_total{{{}}} {}",
                vlabels(m, *v),
                vm.success.load(Relaxed)
            );
        }
        family(
            &mut out,
            "kiln_inference_request_failure_total",
            "counter",
            "Inference requests that failed, by reason (not_ready: no version was ready).",
        );
        for (m, v, vm) in &versions {
            for f in Failure::ALL {
                if f != Failure::NotReady {
                    let _ = writeln!(
                        out,
                        "kiln_inference_request_failure_total{{{},reason=\"{}\"}} {}",
                        vlabels(m, *v),
                        f.label(),
                        vm.failures(f)
                    );
                }
            }
        }
        for (m, mm) in &models {
            let _ = writeln!(
                out,
                "kiln_inference_request_failure_total{{{},version=\"none\",reason=\"not_ready\"}} {}",
                mlabels(m),
                mm.not_ready.load(Relaxed)
            );
        }
        family(
            &mut out,
            "kiln_inference_count_total",
            "counter",
            "Rows inferred (batch sizes summed).",
        );
        for (m, v, vm) in &versions {
            let _ = writeln!(
                out,
                "kiln_inference_count_total{{{}}} {}",
                vlabels(m, *v),
                vm.inference_count.load(Relaxed)
            );
        }
        family(
            &mut out,
            "kiln_inference_exec_count_total",
            "counter",
            "Batches executed; inference_count / exec_count is the average batch size.",
        );
        for (m, v, vm) in &versions {
            let _ = writeln!(
                out,
                "kiln_inference_exec_count_total{{{}}} {}",
                vlabels(m, *v),
                vm.exec_count.load(Relaxed)
            );
        }
        for (name, help, pick) in [
            (
                "kiln_inference_queue_duration_seconds",
                "Time a request waited in the batcher's queue.",
                0,
            ),
            (
                "kiln_inference_compute_duration_seconds",
                "Time a batch took to compute.",
                1,
            ),
            (
                "kiln_inference_request_duration_seconds",
                "Time from a parsed request to its encoded response.",
                2,
            ),
            ("kiln_inference_batch_size", "Rows per executed batch.", 3),
        ] {
            family(&mut out, name, "histogram", help);
            for (m, v, vm) in &versions {
                let h = match pick {
                    0 => &vm.queue,
                    1 => &vm.compute,
                    2 => &vm.request,
                    _ => &vm.batch_size,
                };
                h.render(&mut out, name, &vlabels(m, *v));
            }
        }
        family(
            &mut out,
            "kiln_queue_depth",
            "gauge",
            "Requests waiting in the model's queue.",
        );
        for (m, mm) in &models {
            let _ = writeln!(
                out,
                "kiln_queue_depth{{{}}} {}",
                mlabels(m),
                mm.queue_depth.load(Relaxed)
            );
        }
        family(
            &mut out,
            "kiln_model_loaded_version",
            "gauge",
            "The version being served (-1: none).",
        );
        for (m, mm) in &models {
            let _ = writeln!(
                out,
                "kiln_model_loaded_version{{{}}} {}",
                mlabels(m),
                mm.loaded_version.load(Relaxed)
            );
        }
        family(
            &mut out,
            "kiln_model_ready",
            "gauge",
            "1 when a version is loaded, warmed and serving.",
        );
        for (m, mm) in &models {
            let _ = writeln!(
                out,
                "kiln_model_ready{{{}}} {}",
                mlabels(m),
                mm.ready.load(Relaxed) as u8
            );
        }
        family(
            &mut out,
            "kiln_model_reloads_total",
            "counter",
            "Versions loaded, warmed and swapped in.",
        );
        for (m, mm) in &models {
            let _ = writeln!(
                out,
                "kiln_model_reloads_total{{{}}} {}",
                mlabels(m),
                mm.reloads.load(Relaxed)
            );
        }
        family(
            &mut out,
            "kiln_model_reload_failures_total",
            "counter",
            "Versions rejected because they failed to load or warm up.",
        );
        for (m, mm) in &models {
            let _ = writeln!(
                out,
                "kiln_model_reload_failures_total{{{}}} {}",
                mlabels(m),
                mm.reload_failures.load(Relaxed)
            );
        }
        family(
            &mut out,
            "kiln_infer_responses_total",
            "counter",
            "Responses of the infer route by HTTP status.",
        );
        for (code, n) in self.infer_codes.lock().expect("metrics lock").iter() {
            let _ = writeln!(out, "kiln_infer_responses_total{{code=\"{code}\"}} {n}");
        }
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Read one sample from Prometheus text (`name{labels}` exactly as rendered, or a bare
/// name); for tests and tools.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == series).then(|| v.parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_in_seconds() {
        let m = Metrics::default();
        let v = m.model("a").version(1);
        v.queue.observe_duration(Duration::from_micros(30));
        v.queue.observe_duration(Duration::from_millis(3));
        v.queue.observe_duration(Duration::from_secs(100));
        let text = m.render();
        let l = "model=\"a\",version=\"1\"";
        assert_eq!(
            sample(
                &text,
                &format!("kiln_inference_queue_duration_seconds_bucket{{{l},le=\"0.00005\"}}")
            ),
            Some(1.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("kiln_inference_queue_duration_seconds_bucket{{{l},le=\"0.005\"}}")
            ),
            Some(2.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("kiln_inference_queue_duration_seconds_bucket{{{l},le=\"+Inf\"}}")
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(
                &text,
                &format!("kiln_inference_queue_duration_seconds_count{{{l}}}")
            ),
            Some(3.0)
        );
        assert_eq!(
            sample(&text, "kiln_model_loaded_version{model=\"a\"}"),
            Some(-1.0)
        );
    }
}
