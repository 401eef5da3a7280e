//! Prometheus metrics: lock-free counters and histograms updated on the request path, and
//! their text exposition for `GET /metrics`.
//!
//! Per model and version (Triton's `nv_inference_*` family, renamed): request success and
//! failure (by reason), inference count (rows) and execution count (batches) — their ratio is
//! the average batch size —, queue, compute and request-duration histograms, and a batch-size
//! histogram. Per model: queue depth, loaded version, readiness, reloads and reload failures.
//! Per server: responses of the infer route by HTTP status.
//!
//! The values live in atomics that the request path bumps without locks; the exposition is
//! written by the `prometheus-client` crate: a [`Registry`] holds one collector that reads
//! the atomics at scrape time, and `prometheus_client::encoding::prometheus_text` writes the
//! Prometheus text format (0.0.4). Two details keep the output identical to kiln's earlier
//! hand-written exposition:
//!
//! - Counters are described by their base name (`kiln_model_reloads`); the Prometheus text
//!   encoder appends `_total` to the HELP, TYPE and sample lines.
//! - The encoder writes histogram bounds as Go does (`le="5e-05"`); kiln has always written
//!   the shortest decimal (`le="0.00005"`), so [`Metrics::render`] rewrites each `le` value
//!   to that form (the same number, so only the spelling of the two sub-0.1 ms bounds
//!   changes back).
//!
//! Beside kiln's own series, the exposition ends with Triton's per-request counters under
//! Triton's names (`nv_inference_request_success`, `nv_inference_request_failure`,
//! `nv_inference_count`, `nv_inference_exec_count`, `nv_inference_request_duration_us`,
//! `nv_inference_queue_duration_us`, `nv_inference_compute_{input,infer,output}_duration_us`,
//! labels `model` and `version`), so Triton's Grafana dashboards work unchanged. Triton's
//! counters carry no `_total` suffix, so these families are written by hand, not by the
//! encoder (which would append it). They read the same atomics as the statistics extension
//! ([`TritonStats`], `GET /v2/models/stats`): the durations there are in ns, here in µs
//! (`ns / 1000`, rounded down), and the counts are equal. Semantics are Triton's: queue and
//! compute times are per request, and every request of a batch is attributed the whole
//! batch's compute time (so `nv_inference_compute_infer_duration_us` grows by `n × t` for a
//! batch of `n` requests that took `t`); request duration and success count only successful
//! requests.
//!
//! Files: this one holds the atomics (per version, per model, per server) and what the
//! request path records; `exposition.rs` the scrape-time collector and Triton's families.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{MetricEncoder, NoLabelSet, prometheus_text};
use prometheus_client::registry::Registry;

use crate::live_profile;
use crate::monitor::{DriftMonitor, LatencyWatch};
use crate::records::stats::{BatchStats, InferenceStats, ModelStats, StatDuration};
use exposition::{Exposition, decimal_bucket_bounds, render_triton};

mod exposition;
#[cfg(test)]
mod tests;

pub use exposition::sample;

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

    /// Sum of the observations, in the histogram's unit (µs for durations).
    pub fn sum(&self) -> u64 {
        self.sum.load(Relaxed)
    }

    /// Encode as one histogram series: `(upper bound, observations in that bucket alone)`
    /// pairs (the encoder accumulates them and adds `+Inf` from the count).
    pub(super) fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        let buckets: Vec<(f64, u64)> = self
            .bounds
            .iter()
            .zip(&self.buckets)
            .map(|(b, n)| (*b as f64 / self.scale, n.load(Relaxed)))
            .collect();
        let sum = self.sum.load(Relaxed) as f64 / self.scale;
        encoder.encode_histogram::<NoLabelSet>(sum, self.count.load(Relaxed), &buckets, None)
    }
}

/// A count and a cumulative duration in nanoseconds (Triton's `{count, ns}`).
#[derive(Debug, Default)]
pub struct DurationStat {
    count: AtomicU64,
    ns: AtomicU64,
}

impl DurationStat {
    /// Count one event that took `d`.
    pub fn add(&self, d: Duration) {
        self.add_n(1, d);
    }

    /// Count `n` events that each took `each`.
    pub fn add_n(&self, n: u64, each: Duration) {
        self.count.fetch_add(n, Relaxed);
        self.ns.fetch_add(n * each.as_nanos() as u64, Relaxed);
    }

    /// Events so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// Their cumulative duration, ns.
    pub fn ns(&self) -> u64 {
        self.ns.load(Relaxed)
    }
}

impl From<&DurationStat> for StatDuration {
    fn from(d: &DurationStat) -> Self {
        Self {
            count: d.count(),
            ns: d.ns(),
        }
    }
}

/// What executions of one batch size took (Triton's `batch_stats` entry).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BatchStat {
    /// Executions of this batch size.
    pub count: u64,
    /// Their cumulative batch assembly time, ns.
    pub input_ns: u64,
    /// Their cumulative engine time, ns.
    pub infer_ns: u64,
    /// Their cumulative result splitting time, ns.
    pub output_ns: u64,
}

/// Triton's per-version statistics (the statistics extension and the `nv_inference_*`
/// counters), cumulative since the version was loaded. Per request: `success` and `fail`
/// (with the request's end-to-end time), `queue` (time in the batcher's queue),
/// `compute_input` (batch assembly and hand-off to the instance), `compute_infer` (the
/// instance's execution: concatenating the inputs, the engine, splitting the outputs) and
/// `compute_output` (handing each request its rows); a batch's compute times are
/// attributed in full to each request in it, as Triton does. Per batch size: `batches`.
#[derive(Debug, Default)]
pub struct TritonStats {
    /// Successful requests and their end-to-end time.
    pub success: DurationStat,
    /// Failed requests (attributed to this version) and their end-to-end time.
    pub fail: DurationStat,
    /// Time each request waited in the queue.
    pub queue: DurationStat,
    /// Batch assembly, per request.
    pub compute_input: DurationStat,
    /// Engine execution, per request.
    pub compute_infer: DurationStat,
    /// Output hand-back, per request.
    pub compute_output: DurationStat,
    /// Executions by batch size (rows).
    pub batches: Mutex<BTreeMap<u64, BatchStat>>,
    /// When the last batch finished, ms since the Unix epoch (0: never).
    pub last_inference_ms: AtomicU64,
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
    /// The caller went away (an HTTP client disconnected, a gRPC call was cancelled) before
    /// the answer.
    Cancelled,
}

impl Failure {
    pub(super) const ALL: [Failure; 6] = [
        Failure::BadRequest,
        Failure::QueueFull,
        Failure::Timeout,
        Failure::NotReady,
        Failure::Internal,
        Failure::Cancelled,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Failure::BadRequest => "bad_request",
            Failure::QueueFull => "queue_full",
            Failure::Timeout => "timeout",
            Failure::NotReady => "not_ready",
            Failure::Internal => "internal",
            Failure::Cancelled => "cancelled",
        }
    }
}

/// Metrics of one model version.
pub struct VersionMetrics {
    /// Successful requests.
    pub success: AtomicU64,
    failures: [AtomicU64; 6],
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
    /// Triton's statistics.
    pub stats: TritonStats,
    /// The live inputs against the checkpoint's training sketches (set at load when the
    /// checkpoint has them).
    pub drift: OnceLock<DriftMonitor>,
    /// Live compute time against the checkpoint's recorded latency (set at load when the
    /// checkpoint has it).
    pub latency: OnceLock<LatencyWatch>,
    /// When these metrics started (the version's load).
    pub since: std::time::Instant,
    /// Requests dropped before they computed: past their deadline, or their caller left.
    pub dropped: [AtomicU64; 2],
}

/// Why a queued request was dropped before it computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Its deadline (`timeout` parameter or the server's request timeout) passed.
    Deadline = 0,
    /// Its caller disconnected (HTTP) or cancelled the call (gRPC).
    Cancelled = 1,
}

impl std::fmt::Debug for VersionMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VersionMetrics")
            .field("success", &self.success)
            .field("exec_count", &self.exec_count)
            .field("drift", &self.drift.get().is_some())
            .field("latency", &self.latency.get().is_some())
            .finish_non_exhaustive()
    }
}

impl VersionMetrics {
    /// Count a queued request dropped before it computed.
    pub fn record_dropped(&self, why: Dropped) {
        self.dropped[why as usize].fetch_add(1, Relaxed);
    }

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
            stats: TritonStats::default(),
            drift: OnceLock::new(),
            latency: OnceLock::new(),
            since: std::time::Instant::now(),
            dropped: Default::default(),
        }
    }

    /// Count a failed request (Triton's `fail` with no duration).
    pub fn fail(&self, why: Failure) {
        self.record_failure(why, Duration::ZERO);
    }

    /// Count a failed request that took `elapsed` from arrival to its error answer. Every
    /// protocol (HTTP, gRPC) calls this for a request resolved to this version.
    pub fn record_failure(&self, why: Failure, elapsed: Duration) {
        let i = Failure::ALL.iter().position(|f| *f == why).expect("listed");
        self.failures[i].fetch_add(1, Relaxed);
        self.stats.fail.add(elapsed);
    }

    /// Count a successful request that took `elapsed` from arrival to its encoded answer.
    /// Every protocol (HTTP, gRPC) calls this once per answered request.
    pub fn record_success(&self, elapsed: Duration) {
        let now = std::time::Instant::now();
        crate::observe::profiler::record_interval(
            live_profile::STEP_NAME,
            now.checked_sub(elapsed).unwrap_or(now),
            now,
        );
        self.request.observe_duration(elapsed);
        self.stats.success.add(elapsed);
        self.success.fetch_add(1, Relaxed);
    }

    /// A request left the queue after waiting `waited` (the batcher calls this).
    pub fn record_queue(&self, waited: Duration) {
        self.queue.observe_duration(waited);
        self.stats.queue.add(waited);
    }

    /// A batch of `rows` rows from `requests` requests executed: `input` to assemble and hand
    /// it to the instance, `infer` in the instance, `output` to split the results (the
    /// batcher calls this before answering the requests).
    pub fn record_execution(
        &self,
        rows: usize,
        requests: usize,
        input: Duration,
        infer: Duration,
        output: Duration,
    ) {
        self.compute.observe_duration(input + infer + output);
        self.exec_count.fetch_add(1, Relaxed);
        self.inference_count.fetch_add(rows as u64, Relaxed);
        self.batch_size.observe(rows as u64);
        let n = requests as u64;
        let s = &self.stats;
        s.compute_input.add_n(n, input);
        s.compute_infer.add_n(n, infer);
        s.compute_output.add_n(n, output);
        {
            let mut b = s.batches.lock().unwrap_or_else(|p| p.into_inner());
            let e = b.entry(rows as u64).or_default();
            e.count += 1;
            e.input_ns += input.as_nanos() as u64;
            e.infer_ns += infer.as_nanos() as u64;
            e.output_ns += output.as_nanos() as u64;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        s.last_inference_ms.store(now, Relaxed);
    }

    /// The engine computed a batch of `rows` rows in `took` (the latency watch's input).
    pub fn record_engine_time(&self, rows: usize, took: std::time::Duration) {
        if let Some(w) = self.latency.get() {
            w.record(rows, took);
        }
    }

    /// Failed requests for a reason.
    pub fn failures(&self, why: Failure) -> u64 {
        let i = Failure::ALL.iter().position(|f| *f == why).expect("listed");
        self.failures[i].load(Relaxed)
    }

    /// This version's statistics (Triton's statistics extension), read from the same
    /// atomics as the `nv_inference_*` counters.
    pub fn statistics(&self, model: &str, version: u64) -> ModelStats {
        let s = &self.stats;
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
            inference_count: self.inference_count.load(Relaxed),
            execution_count: self.exec_count.load(Relaxed),
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

    /// Fresh metrics for a version being loaded: its counters start again from zero, as
    /// Triton's do when a model is (re)loaded ("cumulative since load").
    pub fn fresh_version(&self, v: u64) -> Arc<VersionMetrics> {
        let vm = Arc::new(VersionMetrics::new());
        self.versions
            .lock()
            .expect("metrics lock")
            .insert(v, vm.clone());
        vm
    }
}

/// The values behind the exposition, shared by [`Metrics`] and its collector.
#[derive(Debug, Default)]
pub(super) struct Values {
    pub(super) models: Mutex<BTreeMap<String, Arc<ModelMetrics>>>,
    pub(super) infer_codes: Mutex<BTreeMap<u16, u64>>,
}

/// The models and their versions, copied out of the locks (each held only while copying),
/// in name and version order.
pub(super) type Snapshot = (
    Vec<(String, Arc<ModelMetrics>)>,
    Vec<(String, u64, Arc<VersionMetrics>)>,
);

impl Values {
    pub(super) fn snapshot(&self) -> Snapshot {
        let models: Vec<(String, Arc<ModelMetrics>)> = self
            .models
            .lock()
            .expect("metrics lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let versions = models
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
        (models, versions)
    }
}

/// All metrics of a server.
#[derive(Debug)]
pub struct Metrics {
    values: Arc<Values>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let values = Arc::new(Values::default());
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Exposition(values.clone())));
        Self { values, registry }
    }
}

impl Metrics {
    /// The metrics of a model (created on first use).
    pub fn model(&self, name: &str) -> Arc<ModelMetrics> {
        self.values
            .models
            .lock()
            .expect("metrics lock")
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(ModelMetrics::new()))
            .clone()
    }

    /// Count a response of the infer route.
    pub fn infer_response(&self, code: u16) {
        *self
            .values
            .infer_codes
            .lock()
            .expect("metrics lock")
            .entry(code)
            .or_default() += 1;
    }

    /// Prometheus text exposition (format 0.0.4, served as
    /// `text/plain; version=0.0.4; charset=utf-8`).
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        // The collector only fails when its writer does, and a String never does.
        prometheus_text::encode(&mut out, &self.registry)
            .expect("the metrics exposition writes to a String");
        let mut out = decimal_bucket_bounds(&out);
        render_triton(&self.values, &mut out);
        out
    }
}
