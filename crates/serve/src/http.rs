//! The HTTP transport: Open Inference Protocol v2 routes on axum, a thin adapter over the
//! transport-neutral [`Service`]. An inference reads the body within its limits and hands the
//! service its parser (JSON or the binary extension) and encoder; every other route answers
//! one of the service's [`records`](crate::records) as JSON. It holds no batching, lookup or
//! statistics logic.
//!
//! Status codes: 400 bad request, 404 unknown model, version or route, 405 wrong method,
//! 408 body not received in time, 413 body over the limit, 500 engine failure, 503 not
//! ready, queue full or timed out. Every error body is `{"error": "..."}`: the answers of
//! axum's own extractors (a model name that is not UTF-8, say) are rewritten by
//! [`json_errors`], and those hyper gives before any route runs by [`conn`](crate::conn).
//!
//! Besides inference: Triton's statistics extension
//! (`GET /v2/models[/{m}[/versions/{v}]]/stats`, answered by [`Service::statistics`]), the model
//! repository extension (`POST /v2/repository/index`, `POST /v2/repository/models/{m}/load` and
//! `/unload`, by the [`Repository`](crate::repository::Repository)) and on-demand
//! profiling (`POST /v2/profile?duration_ms=…`, by [`live_profile`]). The repository
//! and profiling routes are control endpoints: with `--control-token` they require
//! `Authorization: Bearer <token>` (401 otherwise), without one they answer loopback clients
//! only (403 otherwise); load and unload also need `--model-control-mode explicit` (400
//! otherwise).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, Version, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::Serialize;
use serde_json::{Value, json};

use crate::conn::{PeerAddr, is_body_timeout};
use crate::infer::EngineKind;
use crate::infer::auto::PROMETHEUS_HEADER;
use crate::live_profile::{self, ProfileError};
use crate::model::buckets;
use crate::observe::profiler::SortBy;
use crate::otel::RequestTrace;
use crate::protocol::{HEADER_LENGTH, InferRequest, bound_message, clip, encode_response};
use crate::repository::LoadedVersion;
use crate::service::{ErrorKind, LoadParameter, PROXY_HEADERS, Service, ServiceError, Transport};

type Shared = State<Arc<Service>>;

/// An error answer.
pub fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    let msg = bound_message(msg.into());
    (status, axum::Json(json!({"error": msg}))).into_response()
}

/// The HTTP status of a service error.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable | ErrorKind::QueueFull | ErrorKind::Timeout => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
    }
}

/// A service error as an HTTP answer (`WWW-Authenticate: Bearer` on 401).
fn failed(e: ServiceError) -> Response {
    let mut r = error(status_of(e.kind), e.message);
    if e.kind == ErrorKind::Unauthenticated {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    r
}

fn ok_json(v: Value) -> Response {
    (StatusCode::OK, axum::Json(v)).into_response()
}

/// One of the service's [`records`](crate::records) as a JSON answer with `status` (through
/// a `Value`: its keys come out sorted, as kiln's answers always had them).
fn record<T: Serialize>(status: StatusCode, r: &T) -> Response {
    match serde_json::to_value(r) {
        Ok(v) => (status, axum::Json(v)).into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write the answer: {e}"),
        ),
    }
}

/// A service answer: the record (200) or the error.
fn answer<T: Serialize>(r: Result<T, ServiceError>) -> Response {
    match r {
        Ok(v) => record(StatusCode::OK, &v),
        Err(e) => failed(e),
    }
}

/// The router.
pub fn router(state: Arc<Service>) -> Router {
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/config", get(model_config))
        .route("/v2/models/{name}/infer", post(infer))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(model_metadata_v),
        )
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(model_ready_v),
        )
        .route(
            "/v2/models/{name}/versions/{version}/config",
            get(model_config_v),
        )
        .route("/v2/models/{name}/versions/{version}/infer", post(infer_v))
        .route("/v2/models/{name}/drift", get(drift_model))
        .route(
            "/v2/models/{name}/versions/{version}/drift",
            get(drift_version),
        )
        .route("/v2/models/stats", get(stats_all))
        .route("/v2/models/{name}/stats", get(stats_model))
        .route(
            "/v2/models/{name}/versions/{version}/stats",
            get(stats_version),
        )
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{name}/load", post(repository_load))
        .route(
            "/v2/repository/models/{name}/unload",
            post(repository_unload),
        )
        .route("/v2/profile", post(profile))
        .route("/metrics", get(metrics))
        .fallback(|req: axum::extract::Request| async move {
            error(
                StatusCode::NOT_FOUND,
                format!(
                    "no route {} {}; see GET /v2 and GET /v2/models/<name>",
                    req.method(),
                    req.uri().path()
                ),
            )
        })
        .method_not_allowed_fallback(|req: axum::extract::Request| async move {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!(
                    "method {} is not allowed on {}",
                    req.method(),
                    req.uri().path()
                ),
            )
        })
        .layer(axum::middleware::map_response(json_errors))
        .with_state(state)
}

/// Turns an error answer that is not JSON (axum's extractor rejections are plain text) into
/// `{"error": "<its text>"}`, keeping the status and the other headers.
pub async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error())
        || resp
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/json"))
    {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let msg = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_string()
    } else {
        text
    };
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut out = error(status, msg);
    for (k, v) in parts.headers.iter() {
        out.headers_mut().entry(k).or_insert_with(|| v.clone());
    }
    out
}

async fn live() -> Response {
    ok_json(json!({"live": true}))
}

async fn ready(State(s): Shared) -> Response {
    if s.repo.ready() {
        ok_json(json!({"ready": true}))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"ready": false})),
        )
            .into_response()
    }
}

async fn server_metadata(State(s): Shared) -> Response {
    record(StatusCode::OK, &s.server_metadata())
}

async fn metrics(State(s): Shared) -> Response {
    let mut body = s.metrics.render();
    body.push_str(&auto_engine_metrics(&s));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// `kiln_auto_engine_choice` lines for the models served on the `auto` engine.
fn auto_engine_metrics(s: &Service) -> String {
    let cfg = s.repo.config();
    if cfg.engine != EngineKind::Auto {
        return String::new();
    }
    let (threads, buckets) = (
        cfg.batcher.threads_per_instance,
        buckets(cfg.batcher.max_batch_size),
    );
    let mut names = s.repo.names();
    names.sort();
    let lines: String = names
        .iter()
        .filter_map(|n| {
            let choice = s
                .repo
                .get(n)?
                .current()?
                .spec
                .auto_choice(threads, &buckets)?;
            Some(choice.prometheus_lines(n))
        })
        .collect();
    if lines.is_empty() {
        lines
    } else {
        format!("{}{lines}", PROMETHEUS_HEADER)
    }
}

async fn model_metadata(State(s): Shared, Path(name): Path<String>) -> Response {
    metadata_for(&s, &name, None)
}

async fn model_metadata_v(State(s): Shared, Path((name, v)): Path<(String, String)>) -> Response {
    metadata_for(&s, &name, Some(&v))
}

fn metadata_for(s: &Service, name: &str, v: Option<&str>) -> Response {
    answer(s.model_metadata(name, v))
}

async fn model_ready(State(s): Shared, Path(name): Path<String>) -> Response {
    ready_for(&s, &name, None)
}

async fn model_ready_v(State(s): Shared, Path((name, v)): Path<(String, String)>) -> Response {
    ready_for(&s, &name, Some(&v))
}

fn ready_for(s: &Service, name: &str, v: Option<&str>) -> Response {
    match s.model_readiness(name, v) {
        Ok(r) if r.ready => record(StatusCode::OK, &r),
        Ok(r) => record(StatusCode::SERVICE_UNAVAILABLE, &r),
        Err(e) => failed(e),
    }
}

async fn model_config(State(s): Shared, Path(name): Path<String>) -> Response {
    config_for(&s, &name, None)
}

async fn model_config_v(State(s): Shared, Path((name, v)): Path<(String, String)>) -> Response {
    config_for(&s, &name, Some(&v))
}

async fn drift_model(State(s): Shared, Path(name): Path<String>) -> Response {
    drift_for(&s, &name, None)
}

async fn drift_version(State(s): Shared, Path((name, v)): Path<(String, String)>) -> Response {
    drift_for(&s, &name, Some(&v))
}

/// The version's input drift and latency watch (`GET /v2/models/<m>[/versions/<v>]/drift`).
fn drift_for(s: &Service, name: &str, v: Option<&str>) -> Response {
    let lv = match s.lookup(name, v) {
        Ok(x) => x,
        Err(e) => return failed(e),
    };
    let vm = &lv.metrics;
    let Some(d) = vm.drift.get() else {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "model `{}` version {} has no drift reference (a pick model, or a checkpoint exported by an older kiln: retrain to get its training sketches)",
                lv.model, lv.version
            ),
        );
    };
    ok_json(json!({
        "name": lv.model,
        "version": lv.version.to_string(),
        "drift": d.report(vm.since),
        "latency": vm.latency.get().map(|w| w.buckets()),
    }))
}

fn config_for(s: &Service, name: &str, v: Option<&str>) -> Response {
    answer(s.model_config(name, v))
}

async fn infer(
    State(s): Shared,
    Path(name): Path<String>,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let at = HttpRoute {
        route: "/v2/models/{model_name}/infer",
        name: "POST /v2/models/{model_name}/infer",
        uri,
        version,
    };
    infer_for(s, name, None, at, headers, body).await
}

async fn infer_v(
    State(s): Shared,
    Path((name, v)): Path<(String, String)>,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let at = HttpRoute {
        route: "/v2/models/{model_name}/versions/{model_version}/infer",
        name: "POST /v2/models/{model_name}/versions/{model_version}/infer",
        uri,
        version,
    };
    infer_for(s, name, Some(v), at, headers, body).await
}

/// Where an inference request arrived: its route (for the span's name and `http.route`),
/// the request's URI and HTTP version.
struct HttpRoute {
    route: &'static str,
    name: &'static str,
    uri: Uri,
    version: Version,
}

/// The OpenTelemetry semantic conventions' HTTP server attributes of a request (the
/// response's status code is added when it ends). `server.address`/`server.port` come from
/// the `Host` header, as the conventions say for a server span.
fn http_span_attributes(at: &HttpRoute, headers: &HeaderMap) -> Vec<opentelemetry::KeyValue> {
    use opentelemetry::KeyValue;
    let protocol = match at.version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_11 => "1.1",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    };
    let mut a = vec![
        KeyValue::new("http.request.method", "POST"),
        KeyValue::new("http.route", at.route),
        KeyValue::new("url.path", at.uri.path().to_string()),
        KeyValue::new("url.scheme", "http"),
        KeyValue::new("network.protocol.name", "http"),
        KeyValue::new("network.protocol.version", protocol),
    ];
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| at.uri.authority().map(|a| a.to_string()));
    if let Some((address, port)) = host.as_deref().and_then(split_host) {
        a.push(KeyValue::new("server.address", address));
        if let Some(p) = port {
            a.push(KeyValue::new("server.port", i64::from(p)));
        }
    }
    a
}

/// `host[:port]` (an IPv6 literal in brackets) as address and port; `None` when empty or
/// malformed.
fn split_host(h: &str) -> Option<(String, Option<u16>)> {
    let h = h.trim();
    if h.is_empty() {
        return None;
    }
    if let Some(rest) = h.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((addr.to_string(), port));
    }
    match h.rsplit_once(':') {
        Some((addr, p)) if !addr.contains(':') => Some((addr.to_string(), Some(p.parse().ok()?))),
        Some(_) => None,
        None => Some((h.to_string(), None)),
    }
}

async fn read_body(s: &Service, headers: &HeaderMap, body: Body) -> Result<Bytes, Response> {
    let too_big = |n: Option<u64>| {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "request body {}exceeds the limit of {} bytes (--max-body-bytes)",
                n.map(|n| format!("of {n} bytes ")).unwrap_or_default(),
                s.max_body_bytes
            ),
        )
    };
    if let Some(n) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && n > s.max_body_bytes as u64
    {
        return Err(too_big(Some(n)));
    }
    match Limited::new(body, s.max_body_bytes).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_big(None)),
        Err(e) if is_body_timeout(&*e) => Err(error(StatusCode::REQUEST_TIMEOUT, e.to_string())),
        Err(e) => Err(error(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {e}"),
        )),
    }
}

async fn infer_for(
    s: Arc<Service>,
    name: String,
    version: Option<String>,
    at: HttpRoute,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let resp = infer_inner(&s, &name, version.as_deref(), &at, &headers, body).await;
    s.metrics.infer_response(resp.status().as_u16());
    resp
}

/// An inference over HTTP: read the body within its limits, then the service's one infer
/// path, with the JSON or binary-extension request parser and response encoder.
async fn infer_inner(
    s: &Service,
    name: &str,
    version: Option<&str>,
    at: &HttpRoute,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let trace = s.tracing.as_ref().and_then(|t| {
        let h = |k: &str| headers.get(k).and_then(|v| v.to_str().ok());
        t.request(
            at.name,
            h("traceparent"),
            h("tracestate"),
            "http",
            http_span_attributes(at, headers),
        )
    });
    let resp = infer_traced(s, name, version, headers, body, trace.as_ref()).await;
    let Some(t) = trace else {
        return resp;
    };
    let status = resp.status();
    let tr = t.finish(
        opentelemetry::KeyValue::new("http.response.status_code", status.as_u16() as i64),
        (!status.is_success()).then(|| status.as_str()),
    );
    let mut resp = resp;
    if let Ok(v) = HeaderValue::from_str(&tr) {
        resp.headers_mut().insert("traceresponse", v);
    }
    resp
}

async fn infer_traced(
    s: &Service,
    name: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    body: Body,
    trace: Option<&RequestTrace>,
) -> Response {
    let body = match read_body(s, headers, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .filter(|enc| enc.as_bytes() != b"identity")
        .map(|enc| format!("{enc:?}"));
    let hlen = headers
        .get(HEADER_LENGTH)
        .map(|v| v.to_str().unwrap_or("?").to_string());
    let size = body.len();
    let parse = move || {
        if let Some(enc) = encoding {
            return Err(format!(
                "Content-Encoding {} is not supported; send an uncompressed body",
                clip(&enc)
            ));
        }
        InferRequest::parse(body, hlen.as_deref()).map_err(|e| e.0)
    };
    let encode = |lv: &LoadedVersion, req: &InferRequest, selected: Vec<_>| {
        encode_response(
            &lv.model,
            &lv.version.to_string(),
            req.id.as_deref(),
            &selected,
        )
    };
    let enc = match s.infer(name, version, size, trace, parse, encode).await {
        Ok(enc) => enc,
        Err(e) => return failed(e),
    };
    let mut resp = Response::new(Body::from(enc.body));
    let h = resp.headers_mut();
    match enc.header_length {
        Some(n) => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(HEADER_LENGTH, HeaderValue::from(n));
        }
        None => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    resp
}

fn stats_for(s: &Service, name: Option<&str>, version: Option<&str>) -> Response {
    answer(s.statistics(name, version))
}

async fn stats_all(State(s): Shared) -> Response {
    stats_for(&s, None, None)
}

async fn stats_model(State(s): Shared, Path(name): Path<String>) -> Response {
    stats_for(&s, Some(&name), None)
}

async fn stats_version(State(s): Shared, Path((name, v)): Path<(String, String)>) -> Response {
    stats_for(&s, Some(&name), Some(&v))
}

/// The refusal of a control request, if it may not proceed: it needs the bearer token when
/// one is set, else a loopback client ([`Service::authorize_control`]).
fn refused(
    s: &Service,
    headers: &HeaderMap,
    ext: &axum::http::Extensions,
) -> Option<Box<Response>> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let peer = ext.get::<PeerAddr>().map(|PeerAddr(p)| p.ip());
    let proxied = PROXY_HEADERS.into_iter().find(|h| headers.contains_key(*h));
    s.authorize_control(given, peer, proxied, Transport::Http)
        .err()
        .map(|e| Box::new(failed(e)))
}

async fn repository_index(
    State(s): Shared,
    headers: HeaderMap,
    ext: axum::http::Extensions,
    body: Bytes,
) -> Response {
    if let Some(r) = refused(&s, &headers, &ext) {
        return *r;
    }
    let ready_only = if body.iter().all(u8::is_ascii_whitespace) {
        false
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => match v.get("ready") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("`ready` must be true or false, not {other}"),
                    );
                }
            },
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the index request body is not JSON: {e}"),
                );
            }
        }
    };
    let repo = s.repo.clone();
    match Service::blocking(move || repo.index(ready_only)).await {
        Ok(entries) => ok_json(serde_json::to_value(entries).unwrap_or(Value::Null)),
        Err(e) => failed(e),
    }
}

async fn repository_load(
    State(s): Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
    ext: axum::http::Extensions,
    body: Bytes,
) -> Response {
    if let Some(r) = refused(&s, &headers, &ext) {
        return *r;
    }
    let params = if body.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v) => match v.get("parameters") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Object(m)) => m
                    .iter()
                    .map(|(k, v)| {
                        let p = match v {
                            Value::String(t) => LoadParameter::Text(t.clone()),
                            other => LoadParameter::Other(other.to_string()),
                        };
                        (k.clone(), p)
                    })
                    .collect(),
                Some(other) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "`parameters` of a load request must be an object, not {}",
                            clip(&other.to_string())
                        ),
                    );
                }
            },
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the load request body is not JSON: {e}"),
                );
            }
        }
    };
    if let Err(e) = s.check_load_parameters(&name, &params) {
        return failed(e);
    }
    let repo = s.repo.clone();
    match Service::blocking(move || {
        let v = repo.load_model(&name)?;
        Ok((name, v))
    })
    .await
    {
        Ok((name, v)) => ok_json(json!({"name": name, "version": v.to_string()})),
        Err(e) => failed(e),
    }
}

async fn repository_unload(
    State(s): Shared,
    Path(name): Path<String>,
    headers: HeaderMap,
    ext: axum::http::Extensions,
) -> Response {
    if let Some(r) = refused(&s, &headers, &ext) {
        return *r;
    }
    let repo = s.repo.clone();
    // Requests in flight end within their deadline; wait a little longer than that.
    let drain = s.request_timeout + Duration::from_secs(5);
    match Service::blocking(move || repo.unload_model(&name, drain)).await {
        Ok(()) => ok_json(json!({})),
        Err(e) => failed(e),
    }
}

/// The query of `POST /v2/profile`.
#[derive(Debug, serde::Deserialize)]
struct ProfileQuery {
    duration_ms: Option<u64>,
}

async fn profile(
    State(s): Shared,
    headers: HeaderMap,
    ext: axum::http::Extensions,
    query: Result<Query<ProfileQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Some(r) = refused(&s, &headers, &ext) {
        return *r;
    }
    let Some(root) = s.profile_dir.clone() else {
        return error(
            StatusCode::BAD_REQUEST,
            "on-demand profiling is off; start kiln serve with --profile-dir DIR",
        );
    };
    let ms = match query {
        Ok(Query(q)) => q.duration_ms.unwrap_or(1000),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("bad query: {e}; expected ?duration_ms=<milliseconds>"),
            );
        }
    };
    let window = match live_profile::window(ms) {
        Ok(w) => w,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match live_profile::record_bounded(&root, window, s.profile_max_events, s.profile_max_bytes)
        .await
    {
        Ok(p) => ok_json(json!({
            "dir": p.dir.display().to_string(),
            "trace": p.outputs.trace.display().to_string(),
            "key_averages": p.outputs.table_txt.display().to_string(),
            "key_averages_json": p.outputs.table_json.display().to_string(),
            "events": p.events,
            "dropped_events": p.dropped,
            "max_events": s.profile_max_events,
            "bytes": p.bytes,
            "max_bytes": s.profile_max_bytes,
            "message": (p.dropped > 0).then(|| format!(
                "dropped {} events: the recording keeps at most {} events and {} bytes (its \
                 memory stays bounded); ask for a shorter window",
                p.dropped,
                s.profile_max_events,
                s.profile_max_bytes
            )),
            "duration_ms": ms,
            "table": p.outputs.averages.table(SortBy::Total, 30),
        })),
        Err(e @ ProfileError::Busy) => error(StatusCode::CONFLICT, e.to_string()),
        Err(e @ ProfileError::Invalid(_)) => error(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ ProfileError::Empty(_)) => ok_json(json!({
            "events": 0,
            "duration_ms": ms,
            "message": e.to_string(),
        })),
        Err(e @ ProfileError::Io { .. }) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_attributes_follow_the_http_semantic_conventions() {
        let at = HttpRoute {
            route: "/v2/models/{model_name}/infer",
            name: "POST /v2/models/{model_name}/infer",
            uri: "/v2/models/tiny/infer".parse().unwrap(),
            version: Version::HTTP_11,
        };
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("scorer.local:8000"));
        let a: std::collections::HashMap<String, String> = http_span_attributes(&at, &headers)
            .into_iter()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect();
        for (k, v) in [
            ("http.request.method", "POST"),
            ("http.route", "/v2/models/{model_name}/infer"),
            ("url.path", "/v2/models/tiny/infer"),
            ("url.scheme", "http"),
            ("network.protocol.version", "1.1"),
            ("server.address", "scorer.local"),
            ("server.port", "8000"),
        ] {
            assert_eq!(a.get(k).map(String::as_str), Some(v), "{k}: {a:?}");
        }
    }

    #[test]
    fn host_headers_split_into_address_and_port() {
        assert_eq!(split_host("a:80"), Some(("a".into(), Some(80))));
        assert_eq!(split_host("a"), Some(("a".into(), None)));
        assert_eq!(split_host("[::1]:8000"), Some(("::1".into(), Some(8000))));
        assert_eq!(split_host("[::1]"), Some(("::1".into(), None)));
        for bad in ["", "a:b", "a:99999", "[::1", "[::1]x", "::1"] {
            assert_eq!(split_host(bad), None, "{bad}");
        }
    }
}
