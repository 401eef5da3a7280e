//! `kiln loadtest`: a bounded load generator for a kiln (or any OIP v2) server on loopback.

use std::time::Duration;

use super::{CliError, CliResult};
use kiln::serve::loadtest::{LoadtestConfig, run_loadtest};

/// Send inference requests to a server on this machine and print what it sustained as JSON:
/// achieved throughput, p50/p90/p99 latency and errors by HTTP status.
///
/// With `--rps R` the load is open-loop: request i is due at i/R seconds, whether or not
/// earlier ones have been answered, and its latency counts from that moment. With `--rps 0`
/// it is closed-loop: each of `--concurrency` connections sends back to back (the way to
/// find the maximum throughput). Bounded by `--duration` and `--max-requests`: no request is
/// sent after the deadline (requests that came due while every connection was busy are
/// counted as `unsent`), so a run lasts at most `--duration` plus the answer time of the
/// requests in flight at the deadline (each bounded by `--timeout-ms`). Only loopback hosts
/// (127.0.0.0/8, ::1, localhost) are accepted.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadtestArgs {
    /// Server base URL.
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
    /// Connections, each with one request in flight.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Rows per request.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Send and receive tensors with the binary tensor extension instead of JSON.
    #[arg(long)]
    pub binary: bool,
    /// Most requests in all.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_requests: u64,
    /// Per-request client timeout in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
}

/// Run the load test and print the JSON report on stdout.
pub fn run(args: &LoadtestArgs) -> CliResult {
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
    kiln::serve::client::BaseUrl::parse(&cfg.url).map_err(CliError::input)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(run_loadtest(&cfg))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
