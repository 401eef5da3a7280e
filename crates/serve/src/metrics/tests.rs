//! The metrics' unit tests: histograms, the exposition's names and series, Triton's counters.

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
const FAMILIES: [(&str, &str, &str); 33] = [
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
        "kiln_latency_serving_factor",
        "gauge",
        "Live over recorded p50 the bucket learned over its first batches (the watch's baseline is the recorded p50 times it; 1 to --latency-watch-max-factor).",
    ),
    (
        "kiln_drift_unknown_ratio",
        "gauge",
        "Fraction of the feature's live values that are categories the training split did not have (categorical features; 0 for numeric ones; missing values not included).",
    ),
    (
        "kiln_missing_value_total",
        "counter",
        "Missing values (empty, NaN, NA, null) of the feature since load: imputed, or sent to the unknown bucket.",
    ),
    (
        "kiln_unknown_category_total",
        "counter",
        "Values of the feature since load that are categories the training split did not have (the unknown bucket; 0 for numeric features).",
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
