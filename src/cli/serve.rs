//! `kiln serve --repository DIR`: the Open Inference Protocol v2 server.

use std::path::PathBuf;
use std::time::Duration;

use super::{CliError, CliResult};
use kiln::serve::{BatcherConfig, ConnectionConfig, ServeConfig, ServeError};

/// Serve the models of a repository over the Open Inference Protocol v2 (KServe / Triton
/// REST, with Triton's binary tensor extension).
///
/// The repository holds `<model>/<version>/` directories, each an exported checkpoint (or a
/// pick model's `pick.json`); the highest version of each model that loads is served. The
/// repository is polled and reloaded on SIGHUP: a new version is loaded and warmed in the
/// background and swapped in atomically; a broken one is rejected while the old one keeps
/// serving. SIGTERM or SIGINT stops accepting connections, answers the requests in flight
/// and exits 0. Metrics are at /metrics. Clients that send headers or bodies too slowly are
/// disconnected (--header-timeout-ms, --body-timeout-ms); every error answer, including
/// those to requests that are not valid HTTP, is `{"error": "..."}`.
///
/// Triton's extensions: statistics at GET /v2/models/stats (and per model and version), the
/// `nv_inference_*` counters beside kiln's own at /metrics, the model repository API
/// (POST /v2/repository/index, /v2/repository/models/<m>/load and /unload; load and unload
/// with --model-control-mode explicit) and on-demand profiling (POST
/// /v2/profile?duration_ms=N, with --profile-dir). These control endpoints answer loopback
/// clients only, unless --control-token is set: then any client with
/// `Authorization: Bearer <token>`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// The model repository: `<DIR>/<model>/<version>/`.
    #[arg(long, value_name = "DIR")]
    pub repository: PathBuf,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Inference engine for regression models (default: `auto`, the fastest exact CPU
    /// engine: an answer does not depend on the batch it was run in; `int8` or `auto-int8`
    /// (int8 per batch-size bucket where faster) quantise, by explicit choice only).
    #[arg(long, value_parser = super::parse_serve_engine)]
    pub engine: Option<kiln::records::EngineKind>,
    /// Inference instances per model, each owning an engine.
    #[arg(long, default_value_t = 2)]
    pub instances: usize,
    /// Threads per instance.
    #[arg(long, default_value_t = 1)]
    pub threads_per_instance: usize,
    /// Most rows per batch (1 turns dynamic batching off).
    #[arg(long, default_value_t = 64)]
    pub max_batch_size: usize,
    /// When a batch launches: `idle` (at once on an idle instance; batches form only while
    /// every instance is busy) or `delay` (Triton's: wait up to --max-queue-delay-us for a
    /// full batch).
    #[arg(long, default_value = "idle", value_name = "idle|delay")]
    pub batching: kiln::serve::batcher::BatchingPolicy,
    /// How long (µs) the oldest queued request may wait for a fuller batch (`--batching delay`).
    #[arg(long, default_value_t = 100)]
    pub max_queue_delay_us: u64,
    /// Most requests queued per model; more are refused with 503 at once.
    #[arg(long, default_value_t = 1024)]
    pub max_queue_size: usize,
    /// Per-request deadline (queue + compute), milliseconds; past it the answer is 503. A
    /// request's `timeout` parameter (µs, Triton's) may shorten it, never lengthen it.
    #[arg(long, default_value_t = 10_000)]
    pub request_timeout_ms: u64,
    /// Priority levels of the queue: a request's `priority` parameter (Triton's) picks one,
    /// 1 served first; 0 or none means --default-priority.
    #[arg(long, default_value_t = 3)]
    pub priority_levels: usize,
    /// The level of a request that names no priority.
    #[arg(long, default_value_t = 2)]
    pub default_priority: usize,
    /// Starvation bound (ms): a request queued this long goes ahead of every level, oldest
    /// first.
    #[arg(long, default_value_t = 500)]
    pub priority_max_wait_ms: u64,
    /// Repository poll interval in milliseconds (0: reload only on SIGHUP).
    #[arg(long, default_value_t = 2_000)]
    pub poll_interval_ms: u64,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Milliseconds a client may take to send a request's headers (also how long an idle
    /// keep-alive connection stays open); slower clients are disconnected.
    #[arg(long, default_value_t = 10_000)]
    pub header_timeout_ms: u64,
    /// Milliseconds a client may take to send a request's body after its headers; past it
    /// the answer is 408 and the connection is closed.
    #[arg(long, default_value_t = 10_000)]
    pub body_timeout_ms: u64,
    /// Connections served at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Most header fields in a request; more are answered 431.
    #[arg(long, default_value_t = 100)]
    pub max_headers: usize,
    /// How models are loaded (Triton's): `poll` (at start, then on every poll and SIGHUP),
    /// `none` (at start only) or `explicit` (nothing at start; load and unload through
    /// POST /v2/repository/models/<m>/load and /unload).
    #[arg(long, default_value = "poll", value_name = "none|poll|explicit")]
    pub model_control_mode: kiln::serve::ModelControlMode,
    /// Bearer token the control endpoints (repository API, profiling) require; without it
    /// they answer loopback clients only. When absent, the KILN_CONTROL_TOKEN environment
    /// variable is used (prefer it: a flag shows in `ps`).
    #[arg(long, value_name = "TOKEN")]
    pub control_token: Option<String>,
    /// Directory for on-demand profiles (POST /v2/profile); without it profiling is off.
    #[arg(long, value_name = "DIR")]
    pub profile_dir: Option<PathBuf>,
    /// Most events one on-demand profile keeps; the rest of its window is counted
    /// (`dropped_events`) but not kept, so a recording's memory stays bounded.
    #[arg(long, default_value_t = kiln::serve::live_profile::MAX_EVENTS)]
    pub profile_max_events: usize,
    /// Most bytes one on-demand profile holds (its own accounting of its events; default
    /// 64 MiB); past it the window is counted (`dropped_events`) but not kept.
    #[arg(long, default_value_t = kiln::serve::live_profile::MAX_BYTES)]
    pub profile_max_bytes: usize,
    /// Serve on a non-loopback --host without a control token. Without this flag (or a
    /// token) such a start is refused: the control endpoints would rest on the peer address
    /// alone. With it they answer loopback peers whose requests carry no proxy header, and a
    /// warning is printed.
    #[arg(long)]
    pub insecure_control: bool,
    /// Port of the KServe v2 gRPC endpoint on --host (Triton's default 8001; 0: any free
    /// port, printed; `off`: no gRPC).
    #[arg(long, default_value = "8001", value_name = "PORT|off")]
    pub grpc_port: GrpcPort,
    /// Sliding window (seconds) of the input-drift statistics at /metrics and
    /// GET /v2/models/<m>/drift (PSI, KS and out-of-range per feature against the
    /// checkpoint's training sketches).
    #[arg(long, default_value_t = 600)]
    pub drift_window_s: u64,
    /// Do not compare live inputs with the checkpoint's training sketches (no drift
    /// statistics; `kiln bench serve` measures what they cost).
    #[arg(long)]
    pub no_drift_watch: bool,
    /// PSI past which a feature counts as drifted.
    #[arg(long, default_value_t = 0.2)]
    pub drift_psi_threshold: f64,
    /// The latency watch flags a batch bucket whose live compute p50 stays at least this many
    /// times the checkpoint's recorded p50 …
    #[arg(long, default_value_t = 1.5)]
    pub latency_watch_ratio: f64,
    /// … and at least this many µs above it (the noise floor of µs-scale batches).
    #[arg(long, default_value_t = 20)]
    pub latency_watch_min_delta_us: u64,
    /// Batches per batch bucket that learn its serving factor (live over the checkpoint's
    /// hot-loop p50, at most --latency-watch-max-factor) before it is watched; 0: the recorded
    /// p50 is the baseline as it is.
    #[arg(long, default_value_t = 64)]
    pub latency_watch_learn_batches: usize,
    /// The largest serving factor a bucket may learn (a model slower than this times its
    /// recorded p50 from the start is still flagged).
    #[arg(long, default_value_t = 3.0)]
    pub latency_watch_max_factor: f64,
    /// Export OpenTelemetry spans of inference requests (request, decode, queue wait, batch,
    /// compute, encode) to this OTLP collector: http://127.0.0.1:4317 for gRPC, or the base
    /// URL http://127.0.0.1:4318 for HTTP (`/v1/traces` is appended). A request's W3C
    /// `traceparent` makes them children of the caller's span. Without it, the standard
    /// variables decide (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
    /// OTEL_TRACES_EXPORTER=otlp); off when none is set.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// OTLP transport: `grpc` or `http/protobuf` (default: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    /// OTEL_EXPORTER_OTLP_PROTOCOL, else grpc).
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<kiln::serve::otel::OtlpProtocol>,
    /// Share of requests without a sampled parent that are traced (0 to 1); a caller's
    /// sampled flag always decides for its own requests. Default: OTEL_TRACES_SAMPLER (and
    /// OTEL_TRACES_SAMPLER_ARG), else parentbased_always_on.
    #[arg(long)]
    pub trace_sample_ratio: Option<f64>,
    /// `service.name` of the spans (default: OTEL_SERVICE_NAME, else `service.name` in
    /// OTEL_RESOURCE_ATTRIBUTES, else kiln-serve).
    #[arg(long, value_name = "NAME")]
    pub otel_service_name: Option<String>,
}

/// `--grpc-port`: a port, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcPort(pub Option<u16>);

impl std::str::FromStr for GrpcPort {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "none" => Ok(GrpcPort(None)),
            _ => s.parse::<u16>().map(|p| GrpcPort(Some(p))).map_err(|_| {
                format!("`{s}` is not a port; expected 0 to 65535 (0: any free port) or `off`")
            }),
        }
    }
}

impl ServeArgs {
    /// The server config these flags describe.
    pub fn config(&self) -> ServeConfig {
        ServeConfig {
            repository: self.repository.clone(),
            host: self.host.clone(),
            port: self.port,
            engine: self.engine,
            batcher: BatcherConfig {
                policy: self.batching,
                max_batch_size: self.max_batch_size,
                max_queue_delay: Duration::from_micros(self.max_queue_delay_us),
                max_queue_size: self.max_queue_size,
                instances: self.instances,
                threads_per_instance: self.threads_per_instance,
                priority_levels: self.priority_levels,
                default_priority: self.default_priority,
                priority_max_wait: Duration::from_millis(self.priority_max_wait_ms),
                fault_compute_delay: Duration::ZERO,
            },
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            poll_interval: (self.poll_interval_ms > 0)
                .then(|| Duration::from_millis(self.poll_interval_ms)),
            max_body_bytes: self.max_body_bytes,
            signals: true,
            connection: ConnectionConfig {
                header_timeout: Duration::from_millis(self.header_timeout_ms),
                body_timeout: Duration::from_millis(self.body_timeout_ms),
                max_connections: self.max_connections,
                max_headers: self.max_headers,
            },
            model_control: self.model_control_mode,
            control_token: self
                .control_token
                .clone()
                .or_else(|| std::env::var("KILN_CONTROL_TOKEN").ok())
                .filter(|t| !t.is_empty()),
            profile_dir: self.profile_dir.clone(),
            profile_max_events: self.profile_max_events,
            profile_max_bytes: self.profile_max_bytes,
            insecure_control: self.insecure_control,
            grpc_port: self.grpc_port.0,
            watch: kiln::serve::monitor::WatchConfig {
                drift: !self.no_drift_watch,
                drift_window: Duration::from_secs(self.drift_window_s.max(1)),
                psi_threshold: self.drift_psi_threshold,
                latency_ratio: self.latency_watch_ratio,
                latency_min_delta: Duration::from_micros(self.latency_watch_min_delta_us),
                latency_learn_batches: self.latency_watch_learn_batches,
                latency_max_serving_factor: self.latency_watch_max_factor,
            },
            trace: kiln::serve::otel::TraceConfig {
                endpoint: self.otlp_endpoint.clone(),
                protocol: self.otlp_protocol,
                sample_ratio: self.trace_sample_ratio,
                service_name: self.otel_service_name.clone(),
            },
        }
    }
}

/// Serve until SIGTERM/SIGINT.
pub fn run(args: &ServeArgs) -> CliResult {
    let repo = args.repository.display().to_string();
    let mode = args.model_control_mode;
    kiln::serve::run_blocking(args.config(), |addr, grpc| {
        // Machine-readable, on stdout (one line per listener; logs stay on stderr).
        println!("listening on http://{addr}");
        if let Some(g) = grpc {
            println!("listening on grpc://{g}");
        }
        eprintln!(
            "kiln serve: {repo} on http://{addr} (Open Inference Protocol v2; metrics at /metrics; \
             model control: {mode})"
        );
        if let Some(g) = grpc {
            eprintln!("kiln serve: KServe v2 gRPC on {g}");
        }
    })
    .map_err(|e| match e {
        ServeError::Config(_) => CliError::input(e),
        other => CliError::from(other),
    })
}
