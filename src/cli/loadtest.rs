//! `kiln loadtest`: a bounded load generator for a kiln (or any OIP v2) server on loopback.

use std::time::Duration;

use super::{CliError, CliResult};
use kiln::loadgen::loadtest::{
    Distribution, LoadtestConfig, PerfConfig, PerfMode, Protocol, parse_range, perf_summary,
    run_loadtest, run_perf,
};

/// Send inference requests to a server on this machine and print what it sustained as JSON:
/// achieved throughput, p50/p90/p95/p99 latency and errors by HTTP status.
///
/// With `--rps R` the load is open-loop: request i is due at i/R seconds, whether or not
/// earlier ones have been answered, and its latency counts from that moment. With `--rps 0`
/// it is closed-loop: each of `--concurrency` connections sends back to back (the way to
/// find the maximum throughput). Bounded by `--duration` and `--max-requests`: no request is
/// sent after the deadline (requests that came due while every connection was busy are
/// counted as `unsent`), so a run lasts at most `--duration` plus the answer time of the
/// requests in flight at the deadline (each bounded by `--timeout-ms`). Only loopback hosts
/// (127.0.0.0/8, ::1, localhost) are accepted.
///
/// perf_analyzer mode (`--concurrency-range` or `--request-rate-range`, over
/// `--protocol http|grpc`): each level is measured in windows of `--measurement-interval`
/// ms until the last three agree within `--stability-percentage` (throughput and mean
/// latency), or `--max-trials` windows; the report gives p50/p90/p95/p99 over those three
/// windows and, when the server has Triton's statistics extension, its queue / compute
/// breakdown (a perf_analyzer-like summary goes to stderr, the JSON to stdout).
#[derive(clap::Args, Debug, Clone)]
pub struct LoadtestArgs {
    /// Server base URL (for `--protocol grpc`: the gRPC port, e.g. http://127.0.0.1:8001).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Model name.
    #[arg(long)]
    pub model: String,
    /// Target requests per second (0: closed loop, as fast as the connections allow).
    #[arg(long, default_value_t = 0.0)]
    pub rps: f64,
    /// Seconds to send for.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Connections, each with one request in flight (request-rate mode: the most in flight).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Rows per request.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Send and receive tensors with the binary tensor extension instead of JSON (gRPC:
    /// raw contents instead of typed contents).
    #[arg(long)]
    pub binary: bool,
    /// Most requests in all.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_requests: u64,
    /// Per-request client timeout in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Wire protocol (perf_analyzer mode): `http` or `grpc`.
    #[arg(long, default_value = "http", value_name = "http|grpc")]
    pub protocol: Protocol,
    /// perf_analyzer mode: closed loop at each concurrency `start[:end[:step]]`.
    #[arg(
        long,
        value_name = "START:END:STEP",
        conflicts_with = "request_rate_range"
    )]
    pub concurrency_range: Option<String>,
    /// perf_analyzer mode: open loop at each rate `start[:end[:step]]` (requests/s).
    #[arg(long, value_name = "START:END:STEP")]
    pub request_rate_range: Option<String>,
    /// Arrivals in request-rate mode.
    #[arg(long, default_value = "constant", value_name = "constant|poisson")]
    pub request_distribution: Distribution,
    /// perf_analyzer mode: one measurement window, milliseconds.
    #[arg(long, default_value_t = 5_000)]
    pub measurement_interval: u64,
    /// perf_analyzer mode: most windows per level.
    #[arg(long, default_value_t = 10)]
    pub max_trials: usize,
    /// perf_analyzer mode: the last three windows must agree within this many percent.
    #[arg(long, default_value_t = 10.0)]
    pub stability_percentage: f64,
    /// perf_analyzer mode: read the statistics extension from this HTTP URL instead of the
    /// server under test (e.g. the HTTP port while testing gRPC).
    #[arg(long)]
    pub stats_url: Option<String>,
}

/// Run the load test and print the JSON report on stdout.
pub fn run(args: &LoadtestArgs) -> CliResult {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mode = match (&args.concurrency_range, &args.request_rate_range) {
        (Some(r), _) => Some(PerfMode::Concurrency(
            parse_range("--concurrency-range", r)
                .map_err(CliError::input)?
                .into_iter()
                .map(|c| c.round() as usize)
                .collect(),
        )),
        (None, Some(r)) => Some(PerfMode::RequestRate(
            parse_range("--request-rate-range", r).map_err(CliError::input)?,
        )),
        (None, None) => None,
    };
    if let Some(mode) = mode {
        let cfg = PerfConfig {
            url: args.url.clone(),
            model: args.model.clone(),
            protocol: args.protocol,
            batch: args.batch,
            binary: args.binary,
            mode,
            distribution: args.request_distribution,
            window: Duration::from_millis(args.measurement_interval),
            max_trials: args.max_trials,
            stability: args.stability_percentage / 100.0,
            connections: args.concurrency,
            timeout: Duration::from_millis(args.timeout_ms.max(1)),
            stats_url: args.stats_url.clone(),
        };
        let report = rt.block_on(run_perf(&cfg)).map_err(|e| match e {
            kiln::loadgen::loadtest::LoadtestError::Perf(_)
            | kiln::loadgen::loadtest::LoadtestError::Url(_) => CliError::input(e),
            other => CliError::from(other),
        })?;
        eprint!("{}", perf_summary(&report));
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    if args.protocol == Protocol::Grpc {
        return Err(CliError::input(anyhow::anyhow!(
            "--protocol grpc needs perf_analyzer mode: give --concurrency-range or --request-rate-range"
        )));
    }
    if !(args.duration > 0.0 && args.duration <= 3600.0) {
        return Err(CliError::input(anyhow::anyhow!(
            "--duration is {}; expected seconds in (0, 3600]",
            args.duration
        )));
    }
    let cfg = LoadtestConfig {
        url: args.url.clone(),
        model: args.model.clone(),
        rps: args.rps,
        duration: Duration::from_secs_f64(args.duration),
        concurrency: args.concurrency,
        batch: args.batch,
        binary: args.binary,
        max_requests: args.max_requests,
        timeout: Duration::from_millis(args.timeout_ms.max(1)),
    };
    kiln::loadgen::client::BaseUrl::parse(&cfg.url).map_err(CliError::input)?;
    let report = rt.block_on(run_loadtest(&cfg))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
