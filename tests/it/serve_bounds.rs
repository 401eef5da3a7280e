//! The serving tier's bounds and guarantees of issue 24, end to end on loopback servers:
//! bounded work per request (input/output caps, linear duplicate checks, long parses off
//! the runtime so health checks keep answering), client strings clipped in error messages
//! (HTTP and gRPC), gRPC size and body-time limits, finite answers or an error, bounded
//! on-demand profiles, control endpoints that do not trust proxied requests or
//! unauthenticated non-loopback binds, the repository API's load parameters, readiness and
//! version fallback, and a drain that answers every request whose bytes had arrived.

use crate::common::{copy_dir, repository_of, serve, serve_config, trained};

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use kiln::artifact::WEIGHTS_FILE;
use kiln::loadgen::client::HttpClient;
use kiln::serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::serve::grpc::proto::{self as pb, model_infer_request as mir};
use kiln::serve::protocol::{ECHO_CHARS, MAX_INPUTS, MAX_MESSAGE_BYTES};
use kiln::serve::{ModelControlMode, ServeConfig, ServerHandle};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::transport::Channel;

const F: usize = 10;

fn config(repo: &Path) -> ServeConfig {
    ServeConfig {
        grpc_port: Some(0),
        ..serve_config(repo, "burn")
    }
}

fn http(h: &ServerHandle) -> HttpClient {
    HttpClient::new(h.addr).with_timeout(Duration::from_secs(60))
}

async fn grpc(h: &ServerHandle) -> GrpcInferenceServiceClient<Channel> {
    let addr = h.grpc_addr.expect("gRPC is on");
    GrpcInferenceServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("gRPC connects")
}

fn rows(n: usize, seed: u32) -> Vec<f32> {
    crate::common::rows_around_means(trained(), n, seed)
}

fn infer_body(x: &[f32]) -> Value {
    json!({"inputs": [{"name": "features", "shape": [x.len() / F, F], "datatype": "FP32", "data": x}]})
}

fn raw_request(model: &str, x: &[f32]) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![mir::InferInputTensor {
            name: "features".into(),
            datatype: "FP32".into(),
            shape: vec![(x.len() / F) as i64, F as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![x.iter().flat_map(|v| v.to_le_bytes()).collect()],
        ..Default::default()
    }
}

fn error_of(r: &kiln::loadgen::client::HttpResponse) -> String {
    r.json()["error"].as_str().unwrap_or_default().to_string()
}

/// A request with 300,000 uniquely named inputs (some 15 MB, under the body limit set here)
/// is refused at once with a 400 naming the cap, and health checks sent while it is sent and
/// parsed are all answered. Before the cap, the duplicate-name check was quadratic and ran
/// on the runtime's workers: minutes of CPU during which health checks failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_inputs_are_refused_at_once_and_health_answers_meanwhile() {
    let repo = repository_of(trained());
    let h = serve(ServeConfig {
        max_body_bytes: 32 << 20,
        ..config(repo.path())
    })
    .await;
    let n = 300_000;
    let mut body = String::with_capacity(n * 56);
    body.push_str(r#"{"inputs":["#);
    for k in 0..n {
        if k > 0 {
            body.push(',');
        }
        body.push_str(&format!(
            r#"{{"name":"i{k}","shape":[0],"datatype":"FP32","data":[]}}"#
        ));
    }
    body.push_str("]}");
    assert!(
        body.len() < 32 << 20 && body.len() > 8 << 20,
        "{}",
        body.len()
    );
    let big = {
        let mut c = http(&h);
        tokio::spawn(async move {
            c.request(
                "POST",
                "/v2/models/tiny/infer",
                &[("Content-Type", "application/json")],
                body.as_bytes(),
            )
            .await
        })
    };
    let mut c = http(&h);
    let mut during = Vec::new();
    while !big.is_finished() {
        during.push(
            c.get("/v2/health/live")
                .await
                .map(|r| r.status)
                .unwrap_or(0),
        );
    }
    let r = big.await.unwrap().expect("the big request is answered");
    assert_eq!(r.status, 400, "{}", r.text());
    let e = error_of(&r);
    assert!(
        e.contains(&format!("{n} inputs; at most {MAX_INPUTS}")),
        "{e}"
    );
    assert!(!during.is_empty(), "no health check ran beside the request");
    assert!(
        during.iter().all(|&s| s == 200),
        "health answers: {during:?}"
    );
    // Just over the cap is refused too; at the cap, the duplicate check (a hash set) still
    // names the repeated input.
    let over: Vec<Value> = (0..=MAX_INPUTS)
        .map(|k| json!({"name": format!("x{k}"), "shape": [1], "datatype": "FP32", "data": [0]}))
        .collect();
    let r = c
        .post_json("/v2/models/tiny/infer", &json!({"inputs": over}))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(error_of(&r).contains("at most 64"), "{}", r.text());
    let mut dup: Vec<Value> = (0..MAX_INPUTS - 1)
        .map(|k| json!({"name": format!("x{k}"), "shape": [1], "datatype": "FP32", "data": [0]}))
        .collect();
    dup.push(json!({"name": "x7", "shape": [1], "datatype": "FP32", "data": [0]}));
    let r = c
        .post_json("/v2/models/tiny/infer", &json!({"inputs": dup}))
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(
        error_of(&r).contains("input `x7` is given more than once"),
        "{}",
        r.text()
    );
    // The same cap over gRPC.
    let mut g = grpc(&h).await;
    let mut req = raw_request("tiny", &rows(1, 0));
    let one = req.inputs[0].clone();
    req.raw_input_contents.clear();
    req.inputs = (0..=MAX_INPUTS)
        .map(|k| mir::InferInputTensor {
            name: format!("x{k}"),
            ..one.clone()
        })
        .collect();
    let e = g.model_infer(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("at most 64"), "{e:?}");
    h.shutdown().await.unwrap();
}

/// A 20,000-character model or input name is echoed clipped: the client gets NOT_FOUND /
/// INVALID_ARGUMENT (HTTP 404 / 400) with a short message, not RESOURCE_EXHAUSTED from its
/// own header limit; a gRPC message over the size limit is RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_client_strings_are_clipped_and_oversize_grpc_is_resource_exhausted() {
    let repo = repository_of(trained());
    let h = serve(ServeConfig {
        max_body_bytes: 1 << 20,
        ..config(repo.path())
    })
    .await;
    let long = "m".repeat(20_000);
    let short_enough = |m: &str| m.len() <= MAX_MESSAGE_BYTES && m.len() < 600;
    let x = rows(2, 1);
    let mut c = http(&h);
    let r = c
        .post_json(&format!("/v2/models/{long}/infer"), &infer_body(&x))
        .await
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    let e = error_of(&r);
    assert!(short_enough(&e), "{} bytes: {e}", e.len());
    assert!(
        e.contains(&format!("unknown model `{}…", &long[..ECHO_CHARS])) && e.contains("20000"),
        "{e}"
    );
    let r = c.get(&format!("/v2/models/{long}/ready")).await.unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(short_enough(&r.text()), "{}", r.text().len());
    let body = json!({"inputs": [{"name": long, "shape": [2, F], "datatype": "FP32", "data": x}]});
    let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    let e = error_of(&r);
    assert!(short_enough(&e) && e.contains("at most 256"), "{e}");

    let mut g = grpc(&h).await;
    let e = g.model_infer(raw_request(&long, &x)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{:?}", e.code());
    assert!(
        short_enough(e.message()) && e.message().contains("unknown model `mmm"),
        "{}",
        e.message()
    );
    let e = g
        .model_ready(pb::ModelReadyRequest {
            name: long.clone(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{:?}", e.code());
    let mut req = raw_request("tiny", &x);
    req.inputs[0].name = long.clone();
    let e = g.model_infer(req).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{:?}", e.code());
    assert!(short_enough(e.message()), "{}", e.message().len());
    // Oversize: RESOURCE_EXHAUSTED naming the limit; the channel still serves afterwards.
    let big = rows(30_000, 2);
    let e = g.model_infer(raw_request("tiny", &big)).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("--max-body-bytes"), "{e:?}");
    let ok = g.model_infer(raw_request("tiny", &x)).await.unwrap();
    assert_eq!(ok.into_inner().outputs.len(), 2);
    h.shutdown().await.unwrap();
}

/// A `ModelInfer` request whose message never completes (its header announces 1,000 bytes, 10
/// follow, then nothing; the generated client always sends whole messages), with `extra`
/// headers: the gRPC status and message it is answered with, and how long that took.
async fn stalled_grpc_request(
    h: &ServerHandle,
    extra: &[(&str, &str)],
) -> (String, String, Duration) {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&1000u32.to_be_bytes());
    frame.extend_from_slice(&[0u8; 10]);
    crate::common::raw_grpc_call(h.grpc_addr.unwrap(), extra, frame, false).await
}

/// A gRPC request whose message never completes is answered DEADLINE_EXCEEDED within the
/// body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_grpc_body_times_out() {
    let repo = repository_of(trained());
    let mut cfg = config(repo.path());
    cfg.connection.body_timeout = Duration::from_millis(300);
    let h = serve(cfg).await;
    let (status, _, _) = stalled_grpc_request(&h, &[]).await;
    assert_eq!(status, (Code::DeadlineExceeded as i32).to_string());
    h.shutdown().await.unwrap();
}

/// The client's deadline (`grpc-timeout`) is honoured: a stalled request is answered
/// DEADLINE_EXCEEDED when the client's deadline passes, well before a long body timeout; a
/// malformed header is INVALID_ARGUMENT naming it; a request within its deadline is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_header_is_the_requests_deadline() {
    let repo = repository_of(trained());
    let mut cfg = config(repo.path());
    cfg.connection.body_timeout = Duration::from_secs(20);
    let h = serve(cfg).await;
    let (status, message, took) = stalled_grpc_request(&h, &[("grpc-timeout", "200m")]).await;
    assert_eq!(
        status,
        (Code::DeadlineExceeded as i32).to_string(),
        "{message}"
    );
    assert!(message.contains("grpc-timeout"), "{message}");
    assert!(took < Duration::from_secs(15), "answered after {took:?}");

    for bad in ["abc", "5", "123456789S", "10x", "S"] {
        let (status, message, _) = stalled_grpc_request(&h, &[("grpc-timeout", bad)]).await;
        assert_eq!(
            status,
            (Code::InvalidArgument as i32).to_string(),
            "{bad}: {message}"
        );
        assert!(message.contains("grpc-timeout"), "{bad}: {message}");
    }

    let mut client = grpc(&h).await;
    let x = rows(1, 1);
    let mut req = tonic::Request::new(raw_request("tiny", &x));
    req.set_timeout(Duration::from_secs(30));
    let r = client.model_infer(req).await.unwrap().into_inner();
    assert!(!r.outputs.is_empty());
    assert_eq!(r.raw_output_contents.len(), r.outputs.len());
    h.shutdown().await.unwrap();
}

/// A row whose features are finite in f32 but overflow the model's arithmetic is an error
/// naming the output and the row (HTTP 500 JSON, gRPC INTERNAL), never `null` in an FP32
/// tensor; features that are not finite after conversion to f32 (JSON 3.5e38, binary inf)
/// are refused as bad requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_outputs_are_errors_and_non_finite_features_are_refused() {
    let repo = repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut x = rows(2, 3);
    for v in &mut x[F..] {
        *v = 3.0e38;
    }
    let mut c = http(&h);
    let r = c
        .post_json("/v2/models/tiny/infer", &infer_body(&x))
        .await
        .unwrap();
    assert_eq!(r.status, 500, "{}", r.text());
    let e = error_of(&r);
    assert!(
        e.contains("non-finite") && e.contains("row 1") && e.contains("output `"),
        "{e}"
    );
    assert!(!r.text().contains("null"), "{}", r.text());
    // Row 0 alone answers.
    let r = c
        .post_json("/v2/models/tiny/infer", &infer_body(&x[..F]))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let mut g = grpc(&h).await;
    let e = g.model_infer(raw_request("tiny", &x)).await.unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(e.message().contains("row 1"), "{e:?}");

    // Features: finite in JSON (f64) but inf in f32; binary inf; gRPC raw NaN.
    let mut body = infer_body(&x[..F]);
    body["inputs"][0]["data"][3] = json!(3.5e38);
    let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        error_of(&r).contains("inf after conversion to FP32"),
        "{}",
        r.text()
    );
    let mut bin = x[..F].to_vec();
    bin[2] = f32::INFINITY;
    let json_part = json!({"inputs": [{"name": "features", "shape": [1, F], "datatype": "FP32",
        "parameters": {"binary_data_size": 4 * F}}]})
    .to_string();
    let mut raw = json_part.clone().into_bytes();
    raw.extend(bin.iter().flat_map(|v| v.to_le_bytes()));
    let hl = json_part.len().to_string();
    let r = c
        .request(
            "POST",
            "/v2/models/tiny/infer",
            &[("Inference-Header-Content-Length", hl.as_str())],
            &raw,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        error_of(&r).contains("not finite") || error_of(&r).contains("inf"),
        "{}",
        r.text()
    );
    bin[2] = f32::NAN;
    let e = g.model_infer(raw_request("tiny", &bin)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    h.shutdown().await.unwrap();
}

/// A profile recorded under load keeps at most its event cap, reports what it dropped, and
/// writes a trace within the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_profile_under_load_stays_within_its_cap() {
    kiln::observe::install_subscriber();
    let _profiling = crate::common::PROFILING.lock().await;
    let repo = repository_of(trained());
    let profiles = tempfile::tempdir().unwrap();
    let cap = 300;
    let h = serve(ServeConfig {
        profile_dir: Some(profiles.path().to_path_buf()),
        profile_max_events: cap,
        ..config(repo.path())
    })
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..2)
        .map(|i| {
            let (mut c, stop) = (http(&h), stop.clone());
            let body = infer_body(&rows(1, i));
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut c = http(&h);
    let mut answered = 0;
    // Each request records several spans: a second's worth of requests exceeds the cap.
    let r = loop {
        let r = c
            .request("POST", "/v2/profile?duration_ms=1500", &[], &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        answered += 1;
        if r.json()["dropped_events"].as_u64().unwrap_or(0) > 0 || answered == 5 {
            break r;
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let served: u64 = futures_sum(load).await;
    let v = r.json();
    let events = v["events"].as_u64().unwrap();
    let dropped = v["dropped_events"].as_u64().unwrap();
    assert!(events <= cap as u64, "{v}");
    assert!(
        dropped > 0,
        "{served} requests served, nothing dropped: {v}"
    );
    assert_eq!(v["max_events"], cap);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("dropped {dropped} events"))
    );
    let trace: Value =
        serde_json::from_str(&std::fs::read_to_string(v["trace"].as_str().unwrap()).unwrap())
            .unwrap();
    let spans = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert!(spans <= cap && spans > 0, "{spans} spans in the trace");
    h.shutdown().await.unwrap();
}

/// A profile recorded under load with a small byte cap (and no binding event cap) holds at
/// most that many bytes by the recording's own accounting, reports the bytes it held and
/// what it dropped, and says so in its message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_profile_under_load_stays_within_its_byte_cap() {
    kiln::observe::install_subscriber();
    let _profiling = crate::common::PROFILING.lock().await;
    let repo = repository_of(trained());
    let profiles = tempfile::tempdir().unwrap();
    let max_bytes = 32 << 10;
    let h = serve(ServeConfig {
        profile_dir: Some(profiles.path().to_path_buf()),
        profile_max_events: 10_000_000,
        profile_max_bytes: max_bytes,
        ..config(repo.path())
    })
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..2)
        .map(|i| {
            let (mut c, stop) = (http(&h), stop.clone());
            let body = infer_body(&rows(1, i));
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut c = http(&h);
    // A few hundred spans fill 32 KiB; ask again (up to 5 times) on a machine too busy to
    // serve that many in the window.
    let mut answered = 0;
    let r = loop {
        let r = c
            .request("POST", "/v2/profile?duration_ms=1500", &[], &[])
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        answered += 1;
        if r.json()["dropped_events"].as_u64().unwrap_or(0) > 0 || answered == 5 {
            break r;
        }
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let served: u64 = futures_sum(load).await;
    let v = r.json();
    let bytes = v["bytes"].as_u64().unwrap();
    let dropped = v["dropped_events"].as_u64().unwrap();
    assert_eq!(v["max_bytes"], max_bytes);
    assert!(bytes > 0 && bytes <= max_bytes as u64, "{v}");
    assert!(
        dropped > 0,
        "{served} requests served, nothing dropped: {v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("dropped {dropped} events")),
        "{v}"
    );
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{max_bytes} bytes"))
    );
    h.shutdown().await.unwrap();
}

async fn futures_sum(tasks: Vec<tokio::task::JoinHandle<u64>>) -> u64 {
    let mut n = 0;
    for t in tasks {
        n += t.await.unwrap();
    }
    n
}

/// Without a control token, a request carrying a proxy header is not a loopback client's
/// (HTTP and gRPC); with the token it is let through; a non-loopback bind without a token
/// is refused at start unless `insecure_control` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxied_requests_are_not_loopback_and_open_binds_need_a_token() {
    let repo = repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut c = http(&h);
    let r = c
        .request("POST", "/v2/repository/index", &[], &[])
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    for header in ["Forwarded", "X-Forwarded-For", "X-Real-IP"] {
        let r = c
            .request(
                "POST",
                "/v2/repository/index",
                &[(header, "203.0.113.7")],
                &[],
            )
            .await
            .unwrap();
        assert_eq!(r.status, 403, "{header}: {}", r.text());
        assert!(error_of(&r).contains("proxy"), "{}", r.text());
    }
    let mut g = grpc(&h).await;
    let mut req = tonic::Request::new(pb::RepositoryIndexRequest::default());
    req.metadata_mut()
        .insert("x-forwarded-for", "203.0.113.7".parse().unwrap());
    let e = g.repository_index(req).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    g.repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap();
    h.shutdown().await.unwrap();

    // With a token, the proxied request is authorised by the token.
    let token = "0123456789abcdef0123";
    let h = serve(ServeConfig {
        control_token: Some(token.into()),
        ..config(repo.path())
    })
    .await;
    let auth = format!("Bearer {token}");
    let r = http(&h)
        .request(
            "POST",
            "/v2/repository/index",
            &[("X-Forwarded-For", "203.0.113.7"), ("Authorization", &auth)],
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    h.shutdown().await.unwrap();

    // A non-loopback bind: refused without a token, served with one or with the opt-out.
    let open = |token: Option<&str>, insecure: bool| ServeConfig {
        host: "0.0.0.0".into(),
        control_token: token.map(str::to_string),
        insecure_control: insecure,
        grpc_port: None,
        ..config(repo.path())
    };
    let e = match kiln::serve::start(open(None, false)).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("0.0.0.0 without a token started"),
    };
    assert!(
        e.contains("--host 0.0.0.0")
            && e.contains("--control-token")
            && e.contains("--insecure-control"),
        "{e}"
    );
    for (t, insecure) in [(Some(token), false), (None, true)] {
        let h = kiln::serve::start(open(t, insecure)).await.unwrap();
        h.shutdown().await.unwrap();
    }
    assert!(kiln::serve::is_loopback_host("127.0.0.1"));
    assert!(kiln::serve::is_loopback_host("::1"));
    assert!(kiln::serve::is_loopback_host("localhost"));
    assert!(!kiln::serve::is_loopback_host("0.0.0.0"));
    assert!(!kiln::serve::is_loopback_host("::"));
    assert!(!kiln::serve::is_loopback_host("10.1.2.3"));
}

/// The shipped manifests that bind 0.0.0.0 take the control token from a Kubernetes Secret.
#[test]
fn shipped_manifests_set_the_control_token_from_a_secret() {
    for file in ["serve-deployment.yaml", "kserve-inferenceservice.yaml"] {
        let text =
            std::fs::read_to_string(crate::common::root().join("deploy/kubernetes").join(file))
                .unwrap();
        let doc: Value = serde_yaml_value(&text);
        let containers = doc
            .pointer("/spec/template/spec/containers")
            .or_else(|| doc.pointer("/spec/predictor/containers"))
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("{file}: no containers"));
        let c = &containers[0];
        let args: Vec<&str> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let host = args
            .windows(2)
            .find(|w| w[0] == "--host")
            .map(|w| w[1])
            .unwrap_or("127.0.0.1");
        if kiln::serve::is_loopback_host(host) {
            continue;
        }
        assert!(!args.contains(&"--insecure-control"), "{file}");
        let env = c["env"]
            .as_array()
            .unwrap_or_else(|| panic!("{file}: no env"));
        let token = env
            .iter()
            .find(|e| e["name"] == "KILN_CONTROL_TOKEN")
            .unwrap_or_else(|| panic!("{file}: KILN_CONTROL_TOKEN is not set"));
        let r = &token["valueFrom"]["secretKeyRef"];
        assert!(
            r["name"].is_string() && r["key"].is_string(),
            "{file}: the token does not come from a Secret: {token}"
        );
    }
}

fn serde_yaml_value(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap()
}

/// Explicit model control: a model on disk but not loaded is not ready (HTTP 503
/// `ready: false`, gRPC `ready: false`), not unknown; load parameters are applied only
/// when they restate the server's settings, refused with a clear 400 / INVALID_ARGUMENT
/// otherwise (invalid JSON included); a load that falls back to a lower version succeeds
/// and says which version it loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_mode_readiness_load_parameters_and_version_fallback() {
    let repo = repository_of(trained());
    let v2 = repo.path().join("tiny").join("2");
    copy_dir(trained(), &v2);
    std::fs::remove_file(v2.join(WEIGHTS_FILE)).unwrap();
    let h = serve(ServeConfig {
        model_control: ModelControlMode::Explicit,
        ..config(repo.path())
    })
    .await;
    let mut c = http(&h);
    let mut g = grpc(&h).await;
    let r = c.get("/v2/models/tiny/ready").await.unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["ready"], false);
    let ready = g
        .model_ready(pb::ModelReadyRequest {
            name: "tiny".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!ready.ready);
    // Unknown models stay unknown.
    assert_eq!(c.get("/v2/models/nope/ready").await.unwrap().status, 404);

    let load = |config: &str| json!({"parameters": {"config": config}});
    let path = "/v2/repository/models/tiny/load";
    for (cfg, needle) in [
        ("{not json", "not valid JSON"),
        (r#"{"max_batch_size": 8}"#, "max_batch_size to 8"),
        (
            r#"{"instance_group": []}"#,
            "`instance_group` cannot be overridden",
        ),
        ("[1]", "must be a JSON object"),
    ] {
        let r = c.post_json(path, &load(cfg)).await.unwrap();
        assert_eq!(r.status, 400, "{cfg}: {}", r.text());
        assert!(error_of(&r).contains(needle), "{cfg}: {}", r.text());
    }
    let mut params = std::collections::HashMap::new();
    params.insert(
        "config".to_string(),
        pb::ModelRepositoryParameter {
            parameter_choice: Some(
                pb::model_repository_parameter::ParameterChoice::StringParam(
                    r#"{"max_batch_size": 8}"#.into(),
                ),
            ),
        },
    );
    let e = g
        .repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "tiny".into(),
            parameters: params,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("max_batch_size"), "{e:?}");
    // Nothing was loaded by the refused requests.
    assert_eq!(c.get("/v2/models/tiny/ready").await.unwrap().status, 503);

    // The server's own max_batch_size is accepted; version 2 is broken, so version 1 is
    // loaded: success, naming it.
    let r = c
        .post_json(path, &load(r#"{"max_batch_size": 64}"#))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["version"], "1", "{}", r.text());
    assert_eq!(c.get("/v2/models/tiny/ready").await.unwrap().status, 200);
    // The same over gRPC after an unload.
    g.repository_model_unload(pb::RepositoryModelUnloadRequest {
        model_name: "tiny".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(c.get("/v2/models/tiny/ready").await.unwrap().status, 503);
    g.repository_model_load(pb::RepositoryModelLoadRequest {
        model_name: "tiny".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = c
        .post_json("/v2/models/tiny/infer", &infer_body(&rows(1, 4)))
        .await
        .unwrap();
    assert_eq!(r.json()["model_version"], "1", "{}", r.text());
    h.shutdown().await.unwrap();
}

/// Read one HTTP/1.1 response (head and Content-Length body) from `s`; `None` when the
/// connection closes first.
async fn read_response(s: &mut tokio::net::TcpStream) -> Option<u16> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return head.get(9..12).and_then(|c| c.parse().ok());
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn raw_infer(addr: SocketAddr, x: &[f32]) -> Vec<u8> {
    let body = infer_body(x).to_string();
    format!(
        "POST /v2/models/tiny/infer HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Requests written just before the stop are all answered: on keep-alive connections that
/// were idle (the race: the connection was closed as idle before hyper read them) and on
/// connections still in the listen backlog. Repeated a few rounds, counting answered
/// against sent. (`shutdown` is the path SIGTERM takes, after the signal.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_written_just_before_the_stop_are_all_answered() {
    let repo = repository_of(trained());
    let (mut sent, mut answered) = (0, 0);
    for round in 0..4u32 {
        let h = serve(config(repo.path())).await;
        let addr = h.addr;
        let x = rows(1, round);
        let req = raw_infer(addr, &x);
        // Idle keep-alive connections: one request answered on each first.
        let mut idle = Vec::new();
        for _ in 0..12 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.set_nodelay(true).unwrap();
            s.write_all(&req).await.unwrap();
            assert_eq!(read_response(&mut s).await, Some(200));
            idle.push(s);
        }
        // Let every connection go idle (its answer written, hyper waiting for a head).
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut fresh = Vec::new();
        for _ in 0..4 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(&req).await.unwrap();
            fresh.push(s);
        }
        for s in &mut idle {
            s.write_all(&req).await.unwrap();
        }
        let stop = tokio::spawn(h.shutdown());
        for s in idle.iter_mut().chain(fresh.iter_mut()) {
            sent += 1;
            if read_response(s).await == Some(200) {
                answered += 1;
            }
        }
        stop.await.unwrap().unwrap();
    }
    assert_eq!(answered, sent, "{answered} of {sent} requests answered");
}
