//! The load generator's unit tests.

use super::caller::grpc_error_key;
use super::drive::Window;
use super::perf::is_stable;
use super::request::grpc_message;
use super::server_stats::StatsResponse;
use super::*;

#[test]
fn grpc_messages_are_framed_and_statuses_keyed_by_name() {
    use prost::Message;
    let req = pb::ModelInferRequest {
        model_name: "tiny".into(),
        raw_input_contents: vec![vec![1u8, 2, 3, 4].into()],
        ..Default::default()
    };
    let m = grpc_message(&req);
    assert_eq!(m[0], 0, "uncompressed");
    let n = u32::from_be_bytes([m[1], m[2], m[3], m[4]]) as usize;
    assert_eq!(n, m.len() - 5);
    assert_eq!(pb::ModelInferRequest::decode(&m[5..]).unwrap(), req);
    assert_eq!(grpc_error_key(b"5"), "grpc_NotFound");
    assert_eq!(grpc_error_key(b"14"), "grpc_Unavailable");
    assert_eq!(grpc_error_key(b"x"), "grpc_Unknown");
}

#[test]
fn percentiles_are_nearest_rank() {
    let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
    assert_eq!(percentile(&v, 0.5), 50.0);
    assert_eq!(percentile(&v, 0.99), 99.0);
    assert_eq!(percentile(&[3.0], 0.99), 3.0);
}

#[test]
fn ranges_follow_perf_analyzer() {
    assert_eq!(
        parse_range("--concurrency-range", "1:4:1").unwrap(),
        [1.0, 2.0, 3.0, 4.0]
    );
    assert_eq!(parse_range("--concurrency-range", "2").unwrap(), [2.0]);
    assert_eq!(
        parse_range("--request-rate-range", "100:300:100").unwrap(),
        [100.0, 200.0, 300.0]
    );
    let e = parse_range("--concurrency-range", "4:1")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--concurrency-range is `4:1`: end is below start"),
        "{e}"
    );
    let e = parse_range("--concurrency-range", "1:x")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`x` is not a number"), "{e}");
    assert!(parse_range("--concurrency-range", "0:2").is_err());
    assert!(parse_range("--concurrency-range", "1:1000:1").is_err());
}

#[test]
fn arrivals_are_constant_or_poisson_at_the_rate() {
    let c = arrivals(
        100.0,
        Duration::from_secs(1),
        Distribution::Constant,
        0,
        u64::MAX,
    );
    assert_eq!(c.len(), 100);
    assert!((c[1].as_secs_f64() - 0.01).abs() < 1e-9, "{:?}", c[1]);
    let p = arrivals(
        1000.0,
        Duration::from_secs(10),
        Distribution::Poisson,
        3,
        u64::MAX,
    );
    // 10 000 expected; a Poisson count has sd 100.
    assert!((9_500..10_500).contains(&p.len()), "{}", p.len());
    assert!(p.windows(2).all(|w| w[0] <= w[1]));
    let gaps: Vec<f64> = p.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
    // Exponential gaps: sd equals the mean (a constant schedule has sd 0).
    assert!(
        (var.sqrt() / mean - 1.0).abs() < 0.1,
        "cv {}",
        var.sqrt() / mean
    );
    assert_eq!(
        arrivals(10.0, Duration::from_secs(1), Distribution::Constant, 0, 3).len(),
        3
    );
}

#[test]
fn stability_needs_three_windows_within_the_threshold() {
    let w = |n: usize, ms: f64| Window {
        lat: vec![ms; n],
        elapsed_s: 1.0,
        ..Default::default()
    };
    assert!(is_stable(&[w(100, 1.0), w(105, 1.05), w(96, 0.97)], 0.10));
    assert!(!is_stable(&[w(100, 1.0), w(130, 1.0), w(100, 1.0)], 0.10));
    assert!(!is_stable(&[w(100, 1.0), w(100, 1.5), w(100, 1.0)], 0.10));
    assert!(!is_stable(&[w(0, 0.0), w(0, 0.0), w(0, 0.0)], 0.10));
}

#[test]
fn triton_statistics_json_is_summed_per_model() {
    let v = serde_json::json!({"model_stats": [
        {"name": "m", "version": "1", "inference_count": 10, "execution_count": 4,
         "inference_stats": {"success": {"count": 5, "ns": 5000}, "queue": {"count": 5, "ns": 1000},
                             "compute_infer": {"count": 5, "ns": 2500}}},
        {"name": "m", "version": "2", "inference_count": 2, "execution_count": 1,
         "inference_stats": {"success": {"count": 1, "ns": 3000}}},
        {"name": "other", "inference_count": 99}]});
    let s = ServerStats::of_model(&serde_json::from_value(v).unwrap(), "m");
    assert_eq!((s.inference_count, s.execution_count), (12, 5));
    assert_eq!(s.success, StatDuration { count: 6, ns: 8000 });
    let b = ServerBreakdown::between(&ServerStats::default(), &s);
    assert_eq!(b.requests, 6);
    assert!((b.queue_us - 0.2).abs() < 1e-12 && (b.compute_infer_us - 0.5).abs() < 1e-12);
    assert!(serde_json::from_value::<StatsResponse>(serde_json::json!({"error": "x"})).is_err());
}
