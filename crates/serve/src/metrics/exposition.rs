//! The exposition: a `prometheus-client` collector that reads the atomics at scrape time
//! (kiln's families, in a fixed order), and Triton's `nv_inference_*` families written by hand
//! (see [`super`] for why).

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::{Dropped, Failure, Histogram, ModelMetrics, Values, VersionMetrics};
use crate::monitor::{BucketLatency, DriftReport, FeatureDrift};

/// Append Triton's `nv_inference_*` counters (no `_total` suffix, as Triton writes them).
pub(super) fn render_triton(values: &Values, out: &mut String) {
    use std::fmt::Write;
    let (_, versions) = values.snapshot();
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
pub(super) fn decimal_bucket_bounds(text: &str) -> String {
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
pub(super) struct Exposition(pub(super) Arc<Values>);

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
    let reports: Vec<(Labels, DriftReport)> = versions
        .iter()
        .filter_map(|(m, v, vm)| {
            vm.drift
                .get()
                .map(|d| (version_labels(m, *v), d.report(vm.since)))
        })
        .collect();
    type PickFeature = fn(&FeatureDrift) -> Option<f64>;
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
    let buckets: Vec<(Labels, BucketLatency)> = versions
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
    )?;
    gauges(
        e,
        "kiln_latency_serving_factor",
        "Live over recorded p50 the bucket learned over its first batches (the watch's baseline is the recorded p50 times it; 1 to --latency-watch-max-factor).",
        buckets.iter().map(|(l, b)| (l.clone(), b.serving_factor)),
    )?;
    gauges(
        e,
        "kiln_drift_unknown_ratio",
        "Fraction of the feature's live values that are categories the training split did not have (categorical features; 0 for numeric ones; missing values not included).",
        reports.iter().flat_map(|(l, r)| {
            r.features
                .iter()
                .map(|f| (with(l.clone(), "feature", &f.feature), f.unknown_ratio))
        }),
    )?;
    let cells: Vec<(Labels, &str, u64, u64)> = versions
        .iter()
        .filter_map(|(m, v, vm)| vm.drift.get().map(|d| (version_labels(m, *v), d)))
        .flat_map(|(l, d)| {
            d.cell_totals()
                .into_iter()
                .map(move |(f, missing, unknown)| (l.clone(), f, missing, unknown))
        })
        .collect();
    counters(
        e,
        "kiln_missing_value",
        "Missing values (empty, NaN, NA, null) of the feature since load: imputed, or sent to the unknown bucket.",
        cells
            .iter()
            .map(|(l, f, missing, _)| (with(l.clone(), "feature", f), *missing)),
    )?;
    counters(
        e,
        "kiln_unknown_category",
        "Values of the feature since load that are categories the training split did not have (the unknown bucket; 0 for numeric features).",
        cells
            .iter()
            .map(|(l, f, _, unknown)| (with(l.clone(), "feature", f), *unknown)),
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
