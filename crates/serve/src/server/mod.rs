//! The server: [`start`] binds the HTTP (and optionally gRPC) port, starts loading the
//! repository in the background and serves; the [`ServerHandle`] it returns waits for
//! readiness, triggers reloads and shuts down gracefully. [`run_blocking`] is the same for a
//! process that has no runtime of its own (`kiln serve`).
//!
//! This is where the layers meet: the [`Repository`] and its reload loop (poll ticks, SIGHUP,
//! [`ServerHandle::reload`]), the transport-neutral [`Service`](crate::service::Service), and
//! the transports over it — [`http`](crate::http) on [`conn`](crate::conn)'s connections,
//! [`grpc`](crate::grpc) on its own port.

mod config;

pub use config::{ServeConfig, default_engine, is_loopback_host, unknown_engine};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::error::ServeError;
use crate::metrics::Metrics;
use crate::repository::{ModelControlMode, ReloadReport, Repository, RepositoryConfig};
use crate::{conn, grpc, http, otel, service};

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
    let engine = config::validate(&config)?;
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
        profile_max_bytes: config.profile_max_bytes,
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
