//! Optional MLflow mirror: with `MLFLOW_TRACKING_URI` set (an `http://` URI), each
//! `kiln train` run is also sent to an MLflow tracking server through its REST API —
//! experiment get-by-name/create, runs/create, runs/log-batch (within MLflow's limits of 1,000
//! metrics and 100 params per request) and runs/update. The registry stays the source of
//! truth: a failing or absent tracking server logs a warning and never fails training.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::{Value, json};

use super::registry::RunEnd;
use crate::config::LoadedConfig;
use crate::records::RunDir;
use crate::train::state::EpochRecord;

/// MLflow's per-request limits for runs/log-batch.
pub const MAX_METRICS_PER_BATCH: usize = 1000;
/// Params per runs/log-batch request.
pub const MAX_PARAMS_PER_BATCH: usize = 100;
/// Longest param value MLflow accepts.
pub const MAX_PARAM_VALUE: usize = 6000;

/// A minimal HTTP/1.1 JSON client for `http://host:port[/prefix]`.
#[derive(Debug, Clone)]
pub struct Client {
    host: String,
    port: u16,
    prefix: String,
    timeout: Duration,
}

impl Client {
    /// Parse a tracking URI.
    pub fn new(uri: &str) -> Result<Self, String> {
        let rest = uri.strip_prefix("http://").ok_or_else(|| {
            format!("unsupported tracking URI {uri:?}: kiln's mirror speaks plain http:// only")
        })?;
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/').to_string()),
            None => (rest, String::new()),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse()
                    .map_err(|_| format!("bad port in tracking URI {uri:?}"))?,
            ),
            None => (authority.to_string(), 80),
        };
        Ok(Self {
            host,
            port,
            prefix,
            timeout: Duration::from_secs(5),
        })
    }

    /// Send a request; returns the status code and the parsed JSON body.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), String> {
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| format!("{}:{}: {e}", self.host, self.port))?
            .next()
            .ok_or_else(|| format!("{}:{}: no address", self.host, self.port))?;
        let mut s =
            TcpStream::connect_timeout(&addr, self.timeout).map_err(|e| format!("{addr}: {e}"))?;
        s.set_read_timeout(Some(self.timeout)).ok();
        s.set_write_timeout(Some(self.timeout)).ok();
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let req = format!(
            "{method} {}{path} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{payload}",
            self.prefix,
            self.host,
            self.port,
            payload.len()
        );
        s.write_all(req.as_bytes())
            .map_err(|e| format!("{addr}: {e}"))?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .map_err(|e| format!("{addr}: {e}"))?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| format!("{addr}: malformed HTTP response"))?;
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("{addr}: malformed status line"))?;
        let chunked = head.lines().any(|l| {
            l.to_ascii_lowercase().starts_with("transfer-encoding:")
                && l.to_ascii_lowercase().contains("chunked")
        });
        let body = if chunked {
            dechunk(body)
        } else {
            body.to_string()
        };
        let json = if body.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&body).unwrap_or(Value::String(body))
        };
        Ok((status, json))
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let (status, v) = self.call("POST", path, Some(body))?;
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            Err(format!("POST {path}: HTTP {status}: {v}"))
        }
    }
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Flatten a JSON value into `a.b[0].c = value` pairs.
pub fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, x, out);
            }
        }
        Value::Array(a) if a.iter().any(|x| x.is_object() || x.is_array()) => {
            for (i, x) in a.iter().enumerate() {
                flatten(&format!("{prefix}[{i}]"), x, out);
            }
        }
        Value::String(s) => out.push((prefix.to_string(), s.clone())),
        other => out.push((prefix.to_string(), other.to_string())),
    }
}

fn now_ms() -> i64 {
    (crate::util::unix_now() * 1000.0) as i64
}

/// An MLflow run mirroring a kiln run.
#[derive(Debug)]
pub struct Mirror {
    client: Client,
    /// MLflow's run id.
    pub run_id: String,
}

impl Mirror {
    /// Start mirroring when `MLFLOW_TRACKING_URI` is set; `None` (after a warning) on any
    /// failure.
    pub fn from_env(run: &RunDir, loaded: &LoadedConfig) -> Option<Self> {
        let uri = std::env::var("MLFLOW_TRACKING_URI").ok()?;
        let experiment = std::env::var("MLFLOW_EXPERIMENT_NAME")
            .unwrap_or_else(|_| format!("kiln-{}", loaded.config.name));
        match Self::start(&uri, &experiment, run, loaded) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::warn!("MLflow mirror disabled: {e}");
                eprintln!("warning: MLflow mirror disabled: {e}");
                None
            }
        }
    }

    /// Create (or find) the experiment, create the run and log the config as params.
    pub fn start(
        uri: &str,
        experiment: &str,
        run: &RunDir,
        loaded: &LoadedConfig,
    ) -> Result<Self, String> {
        let client = Client::new(uri)?;
        let path = format!(
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name={}",
            percent_encode(experiment)
        );
        let (status, v) = client.call("GET", &path, None)?;
        let experiment_id = match (status, v["experiment"]["experiment_id"].as_str()) {
            (200, Some(id)) => id.to_string(),
            _ => client.post(
                "/api/2.0/mlflow/experiments/create",
                &json!({ "name": experiment }),
            )?["experiment_id"]
                .as_str()
                .ok_or("experiments/create returned no experiment_id")?
                .to_string(),
        };
        let created = client.post(
            "/api/2.0/mlflow/runs/create",
            &json!({
                "experiment_id": experiment_id,
                "start_time": now_ms(),
                "run_name": run.id,
                "tags": [
                    {"key": "kiln.run_id", "value": run.id},
                    {"key": "kiln.run_dir", "value": run.path.display().to_string()},
                    {"key": "mlflow.source.name", "value": "kiln train"},
                ],
            }),
        )?;
        let run_id = created["run"]["info"]["run_id"]
            .as_str()
            .ok_or("runs/create returned no run id")?
            .to_string();
        let mirror = Self { client, run_id };
        let mut params = Vec::new();
        flatten(
            "",
            &serde_json::to_value(&loaded.config).map_err(|e| e.to_string())?,
            &mut params,
        );
        for chunk in params.chunks(MAX_PARAMS_PER_BATCH) {
            let ps: Vec<Value> = chunk
                .iter()
                .map(|(k, v)| json!({"key": k, "value": v.chars().take(MAX_PARAM_VALUE).collect::<String>()}))
                .collect();
            mirror.client.post(
                "/api/2.0/mlflow/runs/log-batch",
                &json!({"run_id": mirror.run_id, "params": ps, "metrics": [], "tags": []}),
            )?;
        }
        Ok(mirror)
    }

    /// Log every epoch's metrics and the final ones, then close the run. Never fails.
    pub fn finish(&self, epochs: &[EpochRecord], end: &RunEnd) {
        if let Err(e) = self.try_finish(epochs, end) {
            tracing::warn!("MLflow mirror: {e}");
            eprintln!("warning: MLflow mirror: {e}");
        }
    }

    fn try_finish(&self, epochs: &[EpochRecord], end: &RunEnd) -> Result<(), String> {
        let ts = now_ms();
        let mut metrics = Vec::new();
        for (step, e) in epochs.iter().enumerate() {
            let s = &e.stage_name;
            for (k, v) in [
                ("train_loss", e.train_loss),
                ("val_loss", e.val_loss),
                ("lr", e.lr),
                ("grad_norm", e.grad_norm_mean),
                ("samples_per_s", e.samples_per_s),
                ("data_wait_frac", e.data_wait_frac),
            ] {
                if v.is_finite() {
                    metrics.push(json!({"key": format!("{s}/{k}"), "value": v, "timestamp": ts, "step": step}));
                }
            }
        }
        for (k, v) in [
            ("val_metric", end.val_metric),
            ("latency_b1_p50_us", end.latency_b1_p50_us),
            ("latency_b128_p50_us", end.latency_b128_p50_us),
            ("param_count", end.param_count.map(|p| p as f64)),
        ] {
            if let Some(v) = v.filter(|v| v.is_finite()) {
                metrics.push(json!({"key": k, "value": v, "timestamp": ts, "step": 0}));
            }
        }
        for chunk in metrics.chunks(MAX_METRICS_PER_BATCH) {
            self.client.post(
                "/api/2.0/mlflow/runs/log-batch",
                &json!({"run_id": self.run_id, "metrics": chunk, "params": [], "tags": []}),
            )?;
        }
        let status = match end.status.as_str() {
            "finished" => "FINISHED",
            "killed" => "KILLED",
            _ => "FAILED",
        };
        self.client.post(
            "/api/2.0/mlflow/runs/update",
            &json!({"run_id": self.run_id, "status": status, "end_time": now_ms()}),
        )?;
        Ok(())
    }
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    type Log = Arc<Mutex<Vec<(String, String, Value)>>>;

    /// A tracking server stand-in: records every request, answers like MLflow.
    fn server() -> (String, Log) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        let log: Log = Arc::new(Mutex::new(Vec::new()));
        let l2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut s = stream.unwrap();
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                loop {
                    let n = s.read(&mut tmp).unwrap();
                    buf.extend_from_slice(&tmp[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .map(|v| v.trim().parse().unwrap())
                            .unwrap_or(0);
                        if body.len() >= len {
                            break;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                let text = String::from_utf8_lossy(&buf).to_string();
                let (head, body) = text.split_once("\r\n\r\n").unwrap();
                let mut first = head.lines().next().unwrap().split_whitespace();
                let (method, path) = (
                    first.next().unwrap().to_string(),
                    first.next().unwrap().to_string(),
                );
                let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
                l2.lock()
                    .unwrap()
                    .push((method.clone(), path.clone(), json));
                let (code, reply) = if path.contains("get-by-name") {
                    (404, json!({"error_code": "RESOURCE_DOES_NOT_EXIST"}))
                } else if path.ends_with("experiments/create") {
                    (200, json!({"experiment_id": "7"}))
                } else if path.ends_with("runs/create") {
                    (200, json!({"run": {"info": {"run_id": "abc123"}}}))
                } else {
                    (200, json!({}))
                };
                let body = reply.to_string();
                let resp = format!(
                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes());
            }
        });
        (uri, log)
    }

    fn loaded() -> LoadedConfig {
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/configs/tiny.yaml"))
                .unwrap();
        let config = crate::config::parse(&text, std::path::Path::new("tiny.yaml")).unwrap();
        LoadedConfig {
            config,
            text,
            path: "tiny.yaml".into(),
        }
    }

    #[test]
    fn mirrors_a_run_through_the_rest_api() {
        let (uri, log) = server();
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        let m = Mirror::start(&uri, "kiln tiny", &run, &loaded()).unwrap();
        assert_eq!(m.run_id, "abc123");
        let epochs: Vec<EpochRecord> = (0..300)
            .map(|e| EpochRecord {
                stage: 0,
                stage_name: "mean".into(),
                epoch: e,
                steps: 1,
                train_loss: 1.0,
                val_loss: 0.5,
                lr: 1e-3,
                grad_norm_mean: 0.1,
                grad_norm_max: 0.2,
                clipped_frac: 0.0,
                samples_per_s: 1e5,
                data_wait_frac: 0.1,
                data_wait_s: 0.0,
                compute_s: 0.0,
                validation_s: 0.0,
            })
            .collect();
        m.finish(
            &epochs,
            &RunEnd {
                status: "finished".into(),
                val_metric: Some(0.4),
                ..RunEnd::default()
            },
        );
        let log = log.lock().unwrap();
        let paths: Vec<&str> = log.iter().map(|(_, p, _)| p.as_str()).collect();
        assert_eq!(
            paths[0],
            "/api/2.0/mlflow/experiments/get-by-name?experiment_name=kiln%20tiny"
        );
        assert_eq!(paths[1], "/api/2.0/mlflow/experiments/create");
        assert_eq!(log[1].2["name"], "kiln tiny");
        assert_eq!(paths[2], "/api/2.0/mlflow/runs/create");
        assert_eq!(log[2].2["experiment_id"], "7");
        assert_eq!(log[2].2["run_name"], run.id.as_str());
        // Params: the flattened config, at most 100 per request.
        let params: Vec<&Value> = log
            .iter()
            .filter(|(_, p, b)| {
                p.ends_with("log-batch") && !b["params"].as_array().unwrap().is_empty()
            })
            .map(|x| &x.2)
            .collect();
        assert!(!params.is_empty());
        assert!(
            params
                .iter()
                .all(|b| b["params"].as_array().unwrap().len() <= MAX_PARAMS_PER_BATCH)
        );
        let all: Vec<&Value> = params
            .iter()
            .flat_map(|b| b["params"].as_array().unwrap())
            .collect();
        assert!(
            all.iter()
                .any(|p| p["key"] == "loader.batch_size" && p["value"] == "64")
        );
        // Metrics: 300 epochs × 6 + 1 final = 1801 → two requests of ≤ 1000.
        let metric_batches: Vec<usize> = log
            .iter()
            .filter(|(_, p, b)| {
                p.ends_with("log-batch") && !b["metrics"].as_array().unwrap().is_empty()
            })
            .map(|x| x.2["metrics"].as_array().unwrap().len())
            .collect();
        assert_eq!(metric_batches, vec![1000, 801]);
        let last = log.last().unwrap();
        assert_eq!(last.1, "/api/2.0/mlflow/runs/update");
        assert_eq!(last.2["status"], "FINISHED");
        assert_eq!(last.2["run_id"], "abc123");
    }

    #[test]
    fn an_absent_server_is_an_error_not_a_panic() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::create(dir.path(), "tiny").unwrap();
        assert!(Mirror::start(&uri, "x", &run, &loaded()).is_err());
        assert!(Client::new("https://mlflow.example.com").is_err());
        let c = Client::new("http://localhost:5000/prefix/").unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.prefix.as_str()),
            ("localhost", 5000, "/prefix")
        );
    }
}
