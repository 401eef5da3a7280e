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
//!
//! Files: this one holds the settings, the errors, the report and [`run_loadtest`];
//! `request.rs` what is sent, `caller.rs` how (a prepared request per protocol, one sender per
//! connection), `drive.rs` the load loop and arrival schedules, `perf.rs` the sweeps,
//! `server_stats.rs` the server's side of them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::client::{ClientError, UrlError};
use kiln_serve::grpc::proto as pb;

mod caller;
mod drive;
mod perf;
mod request;
mod server_stats;
#[cfg(test)]
mod tests;

use caller::prepare_http;
use drive::drive;
pub use drive::{Distribution, arrivals};
pub use perf::{PerfConfig, PerfLevel, PerfMode, PerfReport, parse_range, perf_summary, run_perf};
pub use request::{grpc_request, request_body};
pub use server_stats::{ServerBreakdown, ServerStats, StatDuration};

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
    /// The model's metadata lacks what a request needs, or is not model metadata.
    #[error("model metadata: {0}")]
    BadMetadata(String),
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
    pub(crate) fn of(sorted: &[f64]) -> Self {
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

/// The wire protocol of a load test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::EnumString)]
#[serde(rename_all = "lowercase")]
#[strum(
    serialize_all = "lowercase",
    parse_err_ty = String,
    parse_err_fn = unknown_protocol
)]
pub enum Protocol {
    /// Open Inference Protocol v2 over HTTP/1.1 (JSON, or the binary tensor extension).
    Http,
    /// KServe v2 gRPC (`raw_input_contents` when binary, typed contents otherwise).
    Grpc,
}

/// `Protocol`'s derived `FromStr` error.
fn unknown_protocol(s: &str) -> String {
    format!("`{s}` is not a protocol; expected http or grpc")
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
