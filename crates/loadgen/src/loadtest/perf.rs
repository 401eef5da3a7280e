//! perf_analyzer-style sweeps (`kiln loadtest --concurrency-range` or
//! `--request-rate-range`): at each level, windows until the last three agree within the
//! stability threshold, client percentiles over those three, and the server's breakdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::caller::{grpc_uri, prepare};
use super::drive::{Distribution, Window, arrivals, drive};
use super::server_stats::{ServerBreakdown, StatsSource};
use super::{Latency, LoadtestError, Protocol};
use crate::client::BaseUrl;

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
pub(super) fn is_stable(ws: &[Window], threshold: f64) -> bool {
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
