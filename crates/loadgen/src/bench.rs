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

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::client::{BaseUrl, BlockingClient, ClientError, UrlError};
use crate::loadtest::{LoadtestConfig, LoadtestError, LoadtestReport, request_body, run_loadtest};
use kiln_serve::batcher::BatcherConfig;
use kiln_serve::protocol::{InferRequest, JsonReader, encode_response, select_outputs};
use kiln_serve::{ServeConfig, ServeError, ServerHandle};

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
    pub engine: Option<String>,
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

fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity writes at most its size.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let ok = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0
        };
        if ok {
            // SAFETY: `set` is initialised and the index is below CPU_SETSIZE.
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
                .collect()
        } else {
            Vec::new()
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// Pin the calling thread to `cpus`; false where that is not possible.
fn pin_current(cpus: &[usize]) -> bool {
    if cpus.is_empty() {
        return false;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for indices below
        // CPU_SETSIZE (the ones sched_getaffinity reported).
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        for &c in cpus {
            unsafe { libc::CPU_SET(c, &mut set) };
        }
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

fn check(r: crate::client::HttpResponse, what: &str) -> Result<(), ServeBenchError> {
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

/// A request of one series.
struct Series {
    name: String,
    path: String,
    method: &'static str,
    body: Vec<u8>,
    hlen: Option<String>,
}

impl Series {
    fn send(&self, c: &mut BlockingClient) -> Result<(), ServeBenchError> {
        let hlen = self.hlen.as_deref();
        let mut headers = vec![(
            "Content-Type",
            if hlen.is_some() {
                "application/octet-stream"
            } else {
                "application/json"
            },
        )];
        if let Some(h) = hlen {
            headers.push(("Inference-Header-Content-Length", h));
        }
        let r = c.request(self.method, &self.path, &headers, &self.body)?;
        check(r, &self.name)
    }
}

fn median_us(iters: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..iters.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn stage_costs(
    handle: &ServerHandle,
    bodies: &[(String, String, Vec<u8>, Option<usize>)],
    iters: usize,
) -> Result<Vec<StageCost>, ServeBenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeBenchError::Runtime)?;
    let max_batch = handle.repository().config().batcher.max_batch_size;
    let level = handle
        .repository()
        .config()
        .batcher
        .level(None)
        .map_err(ServeBenchError::Invalid)?;
    let invalid = |e: kiln_serve::protocol::ProtocolError| ServeBenchError::Invalid(e.0);
    let mut out = Vec::new();
    for (name, model, body, hlen) in bodies {
        let model = model.as_str();
        let Some(lv) = handle.repository().get(model).and_then(|s| s.current()) else {
            return Err(ServeBenchError::Invalid(format!(
                "model `{model}` is not loaded"
            )));
        };
        let version = lv.version.to_string();
        let bytes = hyper::body::Bytes::from(body.clone());
        let h = hlen.map(|n| n.to_string());
        let parse_with = |r| InferRequest::parse_with(bytes.clone(), h.as_deref(), r);
        let parse = || parse_with(JsonReader::Fast);
        let req = parse().map_err(invalid)?;
        let input = lv
            .spec
            .decode(&req.inputs, model, max_batch)
            .map_err(invalid)?;
        let outputs = rt
            .block_on(
                lv.batcher
                    .infer(input.clone(), level, Duration::from_secs(10)),
            )
            .map_err(|e| ServeBenchError::Invalid(e.to_string()))?
            .0;
        let mut times = [Vec::new(), Vec::new()];
        for _ in 0..iters.max(1) {
            for (k, r) in [JsonReader::Serde, JsonReader::Fast]
                .into_iter()
                .enumerate()
            {
                let t = Instant::now();
                std::hint::black_box(parse_with(r).ok());
                times[k].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        let [parse_serde_us, parse_us] = times.map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        });
        let decode_us = median_us(iters, || {
            std::hint::black_box(lv.spec.decode(&req.inputs, model, max_batch).ok());
        });
        let batcher_us = median_us(iters, || {
            std::hint::black_box(
                rt.block_on(
                    lv.batcher
                        .infer(input.clone(), level, Duration::from_secs(10)),
                )
                .ok(),
            );
        });
        let encode_us = median_us(iters, || {
            let sel = select_outputs(&req, outputs.clone()).expect("outputs exist");
            std::hint::black_box(encode_response(&lv.model, &version, None, &sel));
        });
        out.push(StageCost {
            request: name.clone(),
            parse_us,
            parse_serde_us,
            decode_us,
            batcher_us,
            encode_us,
        });
    }
    Ok(out)
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
            if !rt.block_on(handle.wait_ready(Duration::from_secs(120))) {
                return Err(ServeBenchError::Invalid(format!(
                    "the repository {} did not become ready within 120 s",
                    opts.repository.display()
                )));
            }
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
fn in_process_config(opts: &ServeBenchOptions) -> ServeConfig {
    ServeConfig {
        repository: opts.repository.clone(),
        port: 0,
        engine: opts.engine.clone(),
        batcher: opts.batcher.clone(),
        poll_interval: None,
        ..ServeConfig::default()
    }
}

fn measure(
    opts: &ServeBenchOptions,
    addr: SocketAddr,
    handle: Option<&ServerHandle>,
    client_pinned: bool,
) -> Result<ServeBenchReport, ServeBenchError> {
    let mut c = BlockingClient::new(addr)?.with_timeout(Duration::from_secs(30));
    let model_path = format!("/v2/models/{}", opts.model);
    let meta = c.get(&model_path)?;
    if meta.status != 200 {
        return Err(ServeBenchError::Status {
            what: format!("GET {model_path}"),
            status: meta.status,
            body: meta.text(),
        });
    }
    let config = c.get(&format!("{model_path}/config"))?.json();
    let mut series = vec![Series {
        name: "health".into(),
        path: "/v2/health/live".into(),
        method: "GET",
        body: Vec::new(),
        hlen: None,
    }];
    let mut bodies = Vec::new();
    for &b in &opts.batches {
        for binary in [false, true] {
            let (body, hlen) = request_body(&meta.json(), &config, b, binary)?;
            let name = format!("{}_b{b}", if binary { "binary" } else { "json" });
            bodies.push((name.clone(), opts.model.clone(), body.clone(), hlen));
            series.push(Series {
                name: format!("infer_{name}"),
                path: format!("{model_path}/infer"),
                method: "POST",
                body,
                hlen: hlen.map(|n| n.to_string()),
            });
        }
    }
    if let Some(pick) = &opts.pick_model {
        let p = format!("/v2/models/{pick}");
        let pm = c.get(&p)?;
        check_meta(&pm, &p)?;
        let pc = c.get(&format!("{p}/config"))?.json();
        let (body, _) = request_body(&pm.json(), &pc, 1, false)?;
        bodies.push(("pick_json_b1".into(), pick.clone(), body.clone(), None));
        series.push(Series {
            name: "pick_json_b1".into(),
            path: format!("{p}/infer"),
            method: "POST",
            body,
            hlen: None,
        });
    }
    // Warm-up, then interleaved rounds.
    for s in &series {
        for _ in 0..(opts.requests / 4).max(1) {
            s.send(&mut c)?;
        }
    }
    let per_round = opts.requests.div_ceil(opts.rounds);
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); series.len()];
    for _ in 0..opts.rounds {
        for (s, out) in series.iter().zip(&mut samples) {
            for _ in 0..per_round {
                let t = Instant::now();
                s.send(&mut c)?;
                out.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    let pcts: Vec<Percentiles> = samples.into_iter().map(Percentiles::of).collect();
    let health = pcts[0].p50;
    let round_trips = series
        .iter()
        .zip(pcts)
        .map(|(s, us)| RoundTrip {
            name: s.name.clone(),
            minus_health_p50_us: us.p50 - health,
            us,
        })
        .collect();
    drop(c);

    // Closed loop, then the open-loop sweep, from a runtime on the client's CPU.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServeBenchError::Runtime)?;
    let url = format!("http://{addr}");
    let lt = |rps: f64, duration: Duration| LoadtestConfig {
        url: url.clone(),
        model: opts.model.clone(),
        rps,
        duration,
        concurrency: opts.connections,
        batch: 1,
        binary: false,
        max_requests: u64::MAX,
        timeout: Duration::from_secs(10),
    };
    let closed: LoadtestReport = rt.block_on(run_loadtest(&lt(0.0, opts.closed_duration)))?;
    let max = closed.achieved_rps;
    let mut open_loop = Vec::new();
    for &f in &opts.fractions {
        let r = rt.block_on(run_loadtest(&lt((max * f).max(1.0), opts.sweep_duration)))?;
        open_loop.push(SweepPoint {
            fraction: f,
            target_rps: r.target_rps,
            achieved_rps: r.achieved_rps,
            service_p50_ms: r.service_latency_ms.p50,
            service_p99_ms: r.service_latency_ms.p99,
            latency_p99_ms: r.latency_ms.p99,
            late: r.late,
            errors: r.errors.values().sum(),
        });
    }
    let stages = match handle {
        Some(h) => stage_costs(h, &bodies, opts.stage_iters)?,
        None => Vec::new(),
    };
    let watch_costs = match handle {
        Some(_) => watch_costs(opts, &meta.json(), &config)?,
        None => Vec::new(),
    };
    let b = &opts.batcher;
    Ok(ServeBenchReport {
        bench: "serve",
        server: opts
            .url
            .clone()
            .unwrap_or_else(|| format!("in-process http://{addr}")),
        model: opts.model.clone(),
        batching: if opts.url.is_some() {
            config["dynamic_batching"].clone()
        } else {
            serde_json::json!({
                "policy": b.policy.name(),
                "instances": b.instances,
                "threads_per_instance": b.threads_per_instance,
                "max_batch_size": b.max_batch_size,
                "max_queue_delay_us": b.max_queue_delay.as_micros() as u64,
            })
        },
        server_workers: 0,
        pinning: Pinning {
            applied: client_pinned,
            client_cpus: Vec::new(),
            server_cpus: Vec::new(),
            note: String::new(),
        },
        round_trips,
        connections: opts.connections,
        closed_loop_rps: max,
        closed_loop_service_ms: [closed.service_latency_ms.p50, closed.service_latency_ms.p99],
        closed_loop_errors: closed.errors.values().sum(),
        open_loop,
        stages,
        watch_costs,
    })
}

/// The on/off costs of the drift watch and of tracing: one in-process server per
/// configuration (same repository, engine and batching), all up at once, measured in
/// interleaved rounds so that drift in the machine's state falls on every configuration
/// alike. Every request carries a `traceparent` (sampled, except for `trace_unsampled`), so
/// the bytes on the wire are the same everywhere. The traced servers export to a loopback
/// listener that closes every connection: spans are built, batched and handed to the
/// exporter, whose network cost is not on the request path and is not measured.
fn watch_costs(
    opts: &ServeBenchOptions,
    meta: &Value,
    config: &Value,
) -> Result<Vec<WatchCost>, ServeBenchError> {
    // The traced servers' collector: a loopback listener that closes every connection at
    // once, so exports fail fast and off the request path.
    let sink_listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(ServeBenchError::Runtime)?;
    let sink = format!(
        "http://{}",
        sink_listener
            .local_addr()
            .map_err(ServeBenchError::Runtime)?
    );
    sink_listener
        .set_nonblocking(true)
        .map_err(ServeBenchError::Runtime)?;
    let sink_stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = sink_stop.clone();
    let sink_thread = std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match sink_listener.accept() {
                Ok((conn, _)) => drop(conn),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kiln-bench-watch")
        .worker_threads(allowed_cpus().len().max(1))
        .build()
        .map_err(ServeBenchError::Runtime)?;
    let configs: [(&str, bool, Option<f64>); 5] = [
        ("off", false, None),
        ("drift", true, None),
        ("trace_unsampled", false, Some(0.0)),
        ("trace_sampled", false, Some(1.0)),
        ("drift+trace_sampled", true, Some(1.0)),
    ];
    let mut servers = Vec::new();
    for (name, drift, ratio) in configs {
        let cfg = ServeConfig {
            watch: kiln_serve::monitor::WatchConfig {
                drift,
                ..Default::default()
            },
            trace: kiln_serve::otel::TraceConfig {
                endpoint: ratio.map(|_| sink.clone()),
                sample_ratio: ratio.unwrap_or(1.0),
                ..Default::default()
            },
            ..in_process_config(opts)
        };
        let h = rt.block_on(kiln_serve::start(cfg))?;
        if !rt.block_on(h.wait_ready(Duration::from_secs(120))) {
            return Err(ServeBenchError::Invalid(format!(
                "the `{name}` server did not become ready within 120 s"
            )));
        }
        let sampled = name != "trace_unsampled";
        servers.push((name, sampled, h));
    }
    let mut series = Vec::new();
    for &b in &opts.batches {
        for binary in [false, true] {
            let (body, hlen) = request_body(meta, config, b, binary)?;
            let kind = if binary { "binary" } else { "json" };
            series.push((
                format!("infer_{kind}_b{b}"),
                body,
                hlen.map(|n| n.to_string()),
            ));
        }
    }
    let path = format!("/v2/models/{}/infer", opts.model);
    let mut clients = servers
        .iter()
        .map(|(_, _, h)| Ok(BlockingClient::new(h.addr)?.with_timeout(Duration::from_secs(30))))
        .collect::<Result<Vec<_>, ServeBenchError>>()?;
    let send = |c: &mut BlockingClient, sampled: bool, body: &[u8], hlen: Option<&str>| {
        let mut headers = vec![
            (
                "Content-Type",
                if hlen.is_some() {
                    "application/octet-stream"
                } else {
                    "application/json"
                },
            ),
            (
                "traceparent",
                if sampled {
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                } else {
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
                },
            ),
        ];
        if let Some(h) = hlen {
            headers.push(("Inference-Header-Content-Length", h));
        }
        let t = Instant::now();
        let r = c.request("POST", &path, &headers, body)?;
        let us = t.elapsed().as_secs_f64() * 1e6;
        check(r, "watch-cost request").map(|_| us)
    };
    let per_round = opts.requests.div_ceil(opts.rounds);
    let mut samples = vec![vec![Vec::new(); series.len()]; servers.len()];
    for ((_, sampled, _), c) in servers.iter().zip(&mut clients) {
        for (_, body, hlen) in &series {
            for _ in 0..(opts.requests / 4).max(1) {
                send(c, *sampled, body, hlen.as_deref())?;
            }
        }
    }
    for _ in 0..opts.rounds {
        for (k, (_, body, hlen)) in series.iter().enumerate() {
            for (i, ((_, sampled, _), c)) in servers.iter().zip(&mut clients).enumerate() {
                for _ in 0..per_round {
                    samples[i][k].push(send(c, *sampled, body, hlen.as_deref())?);
                }
            }
        }
    }
    drop(clients);
    let pcts: Vec<Vec<Percentiles>> = samples
        .into_iter()
        .map(|per| per.into_iter().map(Percentiles::of).collect())
        .collect();
    let mut out = Vec::new();
    for (i, (name, _, _)) in servers.iter().enumerate() {
        for (k, (s, _, _)) in series.iter().enumerate() {
            let base = pcts[0][k].p50;
            let us = pcts[i][k].clone();
            out.push(WatchCost {
                config: name.to_string(),
                series: s.clone(),
                delta_p50_us: us.p50 - base,
                ratio_p50: if base > 0.0 { us.p50 / base } else { 0.0 },
                us,
            });
        }
    }
    for (_, _, h) in servers {
        rt.block_on(h.shutdown())?;
    }
    sink_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sink_thread.join();
    Ok(out)
}

fn check_meta(r: &crate::client::HttpResponse, path: &str) -> Result<(), ServeBenchError> {
    if r.status == 200 {
        Ok(())
    } else {
        Err(ServeBenchError::Status {
            what: format!("GET {path}"),
            status: r.status,
            body: r.text(),
        })
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
