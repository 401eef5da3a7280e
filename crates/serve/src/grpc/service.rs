//! The service adapter: tonic's generated `GrpcInferenceService` trait over the
//! transport-neutral [`Service`]. Each RPC turns its message into the service's terms
//! ([`wire`](super::wire)), calls the service — the one infer path, the views, the control
//! rules — and maps the answer or the [`ServiceError`] back; nothing here decides anything the
//! HTTP routes do not decide the same way.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::proto::grpc_inference_service_server::GrpcInferenceService;
use super::proto::*;
use super::wire::{self, encode_response, parse_request, status_of, version_of};
use crate::otel::RequestTrace;
use crate::protocol::InferRequest;
use crate::repository::{LoadedVersion, RepoError};
use crate::service::{PROXY_HEADERS, Service, Transport};

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

/// A request span's gRPC status attribute.
/// The OpenTelemetry semantic conventions' RPC server attributes of a call to `method` of
/// the KServe v2 service (the status code is added when it ends).
fn rpc_span_attributes(
    method: &'static str,
    local: Option<std::net::SocketAddr>,
) -> Vec<opentelemetry::KeyValue> {
    use opentelemetry::KeyValue;
    let mut a = vec![
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("rpc.service", "inference.GRPCInferenceService"),
        KeyValue::new("rpc.method", method),
        KeyValue::new("network.protocol.name", "http"),
        KeyValue::new("network.protocol.version", "2"),
    ];
    if let Some(l) = local {
        a.push(KeyValue::new("server.address", l.ip().to_string()));
        a.push(KeyValue::new("server.port", i64::from(l.port())));
    }
    a
}

/// The status a stream ends with when one of its messages cannot be read: tonic's
/// `OUT_OF_RANGE` for a message over the decoding limit becomes `RESOURCE_EXHAUSTED`, as a
/// unary call answers (the gRPC convention for a size limit).
fn stream_error(st: Status, max_bytes: usize) -> Status {
    if st.code() == tonic::Code::OutOfRange {
        Status::resource_exhausted(format!(
            "a stream message is larger than the limit of {max_bytes} bytes (--max-body-bytes); \
             the requests before it were answered: {}",
            st.message()
        ))
    } else {
        st
    }
}

fn status_code(code: tonic::Code) -> opentelemetry::KeyValue {
    opentelemetry::KeyValue::new("rpc.grpc.status_code", code as i64)
}

impl GrpcService {
    /// An inference over gRPC: the service's one infer path, with the protobuf request
    /// parser and response encoder.
    async fn infer(
        &self,
        mut r: ModelInferRequest,
        trace: Option<&RequestTrace>,
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
    let proxied = PROXY_HEADERS
        .into_iter()
        .find(|h| req.metadata().contains_key(*h));
    s.authorize_control(given, peer, proxied, Transport::Grpc)
        .map_err(status_of)
}

/// Run blocking repository work off the runtime's threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RepoError> + Send + 'static,
) -> Result<T, Status> {
    Service::blocking(f).await.map_err(status_of)
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
    Ok(wire::repository_index(entries))
}

/// `RepositoryModelLoad` (`POST /v2/repository/models/{m}/load`).
async fn repository_model_load(
    s: &Service,
    req: Request<RepositoryModelLoadRequest>,
) -> Result<RepositoryModelLoadResponse, Status> {
    authorize(s, &req)?;
    let r = req.into_inner();
    let params = wire::load_parameters(r.parameters);
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
        let readiness = self
            .state
            .model_readiness(&r.name, version_of(&r.version))
            .map_err(status_of)?;
        Ok(Response::new(ModelReadyResponse {
            ready: readiness.ready,
        }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(self.state.server_metadata().into()))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let r = req.into_inner();
        let m = self
            .state
            .model_metadata(&r.name, version_of(&r.version))
            .map_err(status_of)?;
        Ok(Response::new(m.into()))
    }

    type ModelStreamInferStream = ReceiverStream<Result<ModelStreamInferResponse, Status>>;

    /// Triton's bidirectional streaming inference: each request of the stream goes through
    /// the same path as `ModelInfer`; its answer (or its error, in `error_message`, the
    /// stream going on) is sent when it is ready, carrying the request's id, so answers come
    /// in completion order. At most [`STREAM_IN_FLIGHT`] requests of one stream are in
    /// flight: past that the stream is not read (HTTP/2 flow control holds the client back).
    /// A client that closes its side has its requests in flight answered, then the stream
    /// ends; one that goes away (or cancels) has its requests withdrawn from the queue. A
    /// message that cannot be read (over `--max-body-bytes`: `RESOURCE_EXHAUSTED`, as unary
    /// calls; or not a request) ends the stream with its status once the requests read
    /// before it are answered.
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
        let local = req.local_addr();
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
                    // A message that cannot be read (over the size limit, or not a request)
                    // ends the stream, but only after the requests read before it are
                    // answered: the framing gives no way past it.
                    Err(st) => {
                        let st = stream_error(st, svc.state.max_body_bytes);
                        loop {
                            tokio::select! {
                                done = tasks.join_next() => if done.is_none() { break },
                                _ = tx.closed() => {
                                    tasks.abort_all();
                                    return;
                                }
                            }
                        }
                        let _ = tx.send(Err(st)).await;
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
                            rpc_span_attributes("ModelStreamInfer", local),
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
                rpc_span_attributes("ModelInfer", req.local_addr()),
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
        let config = self
            .state
            .model_config(&r.name, version_of(&r.version))
            .map_err(status_of)?;
        Ok(Response::new(ModelConfigResponse {
            config: Some((&config).into()),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        // An empty name means every model, an empty version every loaded version.
        let r = req.into_inner();
        let stats = self
            .state
            .statistics(version_of(&r.name), version_of(&r.version))
            .map_err(status_of)?;
        Ok(Response::new(stats.into()))
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
