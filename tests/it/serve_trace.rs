//! OpenTelemetry tracing of `kiln serve`, against the official OpenTelemetry Python packages: a
//! real OTLP/gRPC receiver built from `opentelemetry-proto` (`tests/otel/receiver.py`) and a
//! caller instrumented with the official SDK (`tests/otel/caller.py`), which injects its W3C
//! `traceparent` and exports its own CLIENT span to the same receiver. The server's spans must
//! join the caller's trace: its SERVER span is the caller's span's child, and the stage spans
//! (decode, queue_wait, batch, compute, encode) hang under it with times inside it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kiln::serve::ServerHandle;
use kiln::serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::{Value, json};

use crate::common::{
    repository_of, required_env, root, rows_around_means, serve, serve_config, trained,
};

const F: usize = 10;
/// OTLP's `Span.SpanKind` numbers, as the receiver writes them.
const SERVER: i64 = 2;
const CLIENT: i64 = 3;

fn python() -> String {
    required_env(
        "KILN_TEST_OTEL_PYTHON",
        "the official OpenTelemetry Python SDK and opentelemetry-proto (.ci/otel.sh)",
    )
}

/// The receiver, its port and the file it appends spans to.
struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Receiver {
    fn start(dir: &Path) -> Self {
        Self::start_with(dir, "grpc")
    }

    /// A receiver of OTLP/gRPC (`grpc`) or OTLP/HTTP with protobuf bodies (`http`).
    fn start_with(dir: &Path, protocol: &str) -> Self {
        let out = dir.join(format!("spans-{protocol}.jsonl"));
        let mut child = Command::new(python())
            .arg(root().join("tests/otel/receiver.py"))
            .arg("--out")
            .arg(&out)
            .args(["--protocol", protocol])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the receiver starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the receiver printed {line:?}, not `PORT n`"));
        Self { child, port, out }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            // A line being appended right now is not complete yet.
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Wait (up to 30 s) until `pred` holds of the spans received.
    fn until(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let t = Instant::now();
        loop {
            let s = self.spans();
            if pred(&s) {
                return s;
            }
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{what}: the receiver has {s:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn body(rows: usize) -> Value {
    let x = rows_around_means(trained(), rows, 7);
    json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [rows, F], "data": x}]})
}

/// Run the instrumented caller against `h`; its JSON report.
fn call(h: &ServerHandle, receiver: &Receiver, dir: &Path, sampled: bool) -> Value {
    let file = dir.join("body.json");
    std::fs::write(&file, serde_json::to_vec(&body(3)).unwrap()).unwrap();
    let out = Command::new(python())
        .arg(root().join("tests/otel/caller.py"))
        .args(["--url", &format!("http://{}/v2/models/tiny/infer", h.addr)])
        .arg("--body")
        .arg(&file)
        .args(["--otlp-endpoint", &receiver.endpoint()])
        .args(["--sampled", if sampled { "1" } else { "0" }])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "caller.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn of_trace<'a>(spans: &'a [Value], trace: &str, service: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["trace_id"] == trace && s["service_name"] == service)
        .collect()
}

/// The server span of `trace` and its stage spans by name.
fn server_spans<'a>(spans: &'a [Value], trace: &str) -> (&'a Value, HashMap<String, &'a Value>) {
    let ours = of_trace(spans, trace, "kiln-serve");
    let server: Vec<_> = ours.iter().filter(|s| s["kind"] == SERVER).collect();
    assert_eq!(server.len(), 1, "one server span: {ours:#?}");
    let stages = ours
        .iter()
        .filter(|s| s["kind"] != SERVER)
        .map(|s| (s["name"].as_str().unwrap().to_string(), *s))
        .collect();
    (server[0], stages)
}

fn ns(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("{v} is not a time in ns"))
}

fn within(inner: &Value, outer: &Value) {
    assert!(
        ns(&inner["start_ns"]) >= ns(&outer["start_ns"])
            && ns(&inner["end_ns"]) <= ns(&outer["end_ns"])
            && ns(&inner["start_ns"]) <= ns(&inner["end_ns"]),
        "{} [{}, {}] is not within {} [{}, {}]",
        inner["name"],
        inner["start_ns"],
        inner["end_ns"],
        outer["name"],
        outer["start_ns"],
        outer["end_ns"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OpenTelemetry Python: KILN_TEST_OTEL_PYTHON (.ci/otel.sh)"]
async fn a_traced_request_joins_the_callers_trace_with_the_servers_stage_spans() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let repo = repository_of(trained());
    let mut cfg = serve_config(repo.path(), "burn");
    cfg.grpc_port = Some(0);
    cfg.trace.endpoint = Some(receiver.endpoint());
    // Requests without a sampled parent are not traced: the caller's flag decides alone.
    cfg.trace.sample_ratio = Some(0.0);
    let h = serve(cfg).await;

    // HTTP, from the official SDK.
    let dd = dir.path().to_path_buf();
    let report = tokio::task::block_in_place(|| call(&h, &receiver, &dd, true));
    assert_eq!(report["status"], 200, "{report}");
    let trace = report["trace_id"].as_str().unwrap().to_string();
    let caller_span = report["span_id"].as_str().unwrap().to_string();

    // An unsampled caller's request leaves no server span.
    let unsampled = tokio::task::block_in_place(|| call(&h, &receiver, &dd, false));
    assert_eq!(unsampled["status"], 200, "{unsampled}");

    // gRPC, with the traceparent in the call's metadata.
    let grpc_trace = "5f3c1e8a9b7d4c2e8f1a2b3c4d5e6f70";
    let grpc_parent = "1a2b3c4d5e6f7081";
    let mut g = GrpcInferenceServiceClient::connect(format!("http://{}", h.grpc_addr.unwrap()))
        .await
        .unwrap();
    let x = rows_around_means(trained(), 2, 3);
    let mut req = tonic::Request::new(crate::common::grpc_raw_request(&x, &[]));
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{grpc_trace}-{grpc_parent}-01").parse().unwrap(),
    );
    let resp = g.model_infer(req).await.unwrap();
    let grpc_response = resp
        .metadata()
        .get("traceresponse")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    assert_eq!(resp.into_inner().outputs.len(), 2);

    // The server exports within its batch delay; shutting down flushes the rest.
    let (http_addr, grpc_addr) = (h.addr, h.grpc_addr.unwrap());
    h.shutdown().await.unwrap();
    let spans = tokio::task::block_in_place(|| {
        receiver.until("the caller's and the server's spans", |s| {
            !of_trace(s, &trace, "kiln-test-caller").is_empty()
                && of_trace(s, &trace, "kiln-serve").len() >= 6
                && of_trace(s, grpc_trace, "kiln-serve").len() >= 6
        })
    });

    // The caller's CLIENT span and the server's SERVER span share the trace, parent to child.
    let caller = of_trace(&spans, &trace, "kiln-test-caller");
    assert_eq!(caller.len(), 1);
    assert_eq!(caller[0]["kind"], CLIENT);
    assert_eq!(caller[0]["span_id"], caller_span.as_str());
    let (server, stages) = server_spans(&spans, &trace);
    assert_eq!(server["parent_span_id"], caller_span.as_str(), "{server:#}");
    assert_eq!(server["name"], "POST /v2/models/{model_name}/infer");
    assert_eq!(server["attributes"]["kiln.model"], "tiny");
    assert_eq!(server["attributes"]["kiln.rows"], 3);
    assert_eq!(server["attributes"]["http.response.status_code"], 200);
    // The semantic conventions' HTTP server attributes.
    for (k, v) in [
        ("http.request.method", json!("POST")),
        ("http.route", json!("/v2/models/{model_name}/infer")),
        ("url.path", json!("/v2/models/tiny/infer")),
        ("url.scheme", json!("http")),
        ("network.protocol.version", json!("1.1")),
        ("server.address", json!(http_addr.ip().to_string())),
        ("server.port", json!(http_addr.port())),
    ] {
        assert_eq!(server["attributes"][k], v, "{k}: {server:#}");
    }
    // The answer names the server span.
    let server_id = server["span_id"].as_str().unwrap();
    assert_eq!(
        report["response_headers"]["traceresponse"],
        format!("00-{trace}-{server_id}-01").as_str()
    );

    let mut names: Vec<&str> = stages.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(
        names,
        ["batch", "compute", "decode", "encode", "queue_wait"]
    );
    for (name, s) in &stages {
        let parent = if name == "compute" {
            stages["batch"]["span_id"].as_str().unwrap()
        } else {
            server_id
        };
        assert_eq!(s["parent_span_id"], parent, "{name}: {s:#}");
        within(s, server);
    }
    within(stages["compute"], stages["batch"]);
    assert_eq!(stages["batch"]["attributes"]["kiln.batch.rows"], 3);
    // The stages follow one another.
    for (a, b) in [
        ("decode", "queue_wait"),
        ("queue_wait", "batch"),
        ("batch", "encode"),
    ] {
        assert!(
            ns(&stages[a]["end_ns"]) <= ns(&stages[b]["start_ns"]),
            "{a} ends after {b} starts"
        );
    }

    // The unsampled call: its trace has no server span (and no caller span: ALWAYS_OFF).
    let t = unsampled["trace_id"].as_str().unwrap();
    assert!(of_trace(&spans, t, "kiln-serve").is_empty());

    // gRPC joined the metadata's trace the same way.
    let (gserver, gstages) = server_spans(&spans, grpc_trace);
    assert_eq!(gserver["parent_span_id"], grpc_parent);
    assert_eq!(gserver["name"], "inference.GRPCInferenceService/ModelInfer");
    for (k, v) in [
        ("rpc.system", json!("grpc")),
        ("rpc.service", json!("inference.GRPCInferenceService")),
        ("rpc.method", json!("ModelInfer")),
        ("rpc.grpc.status_code", json!(0)),
        ("server.address", json!(grpc_addr.ip().to_string())),
        ("server.port", json!(grpc_addr.port())),
    ] {
        assert_eq!(gserver["attributes"][k], v, "{k}: {gserver:#}");
    }
    assert_eq!(gstages.len(), 5, "{gstages:#?}");
    assert_eq!(
        grpc_response.as_deref(),
        Some(
            format!(
                "00-{grpc_trace}-{}-01",
                gserver["span_id"].as_str().unwrap()
            )
            .as_str()
        )
    );
}

/// A request without a parent is traced at the sample ratio: all at 1, none at 0, and a
/// malformed `traceparent` starts a new trace instead of failing the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OpenTelemetry Python: KILN_TEST_OTEL_PYTHON (.ci/otel.sh)"]
async fn requests_without_a_parent_follow_the_sample_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start(dir.path());
    let repo = repository_of(trained());
    for (ratio, expect) in [(1.0, 4), (0.0, 0)] {
        let mut cfg = serve_config(repo.path(), "burn");
        cfg.trace.endpoint = Some(receiver.endpoint());
        cfg.trace.sample_ratio = Some(ratio);
        cfg.trace.service_name = Some(format!("kiln-ratio-{ratio}"));
        let h = serve(cfg).await;
        let mut c = kiln::loadgen::client::HttpClient::new(h.addr);
        let b = serde_json::to_vec(&body(1)).unwrap();
        for tp in [None, None, Some("00-zz-bad-01"), Some("garbage")] {
            let mut headers = vec![("Content-Type", "application/json")];
            if let Some(tp) = tp {
                headers.push(("traceparent", tp));
            }
            let r = c
                .request("POST", "/v2/models/tiny/infer", &headers, &b)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.header("traceresponse").is_some(), ratio == 1.0);
        }
        h.shutdown().await.unwrap();
        let name = format!("kiln-ratio-{ratio}");
        let spans = tokio::task::block_in_place(|| {
            receiver.until("the flushed spans", |s| {
                s.iter()
                    .filter(|x| x["service_name"] == name.as_str() && x["kind"] == SERVER)
                    .count()
                    >= expect
            })
        });
        let roots: Vec<_> = spans
            .iter()
            .filter(|x| x["service_name"] == name.as_str() && x["kind"] == SERVER)
            .collect();
        assert_eq!(roots.len(), expect, "ratio {ratio}");
        for r in roots {
            assert!(
                r["parent_span_id"].as_str().unwrap_or("").is_empty(),
                "{r:#}"
            );
        }
    }
}

/// The OpenTelemetry variables `kiln serve` honours (all removed from the child's environment
/// first, so the runner's own settings cannot leak in).
const OTEL_VARS: [&str; 12] = [
    "OTEL_SDK_DISABLED",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];

/// `kiln serve` as a process configured only by the standard OpenTelemetry variables (no
/// tracing flag), once per OTLP protocol against the official receiver of that protocol: the
/// spans arrive with `service.name` from `OTEL_SERVICE_NAME`, the resource attributes of
/// `OTEL_RESOURCE_ATTRIBUTES`, the sampler of `OTEL_TRACES_SAMPLER`, and the semantic
/// conventions' HTTP and RPC attributes on the SERVER spans.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs OpenTelemetry Python: KILN_TEST_OTEL_PYTHON (.ci/otel.sh)"]
async fn the_standard_environment_variables_configure_tracing_over_otlp_http_and_grpc() {
    use std::io::{Read as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    let repo = repository_of(trained());
    for (receiver_protocol, otel_protocol) in [("http", "http/protobuf"), ("grpc", "grpc")] {
        let receiver = Receiver::start_with(dir.path(), receiver_protocol);
        let service = format!("kiln-env-{receiver_protocol}");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        for v in OTEL_VARS {
            cmd.env_remove(v);
        }
        cmd.args(["serve", "--repository"])
            .arg(repo.path())
            .args(["--port", "0", "--grpc-port", "0", "--engine", "burn"])
            .args(["--instances", "1", "--poll-interval-ms", "0"])
            .env("OTEL_SERVICE_NAME", &service)
            .env(
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment.name=ci,service.namespace=kiln%20tests",
            )
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", otel_protocol)
            .env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
            .env("OTEL_TRACES_SAMPLER_ARG", "1.0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        // Both addresses from the banner; the rest of stderr is drained to the end.
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let lines = log.clone();
        std::thread::spawn(move || {
            let (mut http, mut grpc, mut sent) = (None, None, false);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let addr = |after: &str| {
                    let i = line.find(after)? + after.len();
                    let rest = &line[i..];
                    let end = rest.find([' ', '/']).unwrap_or(rest.len());
                    rest[..end].parse::<std::net::SocketAddr>().ok()
                };
                http = http.or_else(|| addr(" on http://"));
                grpc = grpc.or_else(|| addr("KServe v2 gRPC on "));
                if let (false, Some(h), Some(g)) = (sent, http, grpc) {
                    let _ = tx.send((h, g));
                    sent = true;
                }
                lines.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let (http_addr, grpc_addr) =
            rx.recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| {
                    panic!("kiln serve printed its addresses: {}", log.lock().unwrap())
                });
        let mut c = kiln::loadgen::client::HttpClient::new(http_addr);
        let t0 = Instant::now();
        while c.get("/v2/health/ready").await.map(|r| r.status).ok() != Some(200) {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "not ready: {}",
                log.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // HTTP/1.1 by hand, so the request carries exactly the Host header a client sends.
        let body = serde_json::to_vec(&body(2)).unwrap();
        let answer = tokio::task::block_in_place(|| {
            let mut s = std::net::TcpStream::connect(http_addr).unwrap();
            write!(
                s,
                "POST /v2/models/tiny/infer HTTP/1.1\r\nHost: {http_addr}\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            )
            .unwrap();
            s.write_all(&body).unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            answer
        });
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let mut g = GrpcInferenceServiceClient::connect(format!("http://{grpc_addr}"))
            .await
            .unwrap();
        let x = rows_around_means(trained(), 2, 5);
        let req = tonic::Request::new(crate::common::grpc_raw_request(&x, &[]));
        assert_eq!(
            g.model_infer(req).await.unwrap().into_inner().outputs.len(),
            2
        );

        // SIGTERM flushes what the batch processor holds.
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = tokio::task::block_in_place(|| child.wait().unwrap());
        assert!(
            status.success(),
            "kiln serve: {status}: {}",
            log.lock().unwrap()
        );
        let spans = tokio::task::block_in_place(|| {
            receiver.until("the HTTP and gRPC server spans", |s| {
                s.iter()
                    .filter(|x| x["service_name"] == service.as_str() && x["kind"] == SERVER)
                    .count()
                    >= 2
            })
        });
        let servers: Vec<&Value> = spans
            .iter()
            .filter(|x| x["service_name"] == service.as_str() && x["kind"] == SERVER)
            .collect();
        assert_eq!(servers.len(), 2, "{servers:#?}");
        for s in &servers {
            assert_eq!(s["protocol"], otel_protocol, "{s:#}");
            assert_eq!(s["resource"]["deployment.environment.name"], "ci", "{s:#}");
            assert_eq!(s["resource"]["service.namespace"], "kiln tests", "{s:#}");
            // A new trace (no caller), sampled by the environment's sampler.
            assert_eq!(s["parent_span_id"], "", "{s:#}");
        }
        let by_name = |n: &str| {
            *servers
                .iter()
                .find(|s| s["name"] == n)
                .unwrap_or_else(|| panic!("no span {n}: {servers:#?}"))
        };
        let http = by_name("POST /v2/models/{model_name}/infer");
        for (k, v) in [
            ("http.request.method", json!("POST")),
            ("http.route", json!("/v2/models/{model_name}/infer")),
            ("http.response.status_code", json!(200)),
            ("url.path", json!("/v2/models/tiny/infer")),
            ("url.scheme", json!("http")),
            ("network.protocol.version", json!("1.1")),
            ("server.address", json!(http_addr.ip().to_string())),
            ("server.port", json!(http_addr.port())),
        ] {
            assert_eq!(http["attributes"][k], v, "{k}: {http:#}");
        }
        let rpc = by_name("inference.GRPCInferenceService/ModelInfer");
        for (k, v) in [
            ("rpc.system", json!("grpc")),
            ("rpc.service", json!("inference.GRPCInferenceService")),
            ("rpc.method", json!("ModelInfer")),
            ("rpc.grpc.status_code", json!(0)),
            ("server.address", json!(grpc_addr.ip().to_string())),
            ("server.port", json!(grpc_addr.port())),
        ] {
            assert_eq!(rpc["attributes"][k], v, "{k}: {rpc:#}");
        }
        // The stage spans came along, in the same traces.
        for root in [http, rpc] {
            let trace = root["trace_id"].as_str().unwrap();
            assert_eq!(of_trace(&spans, trace, &service).len(), 6, "{trace}");
        }
    }
}
