//! Per-request scheduling: the `timeout` parameter (µs) is a deadline past which a queued
//! request is answered with a timeout and never computed; a client that disconnects (HTTP)
//! or cancels (gRPC) takes its queued request with it; the `priority` parameter orders the
//! queue under load, with waiting bounded by `priority_max_wait`. Each is counted at
//! /metrics. The engine is slowed by the batcher's testing hook (`fault_compute_delay`) so
//! that one request holds the only instance while others queue behind it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln::serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::serve::grpc::proto::{self as pb, infer_parameter::ParameterChoice};
use kiln::serve::{BatchingPolicy, ServeConfig, ServerHandle};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::common::client;
use crate::common::{repository_of, rows_around_means, serve, serve_config, trained};

const F: usize = 10;

/// One instance, one request per batch, every batch `delay` slower.
fn slow(repo: &std::path::Path, policy: BatchingPolicy, delay: Duration) -> ServeConfig {
    let mut cfg = serve_config(repo, "burn");
    cfg.batcher.policy = policy;
    cfg.batcher.max_batch_size = 1;
    cfg.batcher.max_queue_delay = Duration::ZERO;
    cfg.batcher.fault_compute_delay = delay;
    cfg.grpc_port = Some(0);
    cfg
}

fn body(rows: usize, seed: u32, parameters: Value) -> Value {
    let x = rows_around_means(trained(), rows, seed);
    json!({
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [rows, F], "data": x}],
        "parameters": parameters,
    })
}

/// Send `body` on its own connection; the answer's status and its arrival time.
fn spawn_infer(h: &ServerHandle, body: Value) -> tokio::task::JoinHandle<(u16, String)> {
    let mut c = client(h);
    tokio::spawn(async move {
        let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
        (r.status, r.text())
    })
}

/// A counter of the `tiny` model's version 1 at /metrics, picked by its `reason` label
/// (`None`: the unlabelled series).
async fn counter(h: &ServerHandle, family: &str, reason: Option<&str>) -> f64 {
    let text = client(h).get("/metrics").await.unwrap().text();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.starts_with(&format!("{family}{{"))
                && l.contains("model=\"tiny\"")
                && reason.is_none_or(|r| l.contains(&format!("reason=\"{r}\"")))
        })
        .and_then(|l| l.rsplit_once(' '))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {family} {reason:?} in\n{text}"))
}

async fn dropped(h: &ServerHandle, reason: &str) -> f64 {
    counter(h, "kiln_inference_request_dropped_total", Some(reason)).await
}

/// Wait (up to 2 s) until `n` queued requests have been withdrawn as cancelled; `what` says
/// which one is still queued when they have not.
async fn until_cancelled(h: &ServerHandle, n: f64, what: String) {
    let t = Instant::now();
    while dropped(h, "cancelled").await < n {
        assert!(t.elapsed() < Duration::from_secs(2), "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn rows_computed(h: &ServerHandle) -> f64 {
    counter(h, "kiln_inference_count_total", None).await
}

async fn queue_depth(h: &ServerHandle) -> f64 {
    counter(h, "kiln_queue_depth", None).await
}

/// Wait (up to 20 s) until the queue holds `n` requests.
async fn until_queued(h: &ServerHandle, n: f64) {
    let t = Instant::now();
    while queue_depth(h).await != n {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the queue never held {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn grpc_request(
    rows: usize,
    seed: u32,
    params: &[(&str, ParameterChoice)],
) -> pb::ModelInferRequest {
    crate::common::grpc_raw_request(&rows_around_means(trained(), rows, seed), params)
}

async fn grpc(h: &ServerHandle) -> GrpcInferenceServiceClient<tonic::transport::Channel> {
    GrpcInferenceServiceClient::connect(format!("http://{}", h.grpc_addr.unwrap()))
        .await
        .unwrap()
}

/// A request whose `timeout` passes while it waits is answered with a timeout at its
/// deadline (long before the request ahead of it finishes), leaves the queue and never
/// computes — on HTTP and gRPC, under both batching policies. A timeout larger than the
/// server's is capped by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_request_is_answered_with_a_timeout_and_never_computed() {
    let repo = repository_of(trained());
    for policy in [BatchingPolicy::Idle, BatchingPolicy::Delay] {
        let h = serve(slow(repo.path(), policy, Duration::from_millis(1500))).await;
        let busy = spawn_infer(&h, body(1, 1, json!({})));
        until_queued(&h, 0.0).await;
        // Wait until the first request holds the instance (its rows are not counted until it
        // finishes, so watch the queue: the next request must queue behind it).
        tokio::time::sleep(Duration::from_millis(100)).await;

        let t = Instant::now();
        let late = client(&h)
            .post_json(
                "/v2/models/tiny/infer",
                &body(1, 2, json!({"timeout": 50_000, "priority": 1})),
            )
            .await
            .unwrap();
        let waited = t.elapsed();
        assert_eq!(late.status, 503, "{policy}: {}", late.text());
        assert!(late.text().contains("deadline"), "{}", late.text());
        let mut g = grpc(&h).await;
        let status = g
            .model_infer(grpc_request(
                1,
                3,
                &[("timeout", ParameterChoice::Int64Param(50_000))],
            ))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");

        let (code, text) = busy.await.unwrap();
        assert_eq!(code, 200, "{text}");
        assert!(
            waited < Duration::from_millis(1400),
            "{policy}: the expired request was answered after {waited:?}, when the request \
             ahead finished, not at its deadline"
        );
        // Only the first request's row computed; the two expired ones were dropped.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(rows_computed(&h).await, 1.0, "{policy}");
        assert_eq!(dropped(&h, "deadline").await, 2.0, "{policy}");
        assert_eq!(
            counter(&h, "kiln_inference_request_failure_total", Some("timeout")).await,
            2.0
        );
        assert_eq!(queue_depth(&h).await, 0.0);
        h.shutdown().await.unwrap();
    }
}

/// Bad scheduling parameters are refused naming the parameter and what it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_priority_and_timeout_parameters_are_refused_by_name() {
    let repo = repository_of(trained());
    let h = serve(slow(repo.path(), BatchingPolicy::Idle, Duration::ZERO)).await;
    let mut c = client(&h);
    for (params, expect) in [
        (
            json!({"priority": 4}),
            "priority levels: expected 1 (the highest) to 3",
        ),
        (
            json!({"priority": -1}),
            "`priority` is -1; expected a non-negative integer",
        ),
        (
            json!({"timeout": "soon"}),
            "expected a non-negative integer (µs)",
        ),
        (json!({"timeout": 1.5}), "`timeout` is 1.5"),
    ] {
        let r = c
            .post_json("/v2/models/tiny/infer", &body(1, 1, params.clone()))
            .await
            .unwrap();
        assert_eq!(r.status, 400, "{params}: {}", r.text());
        assert!(r.text().contains(expect), "{params}: {}", r.text());
    }
    let mut g = grpc(&h).await;
    let s = g
        .model_infer(grpc_request(
            1,
            1,
            &[("priority", ParameterChoice::Uint64Param(9))],
        ))
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    assert!(s.message().contains("priority levels"), "{}", s.message());
    let s = g
        .model_infer(grpc_request(
            1,
            1,
            &[("timeout", ParameterChoice::StringParam("1s".into()))],
        ))
        .await
        .unwrap_err();
    assert!(s.message().contains("`timeout`"), "{}", s.message());
    // Level 0 is the default; the largest level is accepted.
    for p in [0, 3] {
        let r = c
            .post_json("/v2/models/tiny/infer", &body(1, 1, json!({"priority": p})))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    h.shutdown().await.unwrap();
}

/// An HTTP/1 client that disconnects while its request is queued, a gRPC call that is
/// cancelled and one whose `grpc-timeout` passes take their requests out of the queue at once
/// (while the request ahead still computes), and the requests never compute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_client_or_cancelled_call_leaves_the_queue_uncomputed() {
    let repo = repository_of(trained());
    for policy in [BatchingPolicy::Idle, BatchingPolicy::Delay] {
        let h = serve(slow(repo.path(), policy, Duration::from_millis(3000))).await;
        let busy = spawn_infer(&h, body(1, 1, json!({})));
        tokio::time::sleep(Duration::from_millis(150)).await;

        // A raw HTTP/1 request, then the client hangs up without reading the answer.
        let b = serde_json::to_vec(&body(1, 2, json!({}))).unwrap();
        let mut s = tokio::net::TcpStream::connect(h.addr).await.unwrap();
        let head = format!(
            "POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            b.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&b).await.unwrap();
        until_queued(&h, 1.0).await;
        drop(s);
        until_cancelled(
            &h,
            1.0,
            format!("{policy}: the disconnected client's request is still queued"),
        )
        .await;
        assert_eq!(queue_depth(&h).await, 0.0);

        // A gRPC call cancelled by its client (the future dropped: RST_STREAM).
        let mut g = grpc(&h).await;
        let call = g.model_infer(grpc_request(1, 3, &[]));
        let cut = tokio::time::timeout(Duration::from_millis(150), call).await;
        assert!(
            cut.is_err(),
            "the call was answered while the instance was busy"
        );
        until_cancelled(
            &h,
            2.0,
            format!("{policy}: the cancelled call's request is still queued"),
        )
        .await;

        // A whole call whose own deadline (`grpc-timeout`, no client enforcing it) passes while
        // it is queued: the server answers DEADLINE_EXCEEDED at the deadline, not when the
        // instance frees, and withdraws the request.
        let frame = crate::common::grpc_frame(&grpc_request(1, 4, &[]));
        let (status, message, took) = crate::common::raw_grpc_call(
            h.grpc_addr.unwrap(),
            &[("grpc-timeout", "200m")],
            frame,
            true,
        )
        .await;
        assert_eq!(
            status,
            (tonic::Code::DeadlineExceeded as i32).to_string(),
            "{policy}: {message}"
        );
        assert!(message.contains("grpc-timeout"), "{policy}: {message}");
        assert!(took < Duration::from_millis(1500), "{policy}: {took:?}");
        until_cancelled(
            &h,
            3.0,
            format!("{policy}: the expired call's request is still queued"),
        )
        .await;
        assert!(
            !busy.is_finished(),
            "the test's window closed: the first request finished"
        );

        let (code, text) = busy.await.unwrap();
        assert_eq!(code, 200, "{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(rows_computed(&h).await, 1.0, "{policy}");
        assert_eq!(
            counter(
                &h,
                "kiln_inference_request_failure_total",
                Some("cancelled")
            )
            .await,
            3.0
        );
        h.shutdown().await.unwrap();
    }
}

/// Requests queued behind a busy instance, in the order they finish.
struct Finish(Arc<Mutex<Vec<&'static str>>>);

impl Finish {
    fn spawn(
        &self,
        h: &ServerHandle,
        name: &'static str,
        params: Value,
    ) -> tokio::task::JoinHandle<()> {
        let order = self.0.clone();
        let task = spawn_infer(h, body(1, name.len() as u32, params));
        tokio::spawn(async move {
            let (code, text) = task.await.unwrap();
            assert_eq!(code, 200, "{name}: {text}");
            order.lock().unwrap().push(name);
        })
    }
}

/// Under load, a priority-1 request queued last is served before the default-level ones
/// queued ahead of it, and a priority-3 one after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_changes_the_order_under_load() {
    let repo = repository_of(trained());
    for policy in [BatchingPolicy::Idle, BatchingPolicy::Delay] {
        let mut cfg = slow(repo.path(), policy, Duration::from_millis(150));
        cfg.batcher.priority_max_wait = Duration::from_secs(60);
        let h = serve(cfg).await;
        let f = Finish(Arc::default());
        let mut tasks = vec![f.spawn(&h, "busy", json!({}))];
        tokio::time::sleep(Duration::from_millis(60)).await;
        let mut queued = 0.0;
        for (name, params) in [
            ("low", json!({"priority": 3})),
            ("d1", json!({})),
            ("d2", json!({"priority": 0})),
            ("d3", json!({"priority": 2})),
            ("high", json!({"priority": 1})),
        ] {
            tasks.push(f.spawn(&h, name, params));
            queued += 1.0;
            until_queued(&h, queued).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        let order = f.0.lock().unwrap().clone();
        assert_eq!(order, ["busy", "high", "d1", "d2", "d3", "low"], "{policy}");
        h.shutdown().await.unwrap();
    }
}

/// Starvation is bounded: a priority-3 request that has waited `priority_max_wait` is served
/// ahead of the priority-1 requests that keep arriving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_priority_request_waits_at_most_the_bound() {
    let repo = repository_of(trained());
    let mut cfg = slow(
        repo.path(),
        BatchingPolicy::Idle,
        Duration::from_millis(200),
    );
    cfg.batcher.priority_max_wait = Duration::from_millis(300);
    let h = serve(cfg).await;
    let f = Finish(Arc::default());
    let mut tasks = vec![f.spawn(&h, "busy", json!({}))];
    tokio::time::sleep(Duration::from_millis(60)).await;
    tasks.push(f.spawn(&h, "low", json!({"priority": 3})));
    until_queued(&h, 1.0).await;
    let highs = ["h1", "h2", "h3", "h4", "h5", "h6"];
    for (i, name) in highs.iter().enumerate() {
        tasks.push(f.spawn(&h, name, json!({"priority": 1})));
        until_queued(&h, (i + 2) as f64).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = f.0.lock().unwrap().clone();
    let low = order.iter().position(|n| *n == "low").unwrap();
    // Six priority-1 requests of 200 ms each were queued within ~100 ms of it; without the
    // bound it would finish last. With it, it goes once it has waited 300 ms: after at most
    // two of them.
    assert!(
        (1..=3).contains(&low),
        "the low-priority request finished at position {low} of {order:?}"
    );
    assert_eq!(order[0], "busy");
    h.shutdown().await.unwrap();
}

/// A stream whose client goes away takes its queued requests with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_stream_withdraws_its_queued_requests() {
    let repo = repository_of(trained());
    let h = serve(slow(
        repo.path(),
        BatchingPolicy::Idle,
        Duration::from_millis(2000),
    ))
    .await;
    let busy = spawn_infer(&h, body(1, 1, json!({})));
    tokio::time::sleep(Duration::from_millis(150)).await;
    let mut g = grpc(&h).await;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    for i in 0..3 {
        tx.send(grpc_request(1, 10 + i, &[])).await.unwrap();
    }
    let stream = g
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    until_queued(&h, 3.0).await;
    drop(stream);
    drop(tx);
    drop(g);
    until_cancelled(
        &h,
        3.0,
        "the dropped stream's requests are still queued".into(),
    )
    .await;
    assert!(!busy.is_finished());
    assert_eq!(busy.await.unwrap().0, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(rows_computed(&h).await, 1.0);
    h.shutdown().await.unwrap();
}
