//! A whole training run driven through the library alone — no CLI, no subprocess — with the
//! run registry and the MLflow mirror attached as observers, plus an observer of our own that
//! records the order of the events.
//!
//! The MLflow server here is an in-process stand-in on loopback that records the requests
//! (this test checks what kiln sends and when; the mirror's behaviour against a real MLflow
//! server is the MLflow suite's business).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

use kiln::config;
use kiln::records::{EpochRecord, NewRun, RunDir, RunEnd};
use kiln::run::{ObserverError, RunObserver, RunOptions, TrainingRun};
use kiln::track::mlflow::{Client, MirrorOptions};
use kiln::track::registry::Registry;
use kiln::track::{MlflowObserver, RegistryObserver};

fn tiny_in(dir: &Path) -> config::LoadedConfig {
    let (from, to) = crate::common::absolute_data();
    config::load(&crate::common::tiny_config(
        dir,
        &dir.join("out"),
        &[(from, &to)],
    ))
    .unwrap()
}

/// (method, path, body) of every request.
type Log = Arc<Mutex<Vec<(String, String, serde_json::Value)>>>;

/// A loopback HTTP/1.1 server answering the MLflow REST calls the mirror makes.
fn mlflow_stand_in() -> (String, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap());
    let log: Log = Arc::default();
    let l2 = log.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let log = l2.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut out = stream;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut parts = line.split_whitespace();
                    let (method, path) = (
                        parts.next().unwrap_or("").to_string(),
                        parts.next().unwrap_or("").to_string(),
                    );
                    let mut len = 0usize;
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        let h = h.trim_end();
                        if h.is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; len];
                    reader.read_exact(&mut body).unwrap();
                    let body: serde_json::Value =
                        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                    let (code, answer) = if path.contains("experiments/get-by-name") {
                        (
                            404,
                            serde_json::json!({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"}),
                        )
                    } else if path.ends_with("experiments/create") {
                        (200, serde_json::json!({"experiment_id": "1"}))
                    } else if path.ends_with("runs/create") {
                        (200, serde_json::json!({"run": {"info": {"run_id": "r1"}}}))
                    } else {
                        (200, serde_json::json!({}))
                    };
                    log.lock().unwrap().push((method, path, body));
                    let text = answer.to_string();
                    let _ = write!(
                        out,
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{text}",
                        text.len()
                    );
                }
            });
        }
    });
    (uri, log)
}

/// Records the events it sees, in order.
#[derive(Default, Clone)]
struct Events(Arc<Mutex<Vec<String>>>);

impl RunObserver for Events {
    fn on_start(&self, _run: &RunDir, start: &NewRun<'_>) -> Result<(), ObserverError> {
        self.0.lock().unwrap().push(format!("start {}", start.name));
        Ok(())
    }
    fn on_epoch(&self, _run: &RunDir, r: &EpochRecord) {
        self.0
            .lock()
            .unwrap()
            .push(format!("epoch {} {}", r.stage, r.epoch));
    }
    fn on_stage_end(&self, _run: &RunDir, index: usize, name: &str) {
        self.0.lock().unwrap().push(format!("stage {index} {name}"));
    }
    fn on_export(&self, _run: &RunDir, dir: &Path) {
        assert!(dir.join("manifest.json").is_file());
        self.0.lock().unwrap().push("export".into());
    }
    fn on_end(&self, _run: &RunDir, end: &RunEnd) {
        self.0.lock().unwrap().push(format!("end {}", end.status));
    }
}

#[test]
fn a_full_run_through_the_library_with_registry_and_mlflow_observers() {
    let tmp = tempfile::tempdir().unwrap();
    let loaded = tiny_in(tmp.path());
    let epochs: usize = loaded.config.stages.iter().map(|s| s.epochs).sum();
    let registry_path = tmp.path().join("registry.db");
    let (uri, log) = mlflow_stand_in();

    let mut run = TrainingRun::new(loaded, RunOptions::default()).unwrap();
    let events = Events::default();
    run.observe(Box::new(events.clone()));
    run.observe(Box::new(RegistryObserver::new(
        Registry::open(&registry_path).unwrap(),
    )));
    let options = MirrorOptions {
        experiment: "kiln-tiny".into(),
        parent_run_id: None,
        queue_capacity: 256,
        flush_timeout: std::time::Duration::from_secs(120),
    };
    let mirror = MlflowObserver::new(Client::new(&uri).unwrap(), options, run.config());
    run.observe(Box::new(mirror));
    let dir = run.dir().clone();
    let summary = run.execute().unwrap();

    // The observers saw the run's events in order.
    let ev = events.0.lock().unwrap().clone();
    assert_eq!(ev.first().unwrap(), "start tiny");
    assert_eq!(ev.last().unwrap(), "end finished");
    assert_eq!(ev.iter().filter(|e| e.starts_with("epoch")).count(), epochs);
    let stage_ends: Vec<&String> = ev.iter().filter(|e| e.starts_with("stage")).collect();
    assert_eq!(stage_ends.len(), 2, "{ev:?}");
    let export_at = ev.iter().position(|e| e == "export").unwrap();
    assert_eq!(
        export_at,
        ev.len() - 2,
        "export comes just before the end: {ev:?}"
    );

    // The run directory, the manifest and the summary agree.
    assert_eq!(dir.read_status().unwrap().status, "finished");
    let export = summary.outcome.export_dir.clone().unwrap();
    let ckpt = kiln::artifact::Checkpoint::load(&export).unwrap();
    assert!(
        ckpt.manifest.latency.is_some(),
        "latency stored in the manifest"
    );
    assert_eq!(
        ckpt.manifest
            .metrics
            .int8_test_delta
            .as_ref()
            .map(|d| d.targets.len()),
        Some(3)
    );
    let latency = summary.latency.as_ref().unwrap();
    assert!(latency.p50(1).unwrap() > 0.0);

    // The registry holds the row and every epoch.
    let reg = Registry::open(&registry_path).unwrap();
    let row = reg.get(&dir.id).unwrap();
    assert_eq!(row.status, "finished");
    assert_eq!(
        row.param_count,
        Some(summary.outcome.parameter_count as i64)
    );
    assert_eq!(reg.epochs(&dir.id).unwrap().len(), epochs);
    assert_eq!(row.latency_b1_p50_us, latency.p50(1));

    // The mirror created the run, logged params and every epoch's metrics, and finished it.
    let log = log.lock().unwrap();
    assert!(log.iter().any(|(_, p, _)| p.ends_with("runs/create")));
    let last = log.last().unwrap();
    assert_eq!(last.1, "/api/2.0/mlflow/runs/update");
    assert_eq!(last.2["status"], "FINISHED");
    let val_steps: usize = log
        .iter()
        .filter(|(_, p, _)| p.ends_with("log-batch"))
        .flat_map(|(_, _, b)| b["metrics"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["key"].as_str().is_some_and(|k| k.contains("val_loss")))
        .count();
    assert_eq!(val_steps, epochs, "one validation loss per epoch");
}

/// An observer that refuses every run (a registry that cannot record it).
struct Refuse;

impl RunObserver for Refuse {
    fn on_start(&self, _run: &RunDir, _start: &NewRun<'_>) -> Result<(), ObserverError> {
        Err(ObserverError {
            observer: "test".into(),
            message: "read-only registry".into(),
        })
    }
}

#[test]
fn a_refused_start_marks_the_run_failed_and_tells_every_observer() {
    let tmp = tempfile::tempdir().unwrap();
    let loaded = tiny_in(tmp.path());
    let mut run = TrainingRun::new(loaded, RunOptions::default()).unwrap();
    let events = Events::default();
    run.observe(Box::new(events.clone()));
    run.observe(Box::new(Refuse));
    let dir = run.dir().clone();
    let err = run.execute().unwrap_err();
    assert!(err.to_string().contains("read-only registry"), "{err}");
    let status = dir.read_status().unwrap();
    assert_eq!(status.status, "failed", "never left 'running'");
    assert!(status.reason.unwrap().contains("read-only registry"));
    let ev = events.0.lock().unwrap().clone();
    assert_eq!(ev, vec!["start tiny".to_string(), "end failed".to_string()]);
}
