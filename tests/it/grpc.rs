//! The KServe v2 gRPC endpoint end to end: a tiny model trained in-process, served with
//! `grpc_port: Some(0)` beside HTTP, and exercised with a Rust client generated from the same
//! `proto/grpc_predict_v2.proto` (`kiln::serve::grpc::proto`): every RPC, the status codes of
//! every error class, gRPC and HTTP answers bit-identical for the same inputs (raw and typed
//! contents), shared metrics, graceful shutdown; and, when `KILN_TEST_TRITON_PYTHON` names a
//! Python with `tritonclient[grpc,http]` (`.ci/triton.sh`), tritonclient.grpc answers equal
//! tritonclient.http answers against a live server.

use crate::common::copy_dir;
use crate::common::trained;

use std::path::Path;
use std::time::{Duration, Instant};

use kiln::artifact::WEIGHTS_FILE;
use kiln::loadgen::client::{HttpClient, HttpResponse};
use kiln::serve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use kiln::serve::grpc::proto::{self as pb, model_infer_request as mir};
use kiln::serve::metrics::sample;
use kiln::serve::protocol::{OutputData, decode_response};
use kiln::serve::{BatchingPolicy, ServeConfig, ServerHandle};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

const F: usize = 10;

fn config(repo: &Path) -> ServeConfig {
    ServeConfig {
        max_body_bytes: 1 << 20,
        grpc_port: Some(0),
        ..crate::common::serve_config(repo, "burn")
    }
}

use crate::common::serve;

async fn grpc(h: &ServerHandle) -> GrpcInferenceServiceClient<Channel> {
    let addr = h.grpc_addr.expect("gRPC is on");
    GrpcInferenceServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("gRPC connects")
}

fn http(h: &ServerHandle) -> HttpClient {
    HttpClient::new(h.addr).with_timeout(Duration::from_secs(20))
}

/// `n` deterministic rows around the training means.
fn rows(n: usize, seed: u32) -> Vec<f32> {
    crate::common::rows_around_means(trained(), n, seed)
}

fn le(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn input(n: usize) -> mir::InferInputTensor {
    mir::InferInputTensor {
        name: "features".into(),
        datatype: "FP32".into(),
        shape: vec![n as i64, F as i64],
        ..Default::default()
    }
}

/// A raw-contents request.
fn raw_request(x: &[f32]) -> pb::ModelInferRequest {
    pb::ModelInferRequest {
        model_name: "tiny".into(),
        id: "r1".into(),
        inputs: vec![input(x.len() / F)],
        raw_input_contents: vec![le(x).into()],
        ..Default::default()
    }
}

/// A typed-contents request asking for typed outputs.
fn typed_request(x: &[f32]) -> pb::ModelInferRequest {
    let mut inp = input(x.len() / F);
    inp.contents = Some(pb::InferTensorContents {
        fp32_contents: x.to_vec(),
        ..Default::default()
    });
    let mut parameters = std::collections::HashMap::new();
    parameters.insert(
        "binary_data_output".to_string(),
        pb::InferParameter {
            parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(false)),
        },
    );
    pb::ModelInferRequest {
        model_name: "tiny".into(),
        inputs: vec![inp],
        parameters,
        ..Default::default()
    }
}

/// The HTTP answer's outputs as (name, shape, little-endian bytes), in answer order.
fn http_outputs(r: &HttpResponse) -> Vec<(String, Vec<i64>, Vec<u8>)> {
    assert_eq!(r.status, 200, "{}", r.text());
    let hl = r
        .header("inference-header-content-length")
        .map(|v| v.parse().unwrap());
    let (_, outs) = decode_response(&r.body, hl).unwrap();
    outs.into_iter()
        .map(|(name, shape, data)| {
            let bytes = match data {
                OutputData::F32(v) => le(&v),
                other => panic!("{other:?}"),
            };
            (name, shape.iter().map(|&d| d as i64).collect(), bytes)
        })
        .collect()
}

/// The gRPC answer's outputs as (name, shape, little-endian bytes), raw or typed.
fn grpc_outputs(r: &pb::ModelInferResponse) -> Vec<(String, Vec<i64>, Vec<u8>)> {
    r.outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            assert_eq!(o.datatype, "FP32");
            let bytes = match &o.contents {
                Some(c) => le(&c.fp32_contents),
                None => r.raw_output_contents[i].to_vec(),
            };
            (o.name.clone(), o.shape.clone(), bytes)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_like_its_http_route() {
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut g = grpc(&h).await;
    let mut c = http(&h);

    let live = g.server_live(pb::ServerLiveRequest {}).await.unwrap();
    assert!(live.into_inner().live);
    let ready = g.server_ready(pb::ServerReadyRequest {}).await.unwrap();
    assert!(ready.into_inner().ready);
    let mr = |name: &str, version: &str| pb::ModelReadyRequest {
        name: name.into(),
        version: version.into(),
    };
    assert!(
        g.model_ready(mr("tiny", ""))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    assert!(
        g.model_ready(mr("tiny", "1"))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let e = g.model_ready(mr("nope", "")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("unknown model `nope`"), "{e:?}");
    let e = g.model_ready(mr("tiny", "9")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    let meta = g
        .server_metadata(pb::ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    let http_meta = c.get("/v2").await.unwrap().json();
    assert_eq!(meta.name, http_meta["name"]);
    assert_eq!(meta.version, http_meta["version"]);
    assert_eq!(json!(meta.extensions), http_meta["extensions"]);

    let m = g
        .model_metadata(pb::ModelMetadataRequest {
            name: "tiny".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let hm = c.get("/v2/models/tiny").await.unwrap().json();
    assert_eq!(m.name, "tiny");
    assert_eq!(json!(m.versions), hm["versions"]);
    assert_eq!(m.platform, hm["platform"]);
    let tensors = |t: &[pb::model_metadata_response::TensorMetadata]| -> Value {
        json!(
            t.iter()
                .map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape}))
                .collect::<Vec<_>>()
        )
    };
    let strip = |v: &Value| -> Value {
        json!(
            v.as_array()
                .unwrap()
                .iter()
                .map(|t| json!({"name": t["name"], "datatype": t["datatype"], "shape": t["shape"]}))
                .collect::<Vec<_>>()
        )
    };
    assert_eq!(tensors(&m.inputs), strip(&hm["inputs"]));
    assert_eq!(tensors(&m.outputs), strip(&hm["outputs"]));
    let e = g
        .model_metadata(pb::ModelMetadataRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let cfg = g
        .model_config(pb::ModelConfigRequest {
            name: "tiny".into(),
            version: "1".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .expect("a config");
    let hc = c.get("/v2/models/tiny/config").await.unwrap().json();
    assert_eq!(cfg.name, "tiny");
    assert_eq!(cfg.backend, "kiln");
    assert_eq!(json!(cfg.max_batch_size), hc["max_batch_size"]);
    assert_eq!(json!(cfg.input[0].dims), hc["input"][0]["dims"]);
    assert_eq!(cfg.input[0].data_type, pb::DataType::TypeFp32 as i32);
    assert_eq!(cfg.output.len(), hc["output"].as_array().unwrap().len());
    let kiln: Value = serde_json::from_str(&cfg.parameters["kiln"].string_value).unwrap();
    assert_eq!(kiln, hc["kiln"]);
    assert_eq!(cfg.instance_group[0].count, 1);
    match cfg.scheduling_choice {
        Some(pb::model_config::SchedulingChoice::DynamicBatching(d)) => {
            assert_eq!(
                json!(d.max_queue_delay_microseconds),
                hc["dynamic_batching"]["max_queue_delay_microseconds"]
            );
        }
        None => panic!("no dynamic batching in the config"),
    }

    // The statistics extension: the same numbers as GET /v2/models/stats (no request runs
    // between the two reads).
    let st = g
        .model_statistics(pb::ModelStatisticsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let hs = c.get("/v2/models/stats").await.unwrap().json();
    let hms = hs["model_stats"].as_array().unwrap();
    assert_eq!(st.model_stats.len(), hms.len());
    for (m, hm) in st.model_stats.iter().zip(hms) {
        assert_eq!(json!(m.name), hm["name"]);
        assert_eq!(json!(m.version), hm["version"]);
        assert_eq!(json!(m.inference_count), hm["inference_count"]);
        assert_eq!(json!(m.execution_count), hm["execution_count"]);
        let i = m.inference_stats.as_ref().unwrap();
        let hi = &hm["inference_stats"];
        for (d, k) in [
            (&i.success, "success"),
            (&i.fail, "fail"),
            (&i.queue, "queue"),
        ] {
            let d = d.as_ref().unwrap();
            assert_eq!(json!(d.count), hi[k]["count"], "{k}");
            assert_eq!(json!(d.ns), hi[k]["ns"], "{k}");
        }
        assert_eq!(
            json!(m.batch_stats.len()),
            json!(hm["batch_stats"].as_array().unwrap().len())
        );
    }
    let e = g
        .model_statistics(pb::ModelStatisticsRequest {
            name: "nope".into(),
            version: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    // The model repository extension: the index equals the HTTP one; load and unload need
    // explicit model control (this server polls), so they are refused as bad arguments.
    let idx = g
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap()
        .into_inner();
    let hidx = c
        .post_json("/v2/repository/index", &json!({}))
        .await
        .unwrap()
        .json();
    let hidx = hidx.as_array().unwrap();
    assert_eq!(idx.models.len(), hidx.len());
    for (m, hm) in idx.models.iter().zip(hidx) {
        assert_eq!(json!(m.name), hm["name"]);
        assert_eq!(json!(m.state), hm["state"]);
        assert_eq!(m.state, "READY");
    }
    for e in [
        g.repository_model_load(pb::RepositoryModelLoadRequest {
            model_name: "tiny".into(),
            ..Default::default()
        })
        .await
        .map(drop)
        .unwrap_err(),
        g.repository_model_unload(pb::RepositoryModelUnloadRequest {
            model_name: "tiny".into(),
            ..Default::default()
        })
        .await
        .map(drop)
        .unwrap_err(),
    ] {
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    // With a control token, a control RPC without it is refused as unauthenticated.
    h.shutdown().await.unwrap();
    let h = serve(ServeConfig {
        control_token: Some("a-token-of-sixteen-chars".into()),
        ..config(repo.path())
    })
    .await;
    let mut g = grpc(&h).await;
    let e = g
        .repository_index(pb::RepositoryIndexRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let mut r = tonic::Request::new(pb::RepositoryIndexRequest::default());
    r.metadata_mut().insert(
        "authorization",
        "Bearer a-token-of-sixteen-chars".parse().unwrap(),
    );
    assert_eq!(
        g.repository_index(r)
            .await
            .unwrap()
            .into_inner()
            .models
            .len(),
        1
    );
    h.shutdown().await.unwrap();
}

/// The service builds each answer once, as one of its records; the HTTP answer and the gRPC
/// message, each read back into that record (`kiln::serve::records`, as the load generator
/// reads them), agree on everything the protobuf carries: the model configuration, the
/// metadata and the statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_answer_the_same_records() {
    use kiln::serve::records::{ModelConfig, ModelMetadata, StatsResponse};
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut g = grpc(&h).await;
    let mut c = http(&h);

    let http_cfg: ModelConfig = c
        .get("/v2/models/tiny/config")
        .await
        .unwrap()
        .record()
        .unwrap();
    let p = g
        .model_config(pb::ModelConfigRequest {
            name: "tiny".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .config
        .expect("a config");
    assert_eq!(http_cfg.kiln.features().len(), F);
    assert_eq!(http_cfg.version, 1);
    // Protobuf has no field for the threads per instance, the engine choice or the version.
    let mut want = http_cfg.clone();
    want.engine_choice = None;
    want.version = 0;
    for group in &mut want.instance_group {
        group.threads = 0;
    }
    assert_eq!(ModelConfig::from(&p), want);

    let http_meta: ModelMetadata = c.get("/v2/models/tiny").await.unwrap().record().unwrap();
    let grpc_meta = ModelMetadata::from(
        g.model_metadata(pb::ModelMetadataRequest {
            name: "tiny".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner(),
    );
    // Nor for a tensor's parameters.
    let mut want = http_meta.clone();
    for t in want.inputs.iter_mut().chain(want.outputs.iter_mut()) {
        t.parameters.clear();
    }
    assert_eq!(grpc_meta, want);
    assert_eq!(http_meta.inputs[0].shape, [-1, F as i64]);

    // No request runs between the two reads.
    let http_stats: StatsResponse = c.get("/v2/models/stats").await.unwrap().record().unwrap();
    let grpc_stats = StatsResponse::from(
        &g.model_statistics(pb::ModelStatisticsRequest::default())
            .await
            .unwrap()
            .into_inner(),
    );
    assert_eq!(grpc_stats, http_stats);
    assert_eq!(http_stats.model_stats.len(), 1);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_http_answers_are_bit_identical_raw_and_typed() {
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut g = grpc(&h).await;
    let mut c = http(&h);
    for (n, seed) in [(1, 0), (7, 1), (64, 2)] {
        let x = rows(n, seed);
        // HTTP binary in, binary out.
        let header = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [n, F],
            "parameters": {"binary_data_size": x.len() * 4}}],
            "parameters": {"binary_data_output": true}});
        let mut body = serde_json::to_vec(&header).unwrap();
        let hl = body.len().to_string();
        body.extend(le(&x));
        let r = c
            .request(
                "POST",
                "/v2/models/tiny/infer",
                &[
                    ("Content-Type", "application/octet-stream"),
                    ("Inference-Header-Content-Length", &hl),
                ],
                &body,
            )
            .await
            .unwrap();
        let http_bin = http_outputs(&r);
        // HTTP JSON in, JSON out.
        let r = c
            .post_json(
                "/v2/models/tiny/infer",
                &json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [n, F], "data": x}]}),
            )
            .await
            .unwrap();
        let http_json = http_outputs(&r);
        assert_eq!(http_bin, http_json, "HTTP binary and JSON answers differ");

        let raw = g.model_infer(raw_request(&x)).await.unwrap().into_inner();
        assert_eq!(raw.model_name, "tiny");
        assert_eq!(raw.model_version, "1");
        assert_eq!(raw.id, "r1");
        assert!(raw.outputs.iter().all(|o| o.contents.is_none()));
        assert_eq!(raw.raw_output_contents.len(), raw.outputs.len());
        assert_eq!(grpc_outputs(&raw), http_bin, "raw gRPC vs HTTP, {n} rows");

        let typed = g.model_infer(typed_request(&x)).await.unwrap().into_inner();
        assert!(typed.raw_output_contents.is_empty());
        assert_eq!(
            grpc_outputs(&typed),
            http_json,
            "typed gRPC vs HTTP, {n} rows"
        );
    }
    // Asking for one output answers that one only.
    let x = rows(2, 5);
    let mut req = raw_request(&x);
    req.outputs = vec![mir::InferRequestedOutputTensor {
        name: "std".into(),
        ..Default::default()
    }];
    let r = g.model_infer(req).await.unwrap().into_inner();
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(r.outputs[0].name, "std");
    // Counted by the same per-version metrics as HTTP: 3 sizes x (2 HTTP + 2 gRPC) + 1.
    let text = c.get("/metrics").await.unwrap().text();
    assert_eq!(
        sample(
            &text,
            "kiln_inference_request_success_total{model=\"tiny\",version=\"1\"}"
        ),
        Some(13.0),
        "{text}"
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_map_to_grpc_status_codes() {
    let repo = crate::common::repository_of(trained());
    let broken = repo.path().join("broken").join("1");
    copy_dir(trained(), &broken);
    std::fs::remove_file(broken.join(WEIGHTS_FILE)).unwrap();
    let h = kiln::serve::start(config(repo.path())).await.unwrap();
    let mut g = grpc(&h).await;
    let t0 = Instant::now();
    while !g
        .model_ready(pb::ModelReadyRequest {
            name: "tiny".into(),
            version: String::new(),
        })
        .await
        .is_ok_and(|r| r.into_inner().ready)
    {
        assert!(t0.elapsed() < Duration::from_secs(60), "tiny became ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let x = rows(2, 0);
    let check = |r: Result<tonic::Response<pb::ModelInferResponse>, tonic::Status>,
                 code: Code,
                 needle: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(needle), "`{needle}` not in {e:?}");
    };

    let mut r = raw_request(&x);
    r.model_name = "nope".into();
    check(
        g.model_infer(r).await,
        Code::NotFound,
        "unknown model `nope`",
    );
    let mut r = raw_request(&x);
    r.model_version = "7".into();
    check(g.model_infer(r).await, Code::NotFound, "no version 7");
    let mut r = raw_request(&x);
    r.model_name = "broken".into();
    check(
        g.model_infer(r).await,
        Code::Unavailable,
        "model `broken` is not ready",
    );
    let e = g
        .model_ready(pb::ModelReadyRequest {
            name: "broken".into(),
            version: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!e.ready);
    assert!(
        !g.server_ready(pb::ServerReadyRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready
    );

    let mut r = raw_request(&x);
    r.inputs[0].datatype = "FP99".into();
    check(
        g.model_infer(r).await,
        Code::InvalidArgument,
        "unknown datatype `FP99`",
    );
    let mut r = raw_request(&x);
    r.raw_input_contents[0] = le(&x[..x.len() - 1]).into();
    check(
        g.model_infer(r).await,
        Code::InvalidArgument,
        "has 76 bytes in raw_input_contents but shape [2, 10] of FP32 needs 80",
    );
    let mut r = raw_request(&x);
    r.raw_input_contents.push(vec![0u8; 4].into());
    check(
        g.model_infer(r).await,
        Code::InvalidArgument,
        "raw_input_contents has 2 entries but the request has 1 inputs",
    );
    let mut r = typed_request(&x);
    r.inputs[0].contents.as_mut().unwrap().fp32_contents.pop();
    check(
        g.model_infer(r).await,
        Code::InvalidArgument,
        "has 19 elements in contents.fp32_contents but shape [2, 10] needs 20",
    );
    let mut r = raw_request(&x);
    r.inputs[0].contents = Some(pb::InferTensorContents::default());
    check(g.model_infer(r).await, Code::InvalidArgument, "send one");
    let mut r = typed_request(&x);
    r.inputs[0].contents = None;
    check(g.model_infer(r).await, Code::InvalidArgument, "has no data");
    let mut r = raw_request(&x);
    r.inputs[0].name = "wrong".into();
    check(
        g.model_infer(r).await,
        Code::InvalidArgument,
        "unknown input `wrong`",
    );
    let mut r = raw_request(&x);
    r.outputs = vec![mir::InferRequestedOutputTensor {
        name: "q".into(),
        ..Default::default()
    }];
    check(
        g.model_infer(r).await,
        Code::InvalidArgument,
        "unknown output `q`",
    );
    let big = rows(65, 0);
    check(
        g.model_infer(raw_request(&big)).await,
        Code::InvalidArgument,
        "max_batch_size 64",
    );
    let mut bad = x.clone();
    bad[3] = f32::NAN;
    check(
        g.model_infer(raw_request(&bad)).await,
        Code::InvalidArgument,
        "finite",
    );
    h.shutdown().await.unwrap();

    // A full queue answers RESOURCE_EXHAUSTED at once; a missed deadline DEADLINE_EXCEEDED.
    let mut cfg = config(repo.path());
    cfg.batcher.policy = BatchingPolicy::Delay;
    cfg.batcher.max_queue_size = 2;
    let delay = Duration::from_millis(2000);
    cfg.batcher.max_queue_delay = delay;
    std::fs::remove_dir_all(repo.path().join("broken")).unwrap();
    let h = serve(cfg).await;
    let g0 = grpc(&h).await;
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let mut g = g0.clone();
            let req = raw_request(&rows(1, 3));
            tokio::spawn(async move { g.model_infer(req).await })
        })
        .collect();
    let t0 = Instant::now();
    while h
        .metrics()
        .model("tiny")
        .queue_depth
        .load(std::sync::atomic::Ordering::Relaxed)
        != 2
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "two requests were not queued"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut g = g0.clone();
    check(
        g.model_infer(raw_request(&rows(1, 3))).await,
        Code::ResourceExhausted,
        "queue of model `tiny` is full",
    );
    assert!(waiting.iter().all(|w| !w.is_finished()), "refused at once");
    for w in waiting {
        assert!(w.await.unwrap().is_ok());
    }
    h.shutdown().await.unwrap();

    let mut cfg = config(repo.path());
    cfg.batcher.policy = BatchingPolicy::Delay;
    cfg.batcher.max_queue_delay = Duration::from_millis(3000);
    cfg.request_timeout = Duration::from_millis(100);
    let h = serve(cfg).await;
    let mut g = grpc(&h).await;
    check(
        g.model_infer(raw_request(&rows(1, 3))).await,
        Code::DeadlineExceeded,
        "timed out",
    );
    let text = http(&h).get("/metrics").await.unwrap().text();
    assert_eq!(
        sample(
            &text,
            "kiln_inference_request_failure_total{model=\"tiny\",version=\"1\",reason=\"timeout\"}"
        ),
        Some(1.0)
    );
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_stops_with_the_server_and_can_be_off() {
    let repo = crate::common::repository_of(trained());
    let mut cfg = config(repo.path());
    cfg.grpc_port = None;
    let h = serve(cfg).await;
    assert!(h.grpc_addr.is_none());
    h.shutdown().await.unwrap();

    let h = serve(config(repo.path())).await;
    let addr = h.grpc_addr.unwrap();
    let mut g = grpc(&h).await;
    let x = rows(3, 1);
    let in_flight = tokio::spawn(async move { g.model_infer(raw_request(&x)).await });
    h.shutdown().await.unwrap();
    // The request in flight was answered (or had not started), and the port is closed.
    if let Ok(r) = in_flight.await.unwrap() {
        assert_eq!(r.into_inner().outputs.len(), 2);
    }
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// The gRPC listener keeps the HTTP side's connection limits: with one slot, a client that
/// connects and says nothing holds it only until the header timeout, a second client is
/// turned away meanwhile, and the slot serves again once the silent one is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_connections_are_capped_and_silent_ones_time_out() {
    use tokio::io::AsyncReadExt;
    let repo = crate::common::repository_of(trained());
    let mut cfg = config(repo.path());
    cfg.connection.max_connections = 1;
    cfg.connection.header_timeout = Duration::from_millis(600);
    let h = serve(cfg).await;
    let addr = h.grpc_addr.unwrap();

    let opened = Instant::now();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let turned_away = tokio::time::timeout(Duration::from_secs(5), async {
        match GrpcInferenceServiceClient::connect(format!("http://{addr}")).await {
            Err(_) => true,
            Ok(mut g) => g.server_live(pb::ServerLiveRequest {}).await.is_err(),
        }
    })
    .await
    .expect("a connection over the cap is answered at once");
    assert!(
        turned_away,
        "a second connection was served beyond --max-connections 1"
    );

    // The silent client is disconnected (after whatever the server wrote first) once the
    // header timeout has passed, not before.
    let mut buf = [0u8; 256];
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(n) = silent.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .expect("the silent connection is closed");
    assert!(
        opened.elapsed() >= Duration::from_millis(550),
        "{:?}",
        opened.elapsed()
    );

    // Its slot serves again; and a client that sent its preface is not cut off by the
    // header timeout.
    let mut g = None;
    for _ in 0..50 {
        if let Ok(mut c) = GrpcInferenceServiceClient::connect(format!("http://{addr}")).await
            && c.server_live(pb::ServerLiveRequest {}).await.is_ok()
        {
            g = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut g = g.expect("the freed slot serves a new client");
    tokio::time::sleep(Duration::from_millis(900)).await;
    let r = g.model_infer(raw_request(&rows(2, 3))).await.unwrap();
    assert_eq!(r.into_inner().outputs.len(), 2);
    h.shutdown().await.unwrap();
}

/// tritonclient.grpc and tritonclient.http give equal answers against a live `kiln serve`.
#[test]
#[ignore = "needs tritonclient: KILN_TEST_TRITON_PYTHON (.ci/triton.sh)"]
fn tritonclient_grpc_answers_equal_tritonclient_http() {
    let python = crate::common::required_env(
        "KILN_TEST_TRITON_PYTHON",
        "a Python with tritonclient[grpc,http] (.ci/triton.sh)",
    );
    let repo = crate::common::repository_of(trained());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let h = rt.block_on(serve(config(repo.path())));
    let script = crate::common::root().join("tests/triton/grpc_equals_http.py");
    let out = std::process::Command::new(python)
        .arg(&script)
        .arg(format!("127.0.0.1:{}", h.addr.port()))
        .arg(format!("127.0.0.1:{}", h.grpc_addr.unwrap().port()))
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("OK grpc == http"), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("OK grpc stream == unary"),
        "{stdout}\n{stderr}"
    );
    rt.block_on(h.shutdown()).unwrap();
}

/// `kiln loadtest`'s perf_analyzer modes drive both protocols: every level measured, no
/// errors, ordered percentiles, and a clear line when the server has no statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_sweeps_run_over_http_and_grpc() {
    use kiln::loadgen::loadtest::{Distribution, PerfConfig, PerfMode, Protocol, run_perf};
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let http_url = format!("http://{}", h.addr);
    let grpc_url = format!("http://{}", h.grpc_addr.unwrap());
    for (protocol, url, binary) in [
        (Protocol::Http, &http_url, false),
        (Protocol::Http, &http_url, true),
        (Protocol::Grpc, &grpc_url, true),
        (Protocol::Grpc, &grpc_url, false),
    ] {
        for mode in [
            PerfMode::Concurrency(vec![1, 2]),
            PerfMode::RequestRate(vec![50.0]),
        ] {
            let cfg = PerfConfig {
                url: url.clone(),
                model: "tiny".into(),
                protocol,
                batch: 4,
                binary,
                mode: mode.clone(),
                distribution: Distribution::Poisson,
                window: Duration::from_millis(150),
                max_trials: 3,
                stability: 0.10,
                connections: 2,
                timeout: Duration::from_secs(10),
                stats_url: None,
            };
            let r = run_perf(&cfg).await.unwrap();
            let want = if matches!(mode, PerfMode::Concurrency(_)) {
                2
            } else {
                1
            };
            assert_eq!(r.levels.len(), want, "{r:?}");
            for l in &r.levels {
                assert!(l.ok > 0 && l.errors.is_empty(), "{protocol:?}: {l:?}");
                assert_eq!(l.windows, 3, "{l:?}");
                let p = &l.latency_ms;
                assert!(p.p50 <= p.p90 && p.p90 <= p.p95 && p.p95 <= p.p99, "{p:?}");
                // The server-side breakdown comes from the statistics extension.
                let s = l.server.as_ref().expect("a server-side breakdown");
                assert!(s.requests > 0, "{s:?}");
            }
            assert!(
                !r.server_stats.starts_with("unavailable"),
                "{}",
                r.server_stats
            );
        }
    }
    // Unknown models are refused before any load, over either protocol.
    let mut cfg = PerfConfig {
        url: grpc_url.clone(),
        model: "nope".into(),
        protocol: Protocol::Grpc,
        batch: 1,
        binary: true,
        mode: PerfMode::Concurrency(vec![1]),
        distribution: Distribution::Constant,
        window: Duration::from_millis(100),
        max_trials: 3,
        stability: 0.1,
        connections: 1,
        timeout: Duration::from_secs(5),
        stats_url: None,
    };
    let e = run_perf(&cfg).await.unwrap_err().to_string();
    assert!(e.contains("NotFound") && e.contains("nope"), "{e}");
    cfg.max_trials = 2;
    cfg.model = "tiny".into();
    let e = run_perf(&cfg).await.unwrap_err().to_string();
    assert!(e.contains("--max-trials is 2"), "{e}");
    h.shutdown().await.unwrap();
}

/// The counts of the statistics extension for `tiny` version 1 (HTTP's JSON answer): every
/// `inference_stats` entry's count, the inference and execution counts, and the
/// not-ready count of `/metrics`.
async fn counts(c: &mut HttpClient) -> Value {
    let s = c
        .get("/v2/models/tiny/versions/1/stats")
        .await
        .unwrap()
        .json();
    let m = &s["model_stats"][0];
    let i = &m["inference_stats"];
    let mut out = json!({
        "inference_count": m["inference_count"],
        "execution_count": m["execution_count"],
    });
    for k in [
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
    ] {
        out[k] = i[k]["count"].clone();
    }
    out
}

/// The difference of two [`counts`].
fn delta(after: &Value, before: &Value) -> Value {
    let mut d = json!({});
    for (k, v) in after.as_object().unwrap() {
        d[k] = json!(v.as_u64().unwrap() - before[k].as_u64().unwrap());
    }
    d
}

/// HTTP and gRPC are adapters over one service: the same mix of requests — two good ones, an
/// unknown output, a bad shape, an unknown model — sent over each transport moves every
/// statistic by the same amount, and the errors are the same errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_transports_count_the_same_statistics_through_one_service() {
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut g = grpc(&h).await;
    let mut c = http(&h);
    let x = rows(3, 11);

    let before = counts(&mut c).await;
    let body = |x: &[f32], rows: usize, extra: Value| {
        let mut b = json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [rows, F], "data": x}]});
        if let Value::Object(e) = extra {
            b.as_object_mut().unwrap().extend(e);
        }
        b
    };
    let mut http_errors = Vec::new();
    for _ in 0..2 {
        let r = c
            .post_json("/v2/models/tiny/infer", &body(&x, 3, json!({})))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for (path, b) in [
        (
            "/v2/models/tiny/infer",
            body(&x, 3, json!({"outputs": [{"name": "nope"}]})),
        ),
        ("/v2/models/tiny/infer", body(&x[..2 * F], 3, json!({}))),
        ("/v2/models/nope/infer", body(&x, 3, json!({}))),
    ] {
        let r = c.post_json(path, &b).await.unwrap();
        http_errors.push((r.status, r.json()["error"].as_str().unwrap().to_string()));
    }
    let after_http = counts(&mut c).await;

    let mut grpc_errors = Vec::new();
    for _ in 0..2 {
        g.model_infer(raw_request(&x)).await.unwrap();
    }
    let mut unknown_output = raw_request(&x);
    unknown_output.outputs = vec![mir::InferRequestedOutputTensor {
        name: "nope".into(),
        ..Default::default()
    }];
    let mut bad_shape = typed_request(&x[..2 * F]);
    bad_shape.inputs[0].shape = vec![3, F as i64];
    let mut unknown_model = raw_request(&x);
    unknown_model.model_name = "nope".into();
    for r in [unknown_output, bad_shape, unknown_model] {
        let e = g.model_infer(r).await.unwrap_err();
        grpc_errors.push((e.code(), e.message().to_string()));
    }
    let after_grpc = counts(&mut c).await;

    let (dh, dg) = (delta(&after_http, &before), delta(&after_grpc, &after_http));
    assert_eq!(dh["success"], json!(2), "{dh}");
    assert_eq!(
        dh["fail"],
        json!(2),
        "two bad requests to a known model: {dh}"
    );
    assert_eq!(dh, dg, "HTTP moved the statistics by {dh}, gRPC by {dg}");

    // The same service errors, mapped to each protocol's codes.
    let codes: Vec<(u16, Code)> = http_errors
        .iter()
        .zip(&grpc_errors)
        .map(|((s, _), (c, _))| (*s, *c))
        .collect();
    assert_eq!(
        codes,
        [
            (400, Code::InvalidArgument),
            (400, Code::InvalidArgument),
            (404, Code::NotFound)
        ]
    );
    assert_eq!(http_errors[0].1, grpc_errors[0].1, "unknown output");
    assert_eq!(http_errors[2].1, grpc_errors[2].1, "unknown model");
    h.shutdown().await.unwrap();
}

/// `ModelStreamInfer`: requests over one bidirectional stream are answered by id with the
/// unary answers' bytes; a bad request in the stream gets its error as a message and the
/// stream goes on; the stream ends once the client's side has closed and every request is
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_answers_each_request_by_id_and_goes_on_after_an_error() {
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut g = grpc(&h).await;
    let mut requests = Vec::new();
    let mut unary = std::collections::HashMap::new();
    for (i, n) in [1usize, 3, 64, 2, 7].into_iter().enumerate() {
        let mut r = raw_request(&rows(n, i as u32));
        r.id = format!("r{i}");
        let answer = g.model_infer(r.clone()).await.unwrap().into_inner();
        unary.insert(r.id.clone(), grpc_outputs(&answer));
        requests.push(r);
    }
    let mut bad = raw_request(&rows(2, 9));
    bad.id = "bad".into();
    bad.inputs[0].shape = vec![2, F as i64 + 1];
    requests.insert(2, bad);
    let mut answers = g
        .model_stream_infer(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut got = std::collections::HashMap::new();
    let mut errors = Vec::new();
    while let Some(m) = answers.message().await.unwrap() {
        let r = m.infer_response.expect("every answer names its request");
        if m.error_message.is_empty() {
            got.insert(r.id.clone(), grpc_outputs(&r));
        } else {
            errors.push((r.id, m.error_message));
        }
    }
    assert_eq!(got, unary);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].0, "bad");
    assert!(errors[0].1.contains("features"), "{errors:?}");
    h.shutdown().await.unwrap();
}

/// A `ModelStreamInfer` message over `--max-body-bytes` ends the stream with
/// `RESOURCE_EXHAUSTED`, the code a unary call over the limit gets — and only after the
/// answers to the requests sent before it have arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_stream_message_is_resource_exhausted_after_the_answers_before_it() {
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut g = grpc(&h).await;
    let mut requests = Vec::new();
    for i in 0..3 {
        let mut r = raw_request(&rows(2, i));
        r.id = format!("r{i}");
        requests.push(r);
    }
    // 2 MiB of id: over the 1 MiB limit of `config`.
    let mut big = raw_request(&rows(1, 7));
    big.id = "x".repeat(2 << 20);
    let unary = g.model_infer(big.clone()).await.unwrap_err();
    assert_eq!(unary.code(), Code::ResourceExhausted, "{unary:?}");
    requests.push(big);
    let mut answers = g
        .model_stream_infer(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut ids = Vec::new();
    let status = loop {
        match answers.message().await {
            Ok(Some(m)) => {
                assert!(m.error_message.is_empty(), "{}", m.error_message);
                ids.push(m.infer_response.expect("an answer").id);
            }
            Ok(None) => panic!("the stream ended without an error after {ids:?}"),
            Err(st) => break st,
        }
    };
    ids.sort();
    assert_eq!(ids, ["r0", "r1", "r2"]);
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("--max-body-bytes"), "{status:?}");
    h.shutdown().await.unwrap();
}

/// A malformed frame on a `ModelStreamInfer` stream (bytes that are not a
/// `ModelInferRequest`) fails only itself as far as the framing allows: the answers to the
/// good requests sent before it on the same stream arrive, then the stream ends with an error
/// status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_stream_frame_keeps_the_answers_to_the_requests_before_it() {
    use prost::Message as _;
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let addr = h.grpc_addr.expect("gRPC is on");
    let mut body = Vec::new();
    for i in 0..2 {
        let mut r = raw_request(&rows(3, i));
        r.id = format!("r{i}");
        body.extend(crate::common::grpc_frame(&r));
    }
    // Field 1 with the reserved wire type 7: no protobuf decoder accepts it.
    body.extend([0u8, 0, 0, 0, 3, 0x0f, 0xff, 0xff]);

    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let req = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{addr}/inference.GRPCInferenceService/ModelStreamInfer"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut stream) = client.send_request(req, false).unwrap();
    stream.send_data(body.into(), true).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), resp)
        .await
        .expect("the server answers the stream")
        .unwrap();
    let mut data = resp.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), data.data())
        .await
        .expect("the stream goes on to its end")
    {
        let chunk = chunk.unwrap();
        let _ = data.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    let trailers = data.trailers().await.unwrap().unwrap_or_default();
    let mut ids = Vec::new();
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        let m = pb::ModelStreamInferResponse::decode(&bytes[at + 5..at + 5 + len]).unwrap();
        assert!(m.error_message.is_empty(), "{}", m.error_message);
        ids.push(m.infer_response.unwrap().id);
        at += 5 + len;
    }
    ids.sort();
    assert_eq!(ids, ["r0", "r1"]);
    let status = trailers
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string());
    assert!(
        status.as_deref().is_some_and(|s| s != "0"),
        "the malformed frame ends the stream with an error: {trailers:?}"
    );
    h.shutdown().await.unwrap();
}
