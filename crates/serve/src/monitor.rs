//! The server watches its models: input drift against the checkpoint's training sketches
//! ([`DriftMonitor`]) and live compute time against the checkpoint's recorded latency
//! ([`LatencyWatch`]).
//!
//! **Drift.** Every decoded request row is binned per raw input column with the checkpoint's
//! [`DriftReference`] — one bin lookup and one relaxed atomic add per value, no allocation —
//! and every answered `std` output is summed per target. Statistics are computed when read
//! (`/metrics`, `GET /v2/models/<m>/drift`) over a sliding window: each read keeps a snapshot
//! of the cumulative counters (at most one per sixth of the window), and the window's counts
//! are the counters minus the oldest snapshot kept — snapshots older than the window are
//! dropped but for the newest of them — or since load when there is none. Read regularly
//! (Prometheus scrapes every 15–60 s), the window spans between the configured length and a
//! sixth more.
//!
//! **Latency.** The checkpoint's `latency` (p50 per batch size on the engine the run measured,
//! with the CPU path) is the recorded p50: at `r` rows it is interpolated linearly between the
//! recorded batch sizes (a fixed cost plus a cost per row, extrapolated flat outside). It is a
//! hot-loop number (the same input again and again, caches warm), which a served model at light
//! load does not reach — isolated calls with cold caches computed 2.4–2.5× it on a healthy
//! model. So each batch bucket first **learns its serving factor**: over its first
//! [`WatchConfig::latency_learn_batches`] batches (64) the median of live / recorded, clamped to
//! `1 ..= `[`WatchConfig::latency_max_serving_factor`] (3: a model slower than 3× its hot loop
//! from the start still counts as slow). The baseline is then recorded × factor. Each later
//! executed batch adds the engine's own compute time (what the recorded latency measures: no
//! batch assembly, no output tensors), as a ratio to the baseline at its rows, to its batch
//! bucket's window of the last [`LATENCY_WINDOW`] batches; every [`LATENCY_EVAL_EVERY`]
//! batches the window's median is compared with [`WatchConfig::latency_ratio`] (1.5, the run
//! registry's rule), and the live median must also exceed the baseline by
//! [`WatchConfig::latency_min_delta`] (the noise floor of µs-scale batches). The bucket is
//! flagged after [`LATENCY_SUSTAIN`] consecutive failing evaluations (logged once, as a
//! warning, with both numbers and both engines) and cleared after as many passing ones.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use kiln_model::drift::{DriftReference, FastBins, ks, psi};
use kiln_model::latency::LatencyReport;
use kiln_model::preprocess::EncodeCounts;
use serde::Serialize;

/// Batches per bucket the latency watch keeps.
pub const LATENCY_WINDOW: usize = 256;
/// Batches between two evaluations of a bucket's window.
pub const LATENCY_EVAL_EVERY: usize = 32;
/// Consecutive evaluations that flag (or clear) a bucket.
pub const LATENCY_SUSTAIN: usize = 3;

/// The watch settings (`kiln serve --drift-window-s`, `--drift-psi-threshold`,
/// `--latency-watch-ratio`, `--latency-watch-min-delta-us`).
#[derive(Debug, Clone, PartialEq)]
pub struct WatchConfig {
    /// Whether live inputs are compared with the checkpoint's sketches at all.
    pub drift: bool,
    /// The drift statistics' sliding window.
    pub drift_window: Duration,
    /// PSI past which a feature counts as drifted (0.2: the usual "significant shift").
    pub psi_threshold: f64,
    /// Live median over baseline that flags a latency regression.
    pub latency_ratio: f64,
    /// … provided the live median exceeds the baseline by at least this.
    pub latency_min_delta: Duration,
    /// Batches per bucket that learn its serving factor before it is watched (0: none, the
    /// recorded p50 is the baseline as it is).
    pub latency_learn_batches: usize,
    /// The largest serving factor a bucket may learn.
    pub latency_max_serving_factor: f64,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            drift: true,
            drift_window: Duration::from_secs(600),
            psi_threshold: 0.2,
            latency_ratio: 1.5,
            latency_min_delta: Duration::from_micros(20),
            latency_learn_batches: 64,
            latency_max_serving_factor: 3.0,
        }
    }
}

/// Requests of more rows than this count into a thread-local scratch first.
const LOCAL_FROM_ROWS: usize = 2;

thread_local! {
    /// Per-bin and per-feature counts of the request being observed.
    static LOCAL: std::cell::RefCell<(Vec<u32>, Vec<u32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new()))
    };
}

struct Snapshot {
    at: Instant,
    counts: Vec<u64>,
    out_of_range: Vec<u64>,
    missing: Vec<u64>,
    unknown: Vec<u64>,
    rows: u64,
    std_sum: Vec<f64>,
    std_rows: u64,
}

/// The live inputs of one model version against its training sketches.
pub struct DriftMonitor {
    /// The reference, in the form the hot path bins with.
    bins: FastBins,
    targets: Vec<String>,
    /// First counter of each column in `counts`.
    offsets: Vec<usize>,
    counts: Box<[AtomicU64]>,
    out_of_range: Box<[AtomicU64]>,
    /// Per column, missing cells as decoded (imputed, or sent to the unknown bucket).
    missing: Box<[AtomicU64]>,
    /// Per column, categories the training split did not have.
    unknown: Box<[AtomicU64]>,
    rows: AtomicU64,
    /// Per target, the sum of answered std values (f64 bits).
    std_sum: Box<[AtomicU64]>,
    std_rows: AtomicU64,
    n_features: usize,
    window: Duration,
    threshold: f64,
    snapshots: Mutex<VecDeque<Snapshot>>,
}

/// One feature's drift statistics over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FeatureDrift {
    /// The raw input column.
    pub feature: String,
    /// `numeric` or `categorical`.
    pub kind: &'static str,
    /// Values in the window.
    pub values: u64,
    /// Population stability index.
    pub psi: f64,
    /// Binned KS statistic (numeric columns).
    pub ks: Option<f64>,
    /// Fraction outside the training range (numeric) or of unknown categories
    /// (categorical); a missing cell is neither.
    pub out_of_range_ratio: f64,
    /// Fraction missing (empty, NaN, NA, null: imputed, or sent to the unknown bucket); an
    /// unknown category is not missing.
    pub missing_ratio: f64,
    /// Fraction of categories the training split did not have (categorical columns; 0 for
    /// numeric ones).
    pub unknown_ratio: f64,
    /// Missing values in the window.
    pub missing_values: u64,
    /// Categorical columns: unknown categories in the window.
    pub unknown_values: u64,
    /// PSI past the threshold.
    pub drifted: bool,
    /// Live fraction per bin (the last is missing / unknown).
    pub live: Vec<f64>,
    /// Reference fraction per bin.
    pub reference: Vec<f64>,
}

/// One target's live mean predicted std against the test split's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StdDrift {
    /// The target.
    pub target: String,
    /// Mean predicted std over the window (`None` before any answer).
    pub live_mean: Option<f64>,
    /// The test split's mean predicted std.
    pub reference: Option<f64>,
}

/// A version's drift report (the JSON endpoint; `/metrics` exports the same numbers).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriftReport {
    /// Seconds the window spans (since load when shorter than configured).
    pub window_seconds: f64,
    /// The configured window.
    pub configured_window_seconds: f64,
    /// Rows in the window.
    pub rows: u64,
    /// Training rows of the reference.
    pub reference_rows: usize,
    /// The PSI threshold.
    pub psi_threshold: f64,
    /// Features past it.
    pub drifted: usize,
    /// Whether at least half the features drifted (the dataset rule of Evidently).
    pub table_drift: bool,
    /// Per feature.
    pub features: Vec<FeatureDrift>,
    /// Per target.
    pub prediction_std: Vec<StdDrift>,
}

fn atomics(n: usize) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl DriftMonitor {
    /// A monitor over `reference` (bound to the model's preprocessing), for rows of
    /// `n_features` network inputs and `targets`.
    pub fn new(
        reference: DriftReference,
        n_features: usize,
        targets: Vec<String>,
        config: &WatchConfig,
    ) -> Self {
        let mut offsets = Vec::with_capacity(reference.columns.len());
        let mut n = 0;
        for c in &reference.columns {
            offsets.push(n);
            n += c.bins();
        }
        let cols = reference.columns.len();
        Self {
            counts: atomics(n),
            out_of_range: atomics(cols),
            missing: atomics(cols),
            unknown: atomics(cols),
            std_sum: atomics(targets.len()),
            rows: AtomicU64::new(0),
            std_rows: AtomicU64::new(0),
            offsets,
            bins: FastBins::new(reference),
            targets,
            n_features,
            window: config.drift_window,
            threshold: config.psi_threshold,
            snapshots: Mutex::new(VecDeque::new()),
        }
    }

    /// Count the network rows `x` (`rows × n_features`) of one request.
    pub fn observe(&self, x: &[f32]) {
        if self.n_features == 0 {
            return;
        }
        let rows = x.len() / self.n_features;
        if rows <= LOCAL_FROM_ROWS {
            for row in x.chunks_exact(self.n_features) {
                for (j, &off) in self.offsets.iter().enumerate() {
                    let b = self.bins.bin(j, row);
                    self.counts[off + b.bin].fetch_add(1, Relaxed);
                    if b.out_of_range {
                        self.out_of_range[j].fetch_add(1, Relaxed);
                    }
                }
            }
        } else {
            // Count into this thread's scratch (reused: no allocation once it has grown),
            // then add each non-zero bin once: one atomic per bin, not per value.
            LOCAL.with_borrow_mut(|(counts, oor)| {
                counts.clear();
                counts.resize(self.counts.len(), 0);
                oor.clear();
                oor.resize(self.out_of_range.len(), 0);
                self.bins
                    .count(x, self.n_features, &self.offsets, counts, oor);
                for (c, &n) in self.counts.iter().zip(counts.iter()) {
                    if n > 0 {
                        c.fetch_add(n as u64, Relaxed);
                    }
                }
                for (c, &n) in self.out_of_range.iter().zip(oor.iter()) {
                    if n > 0 {
                        c.fetch_add(n as u64, Relaxed);
                    }
                }
            });
        }
        self.rows.fetch_add(rows as u64, Relaxed);
    }

    /// Count one request's missing cells and unknown categories per raw input column (what
    /// decoding it counted; the bins alone cannot tell a missing category from an unknown one).
    pub fn observe_cells(&self, cells: &EncodeCounts) {
        for (c, &n) in self.missing.iter().zip(&cells.imputed) {
            if n > 0 {
                c.fetch_add(n as u64, Relaxed);
            }
        }
        for (c, &n) in self.unknown.iter().zip(&cells.unknown) {
            if n > 0 {
                c.fetch_add(n as u64, Relaxed);
            }
        }
    }

    /// Since load, per raw input column: (column, missing cells, unknown categories — 0 for
    /// a numeric column).
    pub fn cell_totals(&self) -> Vec<(&str, u64, u64)> {
        self.bins
            .reference()
            .columns
            .iter()
            .enumerate()
            .map(|(j, c)| {
                (
                    c.name.as_str(),
                    self.missing[j].load(Relaxed),
                    self.unknown[j].load(Relaxed),
                )
            })
            .collect()
    }

    /// Add one answer's predicted std (`rows × targets`, original units).
    pub fn observe_std(&self, std: &[f32]) {
        let k = self.targets.len();
        if k == 0 || std.is_empty() {
            return;
        }
        for (t, sum) in self.std_sum.iter().enumerate() {
            let s: f64 = std.iter().skip(t).step_by(k).map(|&v| v as f64).sum();
            let _ = sum.fetch_update(Relaxed, Relaxed, |bits| {
                Some((f64::from_bits(bits) + s).to_bits())
            });
        }
        self.std_rows.fetch_add((std.len() / k) as u64, Relaxed);
    }

    fn snapshot(&self, at: Instant) -> Snapshot {
        Snapshot {
            at,
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            out_of_range: self.out_of_range.iter().map(|c| c.load(Relaxed)).collect(),
            missing: self.missing.iter().map(|c| c.load(Relaxed)).collect(),
            unknown: self.unknown.iter().map(|c| c.load(Relaxed)).collect(),
            rows: self.rows.load(Relaxed),
            std_sum: self
                .std_sum
                .iter()
                .map(|c| f64::from_bits(c.load(Relaxed)))
                .collect(),
            std_rows: self.std_rows.load(Relaxed),
        }
    }

    /// The statistics over the window; `loaded` is when the version was loaded.
    pub fn report(&self, loaded: Instant) -> DriftReport {
        let now = Instant::now();
        let cur = self.snapshot(now);
        let mut snaps = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        // Keep at most one snapshot older than the window: the base, so that the window
        // spans at least the configured length (since load while younger).
        while snaps.len() >= 2 && now.duration_since(snaps[1].at) >= self.window {
            snaps.pop_front();
        }
        let base = snaps.front();
        let since = base.map_or(loaded, |s| s.at);
        let zero = |n: usize| vec![0u64; n];
        let (b_counts, b_oor, b_rows) = match base {
            Some(s) => (s.counts.clone(), s.out_of_range.clone(), s.rows),
            None => (zero(cur.counts.len()), zero(cur.out_of_range.len()), 0),
        };
        let (b_missing, b_unknown) = match base {
            Some(s) => (s.missing.clone(), s.unknown.clone()),
            None => (zero(cur.missing.len()), zero(cur.unknown.len())),
        };
        let (b_std, b_std_rows) = match base {
            Some(s) => (s.std_sum.clone(), s.std_rows),
            None => (vec![0.0; cur.std_sum.len()], 0),
        };
        let slice = self.window / 6;
        if snaps
            .back()
            .is_none_or(|s| now.duration_since(s.at) >= slice)
        {
            snaps.push_back(self.snapshot(now));
        }
        drop(snaps);
        let rows = cur.rows - b_rows;
        let mut features = Vec::with_capacity(self.bins.reference().columns.len());
        for (j, c) in self.bins.reference().columns.iter().enumerate() {
            let off = self.offsets[j];
            let counts: Vec<u64> = (off..off + c.bins())
                .map(|i| cur.counts[i] - b_counts[i])
                .collect();
            let values: u64 = counts.iter().sum();
            let n = values.max(1) as f64;
            let p = psi(&counts, &c.reference);
            let missing = cur.missing[j] - b_missing[j];
            let unknown = cur.unknown[j] - b_unknown[j];
            // Numeric: the bins' count (a missing cell is binned as missing or as its
            // imputed value, never out of range). Categorical: the unknown categories as
            // decoded (the unknown bucket also holds missing cells).
            let out_of_range = if c.is_categorical() {
                unknown
            } else {
                cur.out_of_range[j] - b_oor[j]
            };
            features.push(FeatureDrift {
                feature: c.name.clone(),
                kind: if c.is_categorical() {
                    "categorical"
                } else {
                    "numeric"
                },
                values,
                psi: p,
                ks: (!c.is_categorical()).then(|| ks(&counts, &c.reference)),
                out_of_range_ratio: out_of_range as f64 / n,
                missing_ratio: missing as f64 / n,
                unknown_ratio: unknown as f64 / n,
                missing_values: missing,
                unknown_values: unknown,
                drifted: values > 0 && p > self.threshold,
                live: counts.iter().map(|&k| k as f64 / n).collect(),
                reference: c.reference.clone(),
            });
        }
        let drifted = features.iter().filter(|f| f.drifted).count();
        let std_rows = cur.std_rows - b_std_rows;
        let prediction_std = self
            .targets
            .iter()
            .enumerate()
            .map(|(t, name)| StdDrift {
                target: name.clone(),
                live_mean: (std_rows > 0).then(|| (cur.std_sum[t] - b_std[t]) / std_rows as f64),
                reference: self.bins.reference().prediction_std.get(t).copied(),
            })
            .collect();
        DriftReport {
            window_seconds: now.duration_since(since).as_secs_f64(),
            configured_window_seconds: self.window.as_secs_f64(),
            rows,
            reference_rows: self.bins.reference().rows,
            psi_threshold: self.threshold,
            table_drift: !features.is_empty() && 2 * drifted >= features.len(),
            drifted,
            features,
            prediction_std,
        }
    }
}

/// One batch bucket of the latency watch.
struct Bucket {
    /// The bucket's largest batch size.
    size: usize,
    ratios: VecDeque<f64>,
    live_us: VecDeque<f64>,
    since_eval: usize,
    failing: usize,
    passing: usize,
    /// The last evaluation's medians (µs): live and recorded.
    last: Option<(f64, f64)>,
    /// live / recorded of the batches learning the serving factor.
    learning: Vec<f64>,
    /// The learned serving factor (`None` while learning).
    factor: Option<f64>,
}

/// A bucket's state, for the metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BucketLatency {
    /// The bucket's largest batch size.
    pub batch: usize,
    /// Median live compute time over the window (µs).
    pub live_p50_us: f64,
    /// The checkpoint's recorded p50 at the window's median rows (µs).
    pub baseline_us: f64,
    /// The serving factor the bucket learned (the baseline is the recorded p50 times it).
    pub serving_factor: f64,
    /// Flagged as a sustained regression.
    pub regressed: bool,
}

/// Live compute time against the checkpoint's recorded latency.
pub struct LatencyWatch {
    /// (batch, p50 µs), ascending.
    baseline: Vec<(usize, f64)>,
    recorded: String,
    serving: String,
    ratio: f64,
    min_delta_us: f64,
    learn: usize,
    max_factor: f64,
    sizes: Vec<usize>,
    buckets: Vec<Mutex<Bucket>>,
    flags: Vec<AtomicBool>,
    label: String,
}

impl LatencyWatch {
    /// A watch over `report` (the checkpoint's `latency`) for batches up to the bucket sizes
    /// `buckets`, served on `serving` (engine and CPU path, for the log line); `None` when the
    /// report has no batch sizes.
    pub fn new(
        report: &LatencyReport,
        buckets: &[usize],
        serving: String,
        label: String,
        config: &WatchConfig,
    ) -> Option<Self> {
        let mut baseline: Vec<(usize, f64)> = report
            .batches
            .iter()
            .filter(|b| b.p50_us.is_finite() && b.p50_us > 0.0)
            .map(|b| (b.batch, b.p50_us))
            .collect();
        baseline.sort_by_key(|b| b.0);
        if baseline.is_empty() {
            return None;
        }
        let recorded = match &report.cpu {
            Some(cpu) => format!("{} ({cpu})", report.engine),
            None => report.engine.clone(),
        };
        Some(Self {
            baseline,
            recorded,
            serving,
            ratio: config.latency_ratio,
            min_delta_us: config.latency_min_delta.as_secs_f64() * 1e6,
            learn: config.latency_learn_batches,
            max_factor: config.latency_max_serving_factor.max(1.0),
            sizes: buckets.to_vec(),
            flags: buckets.iter().map(|_| AtomicBool::new(false)).collect(),
            buckets: buckets
                .iter()
                .map(|&size| {
                    Mutex::new(Bucket {
                        size,
                        ratios: VecDeque::with_capacity(LATENCY_WINDOW),
                        live_us: VecDeque::with_capacity(LATENCY_WINDOW),
                        since_eval: 0,
                        failing: 0,
                        passing: 0,
                        last: None,
                        learning: Vec::new(),
                        factor: (config.latency_learn_batches == 0).then_some(1.0),
                    })
                })
                .collect(),
            label,
        })
    }

    /// The recorded p50 at `rows` rows (µs): linear between the recorded batch sizes, flat
    /// outside them.
    pub fn baseline_us(&self, rows: usize) -> f64 {
        let b = &self.baseline;
        let i = b.partition_point(|&(n, _)| n < rows);
        if i == 0 {
            return b[0].1;
        }
        if i == b.len() {
            return b[b.len() - 1].1;
        }
        let ((n0, p0), (n1, p1)) = (b[i - 1], b[i]);
        p0 + (p1 - p0) * (rows - n0) as f64 / (n1 - n0) as f64
    }

    /// One executed batch of `rows` rows that computed for `took`.
    pub fn record(&self, rows: usize, took: Duration) {
        let Some(i) = self.sizes.iter().position(|&s| rows <= s) else {
            return;
        };
        let base = self.baseline_us(rows);
        let live = took.as_secs_f64() * 1e6;
        let mut b = self.buckets[i].lock().unwrap_or_else(|p| p.into_inner());
        let Some(factor) = b.factor else {
            b.learning.push(live / base);
            if b.learning.len() >= self.learn {
                let learned = median(b.learning.drain(..)).clamp(1.0, self.max_factor);
                b.factor = Some(learned);
                tracing::info!(
                    "{}: batches of up to {} rows compute at {:.2}× the checkpoint's hot-loop p50 when served (the latency watch's serving factor; at most {:.1})",
                    self.label,
                    b.size,
                    learned,
                    self.max_factor
                );
            }
            return;
        };
        if b.ratios.len() == LATENCY_WINDOW {
            b.ratios.pop_front();
            b.live_us.pop_front();
        }
        // The ratio to the recorded p50; the watch compares it with the factor.
        b.ratios.push_back(live / base);
        b.live_us.push_back(live);
        b.since_eval += 1;
        if b.since_eval < LATENCY_EVAL_EVERY || b.ratios.len() < LATENCY_EVAL_EVERY {
            return;
        }
        b.since_eval = 0;
        let recorded_ratio = median(b.ratios.iter().copied());
        let live_p50 = median(b.live_us.iter().copied());
        let recorded_p50 = live_p50 / recorded_ratio;
        b.last = Some((live_p50, recorded_p50));
        let ratio = recorded_ratio / factor;
        let base_p50 = recorded_p50 * factor;
        let slow = ratio >= self.ratio && live_p50 - base_p50 >= self.min_delta_us;
        if slow {
            b.failing += 1;
            b.passing = 0;
        } else {
            b.passing += 1;
            b.failing = 0;
        }
        let flagged = self.flags[i].load(Relaxed);
        if !flagged && b.failing >= LATENCY_SUSTAIN {
            self.flags[i].store(true, Relaxed);
            tracing::warn!(
                "{}: latency regression at batches of up to {} rows: live compute p50 {:.1} µs is {:.2}× the baseline {:.1} µs (the checkpoint's recorded {:.1} µs × the serving factor {:.2}; recorded on {}, serving on {}) over the last {} batches",
                self.label,
                b.size,
                live_p50,
                ratio,
                base_p50,
                recorded_p50,
                factor,
                self.recorded,
                self.serving,
                b.ratios.len()
            );
        } else if flagged && b.passing >= LATENCY_SUSTAIN {
            self.flags[i].store(false, Relaxed);
            tracing::info!(
                "{}: latency back within {:.2}× of the recorded one at batches of up to {} rows (live p50 {:.1} µs)",
                self.label,
                self.ratio,
                b.size,
                live_p50
            );
        }
    }

    /// Each bucket that has been evaluated.
    pub fn buckets(&self) -> Vec<BucketLatency> {
        self.buckets
            .iter()
            .zip(&self.flags)
            .filter_map(|(b, f)| {
                let b = b.lock().unwrap_or_else(|p| p.into_inner());
                b.last.map(|(live, base)| BucketLatency {
                    batch: b.size,
                    live_p50_us: live,
                    baseline_us: base,
                    serving_factor: b.factor.unwrap_or(1.0),
                    regressed: f.load(Relaxed),
                })
            })
            .collect()
    }
}

fn median(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    let mid = v.len() / 2;
    let (_, m, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
    *m
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_model::latency::BatchLatency;

    fn report() -> LatencyReport {
        LatencyReport {
            engine: "auto".into(),
            cpu: Some("avx512".into()),
            batches: [(1, 10.0), (128, 137.0)]
                .into_iter()
                .map(|(batch, p50_us)| BatchLatency {
                    batch,
                    iters: 100,
                    p50_us,
                    p95_us: p50_us,
                    p99_us: p50_us,
                })
                .collect(),
        }
    }

    /// A watch whose baseline is the recorded p50 as it is (no serving factor learned).
    fn watch() -> LatencyWatch {
        watch_with(WatchConfig {
            latency_learn_batches: 0,
            ..WatchConfig::default()
        })
    }

    fn watch_with(config: WatchConfig) -> LatencyWatch {
        LatencyWatch::new(
            &report(),
            &[1, 2, 4, 64],
            "burn".into(),
            "m/1".into(),
            &config,
        )
        .unwrap()
    }

    /// Batch-1 compute times around `us` (±15 %, deterministic).
    fn around(us: f64, n: usize, seed: u64) -> impl Iterator<Item = Duration> {
        let mut s = seed;
        (0..n).map(move |_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 33) as f64 / (1u64 << 31) as f64;
            Duration::from_secs_f64(us * (0.85 + 0.3 * u) * 1e-6)
        })
    }

    #[test]
    fn a_healthy_model_slower_than_its_hot_loop_stays_quiet_and_a_real_2x_slowdown_alerts() {
        // Recorded (hot loop) 10 µs at batch 1; served at light load a healthy model computes
        // 2.4–2.5× that (seen live), with noise. A 30 µs floor would hide it: use 4 µs.
        let config = WatchConfig {
            latency_min_delta: Duration::from_micros(4),
            ..WatchConfig::default()
        };
        let w = watch_with(config.clone());
        for d in around(24.5, 3000, 1) {
            w.record(1, d);
        }
        let b1 = w.buckets()[0].clone();
        assert!(!b1.regressed, "{b1:?}");
        assert!((2.2..2.7).contains(&b1.serving_factor), "{b1:?}");
        // Without the learned factor the same stream alerts (the false alarm it fixes).
        let plain = watch_with(WatchConfig {
            latency_learn_batches: 0,
            ..config.clone()
        });
        for d in around(24.5, 3000, 1) {
            plain.record(1, d);
        }
        assert!(plain.buckets()[0].regressed);
        // The same model twice as slow (a portable ISA path, a noisy neighbour): alerts.
        for d in around(49.0, LATENCY_WINDOW * 2, 2) {
            w.record(1, d);
        }
        let b1 = w.buckets()[0].clone();
        assert!(b1.regressed, "{b1:?}");
        // A model slow from the start cannot learn it away: the factor stops at 3.
        let slow = watch_with(config.clone());
        for d in around(49.0, 3000, 3) {
            slow.record(1, d);
        }
        let b1 = slow.buckets()[0].clone();
        assert_eq!(b1.serving_factor, 3.0);
        assert!(b1.regressed, "{b1:?}");
        // Faster than the hot loop: the factor is 1, never below.
        let fast = watch_with(config);
        for d in around(8.0, 500, 4) {
            fast.record(1, d);
        }
        assert_eq!(fast.buckets()[0].serving_factor, 1.0);
        assert!(!fast.buckets()[0].regressed);
    }

    #[test]
    fn a_batch_counts_the_same_as_its_rows_one_by_one() {
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let pre = kiln_model::preprocess::Preprocessing::plain(&names);
        let train: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32).collect();
        let reference = kiln_model::drift::DriftReference::fit(&pre, &train, vec![1.0])
            .bind(&pre)
            .unwrap();
        let cfg = WatchConfig::default();
        let one_by_one = DriftMonitor::new(reference.clone(), 3, vec!["t".into()], &cfg);
        let batched = DriftMonitor::new(reference, 3, vec!["t".into()], &cfg);
        // Values inside and outside the training range.
        let live: Vec<f32> = (0..90).map(|i| ((i * 53) % 140) as f32 - 20.0).collect();
        for row in live.chunks(3) {
            one_by_one.observe(row);
        }
        batched.observe(&live);
        let (a, b) = (
            one_by_one.snapshot(Instant::now()),
            batched.snapshot(Instant::now()),
        );
        assert_eq!(a.rows, 30);
        assert_eq!(
            (a.counts.clone(), a.out_of_range.clone(), a.rows),
            (b.counts, b.out_of_range, b.rows)
        );
        assert!(a.out_of_range.iter().sum::<u64>() > 0);
        assert_eq!(a.counts.iter().sum::<u64>(), 90);
    }

    #[test]
    fn a_missing_category_is_not_unknown_and_a_missing_number_is_not_out_of_range() {
        use kiln_model::preprocess::{InputColumn, Preprocessing};
        // city (categorical, missing → unknown bucket, no indicator), price (numeric,
        // imputed with 5 without an indicator).
        let pre = Preprocessing {
            inputs: vec![
                InputColumn {
                    categories: Some(vec!["a".into(), "b".into()]),
                    missing_to_unknown: true,
                    ..InputColumn::numeric("city")
                },
                InputColumn {
                    impute: Some(5.0),
                    ..InputColumn::numeric("price")
                },
            ],
            ..Preprocessing::default()
        };
        let train: Vec<f32> = (0..100)
            .flat_map(|i| {
                let hot = if i % 2 == 0 { [1.0, 0.0] } else { [0.0, 1.0] };
                [hot[0], hot[1], (i % 10) as f32]
            })
            .collect();
        let reference = DriftReference::fit(&pre, &train, vec![1.0])
            .bind(&pre)
            .unwrap();
        let m = DriftMonitor::new(reference, 3, vec!["t".into()], &WatchConfig::default());
        // 10 rows: city a ×4, missing ×2, unknown ×4; price 3 ×7, missing ×3 (imputed 5).
        let mut x = Vec::new();
        let mut cells = EncodeCounts::default();
        let mut out = Vec::new();
        let none = |c: &str, e: String| format!("{c}: {e}");
        for i in 0..10 {
            let city = match i {
                0..4 => "a",
                4..6 => "",
                _ => "zurich",
            };
            let price = if i < 7 { "3" } else { "" };
            out.clear();
            pre.push_row_counted(&[city, price], &mut out, &none, Some(&mut cells))
                .unwrap();
            x.extend_from_slice(&out);
        }
        m.observe(&x);
        m.observe_cells(&cells);
        let r = m.report(Instant::now());
        let (city, price) = (&r.features[0], &r.features[1]);
        assert_eq!((city.missing_values, city.unknown_values), (2, 4));
        assert!((city.missing_ratio - 0.2).abs() < 1e-12, "{city:?}");
        assert!((city.unknown_ratio - 0.4).abs() < 1e-12, "{city:?}");
        assert!((city.out_of_range_ratio - 0.4).abs() < 1e-12, "{city:?}");
        assert_eq!((price.missing_values, price.unknown_values), (3, 0));
        assert!((price.missing_ratio - 0.3).abs() < 1e-12, "{price:?}");
        assert_eq!(price.out_of_range_ratio, 0.0, "5 and 3 are within 0..9");
        assert_eq!(price.unknown_ratio, 0.0);
        let totals = m.cell_totals();
        assert_eq!(totals, vec![("city", 2, 4), ("price", 3, 0)]);
    }

    #[test]
    fn the_baseline_interpolates_between_recorded_batches() {
        let w = watch();
        assert_eq!(w.baseline_us(1), 10.0);
        assert_eq!(w.baseline_us(64), 10.0 + 127.0 * 63.0 / 127.0);
        assert_eq!(w.baseline_us(500), 137.0);
    }

    #[test]
    fn a_sustained_slowdown_flags_its_bucket_and_normal_time_does_not() {
        let w = watch();
        // Normal: live at the baseline, with noise.
        for i in 0..1000 {
            w.record(1, Duration::from_nanos(9_000 + (i % 7) * 500));
        }
        assert!(
            w.buckets().iter().all(|b| !b.regressed),
            "{:?}",
            w.buckets()
        );
        // 3× slower at batch 64 (10 → 73 µs baseline; live 219 µs).
        for _ in 0..(LATENCY_EVAL_EVERY * (LATENCY_SUSTAIN - 1)) {
            w.record(64, Duration::from_micros(219));
        }
        assert!(
            w.buckets().iter().all(|b| !b.regressed),
            "not sustained yet"
        );
        for _ in 0..LATENCY_EVAL_EVERY {
            w.record(64, Duration::from_micros(219));
        }
        let b = w.buckets();
        let b64 = b.iter().find(|b| b.batch == 64).unwrap();
        assert!(b64.regressed);
        assert!((b64.baseline_us - 73.0).abs() < 1e-9, "{b64:?}");
        assert!(!b.iter().find(|b| b.batch == 1).unwrap().regressed);
        // Back to normal: cleared once the window's median is.
        for _ in 0..LATENCY_WINDOW * 2 {
            w.record(64, Duration::from_micros(75));
        }
        assert!(!w.buckets().iter().any(|b| b.regressed));
    }

    #[test]
    fn a_slowdown_under_the_noise_floor_is_not_a_regression() {
        let w = watch();
        // 2× at batch 1 but only 10 µs more than the baseline (floor 20 µs).
        for _ in 0..1000 {
            w.record(1, Duration::from_micros(20));
        }
        assert!(!w.buckets()[0].regressed);
    }
}
