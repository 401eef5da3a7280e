//! The MLflow mirror against a real MLflow tracking server: tiny trainings through the `kiln`
//! binary, read back through MLflow's REST API and compared with what kiln recorded
//! (`kiln runs show --json`, `epochs.jsonl`, the run directory's files).
//!
//! Needs `KILN_TEST_MLFLOW_URI` (e.g. `http://127.0.0.1:5000`), a server with a proxied
//! artifact store — `.ci/mlflow.sh` starts one:
//!
//! ```text
//! mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///tmp/m/mlflow.db \
//!     --artifacts-destination /tmp/m/artifacts
//! KILN_TEST_MLFLOW_URI=http://127.0.0.1:5000 cargo test --release --test mlflow_real
//! ```
//!
//! The tests that need the server are `#[ignore = "needs …"]` and fail without it. The
//! "server down" tests need no server and always run. Fault injection (a server answering
//! 500 mid-run, a full queue) is tested with an in-process stand-in in
//! `crates/track/src/mlflow/mod.rs`.

use crate::common::root;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The server under test (the tests that need it are `#[ignore]`d and fail without it).
fn server(test: &str) -> Api {
    let uri = crate::common::required_env(
        "KILN_TEST_MLFLOW_URI",
        &format!("a real MLflow server for {test} (.ci/mlflow.sh)"),
    );
    Api {
        base: uri.trim_end_matches('/').to_string(),
    }
}

/// A minimal MLflow REST client of the test's own (not kiln's).
struct Api {
    base: String,
}

impl Api {
    fn get(&self, path: &str) -> Value {
        let text = ureq::get(format!("{}{path}", self.base))
            .call()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .into_body()
            .read_to_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        let text = ureq::post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
            .into_body()
            .read_to_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn bytes(&self, path: &str) -> Vec<u8> {
        ureq::get(format!("{}{path}", self.base))
            .call()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .into_body()
            .with_config()
            .limit(1 << 30)
            .read_to_vec()
            .unwrap()
    }

    fn run(&self, run_id: &str) -> Value {
        self.get(&format!("/api/2.0/mlflow/runs/get?run_id={run_id}"))["run"].clone()
    }

    fn history(&self, run_id: &str, key: &str) -> Vec<Value> {
        let key = key.replace('/', "%2F");
        self.get(&format!(
            "/api/2.0/mlflow/metrics/get-history?run_id={run_id}&metric_key={key}&max_results=25000"
        ))["metrics"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Every artifact file of a run: path → size.
    fn artifacts(&self, run_id: &str, dir: &str, out: &mut BTreeMap<String, u64>) {
        let q = if dir.is_empty() {
            String::new()
        } else {
            format!("&path={}", dir.replace(' ', "%20"))
        };
        let listed = self.get(&format!(
            "/api/2.0/mlflow/artifacts/list?run_id={run_id}{q}"
        ));
        for f in listed["files"].as_array().into_iter().flatten() {
            let path = f["path"].as_str().unwrap().to_string();
            if f["is_dir"].as_bool().unwrap_or(false) {
                self.artifacts(run_id, &path, out);
            } else {
                out.insert(path, f["file_size"].as_u64().unwrap_or(0));
            }
        }
    }

    fn experiment_runs(&self, name: &str) -> Vec<Value> {
        let exp = self.get(&format!(
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name={}",
            name.replace(' ', "%20")
        ));
        let id = exp["experiment"]["experiment_id"].as_str().unwrap();
        self.post(
            "/api/2.0/mlflow/runs/search",
            &json!({"experiment_ids": [id], "max_results": 1000}),
        )["runs"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

fn tags(run: &Value) -> BTreeMap<String, String> {
    run["data"]["tags"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["key"].as_str().unwrap().to_string(),
                t["value"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn params(run: &Value) -> BTreeMap<String, String> {
    run["data"]["params"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            (
                t["key"].as_str().unwrap().to_string(),
                t["value"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// An experiment name no other test (or earlier CI run) uses.
fn experiment(test: &str) -> String {
    format!(
        "kiln-test {test} {}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// `configs/tiny.yaml` exporting into `dir/out`, with substitutions, written to `dir`.
fn tiny(dir: &Path, subst: &[(&str, &str)]) -> PathBuf {
    crate::common::tiny_config(dir, &dir.join("out"), subst)
}

fn kiln(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args).current_dir(root());
    for v in [
        "MLFLOW_TRACKING_TOKEN",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
        "KILN_MLFLOW_PARENT_RUN_ID",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run kiln")
}

fn ok(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kiln failed: {stderr}");
    stderr
}

/// The run directory a `kiln train` printed (its export directory's parent).
fn run_dir_of(out: &Output) -> PathBuf {
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("export path").trim())
        .parent()
        .unwrap()
        .to_path_buf()
}

fn mlflow_run_id(run_dir: &Path) -> String {
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("mlflow.json")).unwrap())
            .unwrap();
    state["run_id"].as_str().unwrap().to_string()
}

/// Every file of the run directory that should be an artifact, with its artifact path.
fn expected_artifacts(run_dir: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    for name in [
        "config.yaml",
        "epochs.jsonl",
        "resources.png",
        "resources.svg",
        "resources.csv",
    ] {
        if run_dir.join(name).is_file() {
            out.insert(name.to_string(), run_dir.join(name));
        }
    }
    // The calibration pictures.
    for e in std::fs::read_dir(run_dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("calibration_") && (name.ends_with(".png") || name.ends_with(".svg")) {
            out.insert(name, e.path());
        }
    }
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let rel = format!("{prefix}/{}", e.file_name().to_string_lossy());
            if p.is_dir() {
                walk(&p, &rel, out);
            } else {
                out.insert(rel, p);
            }
        }
    }
    walk(&run_dir.join("export"), "export", &mut out);
    walk(&run_dir.join("profile"), "profile", &mut out);
    out
}

#[test]
#[ignore = "needs MLflow: KILN_TEST_MLFLOW_URI (.ci/mlflow.sh)"]
fn a_training_run_is_mirrored_completely() {
    let api = server("a_training_run_is_mirrored_completely");
    let tmp = tempfile::tempdir().unwrap();
    // The profiler runs too, so its trace and key averages become artifacts.
    let cfg = tiny(
        tmp.path(),
        &[(
            "export:\n",
            "profile:\n  enabled: true\n  wait: 1\n  warmup: 1\n  active: 2\nexport:\n",
        )],
    );
    let reg = tmp.path().join("runs.db");
    let exp = experiment("full");
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let out = kiln(
        &[
            "train",
            cfg.to_str().unwrap(),
            "-q",
            "--registry",
            reg.to_str().unwrap(),
        ],
        &[
            ("MLFLOW_TRACKING_URI", &api.base),
            ("MLFLOW_EXPERIMENT_NAME", &exp),
        ],
    );
    let stderr = ok(&out);
    assert!(
        !stderr.contains("MLflow"),
        "no MLflow warning for a healthy server: {stderr}"
    );
    let run_dir = run_dir_of(&out);
    let run_id = mlflow_run_id(&run_dir);
    let run = api.run(&run_id);
    let kiln_id = run_dir.file_name().unwrap().to_string_lossy().into_owned();

    // Status and times.
    assert_eq!(run["info"]["status"], "FINISHED");
    assert_eq!(run["info"]["run_name"], kiln_id.as_str());
    let start = run["info"]["start_time"].as_i64().unwrap();
    let end = run["info"]["end_time"].as_i64().unwrap();
    assert!(started_ms <= start && start <= end, "{start} {end}");

    // Tags.
    let t = tags(&run);
    assert_eq!(t["mlflow.runName"], kiln_id);
    assert_eq!(t["mlflow.source.type"], "LOCAL");
    assert!(t["mlflow.source.name"].starts_with("kiln train "), "{t:?}");
    assert!(!t["mlflow.user"].is_empty());
    assert_eq!(t["kiln.run_id"], kiln_id);
    let git = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(commit) = git {
        assert_eq!(t["mlflow.source.git.commit"], commit);
    }

    // Params: exactly the flattened effective config.
    let loaded = kiln::config::load(&run_dir.join("config.yaml")).unwrap();
    let mut want = Vec::new();
    kiln::track::mlflow::flatten(
        "",
        &serde_json::to_value(&loaded.config).unwrap(),
        &mut want,
    );
    let want: BTreeMap<String, String> = want.into_iter().collect();
    let got = params(&run);
    assert_eq!(got, want);
    assert!(got.contains_key("stages.0.clip_norm"));

    // Every epoch's metrics, at its step, as `kiln runs show --json` has them; real
    // timestamps (within the run, increasing from epoch to epoch).
    let show = kiln(
        &[
            "runs",
            "--registry",
            reg.to_str().unwrap(),
            "show",
            &kiln_id,
            "--json",
        ],
        &[],
    );
    ok(&show);
    let shown: Value = serde_json::from_slice(&show.stdout).unwrap();
    let epochs = shown["epochs"].as_array().unwrap();
    let configured: Vec<usize> = loaded.config.stages.iter().map(|s| s.epochs).collect();
    assert_eq!(epochs.len(), configured.iter().sum::<usize>());
    for (stage, name) in loaded.config.stages.iter().map(|s| &s.name).enumerate() {
        let offset: usize = configured[..stage].iter().sum();
        let want: Vec<(u64, f64)> = epochs
            .iter()
            .filter(|e| e["stage"] == stage)
            .map(|e| {
                (
                    (offset + e["epoch"].as_u64().unwrap() as usize) as u64,
                    e["val_loss"].as_f64().unwrap(),
                )
            })
            .collect();
        for key in ["val_loss", "train_loss", "lr", "grad_norm", "samples_per_s"] {
            let h = api.history(&run_id, &format!("{name}/{key}"));
            assert_eq!(h.len(), want.len(), "{name}/{key}: {h:?}");
        }
        let mut h = api.history(&run_id, &format!("{name}/val_loss"));
        h.sort_by_key(|m| m["step"].as_u64().unwrap());
        let got: Vec<(u64, f64)> = h
            .iter()
            .map(|m| (m["step"].as_u64().unwrap(), m["value"].as_f64().unwrap()))
            .collect();
        assert_eq!(got, want, "{name}/val_loss");
        let stamps: Vec<i64> = h.iter().map(|m| m["timestamp"].as_i64().unwrap()).collect();
        assert!(
            stamps.windows(2).all(|w| w[0] <= w[1]),
            "timestamps follow the epochs: {stamps:?}"
        );
        assert!(stamps.iter().all(|&s| start <= s && s <= end), "{stamps:?}");
    }
    let first = api.history(
        &run_id,
        &format!("{}/val_loss", loaded.config.stages[0].name),
    );
    let last = api.history(
        &run_id,
        &format!("{}/val_loss", loaded.config.stages[1].name),
    );
    assert!(
        first.iter().map(|m| m["timestamp"].as_i64().unwrap()).min()
            < last.iter().map(|m| m["timestamp"].as_i64().unwrap()).max(),
        "metrics were sent as the epochs ended, not all at one instant"
    );

    // Summary and test-split metrics, as the registry and the manifest have them.
    let metric = |k: &str| {
        run["data"]["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["key"] == k)
            .map(|m| m["value"].as_f64().unwrap())
    };
    assert_eq!(metric("val_metric"), shown["val_metric"].as_f64());
    assert_eq!(metric("param_count"), shown["param_count"].as_f64());
    assert_eq!(
        metric("latency_b1_p50_us"),
        shown["latency_b1_p50_us"].as_f64()
    );
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir.join("export/manifest.json")).unwrap(),
    )
    .unwrap();
    let targets = manifest["metrics"]["test"]["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 3);
    for t in targets {
        let name = t["target"].as_str().unwrap();
        for field in [
            "mse_model",
            "nll_model",
            "mse_train_mean",
            "nll_constant_variance",
            "rmse_model",
            "mae_model",
            "r2_model",
            "crps_model",
            "coverage_90",
            "calibration_error",
            "sharpness",
        ] {
            assert_eq!(
                metric(&format!("test/{name}/{field}")),
                t[field].as_f64(),
                "test/{name}/{field}"
            );
        }
    }
    // The validation split's table goes too.
    for t in manifest["metrics"]["validation"]["targets"]
        .as_array()
        .unwrap()
    {
        let name = t["target"].as_str().unwrap();
        assert_eq!(
            metric(&format!("validation/{name}/crps_model")),
            t["crps_model"].as_f64()
        );
    }

    // The dataset input with its digest.
    let inputs = run["inputs"]["dataset_inputs"].as_array().unwrap();
    assert_eq!(inputs.len(), 1, "{inputs:?}");
    let sha = manifest["dataset"]["sha256"].as_str().unwrap();
    assert_eq!(inputs[0]["dataset"]["digest"], &sha[..32]);
    assert_eq!(inputs[0]["dataset"]["name"], "baseball.csv");

    // Artifacts: exactly the run's files, byte for byte.
    let mut listed = BTreeMap::new();
    api.artifacts(&run_id, "", &mut listed);
    let expected = expected_artifacts(&run_dir);
    for must in [
        "config.yaml",
        "epochs.jsonl",
        "export/manifest.json",
        "profile/trace.json",
        "profile/key_averages.json",
    ] {
        assert!(
            expected.contains_key(must),
            "{must} missing from the run dir"
        );
    }
    // The calibration pictures are among them.
    for ext in [".png", ".svg"] {
        assert!(
            listed
                .keys()
                .any(|k| k.starts_with("calibration_") && k.ends_with(ext)),
            "no calibration {ext} among {:?}",
            listed.keys()
        );
    }
    assert_eq!(
        listed.keys().collect::<BTreeSet<_>>(),
        expected.keys().collect::<BTreeSet<_>>()
    );
    let exp_id = run["info"]["experiment_id"].as_str().unwrap();
    for (name, file) in &expected {
        let bytes = api.bytes(&format!(
            "/api/2.0/mlflow-artifacts/artifacts/{exp_id}/{run_id}/artifacts/{name}"
        ));
        assert!(bytes == std::fs::read(file).unwrap(), "{name} differs");
    }
}

#[test]
#[ignore = "needs MLflow: KILN_TEST_MLFLOW_URI (.ci/mlflow.sh)"]
fn a_sweep_is_one_parent_run_with_a_child_per_member() {
    let api = server("a_sweep_is_one_parent_run_with_a_child_per_member");
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(
        tmp.path(),
        &[("epochs: 3", "epochs: 1"), ("epochs: 2", "epochs: 1")],
    );
    let sweep = tmp.path().join("sweep.yaml");
    std::fs::write(
        &sweep,
        format!(
            "base: {}\nparallel: 2\ngrid:\n  model.hidden: [[4], [8]]\n",
            cfg.display()
        ),
    )
    .unwrap();
    let reg = tmp.path().join("runs.db");
    let exp = experiment("sweep");
    let out = kiln(
        &[
            "sweep",
            sweep.to_str().unwrap(),
            "--registry",
            reg.to_str().unwrap(),
            "--json",
        ],
        &[
            ("MLFLOW_TRACKING_URI", &api.base),
            ("MLFLOW_EXPERIMENT_NAME", &exp),
        ],
    );
    ok(&out);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let members: Vec<&str> = report["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(members.len(), 2);

    let runs = api.experiment_runs(&exp);
    assert_eq!(runs.len(), 3, "one parent and two children");
    let parents: Vec<&Value> = runs
        .iter()
        .filter(|r| !tags(r).contains_key("mlflow.parentRunId"))
        .collect();
    assert_eq!(parents.len(), 1);
    let parent = parents[0];
    let parent_id = parent["info"]["run_id"].as_str().unwrap();
    assert_eq!(parent["info"]["status"], "FINISHED");
    let p = params(parent);
    assert_eq!(p["grid.model:2Ehidden.0"], "[4]", "{p:?}");
    assert_eq!(p["grid.model:2Ehidden.1"], "[8]", "{p:?}");
    let mut children: Vec<String> = Vec::new();
    for r in runs.iter().filter(|r| r["info"]["run_id"] != parent_id) {
        let t = tags(r);
        assert_eq!(t["mlflow.parentRunId"], parent_id);
        assert_eq!(r["info"]["status"], "FINISHED");
        children.push(t["kiln.run_id"].clone());
    }
    children.sort();
    let mut members: Vec<String> = members.iter().map(|s| s.to_string()).collect();
    members.sort();
    assert_eq!(children, members);
    let mut listed = BTreeMap::new();
    api.artifacts(parent_id, "", &mut listed);
    assert!(listed.contains_key("sweep.yaml"), "{listed:?}");
}

#[test]
#[ignore = "needs MLflow: KILN_TEST_MLFLOW_URI (.ci/mlflow.sh)"]
fn sigkill_is_reaped_as_killed_and_resume_continues_the_same_mlflow_run() {
    let api = server("sigkill_is_reaped_as_killed_and_resume_continues_the_same_mlflow_run");
    let tmp = tempfile::tempdir().unwrap();
    // A real per-sample cost in the data path makes each epoch long enough to be killed in
    // the middle of the run.
    let cfg = tiny(
        tmp.path(),
        &[
            ("  num_workers: 2", "  num_workers: 1"),
            ("  prefetch: 4", "  prefetch: 2"),
            ("data:\n", "data:\n  transform_passes: 150\n"),
        ],
    );
    let reg = tmp.path().join("runs.db");
    let exp = experiment("resume");
    let env = [
        ("MLFLOW_TRACKING_URI", api.base.as_str()),
        ("MLFLOW_EXPERIMENT_NAME", exp.as_str()),
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args([
        "train",
        cfg.to_str().unwrap(),
        "-q",
        "--registry",
        reg.to_str().unwrap(),
    ])
    .current_dir(root())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let runs = tmp.path().join("out/runs");
    let deadline = Instant::now() + Duration::from_secs(120);
    let run_dir = loop {
        let found = std::fs::read_dir(&runs).ok().and_then(|d| {
            d.flatten()
                .map(|e| e.path())
                .find(|p| p.join("state/LATEST").exists() && p.join("mlflow.json").exists())
        });
        if let Some(p) = found {
            break p;
        }
        assert!(Instant::now() < deadline, "no snapshot appeared");
        std::thread::sleep(Duration::from_millis(5));
    };
    let run_id = mlflow_run_id(&run_dir);
    // Wait until the first epoch's metrics reached the server, then SIGKILL.
    while api.history(&run_id, "mean/val_loss").is_empty() {
        assert!(Instant::now() < deadline, "no metric reached the server");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    assert!(!child.wait().unwrap().success());
    assert_eq!(api.run(&run_id)["info"]["status"], "RUNNING");

    // The next kiln run on this host marks the orphan KILLED.
    let other = tempfile::tempdir().unwrap();
    let quick = tiny(
        other.path(),
        &[("epochs: 3", "epochs: 1"), ("epochs: 2", "epochs: 1")],
    );
    ok(&kiln(&["train", quick.to_str().unwrap(), "-q"], &env));
    let killed = api.run(&run_id);
    assert_eq!(killed["info"]["status"], "KILLED");
    assert!(tags(&killed)["kiln.failure_reason"].contains("disappeared"));

    // --resume continues the same MLflow run to FINISHED, every epoch logged.
    let out = kiln(
        &[
            "train",
            cfg.to_str().unwrap(),
            "--resume",
            run_dir.to_str().unwrap(),
            "-q",
            "--registry",
            reg.to_str().unwrap(),
        ],
        &env,
    );
    let stderr = ok(&out);
    assert!(!stderr.contains("MLflow"), "{stderr}");
    assert_eq!(mlflow_run_id(&run_dir), run_id);
    let run = api.run(&run_id);
    assert_eq!(run["info"]["status"], "FINISHED");
    let runs = api.experiment_runs(&exp);
    assert_eq!(
        runs.len(),
        2,
        "the resumed run and the quick run, no duplicate"
    );
    let steps: BTreeSet<u64> = api
        .history(&run_id, "mean/val_loss")
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, (0..3).collect(), "every epoch of the first stage");
    let steps: BTreeSet<u64> = api
        .history(&run_id, "variance/val_loss")
        .iter()
        .map(|m| m["step"].as_u64().unwrap())
        .collect();
    assert_eq!(
        steps,
        (3..5).collect(),
        "the second stage continues the steps"
    );
}

/// A tracking URI where nothing listens.
fn dead_uri() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}", l.local_addr().unwrap());
    drop(l);
    uri
}

#[test]
fn a_server_that_is_down_costs_one_warning_not_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(
        tmp.path(),
        &[("epochs: 3", "epochs: 1"), ("epochs: 2", "epochs: 1")],
    );
    let uri = dead_uri();
    let out = kiln(
        &["train", cfg.to_str().unwrap(), "-q", "--plain"],
        &[("MLFLOW_TRACKING_URI", &uri)],
    );
    let stderr = ok(&out);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("MLflow")).collect();
    assert_eq!(lines.len(), 1, "one warning: {stderr}");
    assert!(lines[0].contains(&uri), "{stderr}");
    assert!(run_dir_of(&out).join("export/manifest.json").is_file());
    assert!(!run_dir_of(&out).join("mlflow.json").exists());
}

/// A tracking URI whose listener accepts every connection and never reads or answers; the
/// number of connections accepted so far.
fn silent_uri() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}", l.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let a2 = std::sync::Arc::clone(&accepted);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming().flatten() {
            held.push(s);
            a2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    (uri, accepted)
}

#[test]
fn a_server_that_accepts_and_never_answers_does_not_hold_up_training() {
    // The read timeout (10 minutes, 3 tries) is far longer than this run: `kiln train` can
    // only finish first because the mirror creates its run off the training thread and gives
    // up at the flush timeout (1 s here) at the end.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(
        tmp.path(),
        &[("epochs: 3", "epochs: 1"), ("epochs: 2", "epochs: 1")],
    );
    let (uri, accepted) = silent_uri();
    let out = kiln(
        &["train", cfg.to_str().unwrap(), "-q", "--plain"],
        &[
            ("MLFLOW_TRACKING_URI", &uri),
            ("MLFLOW_HTTP_REQUEST_TIMEOUT", "600"),
            ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"),
            ("KILN_MLFLOW_FLUSH_TIMEOUT", "1"),
        ],
    );
    let stderr = ok(&out);
    assert!(
        accepted.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "kiln never connected: {stderr}"
    );
    let run = run_dir_of(&out);
    assert!(run.join("export/manifest.json").is_file());
    let status: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(status["status"], "finished");
    // One warning, naming what was not uploaded and why.
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("MLflow")).collect();
    assert_eq!(lines.len(), 1, "one warning: {stderr}");
    for part in [
        "metric values",
        "artifact files were not uploaded",
        "gave up waiting for the server after 1s (KILN_MLFLOW_FLUSH_TIMEOUT)",
        "the final status FINISHED was not set",
    ] {
        assert!(lines[0].contains(part), "{part:?} not in {stderr}");
    }
    assert!(!run.join("mlflow.json").exists());
}

#[test]
fn a_sweep_shows_each_members_mlflow_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(
        tmp.path(),
        &[("epochs: 3", "epochs: 1"), ("epochs: 2", "epochs: 1")],
    );
    let sweep = tmp.path().join("sweep.yaml");
    std::fs::write(
        &sweep,
        format!(
            "base: {}\nparallel: 1\ngrid:\n  seed: [1, 2]\n",
            cfg.display()
        ),
    )
    .unwrap();
    let reg = tmp.path().join("runs.db");
    let out = kiln(
        &[
            "sweep",
            sweep.to_str().unwrap(),
            "--registry",
            reg.to_str().unwrap(),
        ],
        &[("MLFLOW_TRACKING_URI", &dead_uri())],
    );
    let stderr = ok(&out);
    // The sweep's own warning (no parent run) and one per member, each member finishing.
    let member_warnings = stderr
        .lines()
        .filter(|l| l.starts_with("    ") && l.contains("MLflow mirror disabled"))
        .count();
    assert_eq!(member_warnings, 2, "{stderr}");
}

/// `kiln promote` of a run's export into a fresh repository `repo` as model `model`, with
/// `env`; returns its output.
fn promote(run_dir: &Path, repo: &Path, model: &str, reg: &Path, env: &[(&str, &str)]) -> Output {
    kiln(
        &[
            "promote",
            "--checkpoint",
            run_dir.join("export").to_str().unwrap(),
            "--repository",
            repo.to_str().unwrap(),
            "--model",
            model,
            "--registry",
            reg.to_str().unwrap(),
            "--latency-ms",
            "50",
            "--json",
        ],
        env,
    )
}

#[test]
#[ignore = "needs MLflow: KILN_TEST_MLFLOW_URI (.ci/mlflow.sh)"]
fn a_promotion_registers_the_served_version_in_the_model_registry() {
    let api = server("a_promotion_registers_the_served_version_in_the_model_registry");
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(
        tmp.path(),
        &[("epochs: 3", "epochs: 1"), ("epochs: 2", "epochs: 1")],
    );
    let reg = tmp.path().join("runs.db");
    let exp = experiment("registry");
    let env = [
        ("MLFLOW_TRACKING_URI", api.base.as_str()),
        ("MLFLOW_EXPERIMENT_NAME", exp.as_str()),
        ("KILN_MLFLOW_MODEL_ALIAS", "champion"),
    ];
    let out = kiln(
        &[
            "train",
            cfg.to_str().unwrap(),
            "-q",
            "--registry",
            reg.to_str().unwrap(),
        ],
        &env,
    );
    ok(&out);
    let run_dir = run_dir_of(&out);
    let run_id = mlflow_run_id(&run_dir);
    // The calibration pictures reached the run's artifacts.
    let mut listed = BTreeMap::new();
    api.artifacts(&run_id, "", &mut listed);
    for ext in [".png", ".svg"] {
        assert!(
            listed
                .keys()
                .any(|k| k.starts_with("calibration_") && k.ends_with(ext)),
            "no calibration {ext} in {:?}",
            listed.keys()
        );
    }

    let repo = tmp.path().join("models");
    // A model name of this test's own: the server may be shared by other tests.
    let model = format!("kiln-test-{}", std::process::id());
    let p = promote(&run_dir, &repo, &model, &reg, &env);
    ok(&p);
    let promotion: Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(promotion["version"], 1, "{promotion}");
    let registered = &promotion["mlflow"]["registered"];
    assert!(registered.is_object(), "{promotion}");

    // What an MLflow user sees: the alias points at the version, with its source and tags.
    let got = api.get(&format!(
        "/api/2.0/mlflow/registered-models/alias?name={model}&alias=champion"
    ));
    let v = &got["model_version"];
    assert_eq!(v["name"], model.as_str(), "{got}");
    assert_eq!(v["version"], registered["version"], "{got}");
    assert_eq!(v["source"], format!("runs:/{run_id}/export"), "{got}");
    assert_eq!(v["run_id"], run_id.as_str(), "{got}");
    assert!(
        v["aliases"]
            .as_array()
            .is_some_and(|a| a.contains(&Value::from("champion"))),
        "{got}"
    );
    let tags: BTreeMap<String, String> = v["tags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["key"].as_str().unwrap().to_string(),
                t["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir.join("export/manifest.json")).unwrap(),
    )
    .unwrap();
    let installed = std::path::absolute(repo.join(&model).join("1")).unwrap();
    assert_eq!(
        tags["kiln.repository_path"],
        installed.display().to_string()
    );
    assert_eq!(tags["kiln.repository_version"], "1");
    assert_eq!(
        tags["kiln.checkpoint_sha256"],
        manifest["weights"]["sha256"].as_str().unwrap()
    );
    assert_eq!(
        tags["kiln.run_id"],
        run_dir.file_name().unwrap().to_string_lossy()
    );
    assert_eq!(tags["kiln.version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn a_promotion_succeeds_when_the_model_registry_is_unreachable() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny(
        tmp.path(),
        &[("epochs: 3", "epochs: 1"), ("epochs: 2", "epochs: 1")],
    );
    let reg = tmp.path().join("runs.db");
    let out = kiln(
        &[
            "train",
            cfg.to_str().unwrap(),
            "-q",
            "--plain",
            "--registry",
            reg.to_str().unwrap(),
        ],
        &[],
    );
    ok(&out);
    let uri = dead_uri();
    let repo = tmp.path().join("models");
    let p = promote(
        &run_dir_of(&out),
        &repo,
        "baseball",
        &reg,
        &[("MLFLOW_TRACKING_URI", &uri)],
    );
    let stderr = ok(&p);
    assert!(stderr.contains("not registered"), "a warning: {stderr}");
    let promotion: Value = serde_json::from_slice(&p.stdout).unwrap();
    assert_eq!(promotion["version"], 1);
    assert!(repo.join("baseball/1/manifest.json").is_file());
    let m = &promotion["mlflow"];
    assert_eq!(m["tracking_uri"], uri.as_str());
    assert!(m["registered"].is_null());
    assert!(m["error"].as_str().unwrap().contains(&uri), "{m}");
    // The promotion's registry row records it too.
    let rows = kiln::track::registry::Registry::open(&reg)
        .unwrap()
        .promotions(None)
        .unwrap();
    let row = rows.last().unwrap();
    let details = row
        .details
        .mlflow
        .as_ref()
        .expect("recorded in the details");
    assert!(details.error.as_deref().unwrap().contains(&uri));
}
