//! The load generator behind `kiln loadtest`: open-loop (a fixed arrival rate, latency
//! measured from each request's scheduled start, so a slow server cannot hide queueing) or
//! closed-loop (each connection sends back to back), bounded in request count and time,
//! against loopback addresses only, over HTTP ([`run_loadtest`]) or either protocol.
//!
//! [`run_perf`] follows `perf_analyzer`'s conventions: a concurrency range
//! (`start:end:step`, closed loop with that many requests in flight) or a request-rate range
//! with constant or Poisson arrivals; at each level it measures consecutive windows until
//! the last three agree within the stability threshold (10 %: throughput and mean latency
//! each within 10 % of the three windows' mean), reports p50/p90/p95/p99 over those three,
//! and the server-side queue / compute breakdown from the difference of the model's
//! statistics (Triton's statistics extension: `GET /v2/models/{m}/stats` or the gRPC
//! `ModelStatistics` RPC) before and after the level.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Value, json};

use crate::client::{BaseUrl, ClientError, HttpClient, UrlError};
use kiln_serve::grpc::proto as pb;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;

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
    /// The gRPC endpoint could not be reached or refused a metadata request.
    #[error("gRPC {url}: {message}")]
    Grpc {
        /// The endpoint.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// A perf_analyzer-style setting is out of range.
    #[error("{0}")]
    Perf(String),
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
    /// 95th percentile.
    pub p95: f64,
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
            p95: percentile(sorted, 0.95),
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

/// The wire protocol of a load test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Open Inference Protocol v2 over HTTP/1.1 (JSON, or the binary tensor extension).
    Http,
    /// KServe v2 gRPC (`raw_input_contents` when binary, typed contents otherwise).
    Grpc,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "http" => Ok(Protocol::Http),
            "grpc" => Ok(Protocol::Grpc),
            _ => Err(format!("`{s}` is not a protocol; expected http or grpc")),
        }
    }
}

/// How open-loop arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    /// Evenly: request i at i/rate.
    Constant,
    /// A Poisson process: exponential gaps with mean 1/rate (deterministic seed).
    Poisson,
}

impl std::str::FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "constant" => Ok(Distribution::Constant),
            "poisson" => Ok(Distribution::Poisson),
            _ => Err(format!(
                "`{s}` is not a request distribution; expected constant or poisson"
            )),
        }
    }
}

/// Arrival offsets (from the start) of an open-loop window: `rate` per second for
/// `duration`, at most `max` of them.
pub fn arrivals(
    rate: f64,
    duration: Duration,
    dist: Distribution,
    seed: u64,
    max: u64,
) -> Vec<Duration> {
    let d = duration.as_secs_f64();
    let mut out = Vec::new();
    if !(rate > 0.0 && rate.is_finite()) {
        return out;
    }
    match dist {
        Distribution::Constant => {
            let n = ((rate * d).ceil() as u64).min(max);
            for i in 0..n {
                let t = i as f64 / rate;
                if t >= d {
                    break;
                }
                out.push(Duration::from_secs_f64(t));
            }
        }
        Distribution::Poisson => {
            let mut rng = Rng(seed ^ 0x5EED);
            let mut t = 0.0;
            while t < d && (out.len() as u64) < max {
                out.push(Duration::from_secs_f64(t));
                t += -(1.0 - rng.next()).ln() / rate;
            }
        }
    }
    out
}

/// One input's generated values.
struct GenInput {
    name: String,
    datatype: String,
    shape: Vec<usize>,
    values: Vec<f64>,
}

/// `batch` rows of plausible values for each input of a model's metadata (and its config,
/// when it gives feature statistics).
fn generate_inputs(
    meta: &Value,
    config: &Value,
    batch: usize,
) -> Result<Vec<GenInput>, LoadtestError> {
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
    let mut out = Vec::new();
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
        let values: Vec<f64> = (0..n)
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
        out.push(GenInput {
            name: name.to_string(),
            datatype: dt.to_string(),
            shape,
            values,
        });
    }
    Ok(out)
}

/// Little-endian bytes of generated values.
fn raw_le(inp: &GenInput) -> Result<Vec<u8>, LoadtestError> {
    let mut raw = Vec::new();
    for &v in &inp.values {
        match inp.datatype.as_str() {
            "FP32" => raw.extend_from_slice(&(v as f32).to_le_bytes()),
            "FP64" => raw.extend_from_slice(&v.to_le_bytes()),
            "INT32" => raw.extend_from_slice(&(v as i32).to_le_bytes()),
            "INT64" => raw.extend_from_slice(&(v as i64).to_le_bytes()),
            "BOOL" => raw.push(v as u8),
            other => {
                return Err(LoadtestError::Datatype {
                    input: inp.name.clone(),
                    datatype: other.to_string(),
                });
            }
        }
    }
    Ok(raw)
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
    let mut inputs = Vec::new();
    let mut raw = Vec::new();
    for g in generate_inputs(meta, config, batch)? {
        let mut entry = json!({"name": g.name, "datatype": g.datatype, "shape": g.shape});
        if binary {
            let b = raw_le(&g)?;
            entry["parameters"] = json!({"binary_data_size": b.len()});
            raw.extend_from_slice(&b);
        } else {
            let vals = &g.values;
            entry["data"] = match g.datatype.as_str() {
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

/// The gRPC request for the same inputs: raw contents when `binary` (answered raw), typed
/// contents otherwise (answered typed, as JSON is over HTTP).
pub fn grpc_request(
    model: &str,
    meta: &Value,
    config: &Value,
    batch: usize,
    binary: bool,
) -> Result<pb::ModelInferRequest, LoadtestError> {
    let mut req = pb::ModelInferRequest {
        model_name: model.to_string(),
        ..Default::default()
    };
    for g in generate_inputs(meta, config, batch)? {
        let mut t = pb::model_infer_request::InferInputTensor {
            name: g.name.clone(),
            datatype: g.datatype.clone(),
            shape: g.shape.iter().map(|&d| d as i64).collect(),
            ..Default::default()
        };
        if binary {
            req.raw_input_contents.push(raw_le(&g)?.into());
        } else {
            let v = &g.values;
            let mut c = pb::InferTensorContents::default();
            match g.datatype.as_str() {
                "FP32" => c.fp32_contents = v.iter().map(|&x| x as f32).collect(),
                "FP64" => c.fp64_contents = v.clone(),
                "INT32" => c.int_contents = v.iter().map(|&x| x as i32).collect(),
                "INT64" => c.int64_contents = v.iter().map(|&x| x as i64).collect(),
                "BOOL" => c.bool_contents = v.iter().map(|&x| x != 0.0).collect(),
                other => {
                    return Err(LoadtestError::Datatype {
                        input: g.name,
                        datatype: other.to_string(),
                    });
                }
            }
            t.contents = Some(c);
        }
        req.inputs.push(t);
    }
    if !binary {
        req.parameters.insert(
            "binary_data_output".into(),
            pb::InferParameter {
                parameter_choice: Some(pb::infer_parameter::ParameterChoice::BoolParam(false)),
            },
        );
    }
    Ok(req)
}

/// A prepared request for one protocol.
#[derive(Clone)]
enum Target {
    Http {
        addr: std::net::SocketAddr,
        path: Arc<String>,
        body: Arc<Vec<u8>>,
        hlen: Option<String>,
    },
    Grpc {
        uri: String,
        /// The encoded `ModelInferRequest` with its 5-byte gRPC prefix.
        message: Bytes,
    },
}

/// One connection's sending side.
enum Sender {
    Http(HttpClient, Arc<String>, Arc<Vec<u8>>, Option<String>),
    Grpc(GrpcCaller),
}

impl Sender {
    /// Send once; `Err` is the error's key in the report (HTTP status, `io`, gRPC code).
    async fn send(&mut self) -> Result<(), String> {
        match self {
            Sender::Http(c, path, body, hlen) => {
                let mut headers = vec![("Content-Type", "application/json")];
                if let Some(h) = hlen {
                    headers[0].1 = "application/octet-stream";
                    headers.push(("Inference-Header-Content-Length", h.as_str()));
                }
                match c.request("POST", path, &headers, body).await {
                    Ok(r) if r.status == 200 => Ok(()),
                    Ok(r) => Err(r.status.to_string()),
                    Err(_) => Err("io".into()),
                }
            }
            Sender::Grpc(c) => c.call().await,
        }
    }
}

/// The gRPC path of the request the load loop sends: a unary `ModelInfer` on one HTTP/2
/// connection driven by `h2` directly (no tower stack, no per-call message encoding).
///
/// The message is encoded once, with its 5-byte gRPC prefix, when the run is prepared; each
/// call sends one HEADERS frame (`content-type: application/grpc`, `te: trailers`,
/// `grpc-timeout`) and one DATA frame holding that buffer (a reference-counted clone), in one
/// write (the socket is corked: [`kiln_serve::corked`]), reads the answer's DATA frames and its
/// trailers, and checks `grpc-status` and the answer's framing. The HTTP side's client is
/// equally lean (one prepared body, the status checked, the body read and not parsed), so the
/// two protocols are compared on their transports, not on their client libraries: through
/// tonic's client (tower buffer, a request clone and encode per call) the load generator spent
/// about twice its HTTP client's CPU per call, as much as the server (2-core VM,
/// `benches/README.md`).
struct GrpcCaller {
    send: h2::client::SendRequest<Bytes>,
    uri: hyper::Uri,
    body: Bytes,
    timeout: Duration,
    grpc_timeout: hyper::header::HeaderValue,
}

/// The gRPC status code's name as the report keys errors (`grpc_Unavailable`, ...).
fn grpc_error_key(status: &[u8]) -> String {
    let code = std::str::from_utf8(status)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .map(tonic::Code::from_i32)
        .unwrap_or(tonic::Code::Unknown);
    format!("grpc_{code:?}")
}

impl GrpcCaller {
    async fn connect(uri: &str, body: Bytes, timeout: Duration) -> Result<Self, LoadtestError> {
        let fail = |m: String| LoadtestError::Grpc {
            url: uri.to_string(),
            message: m,
        };
        let base = BaseUrl::parse(uri)?;
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(base.addr),
        )
        .await
        .map_err(|_| fail("cannot connect: timed out after 10 s".into()))?
        .map_err(|e| fail(format!("cannot connect: {e}")))?;
        tcp.set_nodelay(true)
            .map_err(|e| fail(format!("cannot set TCP_NODELAY: {e}")))?;
        // Corked (as the server's connections): a call's HEADERS and DATA frames leave in one
        // write, not two.
        let (io, out) = kiln_serve::corked::cork(tcp);
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size(1 << 20)
            .initial_connection_window_size(1 << 24)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(|e| fail(format!("HTTP/2 handshake failed: {e}")))?;
        tokio::spawn(async move {
            let _ = kiln_serve::corked::Corked::new(conn, out).await;
        });
        let path = format!(
            "http://{}/inference.GRPCInferenceService/ModelInfer",
            base.addr
        );
        let uri = path
            .parse()
            .map_err(|e| fail(format!("bad URI {path}: {e}")))?;
        // grpc-timeout: at most 8 digits and a unit; milliseconds cover every sane timeout.
        let ms = timeout.as_millis().clamp(1, 99_999_999);
        let grpc_timeout = hyper::header::HeaderValue::from_str(&format!("{ms}m"))
            .map_err(|e| fail(e.to_string()))?;
        Ok(Self {
            send,
            uri,
            body,
            timeout,
            grpc_timeout,
        })
    }

    /// One call; `Err` is the report's error key (`io`, `http_<status>`, `grpc_<code>`).
    async fn call(&mut self) -> Result<(), String> {
        match tokio::time::timeout(self.timeout, self.exchange()).await {
            Ok(r) => r,
            Err(_) => Err("grpc_DeadlineExceeded".into()),
        }
    }

    async fn exchange(&mut self) -> Result<(), String> {
        use hyper::header::{CONTENT_TYPE, HeaderValue, TE};
        let io = |_| "io".to_string();
        let mut req = hyper::Request::new(());
        *req.method_mut() = hyper::Method::POST;
        *req.uri_mut() = self.uri.clone();
        let h = req.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert("grpc-timeout", self.grpc_timeout.clone());
        let mut send = self.send.clone().ready().await.map_err(io)?;
        let (resp, mut stream) = send.send_request(req, false).map_err(io)?;
        stream.send_data(self.body.clone(), true).map_err(io)?;
        let resp = resp.await.map_err(io)?;
        if resp.status() != hyper::StatusCode::OK {
            return Err(format!("http_{}", resp.status().as_u16()));
        }
        // A trailers-only answer (an error) carries its status in the headers.
        if let Some(s) = resp.headers().get("grpc-status") {
            return if s.as_bytes() == b"0" {
                Err("grpc_no_message".into())
            } else {
                Err(grpc_error_key(s.as_bytes()))
            };
        }
        let mut body = resp.into_body();
        let (mut prefix, mut got) = ([0u8; 5], 0usize);
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(io)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            for (i, &b) in chunk.iter().enumerate().take(5usize.saturating_sub(got)) {
                prefix[got + i] = b;
            }
            got += chunk.len();
        }
        let trailers = body.trailers().await.map_err(io)?;
        match trailers.as_ref().and_then(|t| t.get("grpc-status")) {
            Some(s) if s.as_bytes() == b"0" => {}
            Some(s) => return Err(grpc_error_key(s.as_bytes())),
            None => return Err("grpc_no_status".into()),
        }
        // One uncompressed message filling the body.
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if got >= 5 && prefix[0] == 0 && 5 + len == got {
            Ok(())
        } else {
            Err("grpc_bad_framing".into())
        }
    }
}

/// A gRPC message on the wire: the uncompressed flag, the big-endian length, the protobuf.
fn grpc_message(m: &pb::ModelInferRequest) -> Bytes {
    use prost::Message;
    let n = m.encoded_len();
    let mut out = Vec::with_capacity(5 + n);
    out.push(0);
    out.extend_from_slice(&(n as u32).to_be_bytes());
    m.encode(&mut out).expect("a Vec grows as needed");
    Bytes::from(out)
}

async fn grpc_connect(
    uri: &str,
) -> Result<GrpcInferenceServiceClient<tonic::transport::Channel>, LoadtestError> {
    let fail = |m: String| LoadtestError::Grpc {
        url: uri.to_string(),
        message: m,
    };
    let ep = tonic::transport::Endpoint::from_shared(uri.to_string())
        .map_err(|e| fail(e.to_string()))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true);
    let ch = ep
        .connect()
        .await
        .map_err(|e| fail(format!("cannot connect: {e}")))?;
    Ok(GrpcInferenceServiceClient::new(ch)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}

impl Target {
    async fn sender(&self, timeout: Duration) -> Result<Sender, LoadtestError> {
        Ok(match self {
            Target::Http {
                addr,
                path,
                body,
                hlen,
            } => Sender::Http(
                HttpClient::new(*addr).with_timeout(timeout),
                path.clone(),
                body.clone(),
                hlen.clone(),
            ),
            Target::Grpc { uri, message } => {
                Sender::Grpc(GrpcCaller::connect(uri, message.clone(), timeout).await?)
            }
        })
    }
}

/// What one window measured.
#[derive(Debug, Default)]
struct Window {
    lat: Vec<f64>,
    svc: Vec<f64>,
    errors: BTreeMap<String, u64>,
    late: u64,
    sent: u64,
    unsent: u64,
    elapsed_s: f64,
    last_send_s: f64,
}

impl Window {
    fn throughput(&self) -> f64 {
        self.lat.len() as f64 / self.elapsed_s.max(1e-9)
    }
    fn mean_latency(&self) -> f64 {
        if self.lat.is_empty() {
            0.0
        } else {
            self.lat.iter().sum::<f64>() / self.lat.len() as f64
        }
    }
}

/// Send for `duration` from `workers` connections: closed loop when `schedule` is `None`,
/// else at the scheduled offsets (open loop; nothing is sent after the deadline).
async fn drive(
    target: &Target,
    workers: usize,
    schedule: Option<Arc<Vec<Duration>>>,
    duration: Duration,
    max_requests: u64,
    timeout: Duration,
) -> Result<Window, LoadtestError> {
    let mut senders = Vec::with_capacity(workers);
    for _ in 0..workers {
        senders.push(target.sender(timeout).await?);
    }
    let total = match &schedule {
        Some(s) => (s.len() as u64).min(max_requests),
        None => max_requests,
    };
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now() + Duration::from_millis(20);
    let end = t0 + duration;
    let mut tasks = Vec::new();
    for mut sender in senders {
        let next = next.clone();
        let schedule = schedule.clone();
        tasks.push(tokio::spawn(async move {
            let mut w = Window::default();
            let mut last_send = t0;
            let mut last = t0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let start = if let Some(s) = &schedule {
                    let at = t0 + s[i as usize];
                    if at >= end {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                    let now = Instant::now();
                    if now >= end {
                        // Due before the deadline, but every connection was busy until
                        // after it: not sent, so the run ends at the deadline.
                        w.unsent += 1;
                        continue;
                    }
                    if now > at + Duration::from_millis(2) {
                        w.late += 1;
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
                w.sent += 1;
                let sent_at = Instant::now();
                last_send = last_send.max(sent_at);
                let r = sender.send().await;
                let done = Instant::now();
                last = last.max(done);
                match r {
                    Ok(()) => {
                        w.lat.push((done - start).as_secs_f64() * 1e3);
                        w.svc.push((done - sent_at).as_secs_f64() * 1e3);
                    }
                    Err(k) => *w.errors.entry(k).or_default() += 1,
                }
            }
            (w, last, last_send)
        }));
    }
    let mut out = Window::default();
    let (mut last, mut last_send) = (t0, t0);
    for t in tasks {
        let (w, l, ls) = t.await.map_err(LoadtestError::Task)?;
        out.lat.extend(w.lat);
        out.svc.extend(w.svc);
        for (k, v) in w.errors {
            *out.errors.entry(k).or_default() += v;
        }
        out.late += w.late;
        out.sent += w.sent;
        out.unsent += w.unsent;
        last = last.max(l);
        last_send = last_send.max(ls);
    }
    out.lat.sort_by(|a, b| a.total_cmp(b));
    out.svc.sort_by(|a, b| a.total_cmp(b));
    out.elapsed_s = last.saturating_duration_since(t0).as_secs_f64().max(1e-9);
    out.last_send_s = last_send.saturating_duration_since(t0).as_secs_f64();
    Ok(out)
}

fn unreachable_at(url: &str, source: ClientError) -> LoadtestError {
    LoadtestError::Unreachable {
        url: url.to_string(),
        source: Box::new(source),
    }
}

/// Read a model's metadata and config over HTTP and prepare the request.
async fn prepare_http(
    url: &str,
    model: &str,
    batch: usize,
    binary: bool,
) -> Result<Target, LoadtestError> {
    let base = BaseUrl::parse(url)?;
    let model_path = format!("{}/v2/models/{}", base.prefix, model);
    let mut probe = HttpClient::new(base.addr).with_timeout(Duration::from_secs(10));
    let meta = probe
        .get(&model_path)
        .await
        .map_err(|e| unreachable_at(url, e))?;
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
    let (body, hlen) = request_body(&meta.json(), &config, batch, binary)?;
    Ok(Target::Http {
        addr: base.addr,
        path: Arc::new(format!("{model_path}/infer")),
        body: Arc::new(body),
        hlen: hlen.map(|n| n.to_string()),
    })
}

/// The `http://host:port` of a gRPC endpoint given as a loopback URL (`http://` optional).
fn grpc_uri(url: &str) -> Result<String, LoadtestError> {
    let full = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let base = BaseUrl::parse(&full)?;
    Ok(format!("http://{}", base.addr))
}

/// Read a model's metadata and config over gRPC and prepare the request.
async fn prepare_grpc(
    url: &str,
    model: &str,
    batch: usize,
    binary: bool,
) -> Result<Target, LoadtestError> {
    let uri = grpc_uri(url)?;
    let mut c = grpc_connect(&uri).await?;
    let fail = |s: tonic::Status| LoadtestError::Grpc {
        url: uri.clone(),
        message: format!("model `{model}`: {:?}: {}", s.code(), s.message()),
    };
    let m = c
        .model_metadata(pb::ModelMetadataRequest {
            name: model.to_string(),
            version: String::new(),
        })
        .await
        .map_err(fail)?
        .into_inner();
    let meta = json!({"inputs": m.inputs.iter().map(|t| json!({
        "name": t.name, "datatype": t.datatype, "shape": t.shape,
    })).collect::<Vec<_>>()});
    let config = match c
        .model_config(pb::ModelConfigRequest {
            name: model.to_string(),
            version: String::new(),
        })
        .await
    {
        Ok(r) => r
            .into_inner()
            .config
            .and_then(|c| c.parameters.get("kiln").cloned())
            .and_then(|p| serde_json::from_str::<Value>(&p.string_value).ok())
            .map(|k| json!({"kiln": k}))
            .unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let request = grpc_request(model, &meta, &config, batch, binary)?;
    Ok(Target::Grpc {
        uri,
        message: grpc_message(&request),
    })
}

async fn prepare(
    url: &str,
    model: &str,
    protocol: Protocol,
    batch: usize,
    binary: bool,
) -> Result<Target, LoadtestError> {
    match protocol {
        Protocol::Http => prepare_http(url, model, batch, binary).await,
        Protocol::Grpc => prepare_grpc(url, model, batch, binary).await,
    }
}

/// Run a load test over HTTP and report.
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
    let target = prepare_http(&cfg.url, &cfg.model, cfg.batch, cfg.binary).await?;
    let open = cfg.rps > 0.0;
    let schedule = open.then(|| {
        Arc::new(arrivals(
            cfg.rps,
            cfg.duration,
            Distribution::Constant,
            0,
            cfg.max_requests,
        ))
    });
    let w = drive(
        &target,
        cfg.concurrency,
        schedule,
        cfg.duration,
        cfg.max_requests,
        cfg.timeout,
    )
    .await?;
    let ok = w.lat.len() as u64;
    Ok(LoadtestReport {
        url: cfg.url.clone(),
        model: cfg.model.clone(),
        mode: if open { "open" } else { "closed" }.into(),
        target_rps: cfg.rps,
        duration_s: cfg.duration.as_secs_f64(),
        concurrency: cfg.concurrency,
        batch: cfg.batch,
        binary: cfg.binary,
        requests: w.sent,
        ok,
        elapsed_s: w.elapsed_s,
        achieved_rps: ok as f64 / w.elapsed_s,
        rows_per_s: (ok * cfg.batch as u64) as f64 / w.elapsed_s,
        late: w.late,
        unsent: w.unsent,
        last_send_s: w.last_send_s,
        latency_ms: Latency::of(&w.lat),
        service_latency_ms: Latency::of(&w.svc),
        errors: w.errors,
    })
}

// ---- perf_analyzer-style sweeps ----

/// The levels of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub enum PerfMode {
    /// Closed loop with this many requests in flight (`--concurrency-range`).
    Concurrency(Vec<usize>),
    /// Open loop at this many requests per second (`--request-rate-range`).
    RequestRate(Vec<f64>),
}

/// Parse perf_analyzer's `start[:end[:step]]` (end defaults to start, step to 1) into the
/// levels start, start + step, … up to end.
pub fn parse_range(flag: &str, s: &str) -> Result<Vec<f64>, LoadtestError> {
    let bad = |why: &str| {
        LoadtestError::Perf(format!(
            "{flag} is `{s}`: {why}; expected start[:end[:step]], e.g. 1:8:1"
        ))
    };
    let parts: Vec<&str> = s.split(':').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(bad("one to three numbers"));
    }
    let num = |p: &str| {
        p.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| bad(&format!("`{p}` is not a number")))
    };
    let start = num(parts[0])?;
    let end = parts.get(1).map(|p| num(p)).transpose()?.unwrap_or(start);
    let step = parts.get(2).map(|p| num(p)).transpose()?.unwrap_or(1.0);
    if start <= 0.0 {
        return Err(bad("start must be > 0"));
    }
    if end < start {
        return Err(bad("end is below start"));
    }
    if step <= 0.0 {
        return Err(bad("step must be > 0"));
    }
    let n = ((end - start) / step + 1e-9).floor() as usize + 1;
    if n > 100 {
        return Err(bad(&format!("{n} levels; at most 100")));
    }
    Ok((0..n).map(|i| start + i as f64 * step).collect())
}

/// Sweep settings (the flags of `kiln loadtest` in perf_analyzer mode).
#[derive(Debug, Clone, PartialEq)]
pub struct PerfConfig {
    /// Server URL (`http://127.0.0.1:8000`, or the gRPC port for `Protocol::Grpc`).
    pub url: String,
    /// Model name.
    pub model: String,
    /// Wire protocol.
    pub protocol: Protocol,
    /// Rows per request.
    pub batch: usize,
    /// Binary tensors (HTTP binary extension / gRPC raw contents) instead of JSON / typed.
    pub binary: bool,
    /// The levels.
    pub mode: PerfMode,
    /// Arrivals in request-rate mode.
    pub distribution: Distribution,
    /// One measurement window (perf_analyzer's `--measurement-interval`).
    pub window: Duration,
    /// Most windows per level before giving up on stability.
    pub max_trials: usize,
    /// Stability threshold (0.10: the last three windows within 10 %).
    pub stability: f64,
    /// Request-rate mode: connections (most requests in flight).
    pub connections: usize,
    /// Per-request client timeout.
    pub timeout: Duration,
    /// Where to read the statistics extension (an HTTP URL); `None`: the server under test
    /// over its own protocol.
    pub stats_url: Option<String>,
}

/// Cumulative count and nanoseconds (Triton's `$duration_stat`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StatDuration {
    /// How many.
    pub count: u64,
    /// Their total duration.
    pub ns: u64,
}

/// A model's cumulative server-side statistics, summed over its versions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerStats {
    /// Rows inferred.
    pub inference_count: u64,
    /// Batches executed.
    pub execution_count: u64,
    /// Successful requests.
    pub success: StatDuration,
    /// Failed requests.
    pub fail: StatDuration,
    /// Time in queues.
    pub queue: StatDuration,
    /// Input preparation.
    pub compute_input: StatDuration,
    /// Model execution.
    pub compute_infer: StatDuration,
    /// Output extraction.
    pub compute_output: StatDuration,
}

fn dur_json(v: &Value) -> StatDuration {
    StatDuration {
        count: v["count"].as_u64().unwrap_or(0),
        ns: v["ns"].as_u64().unwrap_or(0),
    }
}

fn add(a: &mut StatDuration, b: StatDuration) {
    a.count += b.count;
    a.ns += b.ns;
}

impl ServerStats {
    fn add(&mut self, o: &ServerStats) {
        self.inference_count += o.inference_count;
        self.execution_count += o.execution_count;
        add(&mut self.success, o.success);
        add(&mut self.fail, o.fail);
        add(&mut self.queue, o.queue);
        add(&mut self.compute_input, o.compute_input);
        add(&mut self.compute_infer, o.compute_infer);
        add(&mut self.compute_output, o.compute_output);
    }

    /// Parse Triton's statistics JSON (`{"model_stats": [...]}`), summing the entries of
    /// `model`. `None` when the shape is not Triton's.
    pub fn from_json(v: &Value, model: &str) -> Option<ServerStats> {
        let mut out = ServerStats::default();
        for m in v["model_stats"].as_array()? {
            if m["name"].as_str() != Some(model) {
                continue;
            }
            let i = &m["inference_stats"];
            out.add(&ServerStats {
                inference_count: m["inference_count"].as_u64().unwrap_or(0),
                execution_count: m["execution_count"].as_u64().unwrap_or(0),
                success: dur_json(&i["success"]),
                fail: dur_json(&i["fail"]),
                queue: dur_json(&i["queue"]),
                compute_input: dur_json(&i["compute_input"]),
                compute_infer: dur_json(&i["compute_infer"]),
                compute_output: dur_json(&i["compute_output"]),
            });
        }
        Some(out)
    }

    /// The same from the gRPC `ModelStatisticsResponse`.
    pub fn from_proto(r: &pb::ModelStatisticsResponse, model: &str) -> ServerStats {
        let d = |s: &Option<pb::StatisticDuration>| {
            s.as_ref()
                .map(|s| StatDuration {
                    count: s.count,
                    ns: s.ns,
                })
                .unwrap_or_default()
        };
        let mut out = ServerStats::default();
        for m in r.model_stats.iter().filter(|m| m.name == model) {
            let i = m.inference_stats.unwrap_or_default();
            out.add(&ServerStats {
                inference_count: m.inference_count,
                execution_count: m.execution_count,
                success: d(&i.success),
                fail: d(&i.fail),
                queue: d(&i.queue),
                compute_input: d(&i.compute_input),
                compute_infer: d(&i.compute_infer),
                compute_output: d(&i.compute_output),
            });
        }
        out
    }
}

/// The server's view of one level: averages per request over the level's windows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServerBreakdown {
    /// Successful requests the server counted.
    pub requests: u64,
    /// Rows inferred.
    pub inferences: u64,
    /// Batches executed.
    pub executions: u64,
    /// Mean request time inside the server, µs.
    pub request_us: f64,
    /// Mean queue time, µs.
    pub queue_us: f64,
    /// Mean input preparation, µs.
    pub compute_input_us: f64,
    /// Mean model execution, µs.
    pub compute_infer_us: f64,
    /// Mean output extraction, µs.
    pub compute_output_us: f64,
}

fn mean_us(a: StatDuration, b: StatDuration) -> f64 {
    let n = b.count.saturating_sub(a.count);
    if n == 0 {
        0.0
    } else {
        b.ns.saturating_sub(a.ns) as f64 / n as f64 / 1e3
    }
}

impl ServerBreakdown {
    /// The difference between two snapshots.
    pub fn between(a: &ServerStats, b: &ServerStats) -> Self {
        Self {
            requests: b.success.count.saturating_sub(a.success.count),
            inferences: b.inference_count.saturating_sub(a.inference_count),
            executions: b.execution_count.saturating_sub(a.execution_count),
            request_us: mean_us(a.success, b.success),
            queue_us: mean_us(a.queue, b.queue),
            compute_input_us: mean_us(a.compute_input, b.compute_input),
            compute_infer_us: mean_us(a.compute_infer, b.compute_infer),
            compute_output_us: mean_us(a.compute_output, b.compute_output),
        }
    }
}

/// Where the statistics come from.
enum StatsSource {
    Http(std::net::SocketAddr, String),
    Grpc(String, String),
}

impl StatsSource {
    fn describe(&self) -> String {
        match self {
            StatsSource::Http(a, p) => format!("GET http://{a}{p}"),
            StatsSource::Grpc(u, _) => format!("gRPC ModelStatistics at {u}"),
        }
    }

    async fn fetch(&self, model: &str) -> Result<ServerStats, String> {
        match self {
            StatsSource::Http(addr, path) => {
                let r = HttpClient::new(*addr)
                    .with_timeout(Duration::from_secs(10))
                    .get(path)
                    .await
                    .map_err(|e| format!("GET {path}: {e}"))?;
                if r.status != 200 {
                    return Err(format!(
                        "GET {path}: HTTP {}: {}",
                        r.status,
                        r.text().trim()
                    ));
                }
                ServerStats::from_json(&r.json(), model)
                    .ok_or_else(|| format!("GET {path}: no `model_stats` array in the answer"))
            }
            StatsSource::Grpc(uri, model) => {
                let mut c = grpc_connect(uri).await.map_err(|e| e.to_string())?;
                let r = c
                    .model_statistics(pb::ModelStatisticsRequest {
                        name: model.clone(),
                        version: String::new(),
                    })
                    .await
                    .map_err(|s| format!("ModelStatistics: {:?}: {}", s.code(), s.message()))?;
                Ok(ServerStats::from_proto(&r.into_inner(), model))
            }
        }
    }
}

/// One level of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerfLevel {
    /// Requests in flight (concurrency mode).
    pub concurrency: Option<usize>,
    /// Target requests per second (request-rate mode).
    pub request_rate: Option<f64>,
    /// Windows measured.
    pub windows: usize,
    /// Whether the last three windows met the stability criterion.
    pub stable: bool,
    /// Requests sent in the reported windows.
    pub requests: u64,
    /// Requests answered successfully in the reported windows.
    pub ok: u64,
    /// Failures by HTTP status, `io`, or gRPC code.
    pub errors: BTreeMap<String, u64>,
    /// Successful requests per second (perf_analyzer's "throughput", infer/sec per request).
    pub throughput: f64,
    /// Rows per second.
    pub rows_per_s: f64,
    /// Client latency (open loop: from the scheduled start).
    pub latency_ms: Latency,
    /// Latency from the moment each request was written.
    pub service_latency_ms: Latency,
    /// Open loop: requests sent more than 2 ms late.
    pub late: u64,
    /// Open loop: requests due while every connection was busy until the window ended.
    pub unsent: u64,
    /// The server's queue / compute breakdown over the level (when it has statistics).
    pub server: Option<ServerBreakdown>,
}

/// A sweep's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerfReport {
    /// The URL.
    pub url: String,
    /// The model.
    pub model: String,
    /// The protocol.
    pub protocol: Protocol,
    /// Rows per request.
    pub batch: usize,
    /// Binary tensors.
    pub binary: bool,
    /// Arrivals (request-rate mode).
    pub distribution: Option<Distribution>,
    /// Window length in milliseconds.
    pub window_ms: f64,
    /// Stability threshold.
    pub stability: f64,
    /// Where the server-side breakdown came from, or why there is none.
    pub server_stats: String,
    /// The levels in order.
    pub levels: Vec<PerfLevel>,
}

/// perf_analyzer's criterion: throughput and mean latency of each of the windows within
/// `threshold` of their mean.
fn is_stable(ws: &[Window], threshold: f64) -> bool {
    let within = |xs: Vec<f64>| {
        let m = xs.iter().sum::<f64>() / xs.len() as f64;
        m > 0.0 && xs.iter().all(|x| (x - m).abs() <= threshold * m)
    };
    ws.iter().all(|w| !w.lat.is_empty())
        && within(ws.iter().map(Window::throughput).collect())
        && within(ws.iter().map(Window::mean_latency).collect())
}

/// Run a perf_analyzer-style sweep.
pub async fn run_perf(cfg: &PerfConfig) -> Result<PerfReport, LoadtestError> {
    let levels = match &cfg.mode {
        PerfMode::Concurrency(l) => l.len(),
        PerfMode::RequestRate(l) => l.len(),
    };
    if cfg.batch == 0 || levels == 0 {
        return Err(LoadtestError::Perf(
            "--batch and every level must be at least 1".into(),
        ));
    }
    if cfg.window.is_zero() || cfg.window > Duration::from_secs(3600) {
        return Err(LoadtestError::Duration(cfg.window));
    }
    if cfg.max_trials < 3 {
        return Err(LoadtestError::Perf(format!(
            "--max-trials is {}; at least 3 (stability compares the last three windows)",
            cfg.max_trials
        )));
    }
    if !(cfg.stability > 0.0 && cfg.stability <= 1.0) {
        return Err(LoadtestError::Perf(format!(
            "--stability-percentage is {}; expected (0, 100]",
            cfg.stability * 100.0
        )));
    }
    if let PerfMode::Concurrency(l) = &cfg.mode
        && l.contains(&0)
    {
        return Err(LoadtestError::Perf("a concurrency of 0".into()));
    }
    if matches!(cfg.mode, PerfMode::RequestRate(_)) && cfg.connections == 0 {
        return Err(LoadtestError::Perf(
            "--concurrency (connections in request-rate mode) must be at least 1".into(),
        ));
    }
    let target = prepare(&cfg.url, &cfg.model, cfg.protocol, cfg.batch, cfg.binary).await?;
    let source = match (&cfg.stats_url, cfg.protocol) {
        (Some(u), _) => {
            let b = BaseUrl::parse(u)?;
            StatsSource::Http(
                b.addr,
                format!("{}/v2/models/{}/stats", b.prefix, cfg.model),
            )
        }
        (None, Protocol::Http) => {
            let b = BaseUrl::parse(&cfg.url)?;
            StatsSource::Http(
                b.addr,
                format!("{}/v2/models/{}/stats", b.prefix, cfg.model),
            )
        }
        (None, Protocol::Grpc) => StatsSource::Grpc(grpc_uri(&cfg.url)?, cfg.model.clone()),
    };
    let mut prev = source.fetch(&cfg.model).await;
    let server_stats = match &prev {
        Ok(_) => format!("from {}", source.describe()),
        Err(e) => format!(
            "unavailable (the server has no statistics extension, or it is elsewhere: --stats-url): {e}"
        ),
    };
    let mut out = Vec::new();
    let points: Vec<(Option<usize>, Option<f64>)> = match &cfg.mode {
        PerfMode::Concurrency(l) => l.iter().map(|&c| (Some(c), None)).collect(),
        PerfMode::RequestRate(l) => l.iter().map(|&r| (None, Some(r))).collect(),
    };
    for (li, (conc, rate)) in points.into_iter().enumerate() {
        let mut windows: Vec<Window> = Vec::new();
        let mut stable = false;
        for trial in 0..cfg.max_trials {
            let (workers, schedule) = match (conc, rate) {
                (Some(c), _) => (c, None),
                (None, Some(r)) => (
                    cfg.connections,
                    Some(Arc::new(arrivals(
                        r,
                        cfg.window,
                        cfg.distribution,
                        (li * 1000 + trial) as u64,
                        u64::MAX,
                    ))),
                ),
                (None, None) => unreachable!("a level is a concurrency or a rate"),
            };
            let w = drive(
                &target,
                workers,
                schedule,
                cfg.window,
                u64::MAX,
                cfg.timeout,
            )
            .await?;
            windows.push(w);
            let n = windows.len();
            if n >= 3 && is_stable(&windows[n - 3..], cfg.stability) {
                stable = true;
                break;
            }
        }
        let server = match &prev {
            Ok(before) => {
                let after = source.fetch(&cfg.model).await;
                let b = after
                    .as_ref()
                    .ok()
                    .map(|a| ServerBreakdown::between(before, a));
                prev = after;
                b
            }
            Err(_) => None,
        };
        let n = windows.len();
        let last = &windows[n.saturating_sub(3)..];
        let mut lat: Vec<f64> = last.iter().flat_map(|w| w.lat.iter().copied()).collect();
        let mut svc: Vec<f64> = last.iter().flat_map(|w| w.svc.iter().copied()).collect();
        lat.sort_by(|a, b| a.total_cmp(b));
        svc.sort_by(|a, b| a.total_cmp(b));
        let elapsed: f64 = last.iter().map(|w| w.elapsed_s).sum::<f64>().max(1e-9);
        let mut errors: BTreeMap<String, u64> = BTreeMap::new();
        for w in last {
            for (k, v) in &w.errors {
                *errors.entry(k.clone()).or_default() += v;
            }
        }
        let ok = lat.len() as u64;
        out.push(PerfLevel {
            concurrency: conc,
            request_rate: rate,
            windows: n,
            stable,
            requests: last.iter().map(|w| w.sent).sum(),
            ok,
            errors,
            throughput: ok as f64 / elapsed,
            rows_per_s: (ok * cfg.batch as u64) as f64 / elapsed,
            latency_ms: Latency::of(&lat),
            service_latency_ms: Latency::of(&svc),
            late: last.iter().map(|w| w.late).sum(),
            unsent: last.iter().map(|w| w.unsent).sum(),
            server,
        });
    }
    Ok(PerfReport {
        url: cfg.url.clone(),
        model: cfg.model.clone(),
        protocol: cfg.protocol,
        batch: cfg.batch,
        binary: cfg.binary,
        distribution: matches!(cfg.mode, PerfMode::RequestRate(_)).then_some(cfg.distribution),
        window_ms: cfg.window.as_secs_f64() * 1e3,
        stability: cfg.stability,
        server_stats,
        levels: out,
    })
}

/// perf_analyzer-like lines for a sweep (the CLI prints them on stderr).
pub fn perf_summary(r: &PerfReport) -> String {
    let mut s = format!(
        "*** kiln loadtest: {} over {}{}, batch {} ***\nserver-side statistics: {}\n",
        r.model,
        match r.protocol {
            Protocol::Http => "HTTP",
            Protocol::Grpc => "gRPC",
        },
        if r.binary { " (binary)" } else { "" },
        r.batch,
        r.server_stats
    );
    for l in &r.levels {
        let what = match (l.concurrency, l.request_rate) {
            (Some(c), _) => format!("Concurrency: {c}"),
            (_, Some(x)) => format!("Request rate: {x}"),
            _ => String::new(),
        };
        let lat = &l.latency_ms;
        s.push_str(&format!(
            "{what}, throughput: {:.1} infer/sec, latency p50 {:.0} usec, p90 {:.0} usec, p95 {:.0} usec, p99 {:.0} usec ({} windows, {})\n",
            l.throughput * r.batch as f64,
            lat.p50 * 1e3,
            lat.p90 * 1e3,
            lat.p95 * 1e3,
            lat.p99 * 1e3,
            l.windows,
            if l.stable { "stable" } else { "NOT stable" }
        ));
        if let Some(b) = &l.server {
            s.push_str(&format!(
                "  Server: {} requests, {} executions; avg request {:.0} usec (queue {:.0} usec + compute input {:.0} usec + compute infer {:.0} usec + compute output {:.0} usec)\n",
                b.requests,
                b.executions,
                b.request_us,
                b.queue_us,
                b.compute_input_us,
                b.compute_infer_us,
                b.compute_output_us
            ));
        }
        if !l.errors.is_empty() {
            s.push_str(&format!("  errors: {:?}\n", l.errors));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_framed_and_statuses_keyed_by_name() {
        use prost::Message;
        let req = pb::ModelInferRequest {
            model_name: "tiny".into(),
            raw_input_contents: vec![vec![1u8, 2, 3, 4].into()],
            ..Default::default()
        };
        let m = grpc_message(&req);
        assert_eq!(m[0], 0, "uncompressed");
        let n = u32::from_be_bytes([m[1], m[2], m[3], m[4]]) as usize;
        assert_eq!(n, m.len() - 5);
        assert_eq!(pb::ModelInferRequest::decode(&m[5..]).unwrap(), req);
        assert_eq!(grpc_error_key(b"5"), "grpc_NotFound");
        assert_eq!(grpc_error_key(b"14"), "grpc_Unavailable");
        assert_eq!(grpc_error_key(b"x"), "grpc_Unknown");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(|x| x as f64).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
    }

    #[test]
    fn ranges_follow_perf_analyzer() {
        assert_eq!(
            parse_range("--concurrency-range", "1:4:1").unwrap(),
            [1.0, 2.0, 3.0, 4.0]
        );
        assert_eq!(parse_range("--concurrency-range", "2").unwrap(), [2.0]);
        assert_eq!(
            parse_range("--request-rate-range", "100:300:100").unwrap(),
            [100.0, 200.0, 300.0]
        );
        let e = parse_range("--concurrency-range", "4:1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--concurrency-range is `4:1`: end is below start"),
            "{e}"
        );
        let e = parse_range("--concurrency-range", "1:x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`x` is not a number"), "{e}");
        assert!(parse_range("--concurrency-range", "0:2").is_err());
        assert!(parse_range("--concurrency-range", "1:1000:1").is_err());
    }

    #[test]
    fn arrivals_are_constant_or_poisson_at_the_rate() {
        let c = arrivals(
            100.0,
            Duration::from_secs(1),
            Distribution::Constant,
            0,
            u64::MAX,
        );
        assert_eq!(c.len(), 100);
        assert!((c[1].as_secs_f64() - 0.01).abs() < 1e-9, "{:?}", c[1]);
        let p = arrivals(
            1000.0,
            Duration::from_secs(10),
            Distribution::Poisson,
            3,
            u64::MAX,
        );
        // 10 000 expected; a Poisson count has sd 100.
        assert!((9_500..10_500).contains(&p.len()), "{}", p.len());
        assert!(p.windows(2).all(|w| w[0] <= w[1]));
        let gaps: Vec<f64> = p.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        // Exponential gaps: sd equals the mean (a constant schedule has sd 0).
        assert!(
            (var.sqrt() / mean - 1.0).abs() < 0.1,
            "cv {}",
            var.sqrt() / mean
        );
        assert_eq!(
            arrivals(10.0, Duration::from_secs(1), Distribution::Constant, 0, 3).len(),
            3
        );
    }

    #[test]
    fn stability_needs_three_windows_within_the_threshold() {
        let w = |n: usize, ms: f64| Window {
            lat: vec![ms; n],
            elapsed_s: 1.0,
            ..Default::default()
        };
        assert!(is_stable(&[w(100, 1.0), w(105, 1.05), w(96, 0.97)], 0.10));
        assert!(!is_stable(&[w(100, 1.0), w(130, 1.0), w(100, 1.0)], 0.10));
        assert!(!is_stable(&[w(100, 1.0), w(100, 1.5), w(100, 1.0)], 0.10));
        assert!(!is_stable(&[w(0, 0.0), w(0, 0.0), w(0, 0.0)], 0.10));
    }

    #[test]
    fn triton_statistics_json_is_summed_per_model() {
        let v = serde_json::json!({"model_stats": [
            {"name": "m", "version": "1", "inference_count": 10, "execution_count": 4,
             "inference_stats": {"success": {"count": 5, "ns": 5000}, "queue": {"count": 5, "ns": 1000},
                                 "compute_infer": {"count": 5, "ns": 2500}}},
            {"name": "m", "version": "2", "inference_count": 2, "execution_count": 1,
             "inference_stats": {"success": {"count": 1, "ns": 3000}}},
            {"name": "other", "inference_count": 99}]});
        let s = ServerStats::from_json(&v, "m").unwrap();
        assert_eq!((s.inference_count, s.execution_count), (12, 5));
        assert_eq!(s.success, StatDuration { count: 6, ns: 8000 });
        let b = ServerBreakdown::between(&ServerStats::default(), &s);
        assert_eq!(b.requests, 6);
        assert!((b.queue_us - 0.2).abs() < 1e-12 && (b.compute_infer_us - 0.5).abs() < 1e-12);
        assert_eq!(
            ServerStats::from_json(&serde_json::json!({"error": "x"}), "m"),
            None
        );
    }
}
