//! The serving latency benchmark behind `kiln bench serve`: one run starts a server on
//! loopback in-process (or measures one at `--url`) and reports
//!
//! * round trips at concurrency 1 over one keep-alive connection: the health endpoint (the
//!   HTTP floor of this server and client) and inference, JSON and binary, at each batch
//!   size (and the pick model when one is named), with p50/p90/p99 and each infer p50 minus
//!   the health p50 — what the inference path adds to HTTP;
//! * the closed-loop maximum (connections sending back to back) and an open-loop sweep at
//!   fractions of it, with the service-side latency (from each request's write to its
//!   answer) and the latency from each request's scheduled start;
//! * the in-process cost of each stage of the request path (parse, decode, batcher round
//!   trip with compute, select and encode), medians over many calls.
//!
//! Where the machine has two or more CPUs, the client's threads are pinned to the first
//! allowed CPU and the server's (its runtime, its instances and their pools, which inherit
//! the mask) to the others, with `sched_setaffinity`; the report says what was done.
//!
//! Files: this one holds the options, the report and [`run_serve_bench`]; `measure.rs` the
//! measurements over HTTP, `stages.rs` the in-process stage costs, `watch.rs` the watch and
//! tracing costs, `pin.rs` CPU pinning.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::client::{BaseUrl, ClientError, UrlError};
use crate::loadtest::LoadtestError;
use kiln_serve::batcher::BatcherConfig;
use kiln_serve::{ServeConfig, ServeError, ServerHandle};

mod measure;
mod pin;
mod stages;
mod watch;

use measure::measure;
use pin::{allowed_cpus, pin_current};

/// Settings of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeBenchOptions {
    /// The model repository (in-process server).
    pub repository: std::path::PathBuf,
    /// The regression model to call.
    pub model: String,
    /// A pick model to call too (concurrency 1, JSON, batch 1).
    pub pick_model: Option<String>,
    /// Measure the server at this loopback URL instead of starting one (no pinning of the
    /// server, no stage costs).
    pub url: Option<String>,
    /// Engine of the in-process server (`None`: the default).
    pub engine: Option<kiln_model::records::EngineKind>,
    /// Batching of the in-process server.
    pub batcher: BatcherConfig,
    /// Tokio worker threads of the in-process server (0: one per allowed CPU).
    pub server_workers: usize,
    /// Rows per inference request at concurrency 1.
    pub batches: Vec<usize>,
    /// Measured requests per series at concurrency 1 (after as many warm-up requests / 4).
    pub requests: usize,
    /// Interleaved rounds over the series.
    pub rounds: usize,
    /// Connections of the closed-loop and open-loop runs.
    pub connections: usize,
    /// Length of the closed-loop run.
    pub closed_duration: Duration,
    /// Fractions of the closed-loop maximum for the open-loop sweep.
    pub fractions: Vec<f64>,
    /// Length of each open-loop point.
    pub sweep_duration: Duration,
    /// Calls per stage for the in-process stage costs.
    pub stage_iters: usize,
    /// Pin client and server threads to different CPUs where there are two or more.
    pub pin: bool,
}

impl Default for ServeBenchOptions {
    fn default() -> Self {
        Self {
            repository: "models".into(),
            model: "regression".into(),
            pick_model: None,
            url: None,
            engine: None,
            batcher: BatcherConfig::default(),
            server_workers: 0,
            batches: vec![1, 64],
            requests: 3000,
            rounds: 3,
            connections: 8,
            closed_duration: Duration::from_secs(5),
            fractions: vec![0.1, 0.5, 0.7, 0.9],
            sweep_duration: Duration::from_secs(5),
            stage_iters: 2000,
            pin: true,
        }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeBenchError {
    /// The server did not start or stop cleanly.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// A request could not be sent.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The URL is not a loopback URL.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// The load generator failed.
    #[error(transparent)]
    Loadtest(#[from] LoadtestError),
    /// A request was answered with an error.
    #[error("{what}: HTTP {status}: {body}")]
    Status {
        /// The request.
        what: String,
        /// The status.
        status: u16,
        /// The body.
        body: String,
    },
    /// An option is out of range.
    #[error("{0}")]
    Invalid(String),
    /// A runtime could not be built.
    #[error("cannot start a runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// A 200 answer, or the error naming the request.
pub(super) fn check(r: crate::client::HttpResponse, what: &str) -> Result<(), ServeBenchError> {
    if r.status == 200 {
        Ok(())
    } else {
        Err(ServeBenchError::Status {
            what: what.into(),
            status: r.status,
            body: r.text(),
        })
    }
}

/// Percentiles of one series, microseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    /// Samples.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

impl Percentiles {
    /// Percentiles (nearest rank) of samples in microseconds.
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let q = |q: f64| {
            if v.is_empty() {
                0.0
            } else {
                crate::util::percentile(&v, q)
            }
        };
        Self {
            n: v.len(),
            p50: q(0.5),
            p90: q(0.9),
            p99: q(0.99),
            mean: if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            },
        }
    }
}

/// One concurrency-1 series.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RoundTrip {
    /// `health`, `infer_json_b1`, `infer_binary_b64`, `pick_json_b1`, …
    pub name: String,
    /// Round trip, µs.
    pub us: Percentiles,
    /// p50 minus the health endpoint's p50, µs (0 for the health series).
    pub minus_health_p50_us: f64,
}

/// One open-loop point.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SweepPoint {
    /// Fraction of the closed-loop maximum.
    pub fraction: f64,
    /// Target rate.
    pub target_rps: f64,
    /// Achieved rate.
    pub achieved_rps: f64,
    /// Service-side latency (write to answer), ms.
    pub service_p50_ms: f64,
    /// Service-side latency, ms.
    pub service_p99_ms: f64,
    /// Latency from the scheduled start, ms.
    pub latency_p99_ms: f64,
    /// Requests sent more than 2 ms behind schedule.
    pub late: u64,
    /// Failed requests.
    pub errors: u64,
}

/// What was pinned where.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Pinning {
    /// Whether client and server threads run on disjoint CPUs.
    pub applied: bool,
    /// The client's CPUs.
    pub client_cpus: Vec<usize>,
    /// The server's CPUs (empty: not pinned).
    pub server_cpus: Vec<usize>,
    /// How, or why not.
    pub note: String,
}

/// The in-process cost of each stage, medians in µs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StageCost {
    /// `json_b1`, `binary_b64`, `pick_json_b1`, …
    pub request: String,
    /// Body → [`InferRequest`] (the server's reader).
    pub parse_us: f64,
    /// The same with serde_json alone ([`JsonReader::Serde`]), in the same run, the two
    /// timed in alternation.
    pub parse_serde_us: f64,
    /// Check and decode against the model.
    pub decode_us: f64,
    /// Batcher round trip: queue, instance, compute, reply.
    pub batcher_us: f64,
    /// Select and encode the outputs.
    pub encode_us: f64,
}

/// A run's results.
#[derive(Debug, Clone, Serialize)]
pub struct ServeBenchReport {
    /// Always `serve`.
    pub bench: &'static str,
    /// `in-process` or the URL measured.
    pub server: String,
    /// The model called.
    pub model: String,
    /// Batching policy, instances, threads, max batch, delay (in-process server).
    pub batching: Value,
    /// Tokio workers of the in-process server (0 when external; by default one per server
    /// CPU).
    pub server_workers: usize,
    /// CPU pinning.
    pub pinning: Pinning,
    /// Concurrency 1 over keep-alive.
    pub round_trips: Vec<RoundTrip>,
    /// Connections of the closed-loop and open-loop runs.
    pub connections: usize,
    /// Closed-loop maximum, requests/s (JSON, batch 1).
    pub closed_loop_rps: f64,
    /// The closed-loop run's service-side p50 and p99, ms.
    pub closed_loop_service_ms: [f64; 2],
    /// Failed requests of the closed-loop run.
    pub closed_loop_errors: u64,
    /// The open-loop sweep.
    pub open_loop: Vec<SweepPoint>,
    /// Per-stage costs in-process (empty for an external server).
    pub stages: Vec<StageCost>,
    /// What the drift watch and OpenTelemetry tracing cost on the request path, on vs off,
    /// measured in this run (empty for an external server).
    pub watch_costs: Vec<WatchCost>,
}

/// One request series through one server configuration of the on/off comparison: servers
/// that differ only in their drift watch and tracing, measured in interleaved rounds at
/// concurrency 1.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WatchCost {
    /// `off` (no drift watch, no tracing), `drift`, `trace_unsampled` (tracing on, the
    /// caller's `traceparent` not sampled), `trace_sampled` (every request's six spans
    /// created and queued for export), `drift+trace_sampled`.
    pub config: String,
    /// `infer_json_b1`, …
    pub series: String,
    /// Round trip, µs.
    pub us: Percentiles,
    /// p50 minus the `off` server's p50 on the same series, µs.
    pub delta_p50_us: f64,
    /// p50 over the `off` server's p50 on the same series.
    pub ratio_p50: f64,
}

/// Wait until the in-process server `h` serves every model (at most 120 s), or fail at once
/// when a model's version was rejected (failed to load or warm up, e.g. a GPU engine without a
/// usable GPU) and nothing is served for it: waiting would not change that. `what` names the
/// server in the message.
pub(crate) fn await_ready(
    rt: &tokio::runtime::Runtime,
    h: &ServerHandle,
    what: &str,
) -> Result<(), ServeBenchError> {
    let until = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if h.is_ready() {
            return Ok(());
        }
        let rejected: Vec<String> = h
            .repository()
            .rejected()
            .into_iter()
            .map(|(name, reason)| format!("model {name}: {reason}"))
            .collect();
        if !rejected.is_empty() {
            return Err(ServeBenchError::Invalid(format!(
                "{what} cannot serve: version rejected: {}",
                rejected.join("; ")
            )));
        }
        if std::time::Instant::now() >= until {
            return Err(ServeBenchError::Invalid(format!(
                "{what} did not become ready within 120 s"
            )));
        }
        // The timer is made inside the runtime (`tokio::time::sleep` outside one panics).
        rt.block_on(async { tokio::time::sleep(Duration::from_millis(5)).await });
    }
}

/// Run the benchmark (blocking; builds its own runtimes).
pub fn run_serve_bench(opts: &ServeBenchOptions) -> Result<ServeBenchReport, ServeBenchError> {
    if opts.requests == 0 || opts.rounds == 0 || opts.connections == 0 {
        return Err(ServeBenchError::Invalid(
            "--requests, --rounds and --connections must be at least 1".into(),
        ));
    }
    if opts.batches.is_empty() || opts.batches.contains(&0) {
        return Err(ServeBenchError::Invalid(
            "--batch needs batch sizes of at least 1".into(),
        ));
    }
    if let Some(f) = opts.fractions.iter().find(|f| !(**f > 0.0 && **f <= 1.0)) {
        return Err(ServeBenchError::Invalid(format!(
            "--fractions has {f}; expected fractions in (0, 1]"
        )));
    }
    let cpus = allowed_cpus();
    let split = opts.pin && opts.url.is_none() && cpus.len() >= 2;
    let (client_cpus, server_cpus) = if split {
        (vec![cpus[0]], cpus[1..].to_vec())
    } else {
        (Vec::new(), Vec::new())
    };
    // The server first: its threads (and the instance threads they spawn) get its CPUs.
    let mut server: Option<(tokio::runtime::Runtime, ServerHandle)> = None;
    let mut server_workers = 0;
    let addr: SocketAddr = match &opts.url {
        Some(url) => BaseUrl::parse(url)?.addr,
        None => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.enable_all().thread_name("kiln-http");
            let workers = if opts.server_workers > 0 {
                opts.server_workers
            } else if !server_cpus.is_empty() {
                server_cpus.len()
            } else {
                cpus.len().max(1)
            };
            b.worker_threads(workers);
            server_workers = workers;
            if !server_cpus.is_empty() {
                let sc = server_cpus.clone();
                b.on_thread_start(move || {
                    pin_current(&sc);
                });
            }
            let rt = b.build().map_err(ServeBenchError::Runtime)?;
            let cfg = in_process_config(opts);
            let handle = rt.block_on(kiln_serve::start(cfg))?;
            await_ready(
                &rt,
                &handle,
                &format!("the repository {}", opts.repository.display()),
            )?;
            let a = handle.addr;
            server = Some((rt, handle));
            a
        }
    };
    let client_pinned = !client_cpus.is_empty() && pin_current(&client_cpus);
    let result = measure(opts, addr, server.as_ref().map(|(_, h)| h), client_pinned);
    if !cpus.is_empty() {
        pin_current(&cpus);
    }
    if let Some((rt, handle)) = server {
        rt.block_on(handle.shutdown())?;
    }
    let mut report = result?;
    report.pinning = Pinning {
        applied: client_pinned,
        client_cpus: if client_pinned {
            client_cpus
        } else {
            Vec::new()
        },
        server_cpus: if client_pinned {
            server_cpus
        } else {
            Vec::new()
        },
        note: if client_pinned {
            "sched_setaffinity: the client's threads on the first allowed CPU; the server's \
             runtime threads on the others, and its instance threads inherit them"
                .into()
        } else if opts.url.is_some() {
            "external server: not pinned (pin it with taskset)".into()
        } else if !opts.pin {
            "pinning turned off".into()
        } else {
            format!(
                "not pinned: {} CPU(s) allowed, two or more needed",
                cpus.len()
            )
        },
    };
    report.server_workers = server_workers;
    Ok(report)
}

/// The in-process server's settings: any free port, the options' repository, engine and
/// batching, no polling.
pub(super) fn in_process_config(opts: &ServeBenchOptions) -> ServeConfig {
    ServeConfig {
        repository: opts.repository.clone(),
        port: 0,
        engine: opts.engine,
        batcher: opts.batcher.clone(),
        poll_interval: None,
        ..ServeConfig::default()
    }
}

/// A short table of a report.
pub fn format_report(r: &ServeBenchReport) -> String {
    let mut s = format!(
        "{} · model {} · pinning: {}\n{:<20} {:>9} {:>9} {:>9} {:>12}\n",
        r.server,
        r.model,
        if r.pinning.applied { "yes" } else { "no" },
        "round trip (µs)",
        "p50",
        "p90",
        "p99",
        "p50-health"
    );
    for t in &r.round_trips {
        s += &format!(
            "{:<20} {:>9.1} {:>9.1} {:>9.1} {:>12.1}\n",
            t.name, t.us.p50, t.us.p90, t.us.p99, t.minus_health_p50_us
        );
    }
    s += &format!(
        "closed loop ({} connections): {:.0} req/s, {} errors\n",
        r.connections, r.closed_loop_rps, r.closed_loop_errors
    );
    for p in &r.open_loop {
        s += &format!(
            "open loop {:>3.0}% ({:.0} req/s): service p50 {:.3} ms, p99 {:.3} ms, {} errors\n",
            p.fraction * 100.0,
            p.achieved_rps,
            p.service_p50_ms,
            p.service_p99_ms,
            p.errors
        );
    }
    for st in &r.stages {
        s += &format!(
            "stages {}: parse {:.2} µs (serde_json alone {:.2}), decode {:.2} µs, batcher {:.2} µs, encode {:.2} µs\n",
            st.request, st.parse_us, st.parse_serde_us, st.decode_us, st.batcher_us, st.encode_us
        );
    }
    if !r.watch_costs.is_empty() {
        s += &format!(
            "{:<22} {:<18} {:>9} {:>9} {:>10} {:>7}\n",
            "watch on/off (µs)", "series", "p50", "p90", "Δp50", "ratio"
        );
    }
    for w in &r.watch_costs {
        s += &format!(
            "{:<22} {:<18} {:>9.1} {:>9.1} {:>+10.1} {:>7.3}\n",
            w.config, w.series, w.us.p50, w.us.p90, w.delta_p50_us, w.ratio_p50
        );
    }
    s
}
