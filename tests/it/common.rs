//! Helpers shared by the integration tests' modules: the repository root and the `kiln`
//! binary, tiny configs written into a temporary directory, a tiny model trained in-process
//! once per test process, repositories holding it, and a server over them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use kiln::serve::{BatcherConfig, BatchingPolicy, ServeConfig, ServerHandle};

use kiln::config;
use kiln::records::RunDir;
use kiln::train::{ProgressMode, TrainJob};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The value of `var`, which names a real service a test needs (`how` says where it comes
/// from). Such tests are `#[ignore = "needs …"]`, so they run only when asked for
/// (`cargo test -- --ignored`, as `.ci/run` does after starting the services); asked for
/// without the service, they fail — never a silent pass.
pub fn required_env(var: &str, how: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!("{var} is not set: this test needs {how}; `.ci/run` provides it"),
    }
}

/// Run the `kiln` binary in the repository root, without the environment variables that
/// change its output (`KILN_LOG`, `NO_COLOR`, `MLFLOW_TRACKING_URI`).
pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(root())
        .env_remove("KILN_LOG")
        .env_remove("NO_COLOR")
        .env_remove("MLFLOW_TRACKING_URI")
        .output()
        .expect("run kiln")
}

/// [`kiln`] with `env` set (and without `KILN_FAULT`, so that only the faults a test plants
/// fire).
pub fn kiln_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(root())
        .env_remove("KILN_LOG")
        .env_remove("NO_COLOR")
        .env_remove("MLFLOW_TRACKING_URI")
        .env_remove("KILN_FAULT")
        .envs(env.iter().copied())
        .output()
        .expect("run kiln")
}

/// A command's standard error, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A command's standard output, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The single run directory under `<export>/runs/` (asserted: exactly one).
pub fn only_run(export: &Path) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(export.join("runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

/// [`tiny_config`] writing under `dir/out`, with nothing substituted.
pub fn tiny_in(dir: &Path) -> PathBuf {
    tiny_config(dir, &dir.join("out"), &[])
}

/// `configs/tiny.yaml` with its export directory at `export_dir` and the substitutions
/// `subst` applied (each must match), written to `dir/tiny.yaml`.
pub fn tiny_config(dir: &Path, export_dir: &Path, subst: &[(&str, &str)]) -> PathBuf {
    let mut text = std::fs::read_to_string(root().join("configs/tiny.yaml"))
        .unwrap()
        .replace(
            "  dir: checkpoints",
            &format!("  dir: {}", export_dir.display()),
        );
    for (a, b) in subst {
        assert!(
            text.contains(a),
            "substitution {a:?} not found in configs/tiny.yaml"
        );
        text = text.replace(a, b);
    }
    let p = dir.join("tiny.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The substitution that makes the tiny config's data path absolute (for runs whose working
/// directory is not the repository root).
pub fn absolute_data() -> (&'static str, String) {
    (
        "path: datasets/baseball.csv",
        format!("path: {}", root().join("datasets/baseball.csv").display()),
    )
}

/// The serving tests' server settings over `repo`: any free port, `engine`, one instance of
/// one thread, idle-flush batching up to 64 rows, no polling.
pub fn serve_config(repo: &Path, engine: &str) -> ServeConfig {
    ServeConfig {
        repository: repo.to_path_buf(),
        port: 0,
        engine: Some(engine.parse().unwrap()),
        batcher: BatcherConfig {
            policy: BatchingPolicy::Idle,
            max_batch_size: 64,
            max_queue_delay: Duration::from_micros(200),
            max_queue_size: 256,
            instances: 1,
            threads_per_instance: 1,
            ..BatcherConfig::default()
        },
        poll_interval: None,
        ..ServeConfig::default()
    }
}

/// An HTTP client of `h` (a generous timeout: it bounds only a failing test's wait).
pub fn client(h: &ServerHandle) -> kiln::loadgen::client::HttpClient {
    kiln::loadgen::client::HttpClient::new(h.addr).with_timeout(Duration::from_secs(60))
}

/// Start a server and wait (up to a minute) until it is ready.
pub async fn serve(cfg: ServeConfig) -> ServerHandle {
    let h = kiln::serve::start(cfg).await.expect("server starts");
    assert!(
        h.wait_ready(Duration::from_secs(60)).await,
        "server became ready"
    );
    h
}

/// The export directory of `configs/tiny.yaml`, trained once per test process under
/// `<target tmp>/trained/<pid>/` (earlier processes' directories there go).
pub fn trained() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| train_tiny("trained", false))
}

/// [`trained`]'s run measured as `kiln train` measures it before the export (its manifest
/// records the latency on the serving engine, the int8 accuracy change and the pick
/// evaluation), under `<target tmp>/trained-measured/<pid>/`.
pub fn trained_measured() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| train_tiny("trained-measured", true))
}

fn train_tiny(name: &str, measured: bool) -> PathBuf {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    if let Ok(old) = std::fs::read_dir(&base) {
        for e in old.flatten() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    let tmp = base.join(std::process::id().to_string());
    std::fs::create_dir_all(&tmp).unwrap();
    let path = tiny_config(&tmp, &tmp.join("out"), &[]);
    let loaded = config::load(&path).unwrap();
    let run = RunDir::create(&loaded.config.export.dir, &loaded.config.name).unwrap();
    std::fs::write(run.config_file(), &loaded.text).unwrap();
    let measure = kiln::run::measure::RunMeasure::new(loaded.config.export.engine_kind());
    let job = TrainJob {
        observer: None,
        teacher: None,
        config: &loaded,
        run,
        resume: false,
        progress: ProgressMode::Quiet,
        stop_after_epochs: None,
        data: None,
        measure: measured.then_some(&measure as &dyn kiln::train::Measure),
    };
    let trained = kiln::train::train_job_cpu(&job).expect("training succeeds");
    trained.outcome.export_dir.clone().unwrap()
}

/// Copy the files of `from` into `to` (created).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A repository holding `tiny/1`: a copy of `trained`.
pub fn repository_of(trained: &Path) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    copy_dir(trained, &repo.path().join("tiny").join("1"));
    repo
}

/// `n` deterministic rows of raw features within one standard deviation of the training
/// means of the checkpoint in `export`.
pub fn rows_around_means(export: &Path, n: usize, seed: u32) -> Vec<f32> {
    let ckpt = kiln::artifact::Checkpoint::load(export).unwrap();
    let f = &ckpt.manifest.features;
    let mut out = Vec::with_capacity(n * f.len());
    for r in 0..n {
        for (j, c) in f.iter().enumerate() {
            let u = (((r as u32 + 1) * 7919 + (j as u32 + 3) * 104_729 + seed * 31) % 1000) as f64
                / 1000.0;
            out.push((c.mean + c.std * (2.0 * u - 1.0)) as f32);
        }
    }
    out
}

/// Held by a test while it records an on-demand profile: the profiler is one per process, so
/// two recordings at once would answer 409.
pub static PROFILING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Read a child `kiln serve`'s stderr for its whole life on a thread, sending the address of
/// each `http://` it prints. Draining matters: a reader that stopped after the address would
/// close the pipe, and the child's next line to stderr would then fail (EPIPE) and end it.
pub fn printed_addrs(
    stderr: std::process::ChildStderr,
) -> std::sync::mpsc::Receiver<std::net::SocketAddr> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(i) = line.find("http://") {
                let rest = &line[i + 7..];
                let end = rest.find([' ', '/']).unwrap_or(rest.len());
                if let Ok(a) = rest[..end].parse::<std::net::SocketAddr>() {
                    let _ = tx.send(a);
                }
            }
        }
    });
    rx
}

/// A KServe v2 gRPC request to `tiny` with `x` (`rows × 10` features) as raw contents and
/// the given request parameters.
pub fn grpc_raw_request(
    x: &[f32],
    params: &[(
        &str,
        kiln::serve::grpc::proto::infer_parameter::ParameterChoice,
    )],
) -> kiln::serve::grpc::proto::ModelInferRequest {
    use kiln::serve::grpc::proto as pb;
    let features = 10;
    pb::ModelInferRequest {
        model_name: "tiny".into(),
        inputs: vec![pb::model_infer_request::InferInputTensor {
            name: "features".into(),
            datatype: "FP32".into(),
            shape: vec![(x.len() / features) as i64, features as i64],
            ..Default::default()
        }],
        raw_input_contents: vec![
            x.iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ],
        parameters: params
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    pb::InferParameter {
                        parameter_choice: Some(v.clone()),
                    },
                )
            })
            .collect(),
        ..Default::default()
    }
}

/// A `ModelInfer` call over a raw HTTP/2 stream (no gRPC client, so no client-side deadline or
/// framing of its own): `body` is sent as the stream's data (`end`: and the stream is closed),
/// with `extra` headers. Returns the gRPC status and message the server answers with, and how
/// long the answer took.
pub async fn raw_grpc_call(
    addr: std::net::SocketAddr,
    extra: &[(&str, &str)],
    body: Vec<u8>,
    end: bool,
) -> (String, String, Duration) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut req = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{addr}/inference.GRPCInferenceService/ModelInfer"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let t0 = std::time::Instant::now();
    let (resp, mut stream) = client.send_request(req.body(()).unwrap(), false).unwrap();
    // A server that refuses the call from its headers alone (a bad `grpc-timeout`) may answer
    // and close the stream before the body is sent: the body is then refused as sent to an
    // inactive stream, and the answer below is what the test checks.
    if let Err(e) = stream.send_data(body.into(), end) {
        assert!(
            e.to_string().contains("inactive stream") || e.is_reset(),
            "sending the body: {e}"
        );
    }
    let resp = tokio::time::timeout(Duration::from_secs(30), resp)
        .await
        .expect("the server answers the call")
        .unwrap();
    let (mut meta, mut body) = (resp.headers().clone(), resp.into_body());
    if !meta.contains_key("grpc-status") {
        while body.data().await.is_some() {}
        meta = body.trailers().await.unwrap().unwrap_or_default();
    }
    let field = |k: &str| {
        meta.get(k)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let answer = (field("grpc-status"), field("grpc-message"), t0.elapsed());
    drop(stream);
    answer
}

/// A message framed as gRPC sends it: an uncompressed flag, the length (big-endian u32), the
/// protobuf bytes.
pub fn grpc_frame(message: &impl prost::Message) -> Vec<u8> {
    let bytes = message.encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    frame.extend_from_slice(&bytes);
    frame
}

/// A registry with 34 finished runs whose latencies are planted (no training needed), run
/// directory `run_dir`; with `with_band` every seventh run (`run-03`, `run-10`, …) is 3.4×
/// slower than its peers. The runs' ids, in order.
pub fn planted_runs(
    reg: &kiln::track::registry::Registry,
    run_dir: &Path,
    with_band: bool,
) -> Vec<String> {
    use kiln::track::registry::{NewRun, RunEnd};
    let base = std::fs::read_to_string(root().join("configs/baseball.yaml")).unwrap();
    let mut ids = Vec::new();
    for i in 0..34 {
        let slow = with_band && i % 7 == 3;
        let hidden = if slow {
            "[49, 49]".to_string()
        } else {
            format!("[{}, 48]", 46 + (i % 4))
        };
        let text = base.replace("hidden: [48, 48]", &format!("hidden: {hidden}"));
        let id = format!("run-{i:02}");
        reg.start_run(&NewRun {
            id: &id,
            name: "baseball",
            run_dir,
            config_text: &text,
            config_sha256: "x",
            started_at: &format!("2026-11-29T10:{i:02}:00Z"),
            environment: Default::default(),
        })
        .unwrap();
        let params = if slow { 3858 } else { 3750 + (i * 3) as i64 };
        let lat =
            600.0 * (1.0 + 0.05 * ((i % 5) as f64 - 2.0) / 2.0) * if slow { 3.4 } else { 1.0 };
        reg.finish_run(
            &id,
            &RunEnd {
                status: kiln::records::RunState::Finished,
                param_count: Some(params),
                val_metric: Some(0.4 + 0.001 * (i % 6) as f64),
                latency_b1_p50_us: Some(lat),
                latency_b128_p50_us: Some(lat * 20.0),
                ..RunEnd::default()
            },
        )
        .unwrap();
        ids.push(id);
    }
    ids
}

/// The part of a test config after `data:` — the model, a one-process loader and the two
/// stages (mean: MSE at learning rate `lr`; variance: Gaussian NLL at 1e-2) — with exports
/// under `export`.
pub fn model_and_stages(
    hidden: &str,
    batch: usize,
    mean_epochs: usize,
    lr: &str,
    variance_epochs: usize,
    export: &Path,
) -> String {
    format!(
        "model:
  hidden: {hidden}
loader:
  batch_size: {batch}
  num_workers: 0
stages:
  - name: mean
    trainable: [backbone, mean_head]
    loss: mse
    epochs: {mean_epochs}
    optimizer: {{lr: {lr}}}
  - name: variance
    trainable: [logvar_head]
    loss: gaussian_nll
    epochs: {variance_epochs}
    optimizer: {{lr: 1.0e-2, weight_decay: 0.0}}
export:
  dir: {}
",
        export.display()
    )
}

/// `kiln predict --checkpoint CKPT --input INPUT --output OUTPUT`, in the repository root.
pub fn predict(ckpt: &str, input: &Path, output: &Path) -> Output {
    kiln(&[
        "predict",
        "--checkpoint",
        ckpt,
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ])
}

/// BYTES elements in the binary form: a 4-byte little-endian length, then the bytes.
pub fn bytes_elements(v: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in v {
        out.extend((s.len() as u32).to_le_bytes());
        out.extend(s.as_bytes());
    }
    out
}

/// POST a KServe v2 request in the binary form to `/v2/models/<model>/infer`: each input as
/// (name, datatype, elements, raw bytes), JSON outputs asked for.
pub async fn infer_binary(
    c: &mut kiln::loadgen::client::HttpClient,
    model: &str,
    inputs: &[(&str, &str, usize, Vec<u8>)],
) -> kiln::loadgen::client::HttpResponse {
    let specs: Vec<serde_json::Value> = inputs
        .iter()
        .map(|(name, dt, n, bytes)| {
            serde_json::json!({"name": name, "datatype": dt, "shape": [n],
                "parameters": {"binary_data_size": bytes.len()}})
        })
        .collect();
    let header = serde_json::json!({"inputs": specs, "parameters": {"binary_data_output": false}})
        .to_string();
    let mut body = header.clone().into_bytes();
    for (_, _, _, bytes) in inputs {
        body.extend(bytes);
    }
    c.request(
        "POST",
        &format!("/v2/models/{model}/infer"),
        &[
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", &header.len().to_string()),
        ],
        &body,
    )
    .await
    .unwrap()
}

/// `kiln export onnx` of `ckpt` into `dir/m.onnx`, which must be refused with exit 2, the
/// error containing `message`, and no file written.
pub fn onnx_refused(ckpt: &str, dir: &Path, message: &str) {
    let onnx = dir.join("m.onnx");
    let o = kiln(&[
        "export",
        "onnx",
        "--checkpoint",
        ckpt,
        "--out",
        onnx.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains(message), "{}", stderr(&o));
    assert!(!onnx.exists());
}

/// The `data` of output `name` in a KServe v2 JSON answer.
pub fn output_data(answer: &serde_json::Value, name: &str) -> Vec<f64> {
    answer["outputs"]
        .as_array()
        .unwrap_or_else(|| panic!("no outputs in {answer}"))
        .iter()
        .find(|o| o["name"] == name)
        .unwrap_or_else(|| panic!("no output {name} in {answer}"))["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// A seeded stream of uniforms in (0, 1) (a 64-bit LCG's high bits): the tests' synthetic
/// tables.
pub fn uniforms(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed;
    move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as f64 + 0.5) / (1u64 << 31) as f64
    }
}

/// The checkpoint directory `kiln train` printed last on stdout (the run must have succeeded).
pub fn exported(o: &Output) -> PathBuf {
    assert!(o.status.success(), "{}", stderr(o));
    PathBuf::from(stdout(o).lines().last().unwrap_or_default().trim())
}

/// `kiln train CFG -q --resume RUN`.
pub fn resume(cfg: &Path, run: &Path) -> Output {
    kiln(&[
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--resume",
        run.to_str().unwrap(),
    ])
}
