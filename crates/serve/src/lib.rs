//! The serving tier: an Open Inference Protocol v2 (KServe / Triton REST) server over a
//! versioned model repository, with a dynamic batcher per model, warm-up before ready, hot
//! reload and Prometheus metrics.
//!
//! Layers, which meet only through small types (as in text-embeddings-inference):
//! * [`conn`] — the accept loop and HTTP/1.1 connections: timeouts, the connection cap,
//!   JSON answers to requests hyper rejects itself;
//! * [`service`] — the transport-neutral service: one function per operation (infer,
//!   lookup for metadata/ready/config, control authorisation, repository work), owning
//!   validation, batching and every per-version metric and statistic;
//! * [`http`] — axum routes: a thin adapter mapping OIP JSON/binary requests and
//!   [`service::ErrorKind`]s onto HTTP;
//! * [`grpc`] — the same for the KServe v2 gRPC protocol on its own port (tonic's
//!   generated service on hyper's HTTP/2, one connection thread per core);
//! * [`protocol`] — OIP JSON and the binary tensor extension, both directions;
//! * [`model`] — what a model takes and returns, and the per-instance executors;
//! * [`batcher`] — one thread owns each version's queue; instances are worker threads with
//!   their own engines and thread pools;
//! * [`repository`] — versions on disk, loading, warm-up and the atomic swap;
//! * [`metrics`] — counters and histograms, Prometheus text (kiln's and Triton's names);
//! * [`stats`] — Triton's statistics extension, protocol-neutral;
//! * [`live_profile`] — on-demand profiling of a live server;
//!
//! The client side — a loopback HTTP client, the load generator and `kiln bench serve` — is
//! the `kiln-loadgen` crate, above this one.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kiln_serve::ServeError> {
//! let server = kiln_serve::start(kiln_serve::ServeConfig {
//!     repository: "models".into(),
//!     port: 0,
//!     ..Default::default()
//! })
//! .await?;
//! server.wait_ready(std::time::Duration::from_secs(30)).await;
//! println!("serving on {}", server.addr);
//! server.shutdown().await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

// The library core's modules, under the names this crate's files use.
use kiln_model::{artifact, backend, infer, observe, predict};

pub mod batcher;
pub mod conn;
pub mod corked;
pub mod grpc;
pub mod http;
pub mod live_profile;
pub mod metrics;
pub mod model;
pub mod monitor;
pub mod otel;
pub mod protocol;
mod queue;
pub mod repository;
pub mod service;
pub mod stats;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

pub use batcher::{BatcherConfig, BatchingPolicy};
pub use conn::ConnectionConfig;
pub use metrics::Metrics;
pub use repository::{
    ModelControlMode, ReloadReport, RepoError, RepoErrorKind, Repository, RepositoryConfig,
};

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
    pub engine: Option<String>,
    /// Batching and instances.
    pub batcher: BatcherConfig,
    /// Per-request deadline (queue + compute).
    pub request_timeout: Duration,
    /// Repository poll interval (`None`: only SIGHUP and [`ServerHandle::reload`]).
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
    /// Serve on a non-loopback `host` without a control token (`--insecure-control`): the
    /// control endpoints then answer only loopback peers whose requests carry no proxy
    /// header, and a warning says so at start. Without it such a start is refused.
    pub insecure_control: bool,
    /// The KServe v2 gRPC port on `host` (`Some(0)`: any free port; `None`: no gRPC). The
    /// CLI's default is Triton's 8001; the library's is off.
    pub grpc_port: Option<u16>,
    /// Drift and latency watch settings.
    pub watch: monitor::WatchConfig,
    /// OpenTelemetry tracing (off unless an OTLP endpoint is given).
    pub trace: otel::TraceConfig,
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
            insecure_control: false,
            grpc_port: None,
            watch: monitor::WatchConfig::default(),
            trace: otel::TraceConfig::default(),
        }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// Binding or serving failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The default engine: `auto` (the fastest CPU engine per batch-size bucket, timed at load;
/// see `kiln_model::infer::auto`).
pub fn default_engine() -> String {
    crate::infer::auto::AUTO.to_string()
}

fn validate(cfg: &ServeConfig) -> Result<String, ServeError> {
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
    if !(0.0..=1.0).contains(&cfg.trace.sample_ratio) {
        return bad(format!(
            "--trace-sample-ratio is {}; expected 0 to 1",
            cfg.trace.sample_ratio
        ));
    }
    if let Some(e) = &cfg.trace.endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return bad(format!(
            "--otlp-endpoint is `{e}`; expected an OTLP/gRPC URL such as http://127.0.0.1:4317"
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
    let engine = cfg.engine.clone().unwrap_or_else(default_engine);
    let names = crate::infer::engine_names();
    if !names.contains(&engine.as_str()) {
        return bad(format!(
            "unknown engine `{engine}`; expected one of: {}",
            names.join(", ")
        ));
    }
    if !cfg.repository.is_dir() {
        return bad(format!(
            "model repository {} is not a directory (expected <repository>/<model>/<version>/)",
            cfg.repository.display()
        ));
    }
    Ok(engine)
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

/// A running server.
pub struct ServerHandle {
    /// The bound address.
    pub addr: SocketAddr,
    /// The bound gRPC address (`None`: gRPC is off).
    pub grpc_addr: Option<SocketAddr>,
    repo: Arc<Repository>,
    metrics: Arc<Metrics>,
    shutdown_tx: watch::Sender<bool>,
    reload_tx: mpsc::UnboundedSender<oneshot::Sender<ReloadReport>>,
    server: tokio::task::JoinHandle<Result<(), ServeError>>,
    grpc: Option<tokio::task::JoinHandle<Result<(), ServeError>>>,
    tracer: Option<Arc<otel::Tracing>>,
}

impl ServerHandle {
    /// The repository.
    pub fn repository(&self) -> &Arc<Repository> {
        &self.repo
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Whether every model is loaded and warm.
    pub fn is_ready(&self) -> bool {
        self.repo.ready()
    }

    /// Wait until ready, at most `timeout`.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let until = tokio::time::Instant::now() + timeout;
        while !self.repo.ready() {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Run a reload pass now (as SIGHUP does) and wait for it.
    pub async fn reload(&self) -> ReloadReport {
        let (tx, rx) = oneshot::channel();
        if self.reload_tx.send(tx).is_err() {
            return ReloadReport {
                error: Some("the server has stopped".into()),
                ..Default::default()
            };
        }
        rx.await.unwrap_or_default()
    }

    /// Stop accepting connections, let requests in flight finish, then unload the models.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.shutdown_tx.send(true);
        self.wait().await
    }

    /// Wait until the server stops (SIGTERM/SIGINT when `signals` is set).
    pub async fn wait(self) -> Result<(), ServeError> {
        let joined = |r: Result<Result<(), ServeError>, tokio::task::JoinError>| match r {
            Ok(r) => r,
            Err(e) => Err(ServeError::Io {
                what: "server task".into(),
                source: std::io::Error::other(e.to_string()),
            }),
        };
        let r = joined(self.server.await);
        // The HTTP side stops on the shutdown signal, which stops the gRPC side too.
        let g = match self.grpc {
            Some(g) => joined(g.await),
            None => Ok(()),
        };
        self.repo.clear();
        // Export the spans still queued (the processor's shutdown blocks).
        if let Some(t) = self.tracer {
            let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
        }
        r.and(g)
    }
}

async fn shutdown_signal(mut rx: watch::Receiver<bool>, signals: bool) {
    #[cfg(unix)]
    if signals {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install SIGTERM/SIGINT handlers");
            let _ = rx.wait_for(|v| *v).await;
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: draining requests in flight"),
            _ = int.recv() => tracing::info!("SIGINT: draining requests in flight"),
            _ = async { let _ = rx.wait_for(|v| *v).await; } => {}
        }
        return;
    }
    let _ = signals;
    let _ = rx.wait_for(|v| *v).await;
}

async fn reload_loop(
    repo: Arc<Repository>,
    poll: Option<Duration>,
    signals: bool,
    mut manual: mpsc::UnboundedReceiver<oneshot::Sender<ReloadReport>>,
    mut stop: watch::Receiver<bool>,
) {
    let pass = |repo: Arc<Repository>| async move {
        tokio::task::spawn_blocking(move || repo.reload())
            .await
            .unwrap_or_else(|e| ReloadReport {
                error: Some(format!("reload panicked: {e}")),
                ..Default::default()
            })
    };
    let report = pass(repo.clone()).await;
    if report.error.is_none() {
        tracing::info!(
            loaded = ?report.loaded,
            failed = report.failed.len(),
            "model repository loaded"
        );
    }
    #[cfg(unix)]
    let mut hup = if signals {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
    } else {
        None
    };
    let _ = signals;
    let mut tick = poll.map(|p| {
        let mut i = tokio::time::interval_at(tokio::time::Instant::now() + p, p);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    loop {
        #[cfg(unix)]
        let hup_fut = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hup_fut = std::future::pending::<()>();
        let tick_fut = async {
            match tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = async { let _ = stop.wait_for(|v| *v).await; } => return,
            _ = hup_fut => {
                tracing::info!("SIGHUP: reloading the model repository");
                pass(repo.clone()).await;
            }
            _ = tick_fut => {
                pass(repo.clone()).await;
            }
            ack = manual.recv() => match ack {
                Some(ack) => {
                    let r = pass(repo.clone()).await;
                    let _ = ack.send(r);
                }
                None => return,
            },
        }
    }
}

/// Bind, start loading the repository in the background, and serve. Returns at once; the
/// server reports ready once every model is loaded and warm.
pub async fn start(config: ServeConfig) -> Result<ServerHandle, ServeError> {
    let engine = validate(&config)?;
    let bind = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&bind)
        .await
        .map_err(|source| ServeError::Io {
            what: format!("cannot listen on {bind}"),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Io {
        what: "local address".into(),
        source,
    })?;
    let tracer = otel::Tracing::start(&config.trace)?.map(Arc::new);
    let metrics = Arc::new(Metrics::default());
    let repo = Arc::new(Repository::with_mode(
        RepositoryConfig {
            root: config.repository.clone(),
            engine,
            batcher: config.batcher.clone(),
            watch: config.watch.clone(),
        },
        metrics.clone(),
        config.model_control,
    ));
    // Only `poll` reloads by itself (ticks, SIGHUP); `none` and `explicit` never do.
    let polling = config.model_control == ModelControlMode::Poll;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (reload_tx, reload_rx) = mpsc::unbounded_channel();
    tokio::spawn(reload_loop(
        repo.clone(),
        config.poll_interval.filter(|d| !d.is_zero() && polling),
        config.signals && polling,
        reload_rx,
        shutdown_rx.clone(),
    ));
    let state = Arc::new(service::Service {
        repo: repo.clone(),
        metrics: metrics.clone(),
        max_body_bytes: config.max_body_bytes,
        request_timeout: config.request_timeout,
        control_token: config.control_token.clone(),
        profile_dir: config.profile_dir.clone(),
        profile_max_events: config.profile_max_events,
        tracing: tracer.clone(),
    });
    let grpc = match config.grpc_port {
        Some(port) => {
            let mut stop = shutdown_rx.clone();
            let limits = config.connection.clone();
            let (a, task) = grpc::serve(&config.host, port, state.clone(), limits, async move {
                let _ = stop.wait_for(|v| *v).await;
            })
            .await?;
            Some((a, task))
        }
        None => None,
    };
    let app = http::router(state);
    let signals = config.signals;
    let stop_tx = shutdown_tx.clone();
    let conn_config = config.connection.clone();
    let server = tokio::spawn(async move {
        let r = conn::serve(listener, app, conn_config, async move {
            shutdown_signal(shutdown_rx, signals).await;
            // Stop the reload loop too.
            let _ = stop_tx.send(true);
        })
        .await
        .map_err(|source| ServeError::Io {
            what: "serving".into(),
            source,
        });
        tracing::info!("server stopped; requests in flight have been answered");
        r
    });
    tracing::info!(%addr, "listening (Open Inference Protocol v2)");
    let (grpc_addr, grpc) = match grpc {
        Some((a, t)) => (Some(a), Some(t)),
        None => (None, None),
    };
    Ok(ServerHandle {
        addr,
        grpc_addr,
        grpc,
        repo,
        metrics,
        shutdown_tx,
        reload_tx,
        server,
        tracer,
    })
}

/// Run a server until SIGTERM/SIGINT (blocking; builds its own runtime). `on_listen` is
/// called with the bound HTTP address and the gRPC one (when gRPC is on).
pub fn run_blocking(
    config: ServeConfig,
    on_listen: impl FnOnce(SocketAddr, Option<SocketAddr>),
) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("kiln-http")
        .build()
        .map_err(|source| ServeError::Io {
            what: "cannot start the runtime".into(),
            source,
        })?;
    rt.block_on(async move {
        let handle = start(config).await?;
        on_listen(handle.addr, handle.grpc_addr);
        handle.wait().await
    })
}
