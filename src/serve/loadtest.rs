//! The load generator behind `kiln loadtest`: open-loop (a fixed arrival rate, latency
//! measured from each request's scheduled start, so a slow server cannot hide queueing) or
//! closed-loop (each connection sends back to back), bounded in request count and time,
//! against loopback addresses only.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use super::client::{BaseUrl, ClientError, HttpClient, UrlError};

/// Why a load test could not run.
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    /// No connections or no rows.
    #[error("--concurrency is {concurrency} and --batch is {batch}; both must be at least 1")]
    Size {
        /// Connections asked for.
        concurrency: usize,
        /// Rows per request asked for.
        batch: usize,
    },
    /// A negative or non-finite rate.
    #[error("--rps is {0}; expected a rate >= 0 (0: closed loop)")]
    Rate(f64),
    /// A duration outside (0, 3600] seconds.
    #[error("--duration is {0:?}; expected between 0 and 3600 seconds")]
    Duration(Duration),
    /// The URL is not a loopback `http://` URL.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The server did not answer the metadata request.
    #[error("cannot reach {url}")]
    Unreachable {
        /// The base URL.
        url: String,
        /// Why.
        #[source]
        source: Box<ClientError>,
    },
    /// The metadata request was answered with an error.
    #[error("GET {path}: HTTP {status}: {body}")]
    Metadata {
        /// The metadata path.
        path: String,
        /// The status.
        status: u16,
        /// The response body.
        body: String,
    },
    /// The model's metadata lacks what a request needs.
    #[error("model metadata: {0}")]
    BadMetadata(&'static str),
    /// An input datatype the generator cannot encode in binary.
    #[error("input `{input}`: datatype {datatype} is not supported by the load generator")]
    Datatype {
        /// The input.
        input: String,
        /// Its datatype.
        datatype: String,
    },
    /// A connection task panicked or was cancelled.
    #[error("a load task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Load generator settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadtestConfig {
    /// Server base URL (`http://127.0.0.1:8000`).
    pub url: String,
    /// Model name.
    pub model: String,
    /// Target requests per second; 0 runs closed-loop (as fast as `concurrency` allows).
    pub rps: f64,
    /// How long to send.
    pub duration: Duration,
    /// Connections (each one request at a time).
    pub concurrency: usize,
    /// Rows per request.
    pub batch: usize,
    /// Send and receive tensors in the binary extension instead of JSON.
    pub binary: bool,
    /// Most requests in all.
    pub max_requests: u64,
    /// Per-request client timeout.
    pub timeout: Duration,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub mean: f64,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LoadtestReport {
    /// The URL.
    pub url: String,
    /// The model.
    pub model: String,
    /// `open` (fixed rate) or `closed` (back to back).
    pub mode: String,
    /// Target rate (0 for closed-loop).
    pub target_rps: f64,
    /// Configured duration in seconds.
    pub duration_s: f64,
    /// Connections.
    pub concurrency: usize,
    /// Rows per request.
    pub batch: usize,
    /// Binary tensors.
    pub binary: bool,
    /// Requests sent.
    pub requests: u64,
    /// Requests answered 200.
    pub ok: u64,
    /// Failed requests by HTTP status (or `io` for connection errors and timeouts).
    pub errors: BTreeMap<String, u64>,
    /// Seconds from the first scheduled request to the last answer.
    pub elapsed_s: f64,
    /// Successful requests per second.
    pub achieved_rps: f64,
    /// Successful rows per second.
    pub rows_per_s: f64,
    /// Open-loop requests sent more than 2 ms behind schedule (the generator, its
    /// connections or the CPU were saturated; tokio's timer alone adds up to 1 ms).
    pub late: u64,
    /// Open-loop requests that came due before the deadline but found every connection busy
    /// until after it: not sent, so that no request goes out after `--duration`.
    pub unsent: u64,
    /// Seconds from the start to the last request written (at most the duration).
    pub last_send_s: f64,
    /// Latency of successful requests; open-loop: from the scheduled start, so time spent
    /// waiting for a free connection counts (no coordinated omission).
    pub latency_ms: Latency,
    /// Latency of successful requests from the moment each was written to its connection.
    pub service_latency_ms: Latency,
}

impl Latency {
    /// Percentiles of sorted milliseconds.
    fn of(sorted: &[f64]) -> Self {
        Self {
            p50: percentile(sorted, 0.50),
            p90: percentile(sorted, 0.90),
            p99: percentile(sorted, 0.99),
            max: sorted.last().copied().unwrap_or(0.0),
            mean: if sorted.is_empty() {
                0.0
            } else {
                sorted.iter().sum::<f64>() / sorted.len() as f64
            },
        }
    }
}

/// [`crate::util::percentile`] (nearest rank), reported as 0 for an empty sample so the
/// JSON report stays numeric.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        0.0
    } else {
        crate::util::percentile(sorted, q)
    }
}

/// A deterministic value stream for request data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Build one request body for a model's metadata (and its config, when it gives feature
/// statistics): `batch` rows of plausible values. Returns the body and the
/// `Inference-Header-Content-Length` when binary.
pub fn request_body(
    meta: &Value,
    config: &Value,
    batch: usize,
    binary: bool,
) -> Result<(Vec<u8>, Option<usize>), LoadtestError> {
    let mut rng = Rng(7);
    let stats: Vec<(f64, f64)> = config["kiln"]["features"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    (
                        c["mean"].as_f64().unwrap_or(0.0),
                        c["std"].as_f64().unwrap_or(1.0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut inputs = Vec::new();
    let mut raw = Vec::new();
    for inp in meta["inputs"]
        .as_array()
        .ok_or(LoadtestError::BadMetadata("it has no inputs"))?
    {
        let name = inp["name"]
            .as_str()
            .ok_or(LoadtestError::BadMetadata("an input has no name"))?;
        let dt = inp["datatype"]
            .as_str()
            .ok_or(LoadtestError::BadMetadata("an input has no datatype"))?;
        let shape: Vec<usize> = inp["shape"]
            .as_array()
            .ok_or(LoadtestError::BadMetadata("an input has no shape"))?
            .iter()
            .enumerate()
            .map(|(i, d)| match d.as_i64() {
                Some(-1) if i == 0 => batch,
                Some(-1) => 2,
                Some(n) => n.max(0) as usize,
                None => 1,
            })
            .collect();
        let n: usize = shape.iter().product();
        let cols = shape.last().copied().unwrap_or(1).max(1);
        let vals: Vec<f64> = (0..n)
            .map(|i| {
                let u = rng.next();
                match dt {
                    "FP32" | "FP64" => {
                        let (m, s) = stats.get(i % cols).copied().unwrap_or((0.5, 0.3));
                        if name == "std" {
                            0.5 + u
                        } else {
                            m + s * (2.0 * u - 1.0)
                        }
                    }
                    "BOOL" => (u < 0.5) as u8 as f64,
                    _ => 0.0,
                }
            })
            .collect();
        let mut entry = json!({"name": name, "datatype": dt, "shape": shape});
        if binary {
            let before = raw.len();
            for &v in &vals {
                match dt {
                    "FP32" => raw.extend_from_slice(&(v as f32).to_le_bytes()),
                    "FP64" => raw.extend_from_slice(&v.to_le_bytes()),
                    "INT32" => raw.extend_from_slice(&(v as i32).to_le_bytes()),
                    "INT64" => raw.extend_from_slice(&(v as i64).to_le_bytes()),
                    "BOOL" => raw.push(v as u8),
                    other => {
                        return Err(LoadtestError::Datatype {
                            input: name.to_string(),
                            datatype: other.to_string(),
                        });
                    }
                }
            }
            entry["parameters"] = json!({"binary_data_size": raw.len() - before});
        } else {
            entry["data"] = match dt {
                "BOOL" => json!(vals.iter().map(|&v| v != 0.0).collect::<Vec<_>>()),
                "FP32" => json!(vals.iter().map(|&v| v as f32).collect::<Vec<_>>()),
                "INT32" | "INT64" => json!(vals.iter().map(|&v| v as i64).collect::<Vec<_>>()),
                _ => json!(vals),
            };
        }
        inputs.push(entry);
    }
    let mut req = json!({"inputs": inputs});
    if binary {
        req["parameters"] = json!({"binary_data_output": true});
    }
    let mut body = serde_json::to_vec(&req).expect("JSON serialises");
    if binary {
        let n = body.len();
        body.extend_from_slice(&raw);
        Ok((body, Some(n)))
    } else {
        Ok((body, None))
    }
}

/// Run a load test and report.
pub async fn run_loadtest(cfg: &LoadtestConfig) -> Result<LoadtestReport, LoadtestError> {
    if cfg.concurrency == 0 || cfg.batch == 0 {
        return Err(LoadtestError::Size {
            concurrency: cfg.concurrency,
            batch: cfg.batch,
        });
    }
    if !(cfg.rps >= 0.0 && cfg.rps.is_finite()) {
        return Err(LoadtestError::Rate(cfg.rps));
    }
    if cfg.duration.is_zero() || cfg.duration > Duration::from_secs(3600) {
        return Err(LoadtestError::Duration(cfg.duration));
    }
    let base = BaseUrl::parse(&cfg.url)?;
    let model_path = format!("{}/v2/models/{}", base.prefix, cfg.model);
    let mut probe = HttpClient::new(base.addr).with_timeout(Duration::from_secs(10));
    let meta = probe
        .get(&model_path)
        .await
        .map_err(|source| LoadtestError::Unreachable {
            url: cfg.url.clone(),
            source: Box::new(source),
        })?;
    if meta.status != 200 {
        return Err(LoadtestError::Metadata {
            path: model_path,
            status: meta.status,
            body: meta.text(),
        });
    }
    let config = probe
        .get(&format!("{model_path}/config"))
        .await
        .map(|r| r.json())
        .unwrap_or(Value::Null);
    let (body, hlen) = request_body(&meta.json(), &config, cfg.batch, cfg.binary)?;
    let body = Arc::new(body);
    let hlen = hlen.map(|n| n.to_string());
    let infer_path = Arc::new(format!("{model_path}/infer"));
    let open = cfg.rps > 0.0;
    let total = if open {
        ((cfg.rps * cfg.duration.as_secs_f64()).ceil() as u64).min(cfg.max_requests)
    } else {
        cfg.max_requests
    };
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now() + Duration::from_millis(20);
    let end = t0 + cfg.duration;
    let mut tasks = Vec::new();
    for _ in 0..cfg.concurrency {
        let next = next.clone();
        let body = body.clone();
        let hlen = hlen.clone();
        let path = infer_path.clone();
        let mut client = HttpClient::new(base.addr).with_timeout(cfg.timeout);
        let rps = cfg.rps;
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut svc = Vec::new();
            let mut errors: BTreeMap<String, u64> = BTreeMap::new();
            let mut late = 0u64;
            let mut unsent = 0u64;
            let mut sent = 0u64;
            let mut last_send = t0;
            let mut last = t0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let start = if open {
                    let at = t0 + Duration::from_secs_f64(i as f64 / rps);
                    if at >= end {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                    let now = Instant::now();
                    if now >= end {
                        // Due before the deadline, but every connection was busy until
                        // after it: not sent, so the run ends at the deadline.
                        unsent += 1;
                        continue;
                    }
                    if now > at + Duration::from_millis(2) {
                        late += 1;
                    }
                    at
                } else {
                    let now = Instant::now();
                    if now < t0 {
                        tokio::time::sleep_until(t0.into()).await;
                    }
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    now
                };
                let mut headers = vec![("Content-Type", "application/json")];
                if let Some(h) = &hlen {
                    headers[0].1 = "application/octet-stream";
                    headers.push(("Inference-Header-Content-Length", h.as_str()));
                }
                sent += 1;
                let sent_at = Instant::now();
                last_send = last_send.max(sent_at);
                let r = client.request("POST", &path, &headers, &body).await;
                let done = Instant::now();
                last = last.max(done);
                match r {
                    Ok(resp) if resp.status == 200 => {
                        lat.push((done - start).as_secs_f64() * 1e3);
                        svc.push((done - sent_at).as_secs_f64() * 1e3);
                    }
                    Ok(resp) => *errors.entry(resp.status.to_string()).or_default() += 1,
                    Err(_) => *errors.entry("io".into()).or_default() += 1,
                }
            }
            (lat, svc, errors, late, sent, last, unsent, last_send)
        }));
    }
    let mut lat = Vec::new();
    let mut svc = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let (mut late, mut sent, mut last, mut unsent, mut last_send) = (0, 0, t0, 0, t0);
    for t in tasks {
        let (l, sv, e, lt, s, ls, us, lsend) = t.await.map_err(LoadtestError::Task)?;
        unsent += us;
        last_send = last_send.max(lsend);
        lat.extend(l);
        svc.extend(sv);
        for (k, v) in e {
            *errors.entry(k).or_default() += v;
        }
        late += lt;
        sent += s;
        last = last.max(ls);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    svc.sort_by(|a, b| a.total_cmp(b));
    let elapsed = last.saturating_duration_since(t0).as_secs_f64().max(1e-9);
    let ok = lat.len() as u64;
    Ok(LoadtestReport {
        url: cfg.url.clone(),
        model: cfg.model.clone(),
        mode: if open { "open" } else { "closed" }.into(),
        target_rps: cfg.rps,
        duration_s: cfg.duration.as_secs_f64(),
        concurrency: cfg.concurrency,
        batch: cfg.batch,
        binary: cfg.binary,
        requests: sent,
        ok,
        errors,
        elapsed_s: elapsed,
        achieved_rps: ok as f64 / elapsed,
        rows_per_s: (ok * cfg.batch as u64) as f64 / elapsed,
        late,
        unsent,
        last_send_s: last_send.saturating_duration_since(t0).as_secs_f64(),
        latency_ms: Latency::of(&lat),
        service_latency_ms: Latency::of(&svc),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
    }
}
