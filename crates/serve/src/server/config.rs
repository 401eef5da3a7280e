//! The server's settings ([`ServeConfig`], the flags of `kiln serve`) and their checks: every
//! range, the control-endpoint rule for non-loopback hosts, the engine name and the repository
//! directory, each refused with a message naming its flag.

use std::path::PathBuf;
use std::time::Duration;

use kiln_model::records::EngineKind;

use crate::batcher::BatcherConfig;
use crate::conn::ConnectionConfig;
use crate::error::ServeError;
use crate::live_profile;
use crate::monitor::WatchConfig;
use crate::otel::TraceConfig;
use crate::repository::ModelControlMode;

/// Server settings (the flags of `kiln serve`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// The model repository: `<repository>/<model>/<version>/`.
    pub repository: PathBuf,
    /// Address to bind.
    pub host: String,
    /// Port (0: any free port).
    pub port: u16,
    /// Engine for regression models (`None`: [`default_engine`]).
    pub engine: Option<EngineKind>,
    /// Batching and instances.
    pub batcher: BatcherConfig,
    /// Per-request deadline (queue + compute).
    pub request_timeout: Duration,
    /// Repository poll interval (`None`: only SIGHUP and
    /// [`ServerHandle::reload`](crate::ServerHandle::reload)).
    pub poll_interval: Option<Duration>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Handle SIGHUP (reload) and SIGTERM/SIGINT (graceful shutdown). The CLI sets it; an
    /// embedding process usually does not.
    pub signals: bool,
    /// Connection limits: header and body timeouts, the connection cap.
    pub connection: ConnectionConfig,
    /// How models get loaded: `poll` (default: at start, then on every poll tick and
    /// SIGHUP), `none` (at start only) or `explicit` (through the repository API only).
    pub model_control: ModelControlMode,
    /// Bearer token of the control endpoints (repository API, on-demand profiling). `None`:
    /// they answer loopback clients only.
    pub control_token: Option<String>,
    /// Where `POST /v2/profile` writes its recordings (`None`: the endpoint is off).
    pub profile_dir: Option<PathBuf>,
    /// Most events one on-demand profile keeps (default [`live_profile::MAX_EVENTS`]); the
    /// rest of its window is counted as dropped.
    pub profile_max_events: usize,
    /// Most bytes one on-demand profile holds by its own accounting (default
    /// [`live_profile::MAX_BYTES`], 64 MiB); the rest of its window is counted as dropped.
    pub profile_max_bytes: usize,
    /// Serve on a non-loopback `host` without a control token (`--insecure-control`): the
    /// control endpoints then answer only loopback peers whose requests carry no proxy
    /// header, and a warning says so at start. Without it such a start is refused.
    pub insecure_control: bool,
    /// The KServe v2 gRPC port on `host` (`Some(0)`: any free port; `None`: no gRPC). The
    /// CLI's default is Triton's 8001; the library's is off.
    pub grpc_port: Option<u16>,
    /// Drift and latency watch settings.
    pub watch: WatchConfig,
    /// OpenTelemetry tracing (off unless an OTLP endpoint is given).
    pub trace: TraceConfig,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            repository: PathBuf::from("models"),
            host: "127.0.0.1".into(),
            port: 8000,
            engine: None,
            batcher: BatcherConfig::default(),
            request_timeout: Duration::from_secs(10),
            poll_interval: Some(Duration::from_secs(2)),
            max_body_bytes: 8 << 20,
            signals: false,
            connection: ConnectionConfig::default(),
            model_control: ModelControlMode::Poll,
            control_token: None,
            profile_dir: None,
            profile_max_events: live_profile::MAX_EVENTS,
            profile_max_bytes: live_profile::MAX_BYTES,
            insecure_control: false,
            grpc_port: None,
            watch: WatchConfig::default(),
            trace: TraceConfig::default(),
        }
    }
}

/// The default engine: `auto` (the fastest CPU engine per batch-size bucket, timed at load;
/// see `kiln_model::infer::auto`).
pub fn default_engine() -> EngineKind {
    EngineKind::Auto
}

/// Check `cfg` (see the module docs); the engine it names, or its default.
pub(super) fn validate(cfg: &ServeConfig) -> Result<EngineKind, ServeError> {
    let bad = |m: String| Err(ServeError::Config(m));
    let b = &cfg.batcher;
    if b.max_batch_size == 0 || b.max_batch_size > 65536 {
        return bad(format!(
            "--max-batch-size is {}; expected 1 to 65536",
            b.max_batch_size
        ));
    }
    if b.max_queue_size == 0 {
        return bad("--max-queue-size must be at least 1".into());
    }
    if b.instances == 0 || b.instances > 256 {
        return bad(format!("--instances is {}; expected 1 to 256", b.instances));
    }
    if b.threads_per_instance == 0 || b.threads_per_instance > 256 {
        return bad(format!(
            "--threads-per-instance is {}; expected 1 to 256",
            b.threads_per_instance
        ));
    }
    if b.priority_levels == 0 || b.priority_levels > 64 {
        return bad(format!(
            "--priority-levels is {}; expected 1 to 64",
            b.priority_levels
        ));
    }
    if b.default_priority == 0 || b.default_priority > b.priority_levels {
        return bad(format!(
            "--default-priority is {}; expected 1 to {} (--priority-levels)",
            b.default_priority, b.priority_levels
        ));
    }
    if let Some(r) = cfg.trace.sample_ratio
        && !(0.0..=1.0).contains(&r)
    {
        return bad(format!("--trace-sample-ratio is {r}; expected 0 to 1"));
    }
    if let Some(e) = &cfg.trace.endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return bad(format!(
            "--otlp-endpoint is `{e}`; expected an OTLP URL such as http://127.0.0.1:4317 \
             (grpc) or http://127.0.0.1:4318 (http/protobuf)"
        ));
    }
    if cfg.request_timeout.is_zero() {
        return bad("--request-timeout-ms must be at least 1".into());
    }
    if cfg.max_body_bytes == 0 {
        return bad("--max-body-bytes must be at least 1".into());
    }
    if let Some(t) = &cfg.control_token
        && (t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()))
    {
        return bad(
            "--control-token must be at least 16 printable ASCII characters without spaces".into(),
        );
    }
    if cfg.profile_max_events == 0 {
        return bad("the profile event cap must be at least 1".into());
    }
    if cfg.profile_max_bytes < 4096 {
        return bad(format!(
            "--profile-max-bytes is {}; expected at least 4096",
            cfg.profile_max_bytes
        ));
    }
    if cfg.control_token.is_none() && !is_loopback_host(&cfg.host) {
        if !cfg.insecure_control {
            return bad(format!(
                "--host {} is not a loopback address but no control token is set: the control \
                 endpoints (repository load/unload, profiling) would rest on the peer address \
                 alone, which a local proxy or sidecar makes loopback. Set --control-token \
                 (or KILN_CONTROL_TOKEN, e.g. from a Kubernetes Secret), bind 127.0.0.1, or \
                 pass --insecure-control to serve anyway",
                cfg.host
            ));
        }
        tracing::warn!(
            host = %cfg.host,
            "WARNING: serving on a non-loopback address without a control token \
             (--insecure-control): the control endpoints answer loopback peers without proxy \
             headers only, and anything that relays traffic from this host reaches them"
        );
        eprintln!(
            "kiln serve: WARNING: --host {} without --control-token (--insecure-control): \
             control endpoints rest on the peer address alone",
            cfg.host
        );
    }
    cfg.connection.validate()?;
    let engine = cfg.engine.unwrap_or_else(default_engine);
    if !engine.is_built() {
        return bad(unknown_engine(engine.name()));
    }
    if !cfg.repository.is_dir() {
        return bad(format!(
            "model repository {} is not a directory (expected <repository>/<model>/<version>/)",
            cfg.repository.display()
        ));
    }
    Ok(engine)
}

/// The message for an engine this build does not know (`kiln serve --engine`), listing the
/// ones it does.
pub fn unknown_engine(name: &str) -> String {
    format!(
        "unknown engine `{name}`; expected one of: {}",
        crate::infer::engine_names().join(", ")
    )
}

/// Whether `host` (a `--host` value) names only loopback addresses: a loopback IP or
/// `localhost`. Anything else (`0.0.0.0`, `::`, a routable address or another name) is not.
pub fn is_loopback_host(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    match h.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => h.eq_ignore_ascii_case("localhost"),
    }
}
