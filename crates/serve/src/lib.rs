//! The serving tier: an Open Inference Protocol v2 (KServe / Triton REST) and KServe v2 gRPC
//! server over a versioned model repository, with a dynamic batcher per model version,
//! warm-up before ready, hot reload, Prometheus metrics and Triton's statistics.
//!
//! This file is the crate's face: its modules, in layers that only import downwards (checked
//! by `tests/it/architecture.rs`), and the names most callers need, re-exported. The design is
//! text-embeddings-inference's: one task owns each version's request queue, and the transports
//! are thin adapters over one transport-neutral [`Service`](service::Service).
//!
//! | level | modules | what they hold |
//! |---|---|---|
//! | 0 | [`error`], [`protocol`], [`records`], [`corked`], [`live_profile`], [`monitor`], [`otel`] | the OIP wire format (JSON and the binary tensor extension, both directions); kiln's own answers as serde types (metadata, model configuration, statistics), read back by the load generator; HTTP/2 corking; on-demand profiling; drift and latency watches; tracing |
//! | 1 | [`model`] | what a model takes and returns, and the per-instance executors |
//! | 2 | [`metrics`] | lock-free counters and histograms, the Prometheus exposition (kiln's and Triton's names) |
//! | 3 | `queue` | one version's request queue: a FIFO per priority level, bounded starvation |
//! | 4 | [`batcher`] | the `idle` and `delay` batching policies over that queue; instances are worker threads with their own engines and pools |
//! | 5 | [`repository`] | versions on disk, loading, warm-up, the watches attached, the atomic swap |
//! | 6 | [`service`] | the transport-neutral service: lookup, validation, batching, metrics and statistics, the views both transports answer, control authorisation |
//! | 7 | [`conn`], [`http`], [`grpc`] | the transports: HTTP/1.1 connections and axum routes; gRPC's connection runtime, wire format and service adapter |
//! | 8 | [`server`] | settings, [`start`], the [`ServerHandle`], the reload loop, shutdown |
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
pub mod error;
pub mod grpc;
pub mod http;
pub mod live_profile;
pub mod metrics;
pub mod model;
pub mod monitor;
pub mod otel;
pub mod protocol;
mod queue;
pub mod records;
pub mod repository;
pub mod server;
pub mod service;

pub use batcher::{BatcherConfig, BatchingPolicy};
pub use conn::ConnectionConfig;
pub use error::ServeError;
pub use metrics::Metrics;
pub use repository::{
    ModelControlMode, ReloadReport, RepoError, RepoErrorKind, Repository, RepositoryConfig,
};
pub use server::{
    ServeConfig, ServerHandle, default_engine, is_loopback_host, run_blocking, start,
};
