//! The serving tier end to end: a tiny model trained in-process, exported into a repository,
//! served on an ephemeral loopback port (in-process through `kiln::serve::start`), and
//! exercised over HTTP with the crate's own small client: every endpoint, JSON and binary
//! tensors against `Predictor::predict`, every error path, batching, queue-full, timeouts,
//! hot swap under load, rejected versions, graceful shutdown, the pick model and the load
//! generator.

use crate::common::copy_dir;
use crate::common::trained;

use std::path::Path;
use std::time::{Duration, Instant};

use kiln::artifact::{Checkpoint, MANIFEST_FILE, WEIGHTS_FILE};
use kiln::infer::build_engine;
use kiln::loadgen::client::{HttpClient, HttpResponse};
use kiln::predict::Predictor;
use kiln::serve::metrics::sample;
use kiln::serve::protocol::{OutputData, decode_response};
use kiln::serve::{BatchingPolicy, ServeConfig, ServerHandle};
use serde_json::{Value, json};

const ENGINE: &str = "burn";

/// The tiny model of this binary (trained once).
/// A repository holding `tiny/1` (the trained model).
fn repository() -> tempfile::TempDir {
    crate::common::repository_of(trained())
}

/// Export a variant of the trained model (biases shifted by `shift`) as `dest`.
fn export_variant(dest: &Path, shift: f32) {
    let ckpt = Checkpoint::load(trained()).unwrap();
    let mut w = ckpt.weights.clone();
    for b in &mut w.mean_head.b {
        *b += shift;
    }
    for b in &mut w.logvar_head.b {
        *b -= shift;
    }
    kiln::artifact::export(dest, ckpt.manifest.clone(), &w).unwrap();
}

fn config(repo: &Path) -> ServeConfig {
    ServeConfig {
        max_body_bytes: 1 << 20,
        ..crate::common::serve_config(repo, ENGINE)
    }
}

use crate::common::client;
use crate::common::serve;

fn predictor(dir: &Path) -> Predictor {
    let ckpt = Checkpoint::load(dir).unwrap();
    let engine = build_engine(ENGINE.parse().unwrap(), &ckpt.weights, 1).unwrap();
    Predictor::for_checkpoint(&ckpt, engine)
}

/// `rows` deterministic rows of raw features around the training means.
fn rows(n: usize, seed: u32) -> Vec<f32> {
    crate::common::rows_around_means(trained(), n, seed)
}

const F: usize = 10;
const K: usize = 3;

fn json_request(x: &[f32], nested: bool, id: Option<&str>) -> Value {
    let n = x.len() / F;
    let data = if nested {
        json!(x.chunks(F).map(|r| r.to_vec()).collect::<Vec<_>>())
    } else {
        json!(x)
    };
    let mut v = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [n, F], "data": data}]});
    if let Some(id) = id {
        v["id"] = json!(id);
    }
    v
}

/// A binary request: JSON header + raw f32 bytes; `binary_out` asks for binary outputs.
fn binary_request(x: &[f32], binary_out: bool) -> (Vec<u8>, String) {
    let n = x.len() / F;
    let mut header = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [n, F],
        "parameters": {"binary_data_size": x.len() * 4}}]});
    if binary_out {
        header["outputs"] = json!([{"name": "mean", "parameters": {"binary_data": true}},
                                   {"name": "std", "parameters": {"binary_data": true}}]);
    }
    let mut body = serde_json::to_vec(&header).unwrap();
    let len = body.len();
    for v in x {
        body.extend_from_slice(&v.to_le_bytes());
    }
    (body, len.to_string())
}

async fn post_binary(c: &mut HttpClient, path: &str, body: &[u8], hlen: &str) -> HttpResponse {
    c.request(
        "POST",
        path,
        &[
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", hlen),
        ],
        body,
    )
    .await
    .unwrap()
}

/// The outputs of an answer: (mean, std) as f32.
fn outputs(r: &HttpResponse) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(r.status, 200, "{}", r.text());
    let hl = r
        .header("inference-header-content-length")
        .map(|v| v.parse().unwrap());
    let (_, outs) = decode_response(&r.body, hl).unwrap();
    let get = |n: &str| match &outs.iter().find(|o| o.0 == n).unwrap().2 {
        OutputData::F32(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    (get("mean"), get("std"))
}

async fn metrics_text(c: &mut HttpClient) -> String {
    let r = c.get("/metrics").await.unwrap();
    assert_eq!(r.status, 200);
    r.text()
}

/// Wait until `cond` holds, at most `limit`; panics naming `what` otherwise.
async fn poll_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Requests waiting in the queue of `model` (read from the server's metrics directly).
fn queued(h: &ServerHandle, model: &str) -> usize {
    h.metrics()
        .model(model)
        .queue_depth
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Requests of `model` version `version` answered successfully so far.
fn answered(metrics: &kiln::serve::Metrics, model: &str, version: u64) -> u64 {
    metrics
        .model(model)
        .version(version)
        .success
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_answers() {
    let repo = repository();
    let h = serve(config(repo.path())).await;
    let mut c = client(&h);

    let r = c.get("/v2/health/live").await.unwrap();
    assert_eq!((r.status, r.json()["live"].clone()), (200, json!(true)));
    let r = c.get("/v2/health/ready").await.unwrap();
    assert_eq!((r.status, r.json()["ready"].clone()), (200, json!(true)));

    let r = c.get("/v2").await.unwrap();
    assert_eq!(r.status, 200);
    let ext = r.json()["extensions"].clone();
    assert!(
        ext.as_array()
            .unwrap()
            .contains(&json!("binary_tensor_data")),
        "{ext}"
    );
    assert_eq!(r.json()["name"], "kiln");

    let ckpt = Checkpoint::load(trained()).unwrap();
    for path in ["/v2/models/tiny", "/v2/models/tiny/versions/1"] {
        let r = c.get(path).await.unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let m = r.json();
        assert_eq!(m["name"], "tiny");
        assert_eq!(m["versions"], json!(["1"]));
        assert_eq!(m["inputs"][0]["name"], "features");
        assert_eq!(m["inputs"][0]["datatype"], "FP32");
        assert_eq!(m["inputs"][0]["shape"], json!([-1, F]));
        assert_eq!(
            m["inputs"][0]["parameters"]["feature_names"],
            json!(ckpt.manifest.feature_names().join(","))
        );
        assert_eq!(m["outputs"][0]["name"], "mean");
        assert_eq!(m["outputs"][1]["name"], "std");
        assert_eq!(m["outputs"][1]["shape"], json!([-1, K]));
        let convention = m["outputs"][1]["parameters"]["convention"]
            .as_str()
            .unwrap();
        assert!(
            convention.contains("std = exp(0.5 * logvar) * target_std"),
            "{convention}"
        );
    }
    for path in ["/v2/models/tiny/ready", "/v2/models/tiny/versions/1/ready"] {
        let r = c.get(path).await.unwrap();
        assert_eq!(
            (r.status, r.json()["ready"].clone()),
            (200, json!(true)),
            "{path}"
        );
    }
    let r = c.get("/v2/models/tiny/config").await.unwrap();
    assert_eq!(r.status, 200);
    let cfg = r.json();
    assert_eq!(cfg["max_batch_size"], 64);
    assert_eq!(cfg["dynamic_batching"]["batching"], "idle");
    assert_eq!(cfg["input"][0]["dims"], json!([F]));
    assert_eq!(cfg["kiln"]["features"].as_array().unwrap().len(), F);
    assert_eq!(
        cfg["kiln"]["features"][0]["name"],
        json!(ckpt.manifest.features[0].name)
    );

    let x = rows(2, 0);
    for path in ["/v2/models/tiny/infer", "/v2/models/tiny/versions/1/infer"] {
        let r = c
            .post_json(path, &json_request(&x, false, Some("req-7")))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["id"], "req-7");
        assert_eq!(v["model_name"], "tiny");
        assert_eq!(v["model_version"], "1");
        assert_eq!(v["outputs"][0]["shape"], json!([2, K]));
        assert_eq!(v["outputs"][0]["datatype"], "FP32");
    }
    let text = metrics_text(&mut c).await;
    for family in [
        "kiln_inference_request_success_total",
        "kiln_inference_request_failure_total",
        "kiln_inference_count_total",
        "kiln_inference_exec_count_total",
        "kiln_inference_queue_duration_seconds",
        "kiln_inference_compute_duration_seconds",
        "kiln_inference_request_duration_seconds",
        "kiln_queue_depth",
        "kiln_model_loaded_version",
        "kiln_model_reload_failures_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "{family} missing:\n{text}"
        );
    }
    let l = "model=\"tiny\",version=\"1\"";
    assert_eq!(
        sample(
            &text,
            &format!("kiln_inference_request_success_total{{{l}}}")
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "kiln_model_loaded_version{model=\"tiny\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            &format!("kiln_inference_request_duration_seconds_count{{{l}}}")
        ),
        Some(2.0)
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_binary_answers_equal_predict() {
    let repo = repository();
    let h = serve(config(repo.path())).await;
    let mut c = client(&h);
    let x = rows(5, 1);
    let want = predictor(trained()).predict(&x, 5).unwrap();

    let flat = outputs(
        &c.post_json("/v2/models/tiny/infer", &json_request(&x, false, None))
            .await
            .unwrap(),
    );
    let nested = outputs(
        &c.post_json("/v2/models/tiny/infer", &json_request(&x, true, None))
            .await
            .unwrap(),
    );
    let (body, hl) = binary_request(&x, true);
    let r = post_binary(&mut c, "/v2/models/tiny/infer", &body, &hl).await;
    assert!(r.header("inference-header-content-length").is_some());
    let bin_bin = outputs(&r);
    let (body, hl) = binary_request(&x, false);
    let bin_json = outputs(&post_binary(&mut c, "/v2/models/tiny/infer", &body, &hl).await);
    for (what, got) in [
        ("json flat", &flat),
        ("json nested", &nested),
        ("binary in/out", &bin_bin),
        ("binary in, json out", &bin_json),
    ] {
        assert_eq!(got.0, want.mean, "{what}: mean");
        assert_eq!(got.1, want.std, "{what}: std");
    }

    // binary_data_output for all outputs, and one requested output only.
    let mut req = json_request(&x, false, None);
    req["parameters"] = json!({"binary_data_output": true});
    let r = c.post_json("/v2/models/tiny/infer", &req).await.unwrap();
    assert_eq!(outputs(&r).1, want.std);
    let mut req = json_request(&x, false, None);
    req["outputs"] = json!([{"name": "std"}]);
    let r = c.post_json("/v2/models/tiny/infer", &req).await.unwrap();
    let v = r.json();
    assert_eq!(v["outputs"].as_array().unwrap().len(), 1);
    assert_eq!(v["outputs"][0]["name"], "std");
    let std: Vec<f32> = v["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(std, want.std);
    h.shutdown().await.unwrap();
}

/// The default engine (`auto`) shows its choice per bucket in the model configuration and in
/// `/metrics`, and answers exactly as a `Predictor` on the engine chosen for the request's
/// bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_engine_answers_equal_its_predictor() {
    let repo = repository();
    let mut cfg = config(repo.path());
    cfg.engine = None;
    let h = serve(cfg).await;
    assert_eq!(kiln::serve::default_engine(), "auto");
    let r = client(&h).get("/v2/models/tiny/config").await.unwrap();
    let cfg = r.json();
    assert_eq!(cfg["engine"], json!("auto"));
    // The buckets of --max-batch-size 64; 7 rows run on the bucket-8 choice.
    let buckets = cfg["engine_choice"]["buckets"].as_array().unwrap().clone();
    let batches: Vec<u64> = buckets
        .iter()
        .map(|b| b["batch"].as_u64().unwrap())
        .collect();
    assert_eq!(batches, [1, 2, 4, 8, 16, 32, 64], "{cfg}");
    let engine = buckets[3]["engine"].as_str().unwrap().to_string();
    assert!(["fused", "int8"].contains(&engine.as_str()), "{cfg}");
    let metrics = metrics_text(&mut client(&h)).await;
    for b in &buckets {
        let line = format!(
            "kiln_auto_engine_choice{{model=\"tiny\",bucket=\"{}\",engine={}}} 1",
            b["batch"], b["engine"]
        );
        assert!(metrics.contains(&line), "{line} not in\n{metrics}");
    }
    let x = rows(7, 11);
    let ckpt = Checkpoint::load(trained()).unwrap();
    let mut p = Predictor::for_checkpoint(
        &ckpt,
        build_engine(engine.parse().unwrap(), &ckpt.weights, 1).unwrap(),
    );
    let want = p.predict(&x, 7).unwrap();
    let got = outputs(
        &client(&h)
            .post_json("/v2/models/tiny/infer", &json_request(&x, false, None))
            .await
            .unwrap(),
    );
    assert_eq!(
        got,
        (want.mean.clone(), want.std.clone()),
        "engine {engine}"
    );
    let burn = predictor(trained()).predict(&x, 7).unwrap();
    let diff = got
        .0
        .iter()
        .zip(&burn.mean)
        .chain(got.1.iter().zip(&burn.std))
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-6))
        .fold(0f32, f32::max);
    eprintln!("engine {engine} vs burn (kiln predict): max relative difference {diff:e}");
    // int8's own bound is tested in tests/it/engines.rs.
    if engine == "fused" {
        assert!(diff < 1e-4, "{engine} differs from burn by {diff}");
    }
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_path_names_the_problem() {
    let repo = repository();
    let mut cfg = config(repo.path());
    cfg.max_body_bytes = 4096;
    cfg.batcher.max_batch_size = 8;
    let h = serve(cfg).await;
    let mut c = client(&h);
    let x = rows(1, 2);
    let infer = "/v2/models/tiny/infer";

    let expect = |r: HttpResponse, code: u16, needle: &str| {
        assert_eq!(r.status, code, "want {code} with {needle:?}: {}", r.text());
        let e = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(e.contains(needle), "error {e:?} lacks {needle:?}");
    };
    expect(
        c.get("/v2/models/nope").await.unwrap(),
        404,
        "unknown model `nope`",
    );
    expect(
        c.post_json("/v2/models/nope/infer", &json_request(&x, false, None))
            .await
            .unwrap(),
        404,
        "unknown model",
    );
    expect(
        c.get("/v2/models/tiny/versions/9").await.unwrap(),
        404,
        "has no version 9",
    );
    expect(
        c.get("/v2/models/tiny/versions/abc/ready").await.unwrap(),
        404,
        "no version `abc`",
    );
    expect(
        c.post_json(
            "/v2/models/tiny/versions/9/infer",
            &json_request(&x, false, None),
        )
        .await
        .unwrap(),
        404,
        "no version 9",
    );
    expect(c.get("/nope").await.unwrap(), 404, "no route GET /nope");
    expect(
        c.request("DELETE", "/v2", &[], &[]).await.unwrap(),
        405,
        "not allowed",
    );

    expect(
        post_raw(&mut c, r#"{"inputs": [{"name": "features""#).await,
        400,
        "JSON",
    );
    expect(
        post_raw(&mut c, r#"{"inputs": [}"#).await,
        400,
        "malformed JSON",
    );
    expect(post_raw(&mut c, "").await, 400, "empty request body");

    let with = |f: &dyn Fn(&mut Value)| {
        let mut v = json_request(&x, false, None);
        f(&mut v);
        v
    };
    expect(
        c.post_json(
            infer,
            &with(&|v| v["inputs"][0]["datatype"] = json!("FP64")),
        )
        .await
        .unwrap(),
        400,
        "datatype FP64; expected FP32",
    );
    expect(
        c.post_json(
            infer,
            &with(&|v| v["inputs"][0]["datatype"] = json!("FLOAT")),
        )
        .await
        .unwrap(),
        400,
        "unknown datatype `FLOAT`",
    );
    expect(
        c.post_json(infer, &with(&|v| v["inputs"][0]["shape"] = json!([2, 5])))
            .await
            .unwrap(),
        400,
        "expected [-1, 10]",
    );
    expect(
        c.post_json(infer, &with(&|v| v["inputs"][0]["shape"] = json!([1, 9])))
            .await
            .unwrap(),
        400,
        "has 10 data elements but shape [1, 9] needs 9",
    );
    expect(
        c.post_json(infer, &with(&|v| v["inputs"][0]["name"] = json!("x")))
            .await
            .unwrap(),
        400,
        "unknown input `x`",
    );
    expect(
        c.post_json(infer, &with(&|v| v["inputs"][0]["data"][3] = json!(1e39)))
            .await
            .unwrap(),
        400,
        "element 3 (row 0) is inf",
    );
    expect(
        c.post_json(infer, &with(&|v| v["inputs"][0]["data"][0] = json!("a")))
            .await
            .unwrap(),
        400,
        "string elements",
    );
    expect(
        c.post_json(
            infer,
            &with(&|v| v["outputs"] = json!([{"name": "median"}])),
        )
        .await
        .unwrap(),
        400,
        "unknown output `median`",
    );
    expect(
        c.post_json(infer, &with(&|v| v["id"] = json!(5)))
            .await
            .unwrap(),
        400,
        "expected a string",
    );
    let nine = rows(9, 0);
    expect(
        c.post_json(infer, &json_request(&nine, false, None))
            .await
            .unwrap(),
        400,
        "batch size 9, more than the max_batch_size 8",
    );
    expect(
        c.post_json(infer, &json_request(&[], false, None))
            .await
            .unwrap(),
        400,
        "batch size 0",
    );

    // Binary: NaN, wrong size, missing header.
    let mut bad = x.clone();
    bad[4] = f32::NAN;
    let (body, hl) = binary_request(&bad, false);
    expect(
        post_binary(&mut c, infer, &body, &hl).await,
        400,
        "element 4 (row 0) is NaN",
    );
    bad[4] = f32::INFINITY;
    let (body, hl) = binary_request(&bad, false);
    expect(post_binary(&mut c, infer, &body, &hl).await, 400, "is inf");
    let (mut body, hl) = binary_request(&x, false);
    body.extend_from_slice(&[0, 0, 0, 0]);
    expect(
        post_binary(&mut c, infer, &body, &hl).await,
        400,
        "4 bytes after the JSON",
    );
    let (body, _) = binary_request(&x, false);
    expect(
        c.request("POST", infer, &[], &body).await.unwrap(),
        400,
        "JSON",
    );
    let (body, _) = binary_request(&x, false);
    expect(
        post_binary(&mut c, infer, &body, "99999").await,
        400,
        "Inference-Header-Content-Length is 99999",
    );

    // Body over the limit.
    let big = rows(8, 0).repeat(8);
    let r = c
        .post_json(infer, &json_request(&big[..64 * F], false, None))
        .await
        .unwrap();
    expect(r, 413, "exceeds the limit of 4096 bytes");

    // Still healthy, and failures are counted.
    let r = c
        .post_json(infer, &json_request(&x, false, None))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let text = metrics_text(&mut c).await;
    let bad_requests = sample(
        &text,
        "kiln_inference_request_failure_total{model=\"tiny\",version=\"1\",reason=\"bad_request\"}",
    )
    .unwrap();
    assert!(bad_requests >= 15.0, "{bad_requests}");
    assert!(sample(&text, "kiln_infer_responses_total{code=\"413\"}").unwrap() >= 1.0);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_batched_and_answered_exactly() {
    let repo = repository();
    let mut cfg = config(repo.path());
    // Delay semantics: a lone request waits in the queue for its batch.
    cfg.batcher.policy = BatchingPolicy::Delay;
    // Long enough that all 24 requests reach the queue within one delay even on a loaded
    // machine, so batching cannot be missed because the clients were slow to start.
    cfg.batcher.max_queue_delay = Duration::from_millis(500);
    let h = serve(cfg).await;
    let addr = h.addr;
    let n = 24;
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(tokio::spawn(async move {
            let x = rows(1 + i % 3, i as u32);
            let mut c = HttpClient::new(addr);
            let r = c
                .post_json("/v2/models/tiny/infer", &json_request(&x, false, None))
                .await
                .unwrap();
            (x, outputs(&r))
        }));
    }
    let mut p = predictor(trained());
    for t in tasks {
        let (x, (mean, std)) = t.await.unwrap();
        let want = p.predict(&x, x.len() / F).unwrap();
        // Rows computed in a shared batch equal rows computed alone.
        assert_eq!(mean, want.mean);
        assert_eq!(std, want.std);
    }
    let mut c = client(&h);
    let text = metrics_text(&mut c).await;
    let l = "model=\"tiny\",version=\"1\"";
    let rows_done = sample(&text, &format!("kiln_inference_count_total{{{l}}}")).unwrap();
    let execs = sample(&text, &format!("kiln_inference_exec_count_total{{{l}}}")).unwrap();
    assert_eq!(rows_done, (0..n).map(|i| 1 + i % 3).sum::<usize>() as f64);
    assert!(
        execs < rows_done / 2.0,
        "average batch {} rows ({rows_done} rows / {execs} batches)",
        rows_done / execs
    );
    assert_eq!(
        sample(
            &text,
            &format!("kiln_inference_queue_duration_seconds_count{{{l}}}")
        ),
        Some(n as f64)
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_batching_launches_a_lone_request_without_waiting_for_a_batch() {
    let repo = repository();
    let mut cfg = config(repo.path());
    cfg.batcher.policy = BatchingPolicy::Idle;
    // Were the delay applied, every request would queue for a whole second.
    cfg.batcher.max_queue_delay = Duration::from_secs(1);
    let h = serve(cfg).await;
    let mut c = client(&h);
    let r = c.get("/v2/models/tiny/config").await.unwrap();
    assert_eq!(r.json()["dynamic_batching"]["batching"], "idle");
    let mut p = predictor(trained());
    let n = 5;
    for i in 0..n {
        let x = rows(1 + i % 2, 40 + i as u32);
        let r = c
            .post_json("/v2/models/tiny/infer", &json_request(&x, false, None))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let (mean, _) = outputs(&r);
        assert_eq!(mean, p.predict(&x, x.len() / F).unwrap().mean);
    }
    let text = metrics_text(&mut c).await;
    let l = "model=\"tiny\",version=\"1\"";
    // One batch per request, each launched alone ...
    assert_eq!(
        sample(&text, &format!("kiln_inference_exec_count_total{{{l}}}")),
        Some(n as f64)
    );
    assert_eq!(
        sample(
            &text,
            &format!("kiln_inference_batch_size_bucket{{{l},le=\"2\"}}")
        ),
        Some(n as f64)
    );
    // ... and measured server-side, none waited anywhere near the delay.
    assert_eq!(
        sample(
            &text,
            &format!("kiln_inference_queue_duration_seconds_bucket{{{l},le=\"0.1\"}}")
        ),
        Some(n as f64)
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_launches_when_full_or_when_its_oldest_request_has_waited() {
    let repo = repository();
    let mut cfg = config(repo.path());
    // Delay semantics: a lone request waits in the queue for its batch.
    cfg.batcher.policy = BatchingPolicy::Delay;
    cfg.batcher.max_batch_size = 8;
    // A delay far above scheduling noise on a loaded machine: a lone request must take at
    // least this long, and a full batch must come back well before it.
    let delay = Duration::from_millis(1000);
    cfg.batcher.max_queue_delay = delay;
    let h = serve(cfg).await;
    let mut c = client(&h);
    // A lone request waits at least the delay (its batch of one is counted below).
    let t0 = Instant::now();
    let r = c
        .post_json(
            "/v2/models/tiny/infer",
            &json_request(&rows(1, 0), false, None),
        )
        .await
        .unwrap();
    let waited = t0.elapsed();
    assert_eq!(r.status, 200);
    assert!(waited >= delay, "{waited:?}");
    // The oldest request sets the launch: a second request queued behind it shares its
    // batch (one batch of 2 rows) and so waits less than the delay.
    let addr = h.addr;
    let first = tokio::spawn(async move {
        let t = Instant::now();
        let r = HttpClient::new(addr)
            .post_json(
                "/v2/models/tiny/infer",
                &json_request(&rows(1, 1), false, None),
            )
            .await
            .unwrap();
        (r.status, t.elapsed())
    });
    poll_until(
        "the first request is queued",
        Duration::from_secs(60),
        || queued(&h, "tiny") == 1,
    )
    .await;
    let t1 = Instant::now();
    let r = c
        .post_json(
            "/v2/models/tiny/infer",
            &json_request(&rows(1, 2), false, None),
        )
        .await
        .unwrap();
    let second = t1.elapsed();
    assert_eq!(r.status, 200);
    let (status, first) = first.await.unwrap();
    assert_eq!(status, 200);
    assert!(first >= delay, "the oldest request waited only {first:?}");
    assert!(
        second < first,
        "the second request ({second:?}) did not ride with the oldest ({first:?})"
    );
    let text = metrics_text(&mut c).await;
    let l = "model=\"tiny\",version=\"1\"";
    assert_eq!(
        sample(&text, &format!("kiln_inference_exec_count_total{{{l}}}")),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            &format!("kiln_inference_batch_size_bucket{{{l},le=\"1\"}}")
        ),
        Some(1.0),
        "the two requests were not one batch"
    );
    // A full batch does not wait: the server's own queue time for it (the statistics
    // extension's cumulative queue ns) stays far below the delay.
    let queue_ns = |v: serde_json::Value| {
        v["model_stats"][0]["inference_stats"]["queue"]["ns"]
            .as_u64()
            .unwrap_or_else(|| panic!("no queue ns in {v}"))
    };
    let stats = "/v2/models/tiny/versions/1/stats";
    let before = queue_ns(c.get(stats).await.unwrap().json());
    let r = c
        .post_json(
            "/v2/models/tiny/infer",
            &json_request(&rows(8, 0), false, None),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let waited_ns = queue_ns(c.get(stats).await.unwrap().json()) - before;
    assert!(
        u128::from(waited_ns) < delay.as_nanos() / 2,
        "a full batch sat in the queue {waited_ns} ns"
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_loads_new_versions_and_unloads_removed_models() {
    let repo = repository();
    copy_dir(trained(), &repo.path().join("other").join("3"));
    let mut cfg = config(repo.path());
    cfg.poll_interval = Some(Duration::from_millis(50));
    let h = serve(cfg).await;
    let mut c = client(&h);
    export_variant(&repo.path().join("tiny").join("2"), 0.3);
    std::fs::remove_dir_all(repo.path().join("other")).unwrap();
    let t0 = Instant::now();
    loop {
        let v = c.get("/v2/models/tiny").await.unwrap().json();
        let other = c.get("/v2/models/other").await.unwrap().status;
        if v["versions"] == json!(["2"]) && other == 404 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not reloaded: {v}, other: {other}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_503_at_once_and_timeouts_answer_503() {
    let repo = repository();
    let mut cfg = config(repo.path());
    // Delay semantics: a lone request waits in the queue for its batch.
    cfg.batcher.policy = BatchingPolicy::Delay;
    cfg.batcher.max_queue_size = 2;
    // The queued requests wait this long; the refusal must come before they are served.
    let delay = Duration::from_millis(2000);
    cfg.batcher.max_queue_delay = delay;
    let h = serve(cfg).await;
    let addr = h.addr;
    let x = rows(1, 3);
    let body = json_request(&x, false, None);
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move {
                HttpClient::new(addr)
                    .post_json("/v2/models/tiny/infer", &body)
                    .await
                    .unwrap()
            })
        })
        .collect();
    poll_until("two requests are queued", Duration::from_secs(60), || {
        queued(&h, "tiny") == 2
    })
    .await;
    let text = metrics_text(&mut client(&h)).await;
    assert_eq!(sample(&text, "kiln_queue_depth{model=\"tiny\"}"), Some(2.0));
    let t0 = Instant::now();
    let r = client(&h)
        .post_json("/v2/models/tiny/infer", &body)
        .await
        .unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("queue of model `tiny` is full")
    );
    // Refused at once: before the queued requests were served (they wait the delay).
    assert!(
        waiting.iter().all(|w| !w.is_finished()) && queued(&h, "tiny") == 2,
        "refused only after {:?}, when the queue had been served",
        t0.elapsed()
    );
    for w in waiting {
        assert_eq!(w.await.unwrap().status, 200);
    }
    let text = metrics_text(&mut client(&h)).await;
    assert_eq!(
        sample(
            &text,
            "kiln_inference_request_failure_total{model=\"tiny\",version=\"1\",reason=\"queue_full\"}"
        ),
        Some(1.0)
    );
    h.shutdown().await.unwrap();

    // A request that cannot be answered within its deadline gets 503.
    // The batch would launch only after the delay; the deadline comes first.
    let mut cfg = config(repo.path());
    // Delay semantics: a lone request waits in the queue for its batch.
    cfg.batcher.policy = BatchingPolicy::Delay;
    let delay = Duration::from_millis(3000);
    let timeout = Duration::from_millis(100);
    cfg.batcher.max_queue_delay = delay;
    cfg.request_timeout = timeout;
    let h = serve(cfg).await;
    let t0 = Instant::now();
    let r = client(&h)
        .post_json("/v2/models/tiny/infer", &body)
        .await
        .unwrap();
    let took = t0.elapsed();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("timed out"));
    assert!(
        took >= timeout,
        "answered after {took:?}: before the {timeout:?} deadline"
    );
    // Answered at its deadline, not when its batch was due, and taken out of the queue
    // (never computed).
    assert!(
        took < delay,
        "answered after {took:?}, when its batch was due"
    );
    let t1 = Instant::now();
    while queued(&h, "tiny") != 0 {
        assert!(
            t1.elapsed() < Duration::from_secs(2),
            "the expired request is still queued"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let text = metrics_text(&mut client(&h)).await;
    assert_eq!(
        sample(
            &text,
            "kiln_inference_request_failure_total{model=\"tiny\",version=\"1\",reason=\"timeout\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "kiln_inference_request_dropped_total{model=\"tiny\",version=\"1\",reason=\"deadline\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "kiln_inference_count_total{model=\"tiny\",version=\"1\"}"
        ),
        Some(0.0)
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_swap_under_load_fails_no_request() {
    let repo = repository();
    let mut cfg = config(repo.path());
    cfg.batcher.instances = 2;
    let h = serve(cfg).await;
    let addr = h.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..4u32 {
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = HttpClient::new(addr);
            let x = rows(2, i);
            let body = json_request(&x, false, None);
            let mut seen = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let r = c.post_json("/v2/models/tiny/infer", &body).await.unwrap();
                let v = r.json();
                seen.push((
                    r.status,
                    v["model_version"].as_str().unwrap_or("?").to_string(),
                    outputs_if_ok(&r),
                ));
            }
            (x, seen)
        }));
    }
    // Swap once the load is running on version 1, stop once version 2 has served some.
    let metrics = h.metrics().clone();
    poll_until(
        "version 1 answers under load",
        Duration::from_secs(30),
        || answered(&metrics, "tiny", 1) >= 20,
    )
    .await;
    export_variant(&repo.path().join("tiny").join("2"), 0.25);
    let report = h.reload().await;
    assert_eq!(report.loaded, vec![("tiny".to_string(), 2)], "{report:?}");
    poll_until(
        "version 2 answers under load",
        Duration::from_secs(30),
        || answered(&metrics, "tiny", 2) >= 20,
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut p1 = predictor(trained());
    let mut p2 = predictor(&repo.path().join("tiny").join("2"));
    let (mut v1, mut v2) = (0, 0);
    for t in tasks {
        let (x, seen) = t.await.unwrap();
        for (status, version, out) in seen {
            assert_eq!(status, 200, "a request failed during the swap");
            let p = if version == "1" {
                v1 += 1;
                &mut p1
            } else {
                v2 += 1;
                &mut p2
            };
            let want = p.predict(&x, 2).unwrap();
            assert_eq!(out.unwrap(), (want.mean, want.std), "version {version}");
        }
    }
    assert!(v1 > 0 && v2 > 0, "answers from v1: {v1}, v2: {v2}");
    let text = metrics_text(&mut client(&h)).await;
    assert_eq!(
        sample(&text, "kiln_model_loaded_version{model=\"tiny\"}"),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "kiln_model_reloads_total{model=\"tiny\"}"),
        Some(2.0)
    );
    h.shutdown().await.unwrap();
}

async fn post_raw(c: &mut HttpClient, body: &str) -> HttpResponse {
    c.request(
        "POST",
        "/v2/models/tiny/infer",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
    .await
    .unwrap()
}

fn outputs_if_ok(r: &HttpResponse) -> Option<(Vec<f32>, Vec<f32>)> {
    (r.status == 200).then(|| outputs(r))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_on_the_old_version() {
    let repo = repository();
    let mut cfg = config(repo.path());
    // Delay semantics: a lone request waits in the queue for its batch.
    cfg.batcher.policy = BatchingPolicy::Delay;
    cfg.batcher.max_queue_delay = Duration::from_millis(700);
    let h = serve(cfg).await;
    let addr = h.addr;
    let x = rows(1, 9);
    let body = json_request(&x, false, None);
    let b = body.clone();
    let in_flight = tokio::spawn(async move {
        HttpClient::new(addr)
            .post_json("/v2/models/tiny/infer", &b)
            .await
            .unwrap()
    });
    poll_until("the request is queued", Duration::from_millis(600), || {
        queued(&h, "tiny") == 1
    })
    .await;
    export_variant(&repo.path().join("tiny").join("2"), 0.5);
    let report = h.reload().await;
    assert_eq!(report.loaded, vec![("tiny".to_string(), 2)]);
    let old = in_flight.await.unwrap();
    assert_eq!(old.json()["model_version"], "1");
    assert_eq!(
        outputs(&old).0,
        predictor(trained()).predict(&x, 1).unwrap().mean
    );
    let new = client(&h)
        .post_json("/v2/models/tiny/infer", &body)
        .await
        .unwrap();
    assert_eq!(new.json()["model_version"], "2");
    // The old version is no longer addressable; the new one is.
    assert_eq!(
        client(&h)
            .get("/v2/models/tiny/versions/1")
            .await
            .unwrap()
            .status,
        404
    );
    assert_eq!(
        client(&h)
            .get("/v2/models/tiny/versions/2/ready")
            .await
            .unwrap()
            .status,
        200
    );
    h.shutdown().await.unwrap();
}

fn set_manifest(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join(MANIFEST_FILE);
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut m);
    std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_versions_are_rejected_and_the_old_one_keeps_serving() {
    let repo = repository();
    let h = serve(config(repo.path())).await;
    let tiny = repo.path().join("tiny");
    let x = rows(3, 4);
    let want = predictor(trained()).predict(&x, 3).unwrap();

    // 2: a flipped byte (hash mismatch); 3: truncated weights with a matching hash (corrupt
    // file); 4: wrong architecture; 5: no manifest; 6: a manifest that does not parse.
    copy_dir(trained(), &tiny.join("2"));
    let w = tiny.join("2").join(WEIGHTS_FILE);
    let mut bytes = std::fs::read(&w).unwrap();
    let n = bytes.len();
    bytes[n - 5] ^= 0x40;
    std::fs::write(&w, &bytes).unwrap();
    copy_dir(trained(), &tiny.join("3"));
    let w = tiny.join("3").join(WEIGHTS_FILE);
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let sha = kiln::data::dataset::sha256_hex(&bytes[..bytes.len() / 2]);
    set_manifest(&tiny.join("3"), |m| m["weights"]["sha256"] = json!(sha));
    copy_dir(trained(), &tiny.join("4"));
    set_manifest(&tiny.join("4"), |m| {
        m["architecture"]["hidden"] = json!([8])
    });
    copy_dir(trained(), &tiny.join("5"));
    std::fs::remove_file(tiny.join("5").join(MANIFEST_FILE)).unwrap();
    copy_dir(trained(), &tiny.join("6"));
    std::fs::write(tiny.join("6").join(MANIFEST_FILE), "{\"format\": ").unwrap();

    let report = h.reload().await;
    assert!(report.loaded.is_empty(), "{report:?}");
    let failed: Vec<(u64, &str)> = report
        .failed
        .iter()
        .map(|(_, v, e)| (*v, e.as_str()))
        .collect();
    assert_eq!(failed.len(), 5, "{failed:?}");
    for (v, needle) in [
        (6, "invalid manifest"),
        (5, "is not a kiln checkpoint"),
        (4, "architecture mismatch"),
        (3, "invalid safetensors"),
        (2, "SHA-256 mismatch"),
    ] {
        let e = failed
            .iter()
            .find(|f| f.0 == v)
            .unwrap_or_else(|| panic!("version {v} not rejected"));
        assert!(e.1.contains(needle), "version {v}: {}", e.1);
    }
    let mut c = client(&h);
    let r = c
        .post_json("/v2/models/tiny/infer", &json_request(&x, false, None))
        .await
        .unwrap();
    assert_eq!(r.json()["model_version"], "1");
    assert_eq!(outputs(&r), (want.mean.clone(), want.std.clone()));
    assert_eq!(c.get("/v2/health/ready").await.unwrap().status, 200);
    let r = c.get("/v2/models/tiny/versions/6/ready").await.unwrap();
    assert_eq!((r.status, r.json()["ready"].clone()), (503, json!(false)));
    let text = metrics_text(&mut c).await;
    assert_eq!(
        sample(&text, "kiln_model_reload_failures_total{model=\"tiny\"}"),
        Some(5.0)
    );
    assert_eq!(
        sample(&text, "kiln_model_loaded_version{model=\"tiny\"}"),
        Some(1.0)
    );

    // Unchanged broken versions are not retried; a repaired one is picked up.
    let report = h.reload().await;
    assert!(
        report.failed.is_empty() && report.loaded.is_empty(),
        "{report:?}"
    );
    std::fs::remove_dir_all(tiny.join("6")).unwrap();
    export_variant(&tiny.join("6"), 0.1);
    let report = h.reload().await;
    assert_eq!(report.loaded, vec![("tiny".to_string(), 6)], "{report:?}");
    let r = c
        .post_json("/v2/models/tiny/infer", &json_request(&x, false, None))
        .await
        .unwrap();
    assert_eq!(r.json()["model_version"], "6");
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_loadable_version_is_not_ready() {
    let repo = repository();
    let broken = repo.path().join("broken").join("1");
    copy_dir(trained(), &broken);
    std::fs::remove_file(broken.join(WEIGHTS_FILE)).unwrap();
    let h = kiln::serve::start(config(repo.path())).await.unwrap();
    let mut c = client(&h);
    // The good model becomes ready; the server does not (strict readiness).
    let t0 = Instant::now();
    while c.get("/v2/models/tiny/ready").await.unwrap().status != 200 {
        assert!(t0.elapsed() < Duration::from_secs(20));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = c.get("/v2/health/ready").await.unwrap();
    assert_eq!((r.status, r.json()["ready"].clone()), (503, json!(false)));
    let r = c.get("/v2/models/broken/ready").await.unwrap();
    assert_eq!(r.status, 503);
    let r = c
        .post_json(
            "/v2/models/broken/infer",
            &json_request(&rows(1, 0), false, None),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 503);
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        e.contains("model `broken` is not ready") && e.contains("model.safetensors"),
        "{e}"
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_requests_in_flight() {
    let repo = repository();
    let mut cfg = config(repo.path());
    // Delay semantics: a lone request waits in the queue for its batch.
    cfg.batcher.policy = BatchingPolicy::Delay;
    let delay = Duration::from_millis(400);
    cfg.batcher.max_queue_delay = delay;
    let h = serve(cfg).await;
    let addr = h.addr;
    let metrics = h.metrics().clone();
    let x = rows(1, 5);
    let want = predictor(trained()).predict(&x, 1).unwrap();
    let body = json_request(&x, false, None);
    let sent = Instant::now();
    let in_flight: Vec<_> = (0..3)
        .map(|_| {
            let b = body.clone();
            tokio::spawn(async move {
                HttpClient::new(addr)
                    .post_json("/v2/models/tiny/infer", &b)
                    .await
            })
        })
        .collect();
    poll_until("three requests are queued", Duration::from_secs(10), || {
        queued(&h, "tiny") == 3
    })
    .await;
    assert_eq!(answered(&metrics, "tiny", 1), 0);
    h.shutdown().await.unwrap();
    // Shutdown returned only after the queued batch was due and its requests answered.
    assert!(
        sent.elapsed() >= delay,
        "shutdown did not wait: {:?}",
        sent.elapsed()
    );
    assert_eq!(answered(&metrics, "tiny", 1), 3, "shutdown did not wait");
    for r in in_flight {
        let r = r
            .await
            .unwrap()
            .expect("answered before the connection closed");
        assert_eq!(outputs(&r).0, want.mean);
    }
    assert!(
        HttpClient::new(addr).get("/v2/health/live").await.is_err(),
        "still accepting after shutdown"
    );
}

/// `kiln serve` as a process: SIGTERM drains the request in flight and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_exits_zero() {
    let repo = repository();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(["serve", "--repository"]).arg(repo.path()).args([
        "--port",
        "0",
        "--grpc-port",
        "0",
        "--engine",
        ENGINE,
        "--batching",
        "delay",
        "--max-queue-delay-us",
        "400000",
        "--instances",
        "1",
        "--poll-interval-ms",
        "0",
    ]);
    let mut child = cmd
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = crate::common::printed_addrs(child.stderr.take().unwrap())
        .recv_timeout(Duration::from_secs(120))
        .expect("kiln serve printed its address");
    let mut c = HttpClient::new(addr);
    let t0 = Instant::now();
    while c
        .get("/v2/health/ready")
        .await
        .map(|r| r.status)
        .unwrap_or(0)
        != 200
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "not ready after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SIGHUP reloads: a new version appears and is served.
    export_variant(&repo.path().join("tiny").join("2"), 0.2);
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
    let t0 = Instant::now();
    while c.get("/v2/models/tiny").await.unwrap().json()["versions"] != json!(["2"]) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "SIGHUP did not reload"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let x = rows(1, 6);
    let body = json_request(&x, false, None);
    let sent = Instant::now();
    let req = tokio::spawn(async move {
        HttpClient::new(addr)
            .post_json("/v2/models/tiny/infer", &body)
            .await
    });
    // SIGTERM once the request is queued (its batch is due 400 ms after it arrived).
    let t0 = Instant::now();
    while sample(
        &metrics_text(&mut c).await,
        "kiln_queue_depth{model=\"tiny\"}",
    ) != Some(1.0)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the request was not queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let r = req.await.unwrap().expect("in-flight request answered");
    assert_eq!(r.status, 200);
    let v2 = repo.path().join("tiny").join("2");
    assert_eq!(outputs(&r).0, predictor(&v2).predict(&x, 1).unwrap().mean);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM");
    // The request was queued when SIGTERM came; it was answered when its batch was due.
    assert!(
        sent.elapsed() >= Duration::from_millis(400),
        "exited without waiting for the request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_model_answers_p_of_all_legs() {
    use kiln::model::mvn::{HaltonMvnCdfConfig, Leg, PickCorrelation, Side, pick_probabilities};
    let repo = repository();
    let pick = repo.path().join("pick").join("1");
    std::fs::create_dir_all(&pick).unwrap();
    std::fs::write(
        pick.join("pick.json"),
        serde_json::to_vec(&json!({"kind": "pick", "checkpoint": "../../tiny/1", "points": 1024}))
            .unwrap(),
    )
    .unwrap();
    let h = serve(config(repo.path())).await;
    let mut c = client(&h);
    let meta = c.get("/v2/models/pick").await.unwrap().json();
    assert_eq!(meta["inputs"].as_array().unwrap().len(), 6);
    assert_eq!(meta["outputs"][0]["name"], "p");

    // Two picks of three legs: mean, std, line, over, target, group.
    let mean = [0.03, 0.08, 0.2, 0.04, 0.09, 0.18];
    let std = [0.01, 0.02, 0.04, 0.015, 0.02, 0.05];
    let line = [0.025, 0.07, 0.22, 0.03, 0.1, 0.2];
    let over = [true, true, false, true, false, true];
    let target = [0, 1, 2, 0, 1, 2];
    let group = [0, 0, 0, 0, 1, 1];
    let req = json!({"id": "p1", "inputs": [
        {"name": "mean", "datatype": "FP64", "shape": [2, 3], "data": mean},
        {"name": "std", "datatype": "FP64", "shape": [2, 3], "data": std},
        {"name": "line", "datatype": "FP64", "shape": [2, 3], "data": line},
        {"name": "over", "datatype": "BOOL", "shape": [2, 3], "data": over},
        {"name": "target", "datatype": "INT32", "shape": [2, 3], "data": target},
        {"name": "group", "datatype": "INT32", "shape": [2, 3], "data": group},
    ]});
    let r = c.post_json("/v2/models/pick/infer", &req).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let p: Vec<f64> = v["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();

    let ckpt = Checkpoint::load(trained()).unwrap();
    let corr = PickCorrelation {
        targets: 3,
        target_corr: ckpt
            .manifest
            .residual_correlation
            .iter()
            .flatten()
            .copied()
            .collect(),
        cross_row_corr: None,
    };
    let mvn = HaltonMvnCdfConfig::new()
        .with_points(1024)
        .init::<kiln::backend::Cpu>(&Default::default())
        .unwrap();
    let legs: Vec<Vec<Leg>> = (0..2)
        .map(|i| {
            (0..3)
                .map(|j| {
                    let k = i * 3 + j;
                    Leg {
                        group: group[k].to_string(),
                        target: target[k],
                        mean: mean[k],
                        std: std[k],
                        line: line[k],
                        side: if over[k] { Side::Over } else { Side::Under },
                    }
                })
                .collect()
        })
        .collect();
    let refs: Vec<&[Leg]> = legs.iter().map(|l| l.as_slice()).collect();
    let want = pick_probabilities(&mvn, &refs, &corr).unwrap();
    assert_eq!(p, want.iter().map(|w| w.p).collect::<Vec<_>>());
    assert!(p.iter().all(|p| (0.0..=1.0).contains(p)));

    // A leg with a negative std is a 400 naming the pick and the leg.
    let mut bad = req.clone();
    bad["inputs"][1]["data"][4] = json!(-1.0);
    let r = c.post_json("/v2/models/pick/infer", &bad).await.unwrap();
    assert_eq!(r.status, 400);
    let e = r.json()["error"].as_str().unwrap().to_string();
    assert!(e.contains("pick 1") && e.contains("std"), "{e}");
    h.shutdown().await.unwrap();
}

/// A pick model whose legs carry rows of features answers as `kiln pick` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pick_model_from_features_equals_kiln_pick() {
    use kiln::model::mvn::{HaltonMvnCdfConfig, Side};
    use kiln::pick::{LegSpec, correlation, evaluate};
    use std::collections::BTreeMap;
    let repo = repository();
    let pick = repo.path().join("pickf").join("1");
    std::fs::create_dir_all(&pick).unwrap();
    let cfg = json!({"kind": "pick", "checkpoint": "../../tiny/1", "points": 1024, "legs_from": "features"});
    std::fs::write(pick.join("pick.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
    let h = serve(config(repo.path())).await;
    let mut c = client(&h);
    let meta = c.get("/v2/models/pickf").await.unwrap().json();
    assert_eq!(meta["inputs"][0]["shape"], json!([-1, -1, F]));

    // Pick "a": two legs on row r0 (correlated) and one on r1; pick "b": r2 and r1.
    let x = rows(3, 21);
    let row = |i: usize| x[i * F..(i + 1) * F].to_vec();
    let legs = [
        ("a", 0, 0, 0.03, Side::Over),
        ("a", 0, 2, 0.2, Side::Under),
        ("a", 1, 1, 0.08, Side::Over),
        ("b", 2, 0, 0.02, Side::Over),
        ("b", 1, 2, 0.15, Side::Over),
    ];
    let mut features = Vec::new();
    for (_, r, ..) in &legs[..3] {
        features.extend(row(*r));
    }
    // Pad pick "b" to three legs with a leg that always hits (line far below, over).
    for (_, r, ..) in &legs[3..] {
        features.extend(row(*r));
    }
    features.extend(row(2));
    let target = [0, 2, 1, 0, 2, 1];
    let line = [0.03, 0.2, 0.08, 0.02, 0.15, -1e6];
    let over = [true, false, true, true, true, true];
    let req = json!({"inputs": [
        {"name": "features", "datatype": "FP32", "shape": [2, 3, F], "data": features},
        {"name": "target", "datatype": "INT32", "shape": [2, 3], "data": target},
        {"name": "line", "datatype": "FP64", "shape": [2, 3], "data": line},
        {"name": "over", "datatype": "BOOL", "shape": [2, 3], "data": over},
    ]});
    let r = c.post_json("/v2/models/pickf/infer", &req).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let p: Vec<f64> = r.json()["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();

    let ckpt = Checkpoint::load(trained()).unwrap();
    let mvn = HaltonMvnCdfConfig::new()
        .with_points(1024)
        .init::<kiln::backend::Cpu>(&Default::default())
        .unwrap();
    let rows_map: BTreeMap<String, Vec<f32>> = (0..3).map(|i| (format!("r{i}"), row(i))).collect();
    let mut specs: Vec<LegSpec> = legs
        .iter()
        .map(|(pick, r, t, line, side)| LegSpec {
            pick: pick.to_string(),
            row: format!("r{r}"),
            target: *t,
            line: *line,
            side: *side,
        })
        .collect();
    specs.push(LegSpec {
        pick: "b".into(),
        row: "r2".into(),
        target: 1,
        line: -1e6,
        side: Side::Over,
    });
    let want = evaluate(
        &mut predictor(trained()),
        &mvn,
        &correlation(&ckpt.manifest, None),
        &rows_map,
        &specs,
    )
    .unwrap();
    assert_eq!(want.len(), 2);
    for (i, (name, w)) in want.iter().enumerate() {
        assert!(
            (p[i] - w.p).abs() < 1e-12,
            "pick {name}: server {} vs kiln pick {}",
            p[i],
            w.p
        );
    }
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_reports_throughput_and_refuses_other_hosts() {
    use kiln::loadgen::loadtest::{LoadtestConfig, run_loadtest};
    let repo = repository();
    let h = serve(config(repo.path())).await;
    let mut cfg = LoadtestConfig {
        url: format!("http://{}", h.addr),
        model: "tiny".into(),
        rps: 300.0,
        duration: Duration::from_millis(400),
        concurrency: 4,
        batch: 2,
        binary: false,
        max_requests: 10_000,
        timeout: Duration::from_secs(5),
    };
    let r = run_loadtest(&cfg).await.unwrap();
    assert_eq!(r.mode, "open");
    assert_eq!(r.requests, 120);
    assert_eq!(r.ok, 120, "{r:?}");
    assert!(r.errors.is_empty(), "{r:?}");
    assert!(r.latency_ms.p50 > 0.0 && r.latency_ms.p50 <= r.latency_ms.p99);
    let json = serde_json::to_value(&r).unwrap();
    for k in ["achieved_rps", "latency_ms", "errors", "rows_per_s"] {
        assert!(json.get(k).is_some(), "{k}");
    }
    cfg.rps = 0.0;
    cfg.binary = true;
    cfg.max_requests = 50;
    let r = run_loadtest(&cfg).await.unwrap();
    assert_eq!((r.mode.as_str(), r.ok), ("closed", 50), "{r:?}");

    // Errors are counted by status: an unknown model is refused before any load is sent.
    cfg.model = "nope".into();
    let e = run_loadtest(&cfg).await.unwrap_err().to_string();
    assert!(e.contains("404"), "{e}");
    cfg.url = "http://192.168.1.1:8000".into();
    let e = run_loadtest(&cfg).await.unwrap_err().to_string();
    assert!(e.contains("not a loopback"), "{e}");
    h.shutdown().await.unwrap();
}

/// `--duration` bounds the run (issue 16): against a server slower than the target rate,
/// requests that come due while every connection is busy are not sent after the deadline,
/// so the run ends about when it should instead of working off the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_stops_sending_at_the_deadline() {
    use kiln::loadgen::loadtest::{LoadtestConfig, run_loadtest};
    let repo = repository();
    let mut cfg = config(repo.path());
    // Each batch waits 100 ms for more rows: two connections get about 20 answers a second.
    cfg.batcher.policy = BatchingPolicy::Delay;
    cfg.batcher.max_queue_delay = Duration::from_millis(100);
    let h = serve(cfg).await;
    let lt = LoadtestConfig {
        url: format!("http://{}", h.addr),
        model: "tiny".into(),
        rps: 200.0,
        duration: Duration::from_secs(1),
        concurrency: 2,
        batch: 1,
        binary: false,
        max_requests: 10_000,
        timeout: Duration::from_secs(5),
    };
    let r = run_loadtest(&lt).await.unwrap();
    // 200 requests came due; the rest could not be sent before the deadline.
    assert_eq!(r.requests + r.unsent, 200, "{r:?}");
    assert!(r.requests < 60 && r.unsent > 100, "{r:?}");
    assert_eq!(r.ok, r.requests, "{r:?}");
    // Sending stopped at the duration (sending all 200 at 20 a second would take 10 s).
    assert!(r.last_send_s <= 1.0, "{r:?}");
    h.shutdown().await.unwrap();
}

#[test]
fn bench_serve_reports_every_series_as_json() {
    let repo = repository();
    let pick = repo.path().join("pick").join("1");
    std::fs::create_dir_all(&pick).unwrap();
    std::fs::write(
        pick.join("pick.json"),
        serde_json::to_vec(&json!({"kind": "pick", "checkpoint": "../../tiny/1", "points": 256}))
            .unwrap(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["bench", "serve", "--repository"])
        .arg(repo.path())
        .args([
            "--model",
            "tiny",
            "--pick-model",
            "pick",
            "--engine",
            ENGINE,
            "--requests",
            "8",
            "--rounds",
            "2",
            "--connections",
            "2",
            "--closed-seconds",
            "0.3",
            "--fractions",
            "0.5,0.7",
            "--sweep-seconds",
            "0.2",
            "--stage-iters",
            "3",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["bench"], "serve");
    assert_eq!(r["batching"]["policy"], "idle");
    let names: Vec<&str> = r["round_trips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "health",
            "infer_json_b1",
            "infer_binary_b1",
            "infer_json_b64",
            "infer_binary_b64",
            "pick_json_b1"
        ]
    );
    for t in r["round_trips"].as_array().unwrap() {
        assert_eq!(t["us"]["n"], 8, "{t}");
        let (p50, p99) = (
            t["us"]["p50"].as_f64().unwrap(),
            t["us"]["p99"].as_f64().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{t}");
        assert!(t["minus_health_p50_us"].is_number(), "{t}");
    }
    assert!(r["closed_loop_rps"].as_f64().unwrap() > 0.0);
    let sweep = r["open_loop"].as_array().unwrap();
    assert_eq!(sweep.len(), 2);
    assert_eq!(sweep[1]["fraction"], 0.7);
    assert!(sweep[1]["service_p99_ms"].is_number());
    let stages: Vec<&str> = r["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["request"].as_str().unwrap())
        .collect();
    assert_eq!(
        stages,
        [
            "json_b1",
            "binary_b1",
            "json_b64",
            "binary_b64",
            "pick_json_b1"
        ]
    );
    // Both JSON readers are timed on every body, in the same run.
    for st in r["stages"].as_array().unwrap() {
        for k in [
            "parse_us",
            "parse_serde_us",
            "decode_us",
            "batcher_us",
            "encode_us",
        ] {
            assert!(st[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {st}");
        }
    }
    assert!(r["pinning"]["applied"].is_boolean());
    assert!(!r["pinning"]["note"].as_str().unwrap().is_empty());
    // The on/off costs of the drift watch and tracing: every configuration on every series,
    // against the `off` server of the same run.
    let costs = r["watch_costs"].as_array().unwrap();
    let configs: std::collections::BTreeSet<&str> = costs
        .iter()
        .map(|c| c["config"].as_str().unwrap())
        .collect();
    assert_eq!(
        configs.into_iter().collect::<Vec<_>>(),
        [
            "drift",
            "drift+trace_sampled",
            "off",
            "trace_sampled",
            "trace_unsampled"
        ]
    );
    assert_eq!(costs.len(), 5 * 4);
    for c in costs {
        assert_eq!(c["us"]["n"], 8, "{c}");
        assert!(c["us"]["p50"].as_f64().unwrap() > 0.0, "{c}");
        if c["config"] == "off" {
            assert_eq!(c["ratio_p50"], 1.0, "{c}");
            assert_eq!(c["delta_p50_us"], 0.0, "{c}");
        }
    }
}
