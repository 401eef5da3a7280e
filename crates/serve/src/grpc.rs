//! The KServe v2 gRPC protocol (`inference.GRPCInferenceService`, Triton's flavour) on its own
//! port, beside the HTTP routes of [`super::http`] and feeding the same batchers and metrics.
//!
//! The messages come from kiln's own `proto/grpc_predict_v2.proto` (written from the protocol
//! specification; field names and numbers are the interface), compiled by `build.rs` with a
//! vendored `protoc` into [`proto`], which also holds the generated client used by the tests
//! and `kiln loadtest --protocol grpc`.
//!
//! A thin adapter over the transport-neutral [`Service`]: a request's inputs become the
//! protocol layer's [`InputTensor`]s — `raw_input_contents` as binary data without a copy,
//! typed `contents` as JSON data would be — and [`Service::infer`] does the rest (lookup,
//! validation, batching, metrics and statistics) exactly as for HTTP; its
//! [`ErrorKind`]s map onto gRPC status codes here.
//!
//! Outputs are answered as `raw_output_contents` (as Triton does) unless the request sets the
//! parameter `binary_data_output` to `false`, then as typed `contents`.
//!
//! Status codes: `INVALID_ARGUMENT` for a request the model cannot take, `NOT_FOUND` for an
//! unknown model or version, `UNAVAILABLE` while a model is not ready, `RESOURCE_EXHAUSTED`
//! when its queue is full, `DEADLINE_EXCEEDED` past the request deadline, `INTERNAL` when the
//! engine fails, `UNIMPLEMENTED` for the RPCs whose extension this build lacks.
//!
//! `ModelStreamInfer` (Triton's bidirectional stream) runs each request of a stream through the
//! same path and answers it, or its error, as one stream message carrying the request's id.
//!
//! Connections are served by hyper's HTTP/2 server on one thread per core, each connection on
//! one thread, and corked ([`super::corked`]): the frames one poll of a connection produces —
//! an answer's headers, data and trailers, and the answers of every stream ready by then —
//! leave in one write.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpConnectInfo;

use prost::bytes::Bytes;
use tonic::{Request, Response, Status};

use super::ServeError;
use super::conn::{ConnectionConfig, is_connection_error};
use super::corked::{Corked, CorkedStream, cork};
use super::protocol::request::input_header;
use super::protocol::{
    Datatype, InferRequest, InputTensor, JsonData, OutputData, OutputTensor, RequestedOutput,
    bound_message, check_counts, check_name, clip,
};
use super::repository::LoadedVersion;
use super::service::{ErrorKind, Service, ServiceError, Transport};

/// The generated messages, server and client of `proto/grpc_predict_v2.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("inference");
}

/// The protobuf codec of the generated server and client: tonic-prost's, with 1 KiB first
/// buffers instead of its 8 KiB. tonic allocates an encode and a decode buffer per RPC; 8 KiB
/// is past glibc's per-thread cache (1 KiB is not), and a KServe request or answer of a few
/// rows fits in 1 KiB; larger ones grow the buffer as before. Under perf_analyzer at batch 1,
/// concurrency 4 it gave +7 % infer/s (median of three alternating runs, `benches/README.md`).
pub struct Codec<T, U>(std::marker::PhantomData<fn(T) -> U>);

/// First size of [`Codec`]'s buffers.
const CODEC_BUFFER_BYTES: usize = 1024;

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self(std::marker::PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = tonic_prost::ProstEncoder<T>;
    type Decoder = tonic_prost::ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(codec_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(codec_buffers())
    }
}

fn codec_buffers() -> tonic::codec::BufferSettings {
    // tonic's own yield threshold (32 KiB): streamed answers are batched into sends as before.
    tonic::codec::BufferSettings::new(CODEC_BUFFER_BYTES, 32 * 1024)
}

use proto::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use proto::*;

/// Most requests of one `ModelStreamInfer` stream in flight at once.
pub const STREAM_IN_FLIGHT: usize = 64;

/// The gRPC adapter: the [`Service`] behind the generated server trait.
#[derive(Clone)]
pub struct GrpcService {
    state: Arc<Service>,
}

impl GrpcService {
    /// An adapter over the service the HTTP routes use too.
    pub fn new(state: Arc<Service>) -> Self {
        Self { state }
    }
}

/// Bind the gRPC port (0: any free port) and serve until `shutdown` resolves; requests in
/// flight are answered before the task ends. Returns the bound address and the task.
///
/// The listener keeps the HTTP side's connection limits (`limits`, from `--max-connections`
/// and `--header-timeout-ms`): at most `max_connections` gRPC connections at once — one more
/// is closed at once, which a client sees as UNAVAILABLE and retries — and a client that
/// connects but does not send the HTTP/2 connection preface within the header timeout is
/// disconnected, so silent sockets cannot hold the slots. Once the preface has arrived a
/// connection may stay open (gRPC channels are long-lived); HTTP/2 keep-alive pings (every
/// 30 s, 10 s to answer) close connections whose peer has gone away.
///
/// Connections are served on [`ConnThreads`]: one single-threaded runtime per core, each
/// connection on the one serving the fewest. A connection's HTTP/2 framing, its streams and
/// the inference they run inline stay on that thread. On the shared multi-threaded runtime
/// (tonic's server) every stream was a task that woke the other worker: the server spent
/// ≈ 76 µs of CPU per batch-1 request, one worker alone ≈ 54 µs, these threads ≈ 46 µs
/// (`perf`, see `benches/README.md`).
pub async fn serve(
    host: &str,
    port: u16,
    state: Arc<Service>,
    limits: ConnectionConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, tokio::task::JoinHandle<Result<(), ServeError>>), ServeError> {
    let bind = format!("{host}:{port}");
    let listener = tokio::net::TcpListener::bind(&bind)
        .await
        .map_err(|source| ServeError::Io {
            what: format!("cannot listen on {bind} (gRPC; --grpc-port)"),
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| ServeError::Io {
        what: "local address (gRPC)".into(),
        source,
    })?;
    let max = state.max_body_bytes;
    let svc = Bounded {
        inner: GrpcInferenceServiceServer::new(GrpcService::new(state))
            .max_decoding_message_size(max)
            .max_encoding_message_size(usize::MAX),
        body_timeout: limits.body_timeout,
        max_message_bytes: max,
        conn: None,
    };
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let pool = ConnThreads::start(threads, svc, limits.header_timeout).map_err(|source| {
        ServeError::Io {
            what: "cannot start the gRPC connection threads".into(),
            source,
        }
    })?;
    let task = tokio::spawn(async move {
        accept(listener, limits, &pool, shutdown).await;
        // The listening socket is closed; let every connection finish what it has started.
        tokio::task::spawn_blocking(move || pool.stop())
            .await
            .map_err(|e| ServeError::Io {
                what: "stopping the gRPC connection threads".into(),
                source: std::io::Error::other(e),
            })?;
        tracing::info!("gRPC server stopped; requests in flight have been answered");
        Ok(())
    });
    tracing::info!(%addr, threads, "listening (KServe v2 gRPC)");
    Ok((addr, task))
}

/// The threads gRPC connections are served on: each runs a single-threaded runtime (its own
/// epoll, timers and blocking pool) and serves the connections handed to it.
struct ConnThreads {
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
    fn start(n: usize, svc: Served, header_timeout: Duration) -> std::io::Result<Self> {
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
    fn stop(self) {
        let _ = self.stop.send(true);
        drop(self.senders);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// The service every connection thread serves.
type Served = Bounded<GrpcInferenceServiceServer<GrpcService>>;

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
struct Bounded<S> {
    inner: S,
    body_timeout: Duration,
    max_message_bytes: usize,
    /// The connection's addresses, given to each request (the control RPCs check the peer).
    conn: Option<TcpConnectInfo>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Bounded<S> {
    const NAME: &'static str = S::NAME;
}

/// A request body's error as the gRPC status it answers.
fn body_status(e: Box<dyn std::error::Error + Send + Sync>) -> Status {
    if super::conn::is_body_timeout(&*e) {
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
            req.map(|b| {
                tonic::body::Body::new(
                    super::conn::DeadlineBody::new(b, limit).map_err(body_status),
                )
            })
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
fn grpc_timeout(h: &tonic::codegen::http::HeaderMap) -> Result<Option<Duration>, String> {
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
async fn accept(
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

/// A request span's gRPC status attribute.
fn status_code(code: tonic::Code) -> opentelemetry::KeyValue {
    opentelemetry::KeyValue::new("rpc.grpc.status_code", code as i64)
}

/// The gRPC status of a service error.
pub fn status_of(e: ServiceError) -> Status {
    let m = bound_message(e.message);
    match e.kind {
        ErrorKind::InvalidArgument => Status::invalid_argument(m),
        ErrorKind::NotFound => Status::not_found(m),
        ErrorKind::Unavailable => Status::unavailable(m),
        ErrorKind::QueueFull => Status::resource_exhausted(m),
        ErrorKind::Timeout => Status::deadline_exceeded(m),
        ErrorKind::Internal => Status::internal(m),
        ErrorKind::Unauthenticated => Status::unauthenticated(m),
        ErrorKind::PermissionDenied => Status::permission_denied(m),
    }
}

fn version_of(v: &str) -> Option<&str> {
    (!v.is_empty()).then_some(v)
}

fn tensor_metadata(t: &super::model::TensorSpec) -> model_metadata_response::TensorMetadata {
    model_metadata_response::TensorMetadata {
        name: t.name.clone(),
        datatype: t.datatype.name().to_string(),
        shape: t.shape.clone(),
    }
}

/// Triton's `DataType` enum value of a datatype.
fn config_datatype(d: Datatype) -> i32 {
    let t = match d {
        Datatype::Bool => DataType::TypeBool,
        Datatype::U8 => DataType::TypeUint8,
        Datatype::U16 => DataType::TypeUint16,
        Datatype::U32 => DataType::TypeUint32,
        Datatype::U64 => DataType::TypeUint64,
        Datatype::I8 => DataType::TypeInt8,
        Datatype::I16 => DataType::TypeInt16,
        Datatype::I32 => DataType::TypeInt32,
        Datatype::I64 => DataType::TypeInt64,
        Datatype::Fp16 => DataType::TypeFp16,
        Datatype::Fp32 => DataType::TypeFp32,
        Datatype::Fp64 => DataType::TypeFp64,
        Datatype::Bytes => DataType::TypeString,
    };
    t as i32
}

/// The model configuration, as `GET /v2/models/{m}/config` gives it in JSON; kiln's own
/// description (features, normalisation, targets, engine) is the JSON string of parameter
/// `kiln`.
fn model_config(s: &Service, lv: &LoadedVersion) -> ModelConfig {
    let cfg = s.repo.config();
    let b = &cfg.batcher;
    let mut parameters = std::collections::HashMap::new();
    parameters.insert(
        "kiln".to_string(),
        ModelParameter {
            string_value: lv.spec.describe().to_string(),
        },
    );
    parameters.insert(
        "engine".to_string(),
        ModelParameter {
            string_value: cfg.engine.clone(),
        },
    );
    parameters.insert(
        "batching".to_string(),
        ModelParameter {
            string_value: b.policy.name().to_string(),
        },
    );
    ModelConfig {
        name: lv.model.clone(),
        platform: lv.spec.platform().to_string(),
        backend: "kiln".into(),
        version_policy: Some(ModelVersionPolicy {
            policy_choice: Some(model_version_policy::PolicyChoice::Latest(
                model_version_policy::Latest { num_versions: 1 },
            )),
        }),
        max_batch_size: b.max_batch_size.min(i32::MAX as usize) as i32,
        input: lv
            .spec
            .inputs
            .iter()
            .map(|t| ModelInput {
                name: t.name.clone(),
                data_type: config_datatype(t.datatype),
                dims: t.shape[1..].to_vec(),
            })
            .collect(),
        output: lv
            .spec
            .outputs
            .iter()
            .map(|t| ModelOutput {
                name: t.name.clone(),
                data_type: config_datatype(t.datatype),
                dims: t.shape[1..].to_vec(),
            })
            .collect(),
        instance_group: vec![ModelInstanceGroup {
            name: String::new(),
            count: b.instances.min(i32::MAX as usize) as i32,
            kind: model_instance_group::Kind::Cpu as i32,
        }],
        scheduling_choice: Some(model_config::SchedulingChoice::DynamicBatching(
            ModelDynamicBatching {
                preferred_batch_size: super::model::buckets(b.max_batch_size)
                    .into_iter()
                    .map(|n| n.min(i32::MAX as usize) as i32)
                    .collect(),
                max_queue_delay_microseconds: b.max_queue_delay.as_micros() as u64,
                preserve_ordering: false,
                default_queue_policy: Some(ModelQueuePolicy {
                    timeout_action: 0,
                    default_timeout_microseconds: s.request_timeout.as_micros() as u64,
                    allow_timeout_override: false,
                    max_queue_size: b.max_queue_size.min(u32::MAX as usize) as u32,
                }),
            },
        )),
        parameters,
    }
}

fn bad(msg: impl Into<String>) -> Status {
    Status::invalid_argument(bound_message(msg.into()))
}

fn param_bool(
    p: &std::collections::HashMap<String, InferParameter>,
    key: &str,
) -> Result<Option<bool>, Status> {
    match p.get(key).and_then(|v| v.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(infer_parameter::ParameterChoice::BoolParam(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(format!(
            "request parameter `{key}` is {other:?}; expected a bool_param"
        ))),
    }
}

/// A request parameter that must be a non-negative integer (`priority`, `timeout`):
/// tritonclient sends `uint64_param` for the priority and `int64_param` for the timeout.
fn param_u64(
    p: &std::collections::HashMap<String, InferParameter>,
    key: &str,
) -> Result<Option<u64>, Status> {
    use infer_parameter::ParameterChoice as C;
    match p.get(key).and_then(|v| v.parameter_choice.as_ref()) {
        None => Ok(None),
        Some(C::Uint64Param(v)) => Ok(Some(*v)),
        Some(C::Int64Param(v)) if *v >= 0 => Ok(Some(*v as u64)),
        Some(other) => Err(bad(format!(
            "request parameter `{key}` is {other:?}; expected a non-negative uint64_param or int64_param{}",
            if key == "timeout" { " (µs)" } else { "" }
        ))),
    }
}

/// Typed contents as the JSON path holds them: row-major values, booleans as 0/1.
fn typed_values(
    name: &str,
    datatype: Datatype,
    c: InferTensorContents,
) -> Result<JsonData, Status> {
    let nums = |values: Vec<f64>| JsonData {
        values,
        has_bool: false,
        has_number: true,
        strings: Vec::new(),
    };
    Ok(match datatype {
        Datatype::Bool => JsonData {
            values: c
                .bool_contents
                .iter()
                .map(|&b| if b { 1.0 } else { 0.0 })
                .collect(),
            has_bool: true,
            has_number: false,
            strings: Vec::new(),
        },
        Datatype::Fp32 => nums(c.fp32_contents.iter().map(|&x| x as f64).collect()),
        Datatype::Fp64 => nums(c.fp64_contents),
        Datatype::I8 | Datatype::I16 | Datatype::I32 => {
            nums(c.int_contents.iter().map(|&x| x as f64).collect())
        }
        Datatype::I64 => nums(c.int64_contents.iter().map(|&x| x as f64).collect()),
        Datatype::U8 | Datatype::U16 | Datatype::U32 => {
            nums(c.uint_contents.iter().map(|&x| x as f64).collect())
        }
        Datatype::U64 => nums(c.uint64_contents.iter().map(|&x| x as f64).collect()),
        Datatype::Fp16 => {
            return Err(bad(format!(
                "input `{name}`: FP16 has no typed contents; send it in raw_input_contents"
            )));
        }
        Datatype::Bytes => JsonData {
            strings: c
                .bytes_contents
                .into_iter()
                .enumerate()
                .map(|(i, b)| {
                    String::from_utf8(b).map_err(|_| {
                        bad(format!(
                            "input `{name}`: BYTES element {i} is not UTF-8 text"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
            ..JsonData::default()
        },
    })
}

/// The typed-contents field a datatype's values go in (for error messages).
fn contents_field(d: Datatype) -> &'static str {
    match d {
        Datatype::Bool => "bool_contents",
        Datatype::Fp32 => "fp32_contents",
        Datatype::Fp64 => "fp64_contents",
        Datatype::I8 | Datatype::I16 | Datatype::I32 => "int_contents",
        Datatype::I64 => "int64_contents",
        Datatype::U8 | Datatype::U16 | Datatype::U32 => "uint_contents",
        Datatype::U64 => "uint64_contents",
        Datatype::Fp16 | Datatype::Bytes => "bytes_contents",
    }
}

/// A `ModelInferRequest` as the protocol layer's [`InferRequest`]: the same checks as a JSON
/// or binary HTTP body gets, with the same messages where they apply.
pub fn parse_request(r: ModelInferRequest) -> Result<InferRequest, Status> {
    if r.inputs.is_empty() {
        return Err(bad("request has no inputs"));
    }
    let raw = !r.raw_input_contents.is_empty();
    if raw && r.raw_input_contents.len() != r.inputs.len() {
        return Err(bad(format!(
            "raw_input_contents has {} entries but the request has {} inputs; send one per input, in input order",
            r.raw_input_contents.len(),
            r.inputs.len()
        )));
    }
    check_counts(r.inputs.len(), r.outputs.len()).map_err(|e| bad(e.0))?;
    let binary_data_output = param_bool(&r.parameters, "binary_data_output")?.unwrap_or(true);
    let priority = param_u64(&r.parameters, "priority")?;
    let timeout_us = param_u64(&r.parameters, "timeout")?;
    let mut raw_contents = r.raw_input_contents.into_iter();
    let mut inputs: Vec<InputTensor> = Vec::with_capacity(r.inputs.len());
    let mut seen = std::collections::HashSet::with_capacity(r.inputs.len());
    for input in r.inputs {
        let name = input.name;
        let raw_bytes = raw_contents.next();
        let (datatype, shape, count) =
            input_header(&name, &input.datatype, &input.shape, &mut seen).map_err(|e| bad(e.0))?;
        let data = match (raw_bytes, input.contents) {
            (Some(_), Some(_)) => {
                return Err(bad(format!(
                    "input `{name}` has both typed contents and raw_input_contents; send one"
                )));
            }
            (Some(b), None) => {
                if let Some(size) = datatype.size()
                    && b.len() != count * size
                {
                    return Err(bad(format!(
                        "input `{name}` has {} bytes in raw_input_contents but shape {shape:?} of {datatype} needs {}",
                        b.len(),
                        count * size
                    )));
                }
                crate::protocol::request::binary_input(&name, datatype, b, count)
                    .map_err(|e| bad(e.0))?
            }
            (None, Some(c)) => {
                let d = typed_values(&name, datatype, c)?;
                if d.len() != count {
                    return Err(bad(format!(
                        "input `{name}` has {} elements in contents.{} but shape {shape:?} needs {count}",
                        d.len(),
                        contents_field(datatype)
                    )));
                }
                crate::protocol::request::json_input(&name, datatype, d).map_err(|e| bad(e.0))?
            }
            (None, None) => {
                return Err(bad(format!(
                    "input `{name}` has no data: expected typed contents or raw_input_contents"
                )));
            }
        };
        inputs.push(InputTensor {
            name,
            datatype,
            shape,
            data,
        });
    }
    let outputs = if r.outputs.is_empty() {
        None
    } else {
        let mut seen = std::collections::HashSet::with_capacity(r.outputs.len());
        let mut v = Vec::with_capacity(r.outputs.len());
        for o in r.outputs {
            check_name("output", &o.name).map_err(|e| bad(e.0))?;
            if !seen.insert(o.name.clone()) {
                return Err(bad(format!(
                    "output `{}` is requested more than once",
                    o.name
                )));
            }
            v.push(RequestedOutput {
                name: o.name,
                binary: None,
            });
        }
        Some(v)
    };
    Ok(InferRequest {
        id: version_of(&r.id).map(str::to_string),
        inputs,
        outputs,
        binary_data_output,
        priority,
        timeout_us,
    })
}

fn le_bytes(d: &OutputData) -> Bytes {
    let mut out = Vec::new();
    match d {
        OutputData::F32(v) => {
            out.reserve(v.len() * 4);
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        OutputData::F64(v) => {
            out.reserve(v.len() * 8);
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
    }
    Bytes::from(out)
}

/// Encode the selected outputs: all raw (`raw_output_contents`) or all typed.
pub fn encode_response(
    lv: &LoadedVersion,
    id: Option<&str>,
    outputs: Vec<(OutputTensor, bool)>,
    raw: bool,
) -> ModelInferResponse {
    let mut resp = ModelInferResponse {
        model_name: lv.model.clone(),
        model_version: lv.version.to_string(),
        id: id.unwrap_or_default().to_string(),
        ..Default::default()
    };
    for (t, _) in outputs {
        let contents = if raw {
            resp.raw_output_contents.push(le_bytes(&t.data));
            None
        } else {
            Some(match &t.data {
                OutputData::F32(v) => InferTensorContents {
                    fp32_contents: v.clone(),
                    ..Default::default()
                },
                OutputData::F64(v) => InferTensorContents {
                    fp64_contents: v.clone(),
                    ..Default::default()
                },
            })
        };
        resp.outputs.push(model_infer_response::InferOutputTensor {
            name: t.name,
            datatype: t.data.datatype().name().to_string(),
            shape: t.shape.iter().map(|&d| d as i64).collect(),
            parameters: Default::default(),
            contents,
        });
    }
    resp
}

impl GrpcService {
    /// An inference over gRPC: the service's one infer path, with the protobuf request
    /// parser and response encoder.
    async fn infer(
        &self,
        mut r: ModelInferRequest,
        trace: Option<&crate::otel::RequestTrace>,
    ) -> Result<ModelInferResponse, Status> {
        let name = std::mem::take(&mut r.model_name);
        let version = std::mem::take(&mut r.model_version);
        let size = prost::Message::encoded_len(&r);
        let parse = move || parse_request(r).map_err(|st| st.message().to_string());
        let encode = |lv: &LoadedVersion, req: &InferRequest, selected| {
            encode_response(lv, req.id.as_deref(), selected, req.binary_data_output)
        };
        self.state
            .infer(&name, version_of(&version), size, trace, parse, encode)
            .await
            .map_err(status_of)
    }
}

// ---------------------------------------------------------------------------------------
// The statistics and model repository extensions: the same library functions the HTTP
// routes call (`stats::model_stats`, `Repository::{index, load_model, unload_model}`), the
// same control rule (loopback or bearer token), errors mapped to gRPC status codes.
// ---------------------------------------------------------------------------------------

/// The extensions `ServerMetadata` lists (keep in step with `GET /v2`).
fn extensions() -> Vec<String> {
    [
        "binary_tensor_data",
        "model_configuration",
        "statistics",
        "model_repository",
    ]
    .map(String::from)
    .to_vec()
}

/// The control RPCs (repository index, load, unload) obey the same rule as the HTTP control
/// endpoints ([`Service::authorize_control`]): with `--control-token`, the metadata must carry
/// `authorization: Bearer <token>` (UNAUTHENTICATED otherwise); without one, only loopback
/// peers may call them (PERMISSION_DENIED otherwise).
fn authorize<T>(s: &Service, req: &Request<T>) -> Result<(), Status> {
    let given = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    let peer = req.remote_addr().map(|p| p.ip());
    let proxied = super::service::PROXY_HEADERS
        .into_iter()
        .find(|h| req.metadata().contains_key(*h));
    s.authorize_control(given, peer, proxied, Transport::Grpc)
        .map_err(status_of)
}

/// Run blocking repository work off the runtime's threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, super::repository::RepoError> + Send + 'static,
) -> Result<T, Status> {
    Service::blocking(f).await.map_err(status_of)
}

fn duration(d: &super::stats::StatDuration) -> Option<StatisticDuration> {
    Some(StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

/// `ModelStatistics`: the statistics extension's answer (`GET /v2/models/.../stats`) as
/// protobuf; an empty name means every model, an empty version every loaded version.
fn model_statistics(
    s: &Service,
    req: ModelStatisticsRequest,
) -> Result<ModelStatisticsResponse, Status> {
    let name = (!req.name.is_empty()).then_some(req.name.as_str());
    let version = (!req.version.is_empty()).then_some(req.version.as_str());
    let r = super::stats::model_stats(&s.repo, name, version).map_err(|e| status_of(e.into()))?;
    let model_stats = r
        .model_stats
        .into_iter()
        .map(|m| {
            let i = &m.inference_stats;
            ModelStatistics {
                name: m.name,
                version: m.version,
                last_inference: m.last_inference,
                inference_count: m.inference_count,
                execution_count: m.execution_count,
                inference_stats: Some(InferStatistics {
                    success: duration(&i.success),
                    fail: duration(&i.fail),
                    queue: duration(&i.queue),
                    compute_input: duration(&i.compute_input),
                    compute_infer: duration(&i.compute_infer),
                    compute_output: duration(&i.compute_output),
                    cache_hit: duration(&i.cache_hit),
                    cache_miss: duration(&i.cache_miss),
                }),
                batch_stats: m
                    .batch_stats
                    .iter()
                    .map(|b| InferBatchStatistics {
                        batch_size: b.batch_size,
                        compute_input: duration(&b.compute_input),
                        compute_infer: duration(&b.compute_infer),
                        compute_output: duration(&b.compute_output),
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(ModelStatisticsResponse { model_stats })
}

/// `RepositoryIndex` (`POST /v2/repository/index`).
async fn repository_index(
    s: &Service,
    req: Request<RepositoryIndexRequest>,
) -> Result<RepositoryIndexResponse, Status> {
    authorize(s, &req)?;
    let ready_only = req.get_ref().ready;
    let repo = s.repo.clone();
    let entries = blocking(move || repo.index(ready_only)).await?;
    Ok(RepositoryIndexResponse {
        models: entries
            .into_iter()
            .map(|e| repository_index_response::ModelIndex {
                name: e.name,
                version: e.version.unwrap_or_default(),
                state: e.state,
                reason: e.reason,
            })
            .collect(),
    })
}

/// `RepositoryModelLoad` (`POST /v2/repository/models/{m}/load`).
async fn repository_model_load(
    s: &Service,
    req: Request<RepositoryModelLoadRequest>,
) -> Result<RepositoryModelLoadResponse, Status> {
    authorize(s, &req)?;
    let r = req.into_inner();
    let params: Vec<(String, super::service::LoadParameter)> = r
        .parameters
        .into_iter()
        .map(|(k, v)| {
            use model_repository_parameter::ParameterChoice as C;
            let p = match v.parameter_choice {
                Some(C::StringParam(t)) => super::service::LoadParameter::Text(t),
                Some(C::BytesParam(b)) => {
                    super::service::LoadParameter::Text(String::from_utf8_lossy(&b).into_owned())
                }
                other => super::service::LoadParameter::Other(format!("{other:?}")),
            };
            (k, p)
        })
        .collect();
    let name = r.model_name;
    s.check_load_parameters(&name, &params).map_err(status_of)?;
    let repo = s.repo.clone();
    blocking(move || repo.load_model(&name)).await?;
    Ok(RepositoryModelLoadResponse {})
}

/// `RepositoryModelUnload` (`POST /v2/repository/models/{m}/unload`): drains the requests in
/// flight, then unloads.
async fn repository_model_unload(
    s: &Service,
    req: Request<RepositoryModelUnloadRequest>,
) -> Result<RepositoryModelUnloadResponse, Status> {
    authorize(s, &req)?;
    let name = req.into_inner().model_name;
    let repo = s.repo.clone();
    // Requests in flight end within their deadline; wait a little longer than that.
    let drain = s.request_timeout + Duration::from_secs(5);
    blocking(move || repo.unload_model(&name, drain)).await?;
    Ok(RepositoryModelUnloadResponse {})
}

#[tonic::async_trait]
impl GrpcInferenceService for GrpcService {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.state.repo.ready(),
        }))
    }

    async fn model_ready(
        &self,
        req: Request<ModelReadyRequest>,
    ) -> Result<Response<ModelReadyResponse>, Status> {
        let r = req.into_inner();
        match self.state.lookup(&r.name, version_of(&r.version)) {
            Ok(_) => Ok(Response::new(ModelReadyResponse { ready: true })),
            // On disk but not loaded: known, not ready (as Triton answers).
            Err(e)
                if e.kind == ErrorKind::NotFound
                    && r.version.is_empty()
                    && self.state.repo.on_disk(&r.name) =>
            {
                Ok(Response::new(ModelReadyResponse { ready: false }))
            }
            Err(e) if e.kind == ErrorKind::Unavailable => {
                Ok(Response::new(ModelReadyResponse { ready: false }))
            }
            Err(e) => Err(status_of(e)),
        }
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "kiln".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: extensions(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let r = req.into_inner();
        let lv = self
            .state
            .lookup(&r.name, version_of(&r.version))
            .map_err(status_of)?;
        Ok(Response::new(ModelMetadataResponse {
            name: lv.model.clone(),
            versions: vec![lv.version.to_string()],
            platform: lv.spec.platform().into(),
            inputs: lv.spec.inputs.iter().map(tensor_metadata).collect(),
            outputs: lv.spec.outputs.iter().map(tensor_metadata).collect(),
        }))
    }

    type ModelStreamInferStream = ReceiverStream<Result<ModelStreamInferResponse, Status>>;

    /// Triton's bidirectional streaming inference: each request of the stream goes through
    /// the same path as `ModelInfer`; its answer (or its error, in `error_message`, the
    /// stream going on) is sent when it is ready, carrying the request's id, so answers come
    /// in completion order. At most [`STREAM_IN_FLIGHT`] requests of one stream are in
    /// flight: past that the stream is not read (HTTP/2 flow control holds the client back).
    /// A client that closes its side has its requests in flight answered, then the stream
    /// ends; one that goes away (or cancels) has its requests withdrawn from the queue.
    async fn model_stream_infer(
        &self,
        req: Request<tonic::Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let meta = |k: &str| {
            req.metadata()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (traceparent, tracestate) = (meta("traceparent"), meta("tracestate"));
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(STREAM_IN_FLIGHT);
        let svc = self.clone();
        tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(STREAM_IN_FLIGHT));
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                let next = tokio::select! {
                    m = inbound.message() => m,
                    _ = tx.closed() => {
                        tasks.abort_all();
                        return;
                    }
                };
                let r = match next {
                    Ok(Some(r)) => r,
                    // The client closed its side: answer what is in flight, then end.
                    Ok(None) => break,
                    Err(st) => {
                        let _ = tx.send(Err(st)).await;
                        tasks.abort_all();
                        return;
                    }
                };
                let permit = tokio::select! {
                    p = slots.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                    _ = tx.closed() => {
                        tasks.abort_all();
                        return;
                    }
                };
                let (svc, tx) = (svc.clone(), tx.clone());
                let (tp, ts) = (traceparent.clone(), tracestate.clone());
                tasks.spawn(async move {
                    let trace = svc.state.tracing.as_ref().and_then(|t| {
                        t.request(
                            "inference.GRPCInferenceService/ModelStreamInfer",
                            tp.as_deref(),
                            ts.as_deref(),
                            "grpc-stream",
                        )
                    });
                    let (id, model) = (r.id.clone(), r.model_name.clone());
                    let answer = match svc.infer(r, trace.as_ref()).await {
                        Ok(resp) => {
                            if let Some(t) = trace {
                                t.finish(status_code(tonic::Code::Ok), None);
                            }
                            ModelStreamInferResponse {
                                error_message: String::new(),
                                infer_response: Some(resp),
                            }
                        }
                        Err(st) => {
                            if let Some(t) = trace {
                                t.finish(status_code(st.code()), Some(st.message()));
                            }
                            ModelStreamInferResponse {
                                error_message: st.message().to_string(),
                                infer_response: Some(ModelInferResponse {
                                    model_name: model,
                                    id,
                                    ..Default::default()
                                }),
                            }
                        }
                    };
                    let _ = tx.send(Ok(answer)).await;
                    drop(permit);
                });
                while tasks.try_join_next().is_some() {}
            }
            // Answer what is in flight — unless the client goes away meanwhile.
            loop {
                tokio::select! {
                    done = tasks.join_next() => if done.is_none() { break },
                    _ = tx.closed() => {
                        tasks.abort_all();
                        break;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn model_infer(
        &self,
        req: Request<ModelInferRequest>,
    ) -> Result<Response<ModelInferResponse>, Status> {
        let trace = self.state.tracing.as_ref().and_then(|t| {
            let m = req.metadata();
            let h = |k: &str| m.get(k).and_then(|v| v.to_str().ok());
            t.request(
                "inference.GRPCInferenceService/ModelInfer",
                h("traceparent"),
                h("tracestate"),
                "grpc",
            )
        });
        let r = self.infer(req.into_inner(), trace.as_ref()).await;
        let Some(t) = trace else {
            return r.map(Response::new);
        };
        let code = match &r {
            Ok(_) => tonic::Code::Ok,
            Err(st) => st.code(),
        };
        let tr = t.finish(status_code(code), r.as_ref().err().map(|st| st.message()));
        let mut resp = Response::new(r?);
        if let Ok(v) = tr.parse() {
            resp.metadata_mut().insert("traceresponse", v);
        }
        Ok(resp)
    }

    async fn model_config(
        &self,
        req: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let r = req.into_inner();
        let lv = self
            .state
            .lookup(&r.name, version_of(&r.version))
            .map_err(status_of)?;
        Ok(Response::new(ModelConfigResponse {
            config: Some(model_config(&self.state, &lv)),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        model_statistics(&self.state, req.into_inner()).map(Response::new)
    }

    async fn repository_index(
        &self,
        req: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        repository_index(&self.state, req).await.map(Response::new)
    }

    async fn repository_model_load(
        &self,
        req: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        repository_model_load(&self.state, req)
            .await
            .map(Response::new)
    }

    async fn repository_model_unload(
        &self,
        req: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        repository_model_unload(&self.state, req)
            .await
            .map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::grpc_timeout;
    use std::time::Duration;
    use tonic::codegen::http::{HeaderMap, HeaderValue};

    fn timeout(v: &str) -> Result<Option<Duration>, String> {
        let mut h = HeaderMap::new();
        h.insert("grpc-timeout", HeaderValue::from_str(v).unwrap());
        grpc_timeout(&h)
    }

    #[test]
    fn grpc_timeout_reads_every_unit() {
        assert_eq!(grpc_timeout(&HeaderMap::new()), Ok(None));
        let cases = [
            ("2H", Duration::from_secs(7200)),
            ("3M", Duration::from_secs(180)),
            ("10S", Duration::from_secs(10)),
            ("250m", Duration::from_millis(250)),
            ("75u", Duration::from_micros(75)),
            ("99999999n", Duration::from_nanos(99_999_999)),
            ("0S", Duration::ZERO),
            ("00000001m", Duration::from_millis(1)),
        ];
        for (text, want) in cases {
            assert_eq!(timeout(text), Ok(Some(want)), "{text}");
        }
    }

    #[test]
    fn grpc_timeout_refuses_what_the_spec_does_not_allow() {
        // No unit, no digits, nine digits, an unknown unit, a sign, a space, a decimal point.
        for text in [
            "",
            "5",
            "S",
            "123456789S",
            "10x",
            "10s",
            "-1S",
            "1 S",
            "1.5S",
        ] {
            assert_eq!(timeout(text), Err(text.to_string()), "{text:?}");
        }
        // A long header is echoed clipped, with its length.
        let long = "9".repeat(5000) + "S";
        let echoed = timeout(&long).unwrap_err();
        assert!(
            echoed.len() < 100 && echoed.ends_with("(5001 bytes)"),
            "{echoed}"
        );
    }
}
