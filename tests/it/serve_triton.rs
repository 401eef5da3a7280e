//! Triton's extensions of the serving tier, end to end over HTTP against an in-process
//! server: the statistics extension (agreeing exactly with `/metrics` and with the requests
//! sent), the `nv_inference_*` counters (checked by a real `promtool check metrics` in an
//! ignored test that `.ci/run` runs), the model repository API under `--model-control-mode explicit` (load
//! and unload under load with no failed request on the other model; a failed load leaves the
//! previous version serving; the control endpoints' token), and on-demand profiling of a
//! loaded server.

use crate::common::copy_dir;
use crate::common::trained;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kiln::artifact::WEIGHTS_FILE;
use kiln::loadgen::client::{HttpClient, HttpResponse};
use kiln::serve::metrics::sample;
use kiln::serve::{ModelControlMode, ServeConfig};
use serde_json::{Value, json};

/// The tiny model of this binary (trained once).
/// Features of the tiny model.
const F: usize = 10;

fn config(repo: &Path) -> ServeConfig {
    crate::common::serve_config(repo, "burn")
}

use crate::common::client;
use crate::common::serve;

/// `n` rows of plausible features.
fn request(n: usize, seed: usize) -> Value {
    let x: Vec<f32> = (0..n * F)
        .map(|i| ((i * 37 + seed * 11) % 17) as f32 / 17.0 - 0.5)
        .collect();
    json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [n, F], "data": x}]})
}

async fn post(c: &mut HttpClient, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    c.request("POST", path, headers, b"").await.unwrap()
}

async fn poll_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn count(v: &Value) -> u64 {
    v["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no count in {v}"))
}

fn ns(v: &Value) -> u64 {
    v["ns"].as_u64().unwrap_or_else(|| panic!("no ns in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_agree_with_metrics_and_with_the_requests_sent() {
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut c = client(&h);
    let r = c.get("/v2").await.unwrap();
    let ext = r.json()["extensions"].clone();
    for e in ["statistics", "model_repository"] {
        assert!(ext.as_array().unwrap().iter().any(|x| x == e), "{e}: {ext}");
    }
    // Nothing served yet: the version is listed with zeros.
    let v = c.get("/v2/models/tiny/stats").await.unwrap().json();
    assert_eq!(v["model_stats"][0]["name"], "tiny", "{v}");
    assert_eq!(v["model_stats"][0]["version"], "1", "{v}");
    assert_eq!(v["model_stats"][0]["inference_count"], 0, "{v}");
    assert_eq!(v["model_stats"][0]["last_inference"], 0, "{v}");

    // One at a time (each its own batch): 12 requests of 1 to 3 rows, and 2 bad ones.
    let mut rows_sent = 0u64;
    let mut ok = 0u64;
    for i in 0..12 {
        let n = 1 + i % 3;
        let r = c
            .post_json("/v2/models/tiny/infer", &request(n, i))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        rows_sent += n as u64;
        ok += 1;
    }
    for bad in [
        json!({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}),
        json!({"inputs": []}),
    ] {
        let r = c.post_json("/v2/models/tiny/infer", &bad).await.unwrap();
        assert_eq!(r.status, 400, "{}", r.text());
    }
    let seq = c
        .get("/v2/models/tiny/versions/1/stats")
        .await
        .unwrap()
        .json();
    let m = &seq["model_stats"][0];
    let s = &m["inference_stats"];
    // Every request was its own batch: per-request compute equals per-batch compute.
    let batch_infer_ns: u64 = m["batch_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| ns(&b["compute_infer"]))
        .sum();
    assert_eq!(ns(&s["compute_infer"]), batch_infer_ns, "{seq}");
    assert_eq!(m["execution_count"], 12, "{seq}");

    // Then concurrent requests, which batch while the instance is busy.
    let mut tasks = Vec::new();
    for t in 0..6usize {
        let addr = h.addr;
        tasks.push(tokio::spawn(async move {
            let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(30));
            let mut rows = 0u64;
            for i in 0..10 {
                let n = 1 + (t + i) % 4;
                let r = c
                    .post_json("/v2/models/tiny/infer", &request(n, 100 + t * 10 + i))
                    .await
                    .unwrap();
                assert_eq!(r.status, 200, "{}", r.text());
                rows += n as u64;
            }
            rows
        }));
    }
    for t in tasks {
        rows_sent += t.await.unwrap();
        ok += 10;
    }

    let all = c.get("/v2/models/stats").await.unwrap().json();
    let one = c.get("/v2/models/tiny/stats").await.unwrap().json();
    let ver = c
        .get("/v2/models/tiny/versions/1/stats")
        .await
        .unwrap()
        .json();
    let text = c.get("/metrics").await.unwrap().text();
    // Nothing was served between the three reads.
    assert_eq!(all, one);
    assert_eq!(one, ver);
    assert_eq!(all["model_stats"].as_array().unwrap().len(), 1, "{all}");
    let m = &all["model_stats"][0];
    let s = &m["inference_stats"];
    let l = "model=\"tiny\",version=\"1\"";
    let metric = |name: &str| {
        sample(&text, &format!("{name}{{{l}}}")).unwrap_or_else(|| panic!("{name}\n{text}")) as u64
    };
    // Requests.
    assert_eq!(count(&s["success"]), ok, "{all}");
    assert_eq!(metric("nv_inference_request_success"), ok);
    assert_eq!(metric("kiln_inference_request_success_total"), ok);
    assert_eq!(count(&s["fail"]), 2, "{all}");
    assert_eq!(metric("nv_inference_request_failure"), 2);
    // Each successful request queued and computed once.
    for k in ["queue", "compute_input", "compute_infer", "compute_output"] {
        assert_eq!(count(&s[k]), ok, "{k}: {all}");
    }
    assert_eq!(count(&s["cache_hit"]), 0);
    // Rows and batches.
    let inferences = m["inference_count"].as_u64().unwrap();
    let executions = m["execution_count"].as_u64().unwrap();
    assert_eq!(inferences, rows_sent, "{all}");
    assert_eq!(metric("nv_inference_count"), rows_sent);
    assert_eq!(metric("kiln_inference_count_total"), rows_sent);
    assert_eq!(metric("nv_inference_exec_count"), executions);
    assert_eq!(metric("kiln_inference_exec_count_total"), executions);
    let batches = m["batch_stats"].as_array().unwrap();
    assert_eq!(
        batches
            .iter()
            .map(|b| count(&b["compute_infer"]))
            .sum::<u64>(),
        executions
    );
    assert_eq!(
        batches
            .iter()
            .map(|b| b["batch_size"].as_u64().unwrap() * count(&b["compute_infer"]))
            .sum::<u64>(),
        rows_sent
    );
    // A batch's compute is attributed to each of its requests: never less than per batch.
    assert!(
        ns(&s["compute_infer"]) >= batches.iter().map(|b| ns(&b["compute_infer"])).sum::<u64>(),
        "{all}"
    );
    // Durations: ns here, µs (rounded down) there.
    for (k, name) in [
        ("success", "nv_inference_request_duration_us"),
        ("queue", "nv_inference_queue_duration_us"),
        ("compute_input", "nv_inference_compute_input_duration_us"),
        ("compute_infer", "nv_inference_compute_infer_duration_us"),
        ("compute_output", "nv_inference_compute_output_duration_us"),
    ] {
        assert_eq!(ns(&s[k]) / 1000, metric(name), "{k}");
    }
    assert!(ns(&s["compute_infer"]) > 0);
    // A request's queue wait and compute lie within its end-to-end time.
    let parts: u64 = ["queue", "compute_input", "compute_infer", "compute_output"]
        .iter()
        .map(|k| ns(&s[*k]))
        .sum();
    assert!(ns(&s["success"]) >= parts, "{all}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let last = m["last_inference"].as_u64().unwrap();
    assert!(
        last <= now_ms && now_ms - last < 600_000,
        "{last} vs {now_ms}"
    );

    // Errors.
    let r = c.get("/v2/models/nope/stats").await.unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    let r = c.get("/v2/models/tiny/versions/2/stats").await.unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("version 2"));
    let r = c.get("/v2/models/tiny/versions/x/stats").await.unwrap();
    assert_eq!(r.status, 400, "{}", r.text());

    h.shutdown().await.unwrap();
}

/// The exposition of a server that answered requests passes Prometheus' own checker: the
/// `promtool` that `KILN_TEST_PROMTOOL` names (`.ci/promtool.sh` installs Debian's and sets
/// it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs promtool (source .ci/promtool.sh)"]
async fn the_metrics_exposition_passes_promtool() {
    let promtool = crate::common::required_env(
        "KILN_TEST_PROMTOOL",
        "Prometheus' promtool (source .ci/promtool.sh)",
    );
    let repo = crate::common::repository_of(trained());
    let h = serve(config(repo.path())).await;
    let mut c = client(&h);
    for seed in 0..5 {
        let r = c
            .post_json("/v2/models/tiny/infer", &request(1 + seed, seed))
            .await
            .unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let text = c.get("/metrics").await.unwrap().text();
    assert!(text.contains("nv_inference_request_success"), "{text}");
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("KILN_TEST_PROMTOOL names a promtool that runs");
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Exit 1 is a parse error. Lint findings (exit 3) are allowed only on Triton's names,
    // which break Prometheus' naming advice (`_total`, `_us`, `_count`) exactly as Triton's
    // own exposition does; on kiln's series they fail.
    let problems: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !(l.starts_with("nv_inference_") && l.contains(" should ")))
        .collect();
    assert!(
        out.status.success() || (out.status.code() == Some(3) && problems.is_empty()),
        "promtool check metrics: {:?}\n{said}",
        out.status
    );
    h.shutdown().await.unwrap();
}

/// A repository with `tiny/1` and `other/1`.
fn two_models() -> tempfile::TempDir {
    let repo = crate::common::repository_of(trained());
    copy_dir(trained(), &repo.path().join("other").join("1"));
    repo
}

fn state_of<'a>(index: &'a Value, name: &str) -> &'a Value {
    index
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {index}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_load_and_unload_under_load_fail_no_request_on_the_other_model() {
    let repo = two_models();
    let mut cfg = config(repo.path());
    cfg.model_control = ModelControlMode::Explicit;
    cfg.batcher.instances = 2;
    let h = serve(cfg).await;
    let mut c = client(&h);
    // Nothing is loaded, yet the server is ready.
    assert_eq!(c.get("/v2/health/ready").await.unwrap().status, 200);
    let r = c
        .post_json("/v2/models/tiny/infer", &request(1, 0))
        .await
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    let index = post(&mut c, "/v2/repository/index", &[]).await;
    assert_eq!(index.status, 200, "{}", index.text());
    let index = index.json();
    for m in ["tiny", "other"] {
        assert_eq!(state_of(&index, m)["state"], "UNAVAILABLE", "{index}");
    }
    let r = post(&mut c, "/v2/repository/models/nope/load", &[]).await;
    assert_eq!(r.status, 404, "{}", r.text());

    // Load `other` and put it under load.
    let r = post(&mut c, "/v2/repository/models/other/load", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let stop = Arc::new(AtomicBool::new(false));
    let mut traffic = Vec::new();
    for t in 0..3usize {
        let (addr, stop) = (h.addr, stop.clone());
        traffic.push(tokio::spawn(async move {
            let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(30));
            let mut codes = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .post_json("/v2/models/other/infer", &request(1 + t, i))
                    .await
                    .unwrap();
                codes.push(r.status);
                i += 1;
            }
            codes
        }));
    }
    let other = h.metrics().model("other").version(1);
    poll_until(
        "`other` answers under load",
        Duration::from_secs(30),
        || other.success.load(Ordering::Relaxed) >= 20,
    )
    .await;

    // Load `tiny`; it answers once the load returns (warm-up came first).
    let r = post(&mut c, "/v2/repository/models/tiny/load", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c
        .post_json("/v2/models/tiny/infer", &request(2, 1))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model_version"], "1");
    // A broken version 2: the load fails and version 1 keeps serving.
    let v2 = repo.path().join("tiny").join("2");
    copy_dir(trained(), &v2);
    std::fs::remove_file(v2.join(WEIGHTS_FILE)).unwrap();
    let r = post(&mut c, "/v2/repository/models/tiny/load", &[]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let msg = r.json()["error"].as_str().unwrap().to_string();
    assert!(
        msg.contains("version 2") && msg.contains("version 1 keeps serving"),
        "{msg}"
    );
    let r = c
        .post_json("/v2/models/tiny/infer", &request(1, 2))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model_version"], "1");
    // Repaired: the next load serves version 2.
    std::fs::remove_dir_all(&v2).unwrap();
    copy_dir(trained(), &v2);
    let r = post(&mut c, "/v2/repository/models/tiny/load", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c
        .post_json("/v2/models/tiny/infer", &request(1, 3))
        .await
        .unwrap();
    assert_eq!(r.json()["model_version"], "2", "{}", r.text());
    let index = post(&mut c, "/v2/repository/index", &[]).await.json();
    assert_eq!(state_of(&index, "tiny")["state"], "READY", "{index}");
    assert_eq!(state_of(&index, "tiny")["version"], "2", "{index}");

    // Unload `tiny` while requests to it are in flight: each is answered 200 (it was in
    // flight) or 404 (it came after), never 5xx.
    let tiny_stop = Arc::new(AtomicBool::new(false));
    let tiny_traffic = {
        let (addr, stop) = (h.addr, tiny_stop.clone());
        tokio::spawn(async move {
            let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(30));
            let mut codes = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .post_json("/v2/models/tiny/infer", &request(3, i))
                    .await
                    .unwrap();
                codes.push(r.status);
                i += 1;
            }
            codes
        })
    };
    let tiny2 = h.metrics().model("tiny").version(2);
    poll_until("`tiny` answers under load", Duration::from_secs(30), || {
        tiny2.success.load(Ordering::Relaxed) >= 10
    })
    .await;
    let r = post(&mut c, "/v2/repository/models/tiny/unload", &[]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c
        .post_json("/v2/models/tiny/infer", &request(1, 4))
        .await
        .unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    tiny_stop.store(true, Ordering::Relaxed);
    let codes = tiny_traffic.await.unwrap();
    assert!(
        codes.iter().all(|c| *c == 200 || *c == 404),
        "tiny answered {codes:?}"
    );
    assert!(codes.contains(&200));
    let index = post(&mut c, "/v2/repository/index", &[]).await.json();
    assert_eq!(state_of(&index, "tiny")["state"], "UNAVAILABLE", "{index}");
    assert_eq!(state_of(&index, "tiny")["reason"], "unloaded", "{index}");
    assert_eq!(state_of(&index, "other")["state"], "READY", "{index}");
    let ready = c
        .request("POST", "/v2/repository/index", &[], br#"{"ready": true}"#)
        .await
        .unwrap()
        .json();
    assert_eq!(ready.as_array().unwrap().len(), 1, "{ready}");
    assert_eq!(c.get("/v2/health/ready").await.unwrap().status, 200);

    // `other` never failed a request.
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for t in traffic {
        let codes = t.await.unwrap();
        assert!(codes.iter().all(|c| *c == 200), "other answered {codes:?}");
        answered += codes.len();
    }
    assert!(answered >= 20);
    h.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_endpoints_need_explicit_mode_for_load_and_the_token_when_set() {
    let repo = crate::common::repository_of(trained());
    let mut cfg = config(repo.path());
    cfg.control_token = Some("0123456789abcdef-secret".into());
    let h = serve(cfg).await;
    let mut c = client(&h);
    let r = post(&mut c, "/v2/repository/index", &[]).await;
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    let r = post(
        &mut c,
        "/v2/repository/index",
        &[("Authorization", "Bearer wrong-token-of-length")],
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.text());
    let auth = [("Authorization", "Bearer 0123456789abcdef-secret")];
    let r = post(&mut c, "/v2/repository/index", &auth).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(state_of(&r.json(), "tiny")["state"], "READY");
    // poll mode: load and unload are refused, saying how to enable them.
    let r = post(&mut c, "/v2/repository/models/tiny/unload", &auth).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("--model-control-mode explicit"),
        "{}",
        r.text()
    );
    // Profiling is off without --profile-dir.
    let r = post(&mut c, "/v2/profile?duration_ms=10", &auth).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("--profile-dir"), "{}", r.text());
    // Still serving.
    let r = c
        .post_json("/v2/models/tiny/infer", &request(1, 0))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    h.shutdown().await.unwrap();
    // A short token is refused at start.
    let mut cfg = config(repo.path());
    cfg.control_token = Some("short".into());
    let e = kiln::serve::start(cfg).await.err().expect("refused");
    assert!(e.to_string().contains("--control-token"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_profile_of_a_loaded_server_has_the_serving_spans() {
    kiln::observe::install_subscriber();
    let _profiling = crate::common::PROFILING.lock().await;
    let repo = crate::common::repository_of(trained());
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config(repo.path());
    cfg.profile_dir = Some(out.path().to_path_buf());
    let h = serve(cfg).await;
    let mut c = client(&h);
    let r = post(&mut c, "/v2/profile?duration_ms=0", &[]).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = post(&mut c, "/v2/profile?duration_ms=abc", &[]).await;
    assert_eq!(r.status, 400, "{}", r.text());

    // Three clients on one instance: requests queue and batch.
    let stop = Arc::new(AtomicBool::new(false));
    let mut traffic = Vec::new();
    for t in 0..3usize {
        let (addr, stop) = (h.addr, stop.clone());
        traffic.push(tokio::spawn(async move {
            let mut c = HttpClient::new(addr).with_timeout(Duration::from_secs(30));
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .post_json("/v2/models/tiny/infer", &request(1 + t, i))
                    .await
                    .unwrap();
                assert_eq!(r.status, 200);
                i += 1;
            }
        }));
    }
    let vm = h.metrics().model("tiny").version(1);
    poll_until("the server is under load", Duration::from_secs(30), || {
        vm.success.load(Ordering::Relaxed) >= 20
    })
    .await;
    let r = post(&mut c, "/v2/profile?duration_ms=400", &[]).await;
    stop.store(true, Ordering::Relaxed);
    for t in traffic {
        t.await.unwrap();
    }
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert!(v["events"].as_u64().unwrap() > 0, "{v}");
    let dir = Path::new(v["dir"].as_str().unwrap());
    assert!(dir.starts_with(out.path()), "{v}");
    let table: Value =
        serde_json::from_slice(&std::fs::read(dir.join("key_averages.json")).unwrap()).unwrap();
    let names: Vec<&str> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    let trace: Value =
        serde_json::from_slice(&std::fs::read(dir.join("trace.json")).unwrap()).unwrap();
    let traced: Vec<&str> = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    for span in [
        "serve_request",
        "serve_decode",
        "serve_queue_wait",
        "serve_batch_assembly",
        "serve_compute",
        "serve_encode",
    ] {
        assert!(names.contains(&span), "{span} not in the table: {names:?}");
        assert!(traced.contains(&span), "{span} not in the trace");
    }
    assert_eq!(table["step_name"], "serve_request");
    assert!(table["steps"].as_u64().unwrap() > 0);
    let txt = std::fs::read_to_string(dir.join("key_averages.txt")).unwrap();
    assert!(txt.contains("serve_compute"), "{txt}");
    assert!(v["table"].as_str().unwrap().contains("serve_queue_wait"));
    h.shutdown().await.unwrap();
}

/// Triton's own HTTP client reads the statistics and drives the repository extension, in
/// poll mode and in explicit mode (load, infer, unload), when `KILN_TEST_TRITON_PYTHON`
/// names a Python with `tritonclient[http]` (`.ci/triton.sh`).
#[test]
#[ignore = "needs tritonclient[http] (source .ci/triton.sh)"]
fn tritonclient_http_reads_statistics_and_controls_the_repository() {
    let python = crate::common::required_env(
        "KILN_TEST_TRITON_PYTHON",
        "a Python with tritonclient[http] (source .ci/triton.sh)",
    );
    let script = crate::common::root().join("tests/triton/http_extensions.py");
    let rt = tokio::runtime::Runtime::new().unwrap();
    for mode in [ModelControlMode::Poll, ModelControlMode::Explicit] {
        let repo = crate::common::repository_of(trained());
        let h = rt.block_on(serve(ServeConfig {
            model_control: mode,
            ..config(repo.path())
        }));
        let mut cmd = std::process::Command::new(&python);
        cmd.arg(&script)
            .arg(format!("127.0.0.1:{}", h.addr.port()))
            .arg("tiny");
        if mode == ModelControlMode::Explicit {
            cmd.arg("--explicit");
        }
        let out = cmd.output().expect("run python");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{mode:?}: {stdout}\n{stderr}");
        assert!(stdout.contains("agree"), "{mode:?}: {stdout}\n{stderr}");
        rt.block_on(h.shutdown()).unwrap();
    }
}
