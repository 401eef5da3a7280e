//! The KServe v2 gRPC protocol (`inference.GRPCInferenceService`, Triton's flavour) on its own
//! port, beside the HTTP routes of [`http`](crate::http) and feeding the same batchers and metrics.
//!
//! The messages come from kiln's own `proto/grpc_predict_v2.proto` (written from the protocol
//! specification; field names and numbers are the interface), compiled by `build.rs` with a
//! vendored `protoc` into [`proto`], which also holds the generated client used by the tests
//! and `kiln loadtest --protocol grpc`.
//!
//! A thin adapter over the transport-neutral [`Service`](crate::service::Service): a
//! request's inputs become the protocol layer's [`InputTensor`](crate::protocol::InputTensor)s
//! — `raw_input_contents` as binary data without a copy, typed `contents` as JSON data would
//! be — and [`Service::infer`](crate::service::Service::infer) does the rest (lookup,
//! validation, batching, metrics and statistics) exactly as for HTTP; its
//! [`ErrorKind`](crate::service::ErrorKind)s map onto gRPC status codes here.
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
//! one thread, and corked ([`corked`](crate::corked)): the frames one poll of a connection
//! produces — an answer's headers, data and trailers, and the answers of every stream ready by
//! then — leave in one write.
//!
//! Rooms: [`proto`] — the generated messages, server and client; [`wire`] — protobuf to and
//! from the service's types (requests, answers, errors, the [`records`](crate::records)) and
//! the codec; `service.rs` — [`GrpcService`], the generated trait over the service; `conn.rs`
//! — the connection runtime (threads, accept loop, limits, corking); this file binds the port
//! and starts them.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::conn::ConnectionConfig;
use crate::error::ServeError;
use crate::service::Service;
use conn::{Bounded, ConnThreads, accept};
use proto::grpc_inference_service_server::GrpcInferenceServiceServer;

mod conn;
pub mod proto;
mod service;
#[cfg(test)]
mod tests;
pub mod wire;

pub use service::{GrpcService, STREAM_IN_FLIGHT};
pub use wire::{Codec, encode_response, parse_request, status_of};

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
