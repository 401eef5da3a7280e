//! The connection runtime: gRPC's listener and its connections. Each connection is served by
//! hyper's HTTP/2 server on one of [`ConnThreads`] (a single-threaded runtime per core) and
//! corked ([`crate::corked`]); the generated server runs under the HTTP side's request limits
//! ([`Bounded`]: body timeout, message size, the client's `grpc-timeout`), and a connection
//! holds one of the listener's slots and must send its HTTP/2 preface within the header
//! timeout ([`Guarded`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::Status;
use tonic::transport::server::TcpConnectInfo;

use super::proto::grpc_inference_service_server::GrpcInferenceServiceServer;
use super::service::GrpcService;
use crate::conn::{ConnectionConfig, DeadlineBody, is_body_timeout, is_connection_error};
use crate::corked::{Corked, CorkedStream, cork};
use crate::protocol::clip;

/// The threads gRPC connections are served on: each runs a single-threaded runtime (its own
/// epoll, timers and blocking pool) and serves the connections handed to it.
pub(super) struct ConnThreads {
    /// Where each thread takes its next connection (a socket detached from the accepting
    /// runtime, and the listener slot it holds).
    senders: Vec<mpsc::UnboundedSender<(std::net::TcpStream, OwnedSemaphorePermit)>>,
    /// Connections open on each thread.
    open: Vec<Arc<AtomicUsize>>,
    /// Set at shutdown: every connection then shuts down gracefully.
    stop: tokio::sync::watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl ConnThreads {
    /// Start `n` threads serving `svc`.
    pub(super) fn start(n: usize, svc: Served, header_timeout: Duration) -> std::io::Result<Self> {
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut me = Self {
            senders: Vec::with_capacity(n),
            open: Vec::with_capacity(n),
            stop,
            threads: Vec::with_capacity(n),
        };
        for i in 0..n {
            let (tx, rx) = mpsc::unbounded_channel();
            let open = Arc::new(AtomicUsize::new(0));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (svc, stop, count) = (svc.clone(), stop_rx.clone(), open.clone());
            let thread = std::thread::Builder::new()
                .name(format!("kiln-grpc-{i}"))
                .spawn(move || rt.block_on(conn_thread(rx, svc, header_timeout, stop, count)))?;
            me.senders.push(tx);
            me.open.push(open);
            me.threads.push(thread);
        }
        Ok(me)
    }

    /// Hand an accepted connection to the thread serving the fewest.
    fn assign(&self, stream: TcpStream, slot: OwnedSemaphorePermit) {
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("gRPC connection dropped: {e}");
                return;
            }
        };
        let i = (0..self.open.len())
            .min_by_key(|&i| self.open[i].load(Ordering::Relaxed))
            .unwrap_or(0);
        self.open[i].fetch_add(1, Ordering::Relaxed);
        if self.senders[i].send((stream, slot)).is_err() {
            self.open[i].fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Shut every connection down gracefully and wait until the threads have finished (blocks).
    pub(super) fn stop(self) {
        let _ = self.stop.send(true);
        drop(self.senders);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The service every connection thread serves.
pub(super) type Served = Bounded<GrpcInferenceServiceServer<GrpcService>>;

/// One connection thread: serve each connection it is handed until the channel closes (at
/// shutdown), then wait for the open ones, which shut down gracefully when `stop` is set.
async fn conn_thread(
    mut rx: mpsc::UnboundedReceiver<(std::net::TcpStream, OwnedSemaphorePermit)>,
    svc: Served,
    header_timeout: Duration,
    stop: tokio::sync::watch::Receiver<bool>,
    open: Arc<AtomicUsize>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let mut http = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    http.timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(10));
    // Every connection task holds a clone; the thread ends when all are gone.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    while let Some((stream, slot)) = rx.recv().await {
        let stream = match TcpStream::from_std(stream) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("gRPC connection dropped: {e}");
                open.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
        };
        let mut svc = svc.clone();
        svc.conn = Some(TcpConnectInfo {
            local_addr: stream.local_addr().ok(),
            remote_addr: stream.peer_addr().ok(),
        });
        let (io, out) = cork(stream);
        let guarded = Guarded {
            io,
            _slot: slot,
            preface: Some(Box::pin(tokio::time::sleep(header_timeout))),
            seen: 0,
        };
        let conn = http.serve_connection(TokioIo::new(guarded), TowerToHyperService::new(svc));
        let conn = Corked::new(conn, out);
        let mut stop = stop.clone();
        let (done, open) = (done_tx.clone(), open.clone());
        tokio::spawn(async move {
            let mut conn = conn;
            let stopping = async move {
                let _ = stop.wait_for(|v| *v).await;
            };
            let r = tokio::select! {
                r = &mut conn => r,
                () = stopping => {
                    conn.conn().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                tracing::debug!("gRPC connection closed: {e}");
            }
            open.fetch_sub(1, Ordering::Relaxed);
            drop(done);
        });
    }
    drop(done_tx);
    let _ = done_rx.recv().await;
}

/// The generated server under two of the HTTP side's request limits:
///
/// * **Body timeout** — a request stream's message must be complete within the body timeout
///   (`--body-timeout-ms`) of its headers; a stream that stalls is answered
///   `DEADLINE_EXCEEDED` and its resources freed.
/// * **Message size** — a message over `--max-body-bytes` is answered `RESOURCE_EXHAUSTED`
///   (the gRPC convention for a size limit; tonic's own answer is `OUT_OF_RANGE`, which
///   kiln never gives otherwise and rewrites here).
#[derive(Clone)]
pub(super) struct Bounded<S> {
    pub(super) inner: S,
    pub(super) body_timeout: Duration,
    pub(super) max_message_bytes: usize,
    /// The connection's addresses, given to each request (the control RPCs check the peer).
    pub(super) conn: Option<TcpConnectInfo>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Bounded<S> {
    const NAME: &'static str = S::NAME;
}

/// A request body's error as the gRPC status it answers.
fn body_status(e: Box<dyn std::error::Error + Send + Sync>) -> Status {
    if is_body_timeout(&*e) {
        Status::deadline_exceeded(e.to_string())
    } else {
        Status::from_error(e)
    }
}

impl<S> tonic::codegen::Service<tonic::codegen::http::Request<hyper::body::Incoming>> for Bounded<S>
where
    S: tonic::codegen::Service<
            tonic::codegen::http::Request<tonic::body::Body>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
        > + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(
        &mut self,
        mut req: tonic::codegen::http::Request<hyper::body::Incoming>,
    ) -> Self::Future {
        use http_body_util::BodyExt;
        if let Some(c) = &self.conn {
            req.extensions_mut().insert(c.clone());
        }
        // The client's deadline (`grpc-timeout`), as tonic's server honoured it.
        let deadline = match grpc_timeout(req.headers()) {
            Ok(d) => d,
            Err(text) => {
                let status = Status::invalid_argument(format!(
                    "header grpc-timeout: {text:?} is not a gRPC timeout (1 to 8 digits and a unit H, M, S, m, u or n)"
                ));
                return Box::pin(std::future::ready(Ok(status.into_http())));
            }
        };
        // A stream (ModelStreamInfer) lives as long as its client wants and may idle between
        // messages: no body deadline (keep-alive pings close dead peers).
        let streaming = req.uri().path().ends_with("/ModelStreamInfer");
        let limit = self.body_timeout;
        let req = if streaming {
            req.map(tonic::body::Body::new)
        } else {
            req.map(|b| tonic::body::Body::new(DeadlineBody::new(b, limit).map_err(body_status)))
        };
        let max = self.max_message_bytes;
        let fut = self.inner.call(req);
        Box::pin(async move {
            let mut resp = match deadline {
                None => fut.await?,
                Some(d) => match tokio::time::timeout(d, fut).await {
                    Ok(r) => r?,
                    Err(_) => {
                        return Ok(Status::deadline_exceeded(format!(
                            "the client's deadline (grpc-timeout, {d:?}) passed before the answer"
                        ))
                        .into_http());
                    }
                },
            };
            let h = resp.headers_mut();
            if h.get("grpc-status").is_some_and(|v| v.as_bytes() == b"11") {
                h.insert(
                    "grpc-status",
                    tonic::codegen::http::HeaderValue::from_static("8"),
                );
                if let Ok(v) = tonic::codegen::http::HeaderValue::from_str(&format!(
                    "the request message is larger than the limit of {max} bytes (--max-body-bytes)"
                )) {
                    h.insert("grpc-message", v);
                }
            }
            Ok(resp)
        })
    }
}

/// The `grpc-timeout` header of a request (gRPC over HTTP/2: at most eight ASCII digits and a
/// unit, `H`ours, `M`inutes, `S`econds, `m`illi-, `u` micro- or `n`anoseconds): `None` when
/// absent, the header's text (clipped, as error messages echo it) when malformed.
pub(super) fn grpc_timeout(
    h: &tonic::codegen::http::HeaderMap,
) -> Result<Option<Duration>, String> {
    let Some(v) = h.get("grpc-timeout") else {
        return Ok(None);
    };
    let bad = || clip(&String::from_utf8_lossy(v.as_bytes()));
    let b = v.as_bytes();
    let Some((&unit, digits)) = b.split_last() else {
        return Err(bad());
    };
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    let n = digits
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    Ok(Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return Err(bad()),
    }))
}

/// Length of the HTTP/2 connection preface every client sends first (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;

/// An accepted gRPC connection: holds one of the listener's slots until it closes, and fails
/// its reads once the header timeout has passed without the client's connection preface. Its
/// writes go through a [`CorkedStream`]: the frames one poll of the connection produces (all the
/// answers ready by then, on every stream, each with its headers, data and trailers) leave in
/// one write when the poll ends ([`Corked`]).
struct Guarded {
    io: CorkedStream,
    _slot: OwnedSemaphorePermit,
    /// Until the preface has been read: when the client's time is up.
    preface: Option<Pin<Box<tokio::time::Sleep>>>,
    seen: usize,
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        if let Some(deadline) = me.preface.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no HTTP/2 connection preface within the header timeout (--header-timeout-ms)",
            )));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            me.seen += buf.filled().len() - before;
            if me.seen >= PREFACE_LEN {
                me.preface = None;
            }
        }
        r
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The accept loop of the gRPC listener (see [`serve`] for the limits): hands each connection
/// to `pool` until `shutdown` resolves, then closes the listening socket.
pub(super) async fn accept(
    listener: tokio::net::TcpListener,
    limits: ConnectionConfig,
    pool: &ConnThreads,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!("gRPC accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(
                max = limits.max_connections,
                "gRPC connection closed: the listener serves its maximum (--max-connections)"
            );
            continue;
        };
        pool.assign(stream, slot);
    }
}
