//! The transport-neutral service (text-embeddings-inference's pattern): one function per
//! operation, owning model lookup, validation, batching and the per-version metrics and
//! statistics. [`http`](crate::http) and [`grpc`](crate::grpc) are thin adapters: they turn
//! their wire format into an [`InferRequest`], call [`Service::infer`], encode what it
//! returns, and map a [`ServiceError`]'s [`ErrorKind`] onto their status codes. Whatever a
//! request costs or fails with is counted here, once, whichever transport carried it.
//!
//! Files: this one holds the service, its errors and the infer path (with its cancellation
//! guard: a request whose caller goes away is counted as cancelled); `views.rs` what the
//! service answers about the server and its models (metadata, readiness, the model
//! configuration, statistics) as [`records`](crate::records) both transports map; `control.rs`
//! the control operations' authorisation and load parameters.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;

use crate::batcher::InferFailure;
use crate::metrics::{Failure, Metrics, VersionMetrics};
use crate::model::ModelInput;
use crate::otel::{RequestTrace, Tracing};
use crate::protocol::{InferRequest, OutputData, OutputTensor, clip, select_outputs};
use crate::repository::{LoadedVersion, ModelSlot, RepoError, RepoErrorKind, Repository};

mod control;
mod views;

pub use control::{LoadParameter, PROXY_HEADERS, Transport, bearer_matches};

/// Requests of at least this many bytes are parsed off the async runtime's workers (see
/// [`Service::infer`]).
pub const PARSE_OFF_RUNTIME_BYTES: usize = 64 << 10;

/// What every transport shares: the models, the metrics and the request limits.
pub struct Service {
    /// The models.
    pub repo: Arc<Repository>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Largest accepted request body (HTTP) or message (gRPC).
    pub max_body_bytes: usize,
    /// Per-request deadline (queue + compute).
    pub request_timeout: Duration,
    /// Bearer token of the control operations (`None`: loopback clients only).
    pub control_token: Option<String>,
    /// Where on-demand profiles go (`None`: profiling is off).
    pub profile_dir: Option<PathBuf>,
    /// Most events one on-demand profile keeps.
    pub profile_max_events: usize,
    /// Most bytes one on-demand profile holds.
    pub profile_max_bytes: usize,
    /// OpenTelemetry tracing (`None`: off).
    pub tracing: Option<Arc<Tracing>>,
}

/// Why an operation failed, in the terms both protocols map onto their own codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request cannot be served as written (HTTP 400, gRPC `INVALID_ARGUMENT`).
    InvalidArgument,
    /// No such model or version (404, `NOT_FOUND`).
    NotFound,
    /// The model is not ready (503, `UNAVAILABLE`).
    Unavailable,
    /// The version's queue is full (503, `RESOURCE_EXHAUSTED`).
    QueueFull,
    /// The request deadline passed (503, `DEADLINE_EXCEEDED`).
    Timeout,
    /// The engine failed (500, `INTERNAL`).
    Internal,
    /// A control operation without the right bearer token (401, `UNAUTHENTICATED`).
    Unauthenticated,
    /// A control operation from a peer that may not call it (403, `PERMISSION_DENIED`).
    PermissionDenied,
}

/// A failed operation: its kind and the message the client gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    /// The kind.
    pub kind: ErrorKind,
    /// The message.
    pub message: String,
}

impl ServiceError {
    /// An error of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

impl From<RepoError> for ServiceError {
    fn from(e: RepoError) -> Self {
        let kind = match e.kind {
            RepoErrorKind::NotFound => ErrorKind::NotFound,
            RepoErrorKind::InvalidArgument | RepoErrorKind::LoadFailed => {
                ErrorKind::InvalidArgument
            }
            RepoErrorKind::Unavailable => ErrorKind::Unavailable,
        };
        Self::new(kind, e.message)
    }
}

/// See [`Service::infer`]: records [`Failure::Cancelled`] when dropped armed.
struct Unanswered {
    vm: Arc<VersionMetrics>,
    t0: Instant,
    armed: bool,
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if self.armed {
            self.vm
                .record_failure(Failure::Cancelled, self.t0.elapsed());
        }
    }
}

impl Service {
    /// The model (and version) a request names, or why it cannot be served. A model that is
    /// not ready is counted in its `not_ready` metric here, for every operation that asks.
    pub fn resolve(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<LoadedVersion>, ServiceError> {
        let slot = self.find_slot(name)?;
        let r = resolve_in(&slot, name, version);
        if let Err(e) = &r
            && e.kind == ErrorKind::Unavailable
        {
            slot.metrics.not_ready.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Like [`Service::resolve`], without counting a not-ready answer (metadata, readiness
    /// and configuration probes are not inference requests).
    pub fn lookup(
        &self,
        name: &str,
        version: Option<&str>,
    ) -> Result<Arc<LoadedVersion>, ServiceError> {
        resolve_in(&self.find_slot(name)?, name, version)
    }

    fn find_slot(&self, name: &str) -> Result<Arc<ModelSlot>, ServiceError> {
        self.repo.get(name).ok_or_else(|| {
            let names = self.repo.names();
            ServiceError::new(
                ErrorKind::NotFound,
                format!(
                    "unknown model `{}`; the repository has: {}",
                    clip(name),
                    if names.is_empty() {
                        "(no models)".into()
                    } else {
                        names.join(", ")
                    }
                ),
            )
        })
    }

    /// One inference, whichever transport carried it: resolve the model, `parse` the
    /// request (the transport's wire format; its error is a bad-request message), check the
    /// requested outputs, decode the inputs against the model, run them through the
    /// version's batcher within the request deadline, select the outputs and `encode` them.
    /// The version's success or failure (with its kind and latency, encoding included) is
    /// recorded here and nowhere else.
    ///
    /// `size` is the request's size in bytes: a request of [`PARSE_OFF_RUNTIME_BYTES`] or
    /// more is parsed on the blocking pool, so that long parses never hold the runtime's
    /// workers (which answer health checks and every other request).
    pub async fn infer<T>(
        &self,
        name: &str,
        version: Option<&str>,
        size: usize,
        trace: Option<&RequestTrace>,
        parse: impl FnOnce() -> Result<InferRequest, String> + Send + 'static,
        encode: impl FnOnce(&LoadedVersion, &InferRequest, Vec<(OutputTensor, bool)>) -> T,
    ) -> Result<T, ServiceError> {
        let t0 = Instant::now();
        let lv = self.resolve(name, version)?;
        // Counts the request as cancelled if its future is dropped (the caller went away)
        // before an outcome was recorded.
        let mut unanswered = Unanswered {
            vm: lv.metrics.clone(),
            t0,
            armed: true,
        };
        let r = self
            .infer_resolved(&lv, name, size, trace, parse, encode, t0)
            .await;
        unanswered.armed = false;
        r
    }

    #[allow(clippy::too_many_arguments)]
    async fn infer_resolved<T>(
        &self,
        lv: &Arc<LoadedVersion>,
        name: &str,
        size: usize,
        trace: Option<&RequestTrace>,
        parse: impl FnOnce() -> Result<InferRequest, String> + Send + 'static,
        encode: impl FnOnce(&LoadedVersion, &InferRequest, Vec<(OutputTensor, bool)>) -> T,
        t0: Instant,
    ) -> Result<T, ServiceError> {
        let vm = &lv.metrics;
        let bad = |msg: String| {
            vm.record_failure(Failure::BadRequest, t0.elapsed());
            ServiceError::new(ErrorKind::InvalidArgument, msg)
        };
        let req = if size >= PARSE_OFF_RUNTIME_BYTES {
            let parsed = tokio::task::spawn_blocking(move || {
                let _span = kiln_model::prof_span!("serve_parse").entered();
                parse()
            })
            .await;
            match parsed {
                Ok(r) => r.map_err(bad)?,
                Err(e) => {
                    vm.record_failure(Failure::Internal, t0.elapsed());
                    return Err(ServiceError::new(
                        ErrorKind::Internal,
                        format!("the request parser failed: {e}"),
                    ));
                }
            }
        } else {
            let _span = kiln_model::prof_span!("serve_parse").entered();
            parse().map_err(bad)?
        };
        let level = self
            .repo
            .config()
            .batcher
            .level(req.priority)
            .map_err(bad)?;
        let timeout = match req.timeout_us {
            None | Some(0) => self.request_timeout,
            Some(us) => Duration::from_micros(us).min(self.request_timeout),
        };
        let decode_span = kiln_model::prof_span!("serve_decode").entered();
        if let Some(outs) = &req.outputs {
            for o in outs {
                if !lv.spec.outputs.iter().any(|t| t.name == o.name) {
                    return Err(bad(format!(
                        "unknown output `{}` requested; model `{name}` has outputs: {}",
                        o.name,
                        lv.spec
                            .outputs
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        let max_batch = self.repo.config().batcher.max_batch_size;
        let drift = vm.drift.get();
        // Missing cells and unknown categories per raw column, for the drift watch
        // (no allocation unless a request has one).
        let mut cells = kiln_model::preprocess::EncodeCounts::default();
        let input = lv
            .spec
            .decode_counted(&req.inputs, name, max_batch, drift.map(|_| &mut cells))
            .map_err(|e| bad(e.0))?;
        if let Some(d) = drift
            && !cells.is_empty()
        {
            d.observe_cells(&cells);
        }
        drop(decode_span);
        // The clock is read for the spans only when the request is traced.
        let queued = trace.map(|_| Instant::now());
        if let (Some(t), Some(queued)) = (trace, queued) {
            t.annotate(vec![
                KeyValue::new("kiln.model", name.to_string()),
                KeyValue::new("kiln.version", lv.version as i64),
                KeyValue::new("kiln.rows", input.rows() as i64),
                KeyValue::new("kiln.priority_level", level as i64 + 1),
            ]);
            t.stage("decode", t0, queued, Vec::new(), None);
        }
        if let (Some(d), ModelInput::Regression { x, .. }) = (drift, &input) {
            d.observe(x);
        }
        let outputs = match lv.batcher.infer(input, level, timeout).await {
            Ok((o, timing)) => {
                if let (Some(t), Some(queued)) = (trace, queued) {
                    t.stage("queue_wait", queued, timing.taken, Vec::new(), None);
                    let batch = t.stage(
                        "batch",
                        timing.taken,
                        timing.compute_end,
                        vec![
                            KeyValue::new("kiln.batch.rows", timing.rows as i64),
                            KeyValue::new("kiln.batch.requests", timing.requests as i64),
                            KeyValue::new("kiln.instance", timing.instance as i64),
                        ],
                        None,
                    );
                    t.stage(
                        "compute",
                        timing.compute_start,
                        timing.compute_end,
                        Vec::new(),
                        Some(&batch),
                    );
                }
                o
            }
            Err(f) => {
                let (kind, why) = match &f {
                    InferFailure::QueueFull { .. } => (ErrorKind::QueueFull, Failure::QueueFull),
                    InferFailure::Timeout(_) => (ErrorKind::Timeout, Failure::Timeout),
                    InferFailure::Internal(_) => {
                        tracing::error!(model = %name, version = lv.version, "{f}");
                        (ErrorKind::Internal, Failure::Internal)
                    }
                };
                vm.record_failure(why, t0.elapsed());
                return Err(ServiceError::new(kind, f.to_string()));
            }
        };
        if let Some(d) = drift
            && let Some(std) = outputs.iter().find(|t| t.name == "std")
            && let OutputData::F32(v) = &std.data
        {
            d.observe_std(v);
        }
        let _encode_span = kiln_model::prof_span!("serve_encode").entered();
        let encoding = trace.map(|_| Instant::now());
        let selected = select_outputs(&req, outputs).map_err(|e| bad(e.0))?;
        if let Some(why) = selected.iter().find_map(|(t, _)| t.non_finite()) {
            tracing::error!(model = %name, version = lv.version, "{why}");
            vm.record_failure(Failure::Internal, t0.elapsed());
            return Err(ServiceError::new(ErrorKind::Internal, why));
        }
        let answer = encode(lv, &req, selected);
        if let (Some(t), Some(encoding)) = (trace, encoding) {
            t.stage("encode", encoding, Instant::now(), Vec::new(), None);
        }
        vm.record_success(t0.elapsed());
        Ok(answer)
    }

    /// Run blocking repository work off the runtime's threads.
    pub async fn blocking<T: Send + 'static>(
        f: impl FnOnce() -> Result<T, RepoError> + Send + 'static,
    ) -> Result<T, ServiceError> {
        match tokio::task::spawn_blocking(f).await {
            Ok(r) => r.map_err(ServiceError::from),
            Err(e) => Err(ServiceError::new(
                ErrorKind::Internal,
                format!("the repository task failed: {e}"),
            )),
        }
    }
}

/// The version of `slot` a request names under the version policy (the latest version).
fn resolve_in(
    slot: &Arc<ModelSlot>,
    name: &str,
    version: Option<&str>,
) -> Result<Arc<LoadedVersion>, ServiceError> {
    let current = slot.current();
    let not_ready = || {
        let why = slot
            .last_error()
            .map(|e| format!("no version loaded ({e})"))
            .unwrap_or_else(|| "loading".into());
        ServiceError::new(
            ErrorKind::Unavailable,
            format!("model `{name}` is not ready: {why}"),
        )
    };
    let not_found = |msg: String| ServiceError::new(ErrorKind::NotFound, msg);
    let Some(v) = version else {
        return current.ok_or_else(not_ready);
    };
    let Ok(v) = v.parse::<u64>() else {
        return Err(not_found(format!(
            "model `{name}` has no version `{}` (versions are numbers)",
            clip(v)
        )));
    };
    if let Some(c) = current.as_ref().filter(|c| c.version == v) {
        return Ok(c.clone());
    }
    let available = slot.available();
    let serving = current.as_ref().map(|c| c.version);
    if !available.contains(&v) {
        return Err(not_found(format!(
            "model `{name}` has no version {v}; versions on disk: {:?}, serving: {}",
            available,
            serving.map_or("none".into(), |s| s.to_string())
        )));
    }
    match serving {
        Some(s) if v < s => Err(not_found(format!(
            "model `{name}` version {v} is not loaded: the version policy serves the latest version, {s}"
        ))),
        _ => Err(not_ready()),
    }
}
