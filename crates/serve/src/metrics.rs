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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

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
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
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
    const ALL: [Failure; 6] = [
        Failure::BadRequest,
        Failure::QueueFull,
        Failure::Timeout,
        Failure::NotReady,
        Failure::Internal,
        Failure::Cancelled,
    ];

    fn label(self) -> &'static str {
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
    pub drift: OnceLock<crate::monitor::DriftMonitor>,
    /// Live compute time against the checkpoint's recorded latency (set at load when the
    /// checkpoint has it).
    pub latency: OnceLock<crate::monitor::LatencyWatch>,
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
            crate::live_profile::STEP_NAME,
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
struct Values {
    models: Mutex<BTreeMap<String, Arc<ModelMetrics>>>,
    infer_codes: Mutex<BTreeMap<u16, u64>>,
}

/// The models and their versions, copied out of the locks (each held only while copying),
/// in name and version order.
type Snapshot = (
    Vec<(String, Arc<ModelMetrics>)>,
    Vec<(String, u64, Arc<VersionMetrics>)>,
);

impl Values {
    fn snapshot(&self) -> Snapshot {
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
        self.render_triton(&mut out);
        out
    }

    /// Append Triton's `nv_inference_*` counters (no `_total` suffix, as Triton writes them).
    fn render_triton(&self, out: &mut String) {
        use std::fmt::Write;
        let (_, versions) = self.values.snapshot();
        type Pick = fn(&VersionMetrics) -> u64;
        let families: [(&str, &str, Pick); 9] = [
            (
                "nv_inference_request_success",
                "Number of successful inference requests, all batch sizes",
                |vm| vm.stats.success.count(),
            ),
            (
                "nv_inference_request_failure",
                "Number of failed inference requests, all batch sizes",
                |vm| vm.stats.fail.count(),
            ),
            (
                "nv_inference_count",
                "Number of inferences performed (does not include cached requests)",
                |vm| vm.inference_count.load(Relaxed),
            ),
            (
                "nv_inference_exec_count",
                "Number of model executions performed (does not include cached requests)",
                |vm| vm.exec_count.load(Relaxed),
            ),
            (
                "nv_inference_request_duration_us",
                "Cumulative inference request duration in microseconds (includes cached requests)",
                |vm| vm.stats.success.ns() / 1000,
            ),
            (
                "nv_inference_queue_duration_us",
                "Cumulative inference queuing duration in microseconds (includes cached requests)",
                |vm| vm.stats.queue.ns() / 1000,
            ),
            (
                "nv_inference_compute_input_duration_us",
                "Cumulative compute input duration in microseconds (does not include cached requests)",
                |vm| vm.stats.compute_input.ns() / 1000,
            ),
            (
                "nv_inference_compute_infer_duration_us",
                "Cumulative compute inference duration in microseconds (does not include cached requests)",
                |vm| vm.stats.compute_infer.ns() / 1000,
            ),
            (
                "nv_inference_compute_output_duration_us",
                "Cumulative inference compute output duration in microseconds (does not include cached requests)",
                |vm| vm.stats.compute_output.ns() / 1000,
            ),
        ];
        for (name, help, pick) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            for (m, v, vm) in &versions {
                let _ = writeln!(
                    out,
                    "{name}{{model=\"{}\",version=\"{v}\"}} {}",
                    escape_label(m),
                    pick(vm)
                );
            }
        }
    }
}

/// A label value escaped for the Prometheus text format.
fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Rewrite the `le="…"` bound of every bucket line that the encoder spelled in exponent
/// form (`5e-05`) as the shortest decimal (`0.00005`), the spelling kiln's series have
/// always had. `le` is the last label of a bucket sample, so the last `le="` of the line is
/// it (label values are escaped, so a value cannot end one early).
fn decimal_bucket_bounds(text: &str) -> String {
    const KEY: &str = "le=\"";
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let bucket = line
            .split('{')
            .next()
            .is_some_and(|name| name.ends_with("_bucket"));
        let bound = line.rfind(KEY).map(|i| i + KEY.len()).and_then(|start| {
            let len = line[start..].find('"')?;
            Some((start, start + len))
        });
        match bound {
            Some((start, end)) if bucket && line[start..end].contains(['e', 'E']) => {
                match line[start..end].parse::<f64>() {
                    Ok(v) if v.is_finite() => {
                        out.push_str(&line[..start]);
                        out.push_str(&v.to_string());
                        out.push_str(&line[end..]);
                    }
                    _ => out.push_str(line),
                }
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// The collector: reads the atomics at scrape time, in a fixed family order, series sorted
/// by model, version, reason and status code.
#[derive(Debug)]
struct Exposition(Arc<Values>);

type Labels = Vec<(&'static str, String)>;

/// Selects one of a version's histograms.
type PickHistogram = fn(&VersionMetrics) -> &Histogram;

fn version_labels(model: &str, version: u64) -> Labels {
    vec![
        ("model", model.to_string()),
        ("version", version.to_string()),
    ]
}

fn model_labels(model: &str) -> Labels {
    vec![("model", model.to_string())]
}

/// Write one counter family.
fn counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Write one gauge family of real values.
fn with(mut l: Labels, key: &'static str, value: impl ToString) -> Labels {
    l.push((key, value.to_string()));
    l
}

/// The drift and latency-watch families.
fn watch_families(
    e: &mut DescriptorEncoder,
    versions: &[(String, u64, Arc<VersionMetrics>)],
) -> std::fmt::Result {
    let reports: Vec<(Labels, crate::monitor::DriftReport)> = versions
        .iter()
        .filter_map(|(m, v, vm)| {
            vm.drift
                .get()
                .map(|d| (version_labels(m, *v), d.report(vm.since)))
        })
        .collect();
    type PickFeature = fn(&crate::monitor::FeatureDrift) -> Option<f64>;
    let per_feature: [(&str, &str, PickFeature); 5] = [
        (
            "kiln_drift_psi",
            "Population stability index of the feature's live values in the drift window against the training split's bins.",
            |f| Some(f.psi),
        ),
        (
            "kiln_drift_ks",
            "Binned Kolmogorov-Smirnov statistic of the feature's live values against the training split (numeric features).",
            |f| f.ks,
        ),
        (
            "kiln_drift_out_of_range_ratio",
            "Fraction of the feature's live values outside the training range (numeric) or of unknown categories (categorical).",
            |f| Some(f.out_of_range_ratio),
        ),
        (
            "kiln_drift_missing_ratio",
            "Fraction of the feature's live values that are missing.",
            |f| Some(f.missing_ratio),
        ),
        (
            "kiln_drift_window_values",
            "Live values of the feature in the drift window.",
            |f| Some(f.values as f64),
        ),
    ];
    for (name, help, pick) in per_feature {
        gauges(
            e,
            name,
            help,
            reports.iter().flat_map(|(l, r)| {
                r.features
                    .iter()
                    .filter_map(|f| pick(f).map(|v| (with(l.clone(), "feature", &f.feature), v)))
            }),
        )?;
    }
    gauges(
        e,
        "kiln_drift_psi_threshold",
        "PSI past which a feature counts as drifted (--drift-psi-threshold).",
        reports.iter().map(|(l, r)| (l.clone(), r.psi_threshold)),
    )?;
    gauges(
        e,
        "kiln_drift_features_drifted",
        "Features whose PSI is past the threshold.",
        reports.iter().map(|(l, r)| (l.clone(), r.drifted as f64)),
    )?;
    gauges(
        e,
        "kiln_drift_features",
        "Features the drift monitor watches.",
        reports
            .iter()
            .map(|(l, r)| (l.clone(), r.features.len() as f64)),
    )?;
    gauges(
        e,
        "kiln_drift_window_seconds",
        "Seconds the drift window spans (since load while shorter than --drift-window-s).",
        reports.iter().map(|(l, r)| (l.clone(), r.window_seconds)),
    )?;
    gauges(
        e,
        "kiln_prediction_std_mean",
        "Mean predicted standard deviation (original units) over the drift window.",
        reports.iter().flat_map(|(l, r)| {
            r.prediction_std.iter().filter_map(|t| {
                t.live_mean
                    .map(|v| (with(l.clone(), "target", &t.target), v))
            })
        }),
    )?;
    gauges(
        e,
        "kiln_prediction_std_reference",
        "Mean predicted standard deviation on the test split, from the checkpoint.",
        reports.iter().flat_map(|(l, r)| {
            r.prediction_std.iter().filter_map(|t| {
                t.reference
                    .map(|v| (with(l.clone(), "target", &t.target), v))
            })
        }),
    )?;
    let buckets: Vec<(Labels, crate::monitor::BucketLatency)> = versions
        .iter()
        .filter_map(|(m, v, vm)| vm.latency.get().map(|w| (m, v, w)))
        .flat_map(|(m, v, w)| {
            w.buckets()
                .into_iter()
                .map(|b| (with(version_labels(m, *v), "batch", b.batch), b))
        })
        .collect();
    gauges(
        e,
        "kiln_latency_live_p50_seconds",
        "Median compute time of the bucket's last batches (batches of up to `batch` rows).",
        buckets
            .iter()
            .map(|(l, b)| (l.clone(), b.live_p50_us * 1e-6)),
    )?;
    gauges(
        e,
        "kiln_latency_baseline_seconds",
        "The checkpoint's recorded p50 at the same rows (interpolated between its batch sizes).",
        buckets
            .iter()
            .map(|(l, b)| (l.clone(), b.baseline_us * 1e-6)),
    )?;
    gauges(
        e,
        "kiln_latency_regression",
        "1 while the bucket's live p50 has stayed at least --latency-watch-ratio times the recorded one.",
        buckets
            .iter()
            .map(|(l, b)| (l.clone(), i64::from(b.regressed))),
    )
}

/// Write one gauge family.
/// A gauge family of integer (`i64`) or real (`f64`) values.
fn gauges<N: prometheus_client::encoding::EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, N)>,
) -> std::fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (models, versions) = self.0.snapshot();
        let e = &mut encoder;
        let per_version = |f: &dyn Fn(&VersionMetrics) -> u64| {
            versions
                .iter()
                .map(|(m, v, vm)| (version_labels(m, *v), f(vm)))
                .collect::<Vec<_>>()
        };

        counters(
            e,
            "kiln_inference_request_success",
            "Inference requests answered successfully.",
            per_version(&|vm| vm.success.load(Relaxed)),
        )?;
        let failures = versions
            .iter()
            .flat_map(|(m, v, vm)| {
                Failure::ALL
                    .into_iter()
                    .filter(|f| *f != Failure::NotReady)
                    .map(|f| {
                        let mut l = version_labels(m, *v);
                        l.push(("reason", f.label().to_string()));
                        (l, vm.failures(f))
                    })
            })
            .chain(models.iter().map(|(m, mm)| {
                let mut l = model_labels(m);
                l.push(("version", "none".to_string()));
                l.push(("reason", Failure::NotReady.label().to_string()));
                (l, mm.not_ready.load(Relaxed))
            }));
        counters(
            e,
            "kiln_inference_request_failure",
            "Inference requests that failed, by reason (not_ready: no version was ready).",
            failures,
        )?;
        counters(
            e,
            "kiln_inference_count",
            "Rows inferred (batch sizes summed).",
            per_version(&|vm| vm.inference_count.load(Relaxed)),
        )?;
        counters(
            e,
            "kiln_inference_exec_count",
            "Batches executed; inference_count / exec_count is the average batch size.",
            per_version(&|vm| vm.exec_count.load(Relaxed)),
        )?;
        let histograms: [(&str, &str, PickHistogram); 4] = [
            (
                "kiln_inference_queue_duration_seconds",
                "Time a request waited in the batcher's queue.",
                |vm| &vm.queue,
            ),
            (
                "kiln_inference_compute_duration_seconds",
                "Time a batch took to compute.",
                |vm| &vm.compute,
            ),
            (
                "kiln_inference_request_duration_seconds",
                "Time from a parsed request to its encoded response.",
                |vm| &vm.request,
            ),
            (
                "kiln_inference_batch_size",
                "Rows per executed batch.",
                |vm| &vm.batch_size,
            ),
        ];
        for (name, help, pick) in histograms {
            let mut family = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
            for (m, v, vm) in &versions {
                let labels = version_labels(m, *v);
                pick(vm).encode(family.encode_family(&labels)?)?;
            }
        }
        counters(
            e,
            "kiln_inference_request_dropped",
            "Queued requests dropped before they computed: past their deadline, or their caller disconnected or cancelled.",
            versions.iter().flat_map(|(m, v, vm)| {
                [
                    (Dropped::Deadline, "deadline"),
                    (Dropped::Cancelled, "cancelled"),
                ]
                .into_iter()
                .map(|(d, name)| {
                    (
                        with(version_labels(m, *v), "reason", name),
                        vm.dropped[d as usize].load(Relaxed),
                    )
                })
            }),
        )?;
        watch_families(e, &versions)?;
        let per_model = |f: &dyn Fn(&ModelMetrics) -> i64| {
            models
                .iter()
                .map(|(m, mm)| (model_labels(m), f(mm)))
                .collect::<Vec<_>>()
        };
        gauges(
            e,
            "kiln_queue_depth",
            "Requests waiting in the model's queue.",
            per_model(&|mm| mm.queue_depth.load(Relaxed) as i64),
        )?;
        gauges(
            e,
            "kiln_model_loaded_version",
            "The version being served (-1: none).",
            per_model(&|mm| mm.loaded_version.load(Relaxed)),
        )?;
        gauges(
            e,
            "kiln_model_ready",
            "1 when a version is loaded, warmed and serving.",
            per_model(&|mm| i64::from(mm.ready.load(Relaxed))),
        )?;
        counters(
            e,
            "kiln_model_reloads",
            "Versions loaded, warmed and swapped in.",
            models
                .iter()
                .map(|(m, mm)| (model_labels(m), mm.reloads.load(Relaxed))),
        )?;
        counters(
            e,
            "kiln_model_reload_failures",
            "Versions rejected because they failed to load or warm up.",
            models
                .iter()
                .map(|(m, mm)| (model_labels(m), mm.reload_failures.load(Relaxed))),
        )?;
        let codes: Vec<(Labels, u64)> = self
            .0
            .infer_codes
            .lock()
            .expect("metrics lock")
            .iter()
            .map(|(code, n)| (vec![("code", code.to_string())], *n))
            .collect();
        counters(
            e,
            "kiln_infer_responses",
            "Responses of the infer route by HTTP status.",
            codes,
        )
    }
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
            sample(
                &text,
                &format!("kiln_inference_queue_duration_seconds_sum{{{l}}}")
            ),
            Some(100.00303)
        );
        assert_eq!(
            sample(&text, "kiln_model_loaded_version{model=\"a\"}"),
            Some(-1.0)
        );
    }

    /// Every family's HELP and TYPE line, in exposition order.
    const FAMILIES: [(&str, &str, &str); 29] = [
        (
            "kiln_inference_request_success_total",
            "counter",
            "Inference requests answered successfully.",
        ),
        (
            "kiln_inference_request_failure_total",
            "counter",
            "Inference requests that failed, by reason (not_ready: no version was ready).",
        ),
        (
            "kiln_inference_count_total",
            "counter",
            "Rows inferred (batch sizes summed).",
        ),
        (
            "kiln_inference_exec_count_total",
            "counter",
            "Batches executed; inference_count / exec_count is the average batch size.",
        ),
        (
            "kiln_inference_queue_duration_seconds",
            "histogram",
            "Time a request waited in the batcher's queue.",
        ),
        (
            "kiln_inference_compute_duration_seconds",
            "histogram",
            "Time a batch took to compute.",
        ),
        (
            "kiln_inference_request_duration_seconds",
            "histogram",
            "Time from a parsed request to its encoded response.",
        ),
        (
            "kiln_inference_batch_size",
            "histogram",
            "Rows per executed batch.",
        ),
        (
            "kiln_inference_request_dropped_total",
            "counter",
            "Queued requests dropped before they computed: past their deadline, or their caller disconnected or cancelled.",
        ),
        (
            "kiln_drift_psi",
            "gauge",
            "Population stability index of the feature's live values in the drift window against the training split's bins.",
        ),
        (
            "kiln_drift_ks",
            "gauge",
            "Binned Kolmogorov-Smirnov statistic of the feature's live values against the training split (numeric features).",
        ),
        (
            "kiln_drift_out_of_range_ratio",
            "gauge",
            "Fraction of the feature's live values outside the training range (numeric) or of unknown categories (categorical).",
        ),
        (
            "kiln_drift_missing_ratio",
            "gauge",
            "Fraction of the feature's live values that are missing.",
        ),
        (
            "kiln_drift_window_values",
            "gauge",
            "Live values of the feature in the drift window.",
        ),
        (
            "kiln_drift_psi_threshold",
            "gauge",
            "PSI past which a feature counts as drifted (--drift-psi-threshold).",
        ),
        (
            "kiln_drift_features_drifted",
            "gauge",
            "Features whose PSI is past the threshold.",
        ),
        (
            "kiln_drift_features",
            "gauge",
            "Features the drift monitor watches.",
        ),
        (
            "kiln_drift_window_seconds",
            "gauge",
            "Seconds the drift window spans (since load while shorter than --drift-window-s).",
        ),
        (
            "kiln_prediction_std_mean",
            "gauge",
            "Mean predicted standard deviation (original units) over the drift window.",
        ),
        (
            "kiln_prediction_std_reference",
            "gauge",
            "Mean predicted standard deviation on the test split, from the checkpoint.",
        ),
        (
            "kiln_latency_live_p50_seconds",
            "gauge",
            "Median compute time of the bucket's last batches (batches of up to `batch` rows).",
        ),
        (
            "kiln_latency_baseline_seconds",
            "gauge",
            "The checkpoint's recorded p50 at the same rows (interpolated between its batch sizes).",
        ),
        (
            "kiln_latency_regression",
            "gauge",
            "1 while the bucket's live p50 has stayed at least --latency-watch-ratio times the recorded one.",
        ),
        (
            "kiln_queue_depth",
            "gauge",
            "Requests waiting in the model's queue.",
        ),
        (
            "kiln_model_loaded_version",
            "gauge",
            "The version being served (-1: none).",
        ),
        (
            "kiln_model_ready",
            "gauge",
            "1 when a version is loaded, warmed and serving.",
        ),
        (
            "kiln_model_reloads_total",
            "counter",
            "Versions loaded, warmed and swapped in.",
        ),
        (
            "kiln_model_reload_failures_total",
            "counter",
            "Versions rejected because they failed to load or warm up.",
        ),
        (
            "kiln_infer_responses_total",
            "counter",
            "Responses of the infer route by HTTP status.",
        ),
    ];

    #[test]
    fn exposition_names_help_types_and_series_are_unchanged() {
        let m = Metrics::default();
        let a = m.model("a");
        let v1 = a.version(1);
        let v2 = a.version(2);
        v1.success.fetch_add(7, Relaxed);
        v2.success.fetch_add(1, Relaxed);
        v1.fail(Failure::QueueFull);
        v1.fail(Failure::QueueFull);
        v1.fail(Failure::BadRequest);
        v1.inference_count.fetch_add(12, Relaxed);
        v1.exec_count.fetch_add(3, Relaxed);
        v1.batch_size.observe(3);
        v1.batch_size.observe(8);
        v1.compute.observe_duration(Duration::from_micros(25));
        v1.request.observe_duration(Duration::from_millis(20));
        a.not_ready.fetch_add(4, Relaxed);
        a.queue_depth.store(5, Relaxed);
        a.loaded_version.store(2, Relaxed);
        a.ready.store(true, Relaxed);
        a.reloads.fetch_add(2, Relaxed);
        a.reload_failures.fetch_add(1, Relaxed);
        // A model name that needs escaping, with no version yet.
        m.model("b\"\\x");
        m.infer_response(200);
        m.infer_response(503);
        m.infer_response(200);
        let text = m.render();

        // HELP then TYPE for every family, in order, and no other comment lines.
        // (Triton's `nv_inference_*` families follow kiln's; they have their own test.)
        let comments: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with('#') && !l.contains(" nv_inference_"))
            .collect();
        let want: Vec<String> = FAMILIES
            .iter()
            .flat_map(|(name, kind, help)| {
                [
                    format!("# HELP {name} {help}"),
                    format!("# TYPE {name} {kind}"),
                ]
            })
            .collect();
        assert_eq!(comments, want, "{text}");
        // Every sample line belongs to the family whose TYPE line precedes it.
        let mut family = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                family = rest.split(' ').next().unwrap();
            } else if !line.starts_with('#') {
                assert!(line.starts_with(family), "{line} outside {family}");
            }
        }

        let l1 = "model=\"a\",version=\"1\"";
        let l2 = "model=\"a\",version=\"2\"";
        let get = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("{series}"));
        assert_eq!(
            get(&format!("kiln_inference_request_success_total{{{l1}}}")),
            7.0
        );
        assert_eq!(
            get(&format!("kiln_inference_request_success_total{{{l2}}}")),
            1.0
        );
        for (reason, n) in [
            ("bad_request", 1.0),
            ("queue_full", 2.0),
            ("timeout", 0.0),
            ("internal", 0.0),
        ] {
            assert_eq!(
                get(&format!(
                    "kiln_inference_request_failure_total{{{l1},reason=\"{reason}\"}}"
                )),
                n,
                "{reason}"
            );
        }
        assert_eq!(
            sample(
                &text,
                &format!("kiln_inference_request_failure_total{{{l1},reason=\"not_ready\"}}")
            ),
            None
        );
        assert_eq!(
            get(
                "kiln_inference_request_failure_total{model=\"a\",version=\"none\",reason=\"not_ready\"}"
            ),
            4.0
        );
        assert_eq!(get(&format!("kiln_inference_count_total{{{l1}}}")), 12.0);
        assert_eq!(
            get(&format!("kiln_inference_exec_count_total{{{l1}}}")),
            3.0
        );
        // Batch-size bounds are integers; 3 and 8 rows fall in le=4 and le=8.
        for (le, n) in [
            ("1", 0.0),
            ("2", 0.0),
            ("4", 1.0),
            ("8", 2.0),
            ("1024", 2.0),
        ] {
            assert_eq!(
                get(&format!(
                    "kiln_inference_batch_size_bucket{{{l1},le=\"{le}\"}}"
                )),
                n,
                "le={le}"
            );
        }
        assert_eq!(get(&format!("kiln_inference_batch_size_sum{{{l1}}}")), 11.0);
        // Duration bounds are spelled as decimals, as before, smallest to largest.
        let bounds: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.starts_with(&format!(
                    "kiln_inference_compute_duration_seconds_bucket{{{l1},"
                ))
            })
            .map(|l| l.split("le=\"").nth(1).unwrap().split('"').next().unwrap())
            .collect();
        assert_eq!(
            bounds,
            [
                "0.000025", "0.00005", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005",
                "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"
            ]
        );
        assert_eq!(
            get(&format!(
                "kiln_inference_compute_duration_seconds_bucket{{{l1},le=\"0.000025\"}}"
            )),
            1.0
        );
        assert_eq!(
            get(&format!(
                "kiln_inference_request_duration_seconds_bucket{{{l1},le=\"0.01\"}}"
            )),
            0.0
        );
        assert_eq!(
            get(&format!(
                "kiln_inference_request_duration_seconds_bucket{{{l1},le=\"0.025\"}}"
            )),
            1.0
        );
        assert_eq!(
            get(&format!(
                "kiln_inference_request_duration_seconds_sum{{{l1}}}"
            )),
            0.02
        );
        assert_eq!(get("kiln_queue_depth{model=\"a\"}"), 5.0);
        assert_eq!(get("kiln_model_loaded_version{model=\"a\"}"), 2.0);
        assert_eq!(get("kiln_model_ready{model=\"a\"}"), 1.0);
        assert_eq!(get("kiln_model_reloads_total{model=\"a\"}"), 2.0);
        assert_eq!(get("kiln_model_reload_failures_total{model=\"a\"}"), 1.0);
        // Label values are escaped; a model without versions still has its model series.
        assert_eq!(get("kiln_model_loaded_version{model=\"b\\\"\\\\x\"}"), -1.0);
        assert_eq!(get("kiln_model_ready{model=\"b\\\"\\\\x\"}"), 0.0);
        assert_eq!(get("kiln_infer_responses_total{code=\"200\"}"), 2.0);
        assert_eq!(get("kiln_infer_responses_total{code=\"503\"}"), 1.0);
        // Series of one family are sorted by model and version.
        let first = text.find(&format!("kiln_inference_count_total{{{l1}}}"));
        let second = text.find(&format!("kiln_inference_count_total{{{l2}}}"));
        assert!(first < second);
    }

    #[test]
    fn triton_counters_have_tritons_names_and_per_request_semantics() {
        let m = Metrics::default();
        let v = m.model("a\"b").version(3);
        // Two requests queued 1.5 ms and 0.5 ms, then ran as one batch of 5 rows that took
        // 10 µs to assemble, 2 ms to compute and 1 µs to split: each request gets it all.
        v.record_queue(Duration::from_micros(1500));
        v.record_queue(Duration::from_micros(500));
        v.record_execution(
            5,
            2,
            Duration::from_micros(10),
            Duration::from_millis(2),
            Duration::from_micros(1),
        );
        v.record_success(Duration::from_millis(4));
        v.record_success(Duration::from_millis(3));
        v.record_failure(Failure::BadRequest, Duration::from_micros(7));
        let text = m.render();
        let l = "model=\"a\\\"b\",version=\"3\"";
        let get = |name: &str| {
            sample(&text, &format!("{name}{{{l}}}")).unwrap_or_else(|| panic!("{name}\n{text}"))
        };
        assert_eq!(get("nv_inference_request_success"), 2.0);
        assert_eq!(get("nv_inference_request_failure"), 1.0);
        assert_eq!(get("nv_inference_count"), 5.0);
        assert_eq!(get("nv_inference_exec_count"), 1.0);
        assert_eq!(get("nv_inference_request_duration_us"), 7000.0);
        assert_eq!(get("nv_inference_queue_duration_us"), 2000.0);
        assert_eq!(get("nv_inference_compute_input_duration_us"), 20.0);
        assert_eq!(get("nv_inference_compute_infer_duration_us"), 4000.0);
        assert_eq!(get("nv_inference_compute_output_duration_us"), 2.0);
        for name in [
            "nv_inference_request_success",
            "nv_inference_queue_duration_us",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} counter\n")),
                "{name}\n{text}"
            );
        }
        // The statistics behind them, in ns.
        let s = &v.stats;
        assert_eq!((s.queue.count(), s.queue.ns()), (2, 2_000_000));
        assert_eq!(
            (s.compute_infer.count(), s.compute_infer.ns()),
            (2, 4_000_000)
        );
        assert_eq!(
            s.batches.lock().unwrap().get(&5).copied(),
            Some(BatchStat {
                count: 1,
                input_ns: 10_000,
                infer_ns: 2_000_000,
                output_ns: 1_000
            })
        );
        assert!(s.last_inference_ms.load(Relaxed) > 0);
        // kiln's own series count the same requests.
        assert_eq!(
            sample(
                &text,
                "kiln_inference_request_success_total{model=\"a\\\"b\",version=\"3\"}"
            ),
            Some(2.0)
        );
    }

    #[test]
    fn bucket_bounds_in_exponent_form_become_decimals() {
        let text = "x_bucket{le=\"5e-05\"} 1\nx_bucket{a=\"le=\",le=\"2.5e-05\"} 2\n\
                    x_bucket{le=\"+Inf\"} 3\ny{le=\"1e-05\"} 4\nx_sum{a=\"b\"} 1e-05\n";
        assert_eq!(
            decimal_bucket_bounds(text),
            "x_bucket{le=\"0.00005\"} 1\nx_bucket{a=\"le=\",le=\"0.000025\"} 2\n\
             x_bucket{le=\"+Inf\"} 3\ny{le=\"1e-05\"} 4\nx_sum{a=\"b\"} 1e-05\n"
        );
    }
}
