//! OpenTelemetry tracing of inference requests, configured by kiln's flags
//! (`kiln serve --otlp-endpoint URL --otlp-protocol grpc|http/protobuf --trace-sample-ratio R`)
//! or by the standard OpenTelemetry environment variables (`OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`,
//! `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`, `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_TRACES_EXPORTER`,
//! `OTEL_SDK_DISABLED`); a kiln flag given wins over the variable ([`TraceConfig::resolve`]).
//!
//! An inference request that arrives with a W3C `traceparent` (HTTP header or gRPC metadata;
//! `tracestate` is carried along) gets a SERVER span that is the caller's child, so kiln's part
//! joins the caller's trace; one without starts a new trace. Sampling is parent-based by
//! default: a caller's sampled flag decides, and a request without a parent is sampled with
//! probability `--trace-sample-ratio` (by trace id, so the decision is the same on every hop).
//! The request span is named after the route or RPC (`POST /v2/models/{model_name}/infer`,
//! `inference.GRPCInferenceService/ModelInfer`) and carries the semantic conventions'
//! attributes (HTTP: `http.request.method`, `http.route`, `http.response.status_code`,
//! `url.path`, `url.scheme`, `server.address`, `server.port`, `network.protocol.version`;
//! gRPC: `rpc.system`, `rpc.service`, `rpc.method`, `rpc.grpc.status_code`, `server.address`,
//! `server.port`). A sampled request's span has one child per stage, with the stage's own
//! measured start and end:
//!
//! | span | from | to |
//! |---|---|---|
//! | `decode` | the request reaches the service | its tensors are decoded against the model |
//! | `queue_wait` | queued | its batch leaves the queue |
//! | `batch` | the batch leaves the queue | its answers are sent (attributes: rows, requests, instance) |
//! | `compute` (child of `batch`) | the engine starts | the engine returns |
//! | `encode` | outputs selected | the response is encoded |
//!
//! The answer carries `traceresponse: 00-<trace id>-<server span id>-<flags>` (W3C Trace Context
//! level 2) so a caller can find the server's span. Spans leave through the OpenTelemetry SDK's
//! batch processor (its own thread, a bounded queue that drops when full) and the OTLP/gRPC
//! exporter or kiln's OTLP/HTTP one (protobuf, `POST …/v1/traces`); nothing on the request
//! path waits for the collector.
//!
//! With tracing off a request costs one branch on a `None`; with it on and a request not
//! sampled, parsing the header and the sampler's decision. `kiln bench serve` measures both.

use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};

use crate::error::ServeError;

/// The OTLP transport spans leave by (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC (`grpc`): `TraceService/Export` on the collector's gRPC port (4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (`http/protobuf`): `POST <endpoint>/v1/traces` (4318).
    HttpProtobuf,
}

impl OtlpProtocol {
    /// The name the OpenTelemetry specification gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }
}

impl std::str::FromStr for OtlpProtocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "grpc" => Ok(Self::Grpc),
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "http/json" => {
                Err("`http/json` is not supported; use `grpc` or `http/protobuf`".into())
            }
            other => Err(format!("`{other}`; expected `grpc` or `http/protobuf`")),
        }
    }
}

/// Which requests are traced: `OTEL_TRACES_SAMPLER`'s choices. `always_on` is a ratio of 1,
/// `always_off` one of 0; `parentbased_*` lets a caller's sampled flag decide for its own
/// requests and applies the ratio to requests without a parent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceSampler {
    /// A caller's `traceparent` decides for its own requests.
    pub parent_based: bool,
    /// Share of the requests (without a parent, when parent-based) that are traced (0 to 1).
    pub ratio: f64,
}

impl Default for TraceSampler {
    /// `parentbased_always_on`, the specification's default.
    fn default() -> Self {
        Self {
            parent_based: true,
            ratio: 1.0,
        }
    }
}

impl TraceSampler {
    /// Parse `OTEL_TRACES_SAMPLER` (and its `OTEL_TRACES_SAMPLER_ARG`, the ratio of the
    /// `*traceidratio` samplers, 1 when absent).
    pub fn from_env_values(name: &str, arg: Option<&str>) -> Result<Self, String> {
        let ratio = || -> Result<f64, String> {
            match arg {
                None => Ok(1.0),
                Some(a) => match a.trim().parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                    _ => Err(format!("OTEL_TRACES_SAMPLER_ARG is `{a}`; expected 0 to 1")),
                },
            }
        };
        let (parent_based, ratio) = match name.trim() {
            "always_on" => (false, 1.0),
            "always_off" => (false, 0.0),
            "traceidratio" => (false, ratio()?),
            "parentbased_always_on" => (true, 1.0),
            "parentbased_always_off" => (true, 0.0),
            "parentbased_traceidratio" => (true, ratio()?),
            other => {
                return Err(format!(
                    "OTEL_TRACES_SAMPLER is `{other}`; expected always_on, always_off, \
                     traceidratio, parentbased_always_on, parentbased_always_off or \
                     parentbased_traceidratio"
                ));
            }
        };
        Ok(Self {
            parent_based,
            ratio,
        })
    }

    fn sdk(self) -> Sampler {
        let root = if self.ratio >= 1.0 {
            Sampler::AlwaysOn
        } else if self.ratio <= 0.0 {
            Sampler::AlwaysOff
        } else {
            Sampler::TraceIdRatioBased(self.ratio)
        };
        if self.parent_based {
            Sampler::ParentBased(Box::new(root))
        } else {
            root
        }
    }
}

/// Tracing settings given by kiln's own flags or configuration; each one that is `None` comes
/// from the standard OpenTelemetry environment variables instead (see [`TraceConfig::resolve`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TraceConfig {
    /// The collector (`--otlp-endpoint`, e.g. `http://host:4317` for gRPC or
    /// `http://host:4318` for HTTP, where `/v1/traces` is appended).
    pub endpoint: Option<String>,
    /// The transport (`--otlp-protocol`).
    pub protocol: Option<OtlpProtocol>,
    /// Probability that a request without a sampled parent is traced, 0 to 1
    /// (`--trace-sample-ratio`; parent-based).
    pub sample_ratio: Option<f64>,
    /// `service.name` of the spans.
    pub service_name: Option<String>,
}

/// Tracing settings with the environment applied: what [`Tracing::start`] runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedTrace {
    /// Where spans are sent: the gRPC endpoint, or the full OTLP/HTTP URL (`…/v1/traces`).
    pub endpoint: String,
    /// The transport.
    pub protocol: OtlpProtocol,
    /// The sampler.
    pub sampler: TraceSampler,
    /// The resource's attributes, `service.name` among them (first).
    pub resource: Vec<(String, String)>,
    /// Headers sent with every OTLP/HTTP export (`OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`; the
    /// gRPC exporter reads those variables itself).
    pub headers: Vec<(String, String)>,
}

impl ResolvedTrace {
    /// The resource's `service.name`.
    pub fn service_name(&self) -> &str {
        self.resource
            .iter()
            .find(|(k, _)| k == "service.name")
            .map_or("kiln-serve", |(_, v)| v.as_str())
    }
}

/// The `service.name` when neither kiln's configuration nor the environment names one.
pub const DEFAULT_SERVICE_NAME: &str = "kiln-serve";

impl TraceConfig {
    /// Apply the process's environment: [`TraceConfig::resolve`] over `std::env`.
    pub fn resolve_from_env(&self) -> Result<Option<ResolvedTrace>, ServeError> {
        self.resolve(&|k| std::env::var(k).ok())
    }

    /// The settings in force, `Ok(None)` when tracing is off. Each setting comes from the
    /// first of: kiln's flag/configuration, the signal-specific OpenTelemetry variable, the
    /// general one, kiln's default. An empty variable counts as unset.
    ///
    /// | setting | kiln | environment | default |
    /// |---|---|---|---|
    /// | on/off | `endpoint` | `OTEL_SDK_DISABLED=true` turns it off; an endpoint variable or `OTEL_TRACES_EXPORTER=otlp` turns it on (`none` off) | off |
    /// | endpoint | `endpoint` | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (as is), `OTEL_EXPORTER_OTLP_ENDPOINT` (HTTP: `/v1/traces` appended) | `http://localhost:4317` (gRPC), `http://localhost:4318/v1/traces` (HTTP) |
    /// | protocol | `protocol` | `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, `OTEL_EXPORTER_OTLP_PROTOCOL` | `grpc` |
    /// | sampler | `sample_ratio` (parent-based ratio) | `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG` | `parentbased_always_on` |
    /// | `service.name` | `service_name` | `OTEL_SERVICE_NAME`, then `service.name` in `OTEL_RESOURCE_ATTRIBUTES` | `kiln-serve` |
    /// | other resource attributes | — | `OTEL_RESOURCE_ATTRIBUTES` (`k=v,k2=v2`, values percent-decoded) | — |
    ///
    /// kiln's flag given (`--otlp-endpoint`) turns tracing on even under `OTEL_SDK_DISABLED`.
    /// A malformed variable is an error naming it, not ignored.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<ResolvedTrace>, ServeError> {
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let bad = |m: String| ServeError::Config(m);
        let traces_endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base_endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT");
        if self.endpoint.is_none() {
            let disabled =
                var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
            let exporter = var("OTEL_TRACES_EXPORTER").map(|v| v.trim().to_ascii_lowercase());
            if let Some(e) = &exporter
                && e != "otlp"
                && e != "none"
            {
                return Err(bad(format!(
                    "OTEL_TRACES_EXPORTER is `{e}`; kiln exports `otlp` (or `none`)"
                )));
            }
            let wanted = match exporter.as_deref() {
                Some("none") => false,
                Some(_) => true,
                None => traces_endpoint.is_some() || base_endpoint.is_some(),
            };
            if disabled || !wanted {
                return Ok(None);
            }
        }
        let protocol = match self.protocol {
            Some(p) => p,
            None => {
                let (name, value) = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
                    Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(v)),
                    None => (
                        "OTEL_EXPORTER_OTLP_PROTOCOL",
                        var("OTEL_EXPORTER_OTLP_PROTOCOL"),
                    ),
                };
                match value {
                    Some(v) => v
                        .parse()
                        .map_err(|e: String| bad(format!("{name} is {e}")))?,
                    None => OtlpProtocol::Grpc,
                }
            }
        };
        let (endpoint, source) = match (&self.endpoint, traces_endpoint, base_endpoint) {
            (Some(e), _, _) => (signal_url(e, protocol), "--otlp-endpoint"),
            (None, Some(e), _) => (e, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            (None, None, Some(e)) => (signal_url(&e, protocol), "OTEL_EXPORTER_OTLP_ENDPOINT"),
            (None, None, None) => match protocol {
                OtlpProtocol::Grpc => ("http://localhost:4317".to_string(), "the default"),
                OtlpProtocol::HttpProtobuf => {
                    ("http://localhost:4318/v1/traces".to_string(), "the default")
                }
            },
        };
        let endpoint = endpoint.trim().to_string();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(bad(format!(
                "{source} is `{endpoint}`; expected an http:// or https:// URL such as \
                 http://127.0.0.1:4317 (grpc) or http://127.0.0.1:4318 (http/protobuf)"
            )));
        }
        let sampler = match (self.sample_ratio, var("OTEL_TRACES_SAMPLER")) {
            (Some(r), _) => {
                if !(0.0..=1.0).contains(&r) {
                    return Err(bad(format!("--trace-sample-ratio is {r}; expected 0 to 1")));
                }
                TraceSampler {
                    parent_based: true,
                    ratio: r,
                }
            }
            (None, Some(name)) => {
                TraceSampler::from_env_values(&name, var("OTEL_TRACES_SAMPLER_ARG").as_deref())
                    .map_err(bad)?
            }
            (None, None) => TraceSampler::default(),
        };
        let mut attributes = match var("OTEL_RESOURCE_ATTRIBUTES") {
            Some(v) => parse_resource_attributes(&v)
                .map_err(|e| bad(format!("OTEL_RESOURCE_ATTRIBUTES: {e}")))?,
            None => Vec::new(),
        };
        let from_attributes = attributes
            .iter()
            .position(|(k, _)| k == "service.name")
            .map(|i| attributes.remove(i).1);
        let service = self
            .service_name
            .clone()
            .or_else(|| var("OTEL_SERVICE_NAME").map(|s| s.trim().to_string()))
            .or(from_attributes)
            .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
        attributes.insert(0, ("service.name".to_string(), service));
        let headers = match var("OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
            Some(v) => Some(("OTEL_EXPORTER_OTLP_TRACES_HEADERS", v)),
            None => var("OTEL_EXPORTER_OTLP_HEADERS").map(|v| ("OTEL_EXPORTER_OTLP_HEADERS", v)),
        };
        let headers = match headers {
            Some((name, v)) => {
                parse_resource_attributes(&v).map_err(|e| bad(format!("{name}: {e}")))?
            }
            None => Vec::new(),
        };
        Ok(Some(ResolvedTrace {
            endpoint,
            protocol,
            sampler,
            resource: attributes,
            headers,
        }))
    }
}

/// A base endpoint as the URL of the traces signal: OTLP/HTTP appends `v1/traces` to the
/// base's path; gRPC takes it as is.
fn signal_url(base: &str, protocol: OtlpProtocol) -> String {
    match protocol {
        OtlpProtocol::Grpc => base.to_string(),
        OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", base.trim().trim_end_matches('/')),
    }
}

/// `OTEL_RESOURCE_ATTRIBUTES` (and `OTEL_EXPORTER_OTLP_HEADERS`): `key=value` pairs separated
/// by commas, keys and values trimmed, values percent-decoded (W3C Baggage octets); a later
/// duplicate key wins.
pub fn parse_resource_attributes(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, item) in s.split(',').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!(
                "item {} (`{}`) is not `key=value`",
                i + 1,
                item.trim()
            ));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("item {} (`{}`) has no key", i + 1, item.trim()));
        }
        let v = percent_decode(v.trim())
            .ok_or_else(|| format!("the value of `{k}` is not valid percent-encoded UTF-8"))?;
        out.retain(|(key, _)| key != k);
        out.push((k.to_string(), v));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The OTLP/HTTP (protobuf) span exporter: each batch is one `ExportTraceServiceRequest`
/// POSTed to the traces URL (`Content-Type: application/x-protobuf`). It blocks, which is
/// what the batch processor's own thread expects; nothing on the request path calls it.
struct OtlpHttpExporter {
    url: String,
    headers: Vec<(String, String)>,
    agent: ureq::Agent,
    resource: opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema,
}

impl std::fmt::Debug for OtlpHttpExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OtlpHttpExporter({})", self.url)
    }
}

impl OtlpHttpExporter {
    fn new(url: String, headers: Vec<(String, String)>, timeout: Duration) -> Self {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .user_agent(format!("kiln-serve/{}", env!("CARGO_PKG_VERSION")))
            .build();
        Self {
            url,
            headers,
            agent: ureq::Agent::new_with_config(config),
            resource: Default::default(),
        }
    }

    fn send(&self, batch: Vec<opentelemetry_sdk::trace::SpanData>) -> Result<(), String> {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;
        let request = ExportTraceServiceRequest {
            resource_spans:
                opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope(
                    batch,
                    &self.resource,
                ),
        };
        let body = request.encode_to_vec();
        let mut post = self.agent.post(&self.url);
        for (k, v) in &self.headers {
            post = post.header(k.as_str(), v.as_str());
        }
        let resp = post
            .header("Content-Type", "application/x-protobuf")
            .send(&body[..])
            .map_err(|e| format!("POST {}: {e}", self.url))?;
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("POST {}: HTTP {status}", self.url))
        }
    }
}

impl opentelemetry_sdk::trace::SpanExporter for OtlpHttpExporter {
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        let result = self
            .send(batch)
            .map_err(opentelemetry_sdk::error::OTelSdkError::InternalFailure);
        std::future::ready(result)
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.resource = resource.into();
    }
}

/// The server's tracer (one per server).
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    parent_based: bool,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracing")
    }
}

impl Tracing {
    /// Resolve `cfg` against the environment ([`TraceConfig::resolve`]), then start the
    /// exporter and the batch processor; must run inside the server's tokio runtime (the
    /// gRPC exporter's channel lives there). `Ok(None)` when tracing is off.
    pub fn start(cfg: &TraceConfig) -> Result<Option<Self>, ServeError> {
        match cfg.resolve_from_env()? {
            Some(r) => Self::start_resolved(&r).map(Some),
            None => Ok(None),
        }
    }

    /// Start tracing with settings already resolved.
    pub fn start_resolved(r: &ResolvedTrace) -> Result<Self, ServeError> {
        let timeout = Duration::from_secs(5);
        let batch_config = || {
            BatchConfigBuilder::default()
                .with_max_queue_size(8192)
                .with_scheduled_delay(Duration::from_millis(500))
                .build()
        };
        let batch = match r.protocol {
            OtlpProtocol::Grpc => {
                use opentelemetry_otlp::WithExportConfig as _;
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(r.endpoint.clone())
                    .with_timeout(timeout)
                    .build()
                    .map_err(|e| {
                        ServeError::Config(format!(
                            "OTLP endpoint {}: cannot build the OTLP/gRPC exporter: {e}",
                            r.endpoint
                        ))
                    })?;
                BatchSpanProcessor::builder(exporter)
                    .with_batch_config(batch_config())
                    .build()
            }
            OtlpProtocol::HttpProtobuf => BatchSpanProcessor::builder(OtlpHttpExporter::new(
                r.endpoint.clone(),
                r.headers.clone(),
                timeout,
            ))
            .with_batch_config(batch_config())
            .build(),
        };
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_sampler(r.sampler.sdk())
            .with_resource(
                opentelemetry_sdk::Resource::builder_empty()
                    // kiln's defaults first: `OTEL_RESOURCE_ATTRIBUTES` may override them.
                    .with_attributes([
                        KeyValue::new("telemetry.sdk.name", "opentelemetry"),
                        KeyValue::new("telemetry.sdk.language", "rust"),
                        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
                    ])
                    .with_attributes(
                        r.resource
                            .iter()
                            .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
                    )
                    .build(),
            )
            .build();
        let tracer = provider.tracer("kiln-serve");
        Ok(Self {
            provider,
            tracer,
            parent_based: r.sampler.parent_based,
        })
    }

    /// Begin a request's SERVER span named `name` (the route or RPC, e.g.
    /// `POST /v2/models/{model_name}/infer`), child of the caller's `traceparent` (and
    /// `tracestate`) when they are valid, with `attributes` (the semantic conventions' HTTP
    /// or RPC attributes); `None` when the sampler leaves the request out.
    pub fn request(
        &self,
        name: &'static str,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
        transport: &'static str,
        attributes: Vec<KeyValue>,
    ) -> Option<RequestTrace> {
        let start = Instant::now();
        let remote = traceparent.and_then(|tp| parse_traceparent(tp, tracestate));
        // A parent-based sampler leaves an unsampled caller's request out, so skip building
        // a span only to drop it.
        if self.parent_based && remote.as_ref().is_some_and(|sc| !sc.is_sampled()) {
            return None;
        }
        let parent = remote
            .map(|sc| Context::new().with_remote_span_context(sc))
            .unwrap_or_default();
        let anchor = (start, SystemTime::now());
        let mut all = Vec::with_capacity(attributes.len() + 1);
        all.push(KeyValue::new("kiln.transport", transport));
        all.extend(attributes);
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(anchor.1)
            .with_attributes(all)
            .start_with_context(&self.tracer, &parent);
        if !span.span_context().is_sampled() {
            return None;
        }
        Some(RequestTrace {
            cx: parent.with_span(span),
            tracer: self.tracer.clone(),
            anchor,
        })
    }

    /// Export what is queued and stop the processor (at server shutdown; blocks, so call it
    /// off the runtime's workers).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("stopping the trace exporter: {e}");
        }
    }
}

/// A sampled request's trace: its SERVER span and the clock anchor that turns the stages'
/// `Instant`s into span timestamps.
pub struct RequestTrace {
    cx: Context,
    tracer: SdkTracer,
    anchor: (Instant, SystemTime),
}

impl RequestTrace {
    fn at(&self, t: Instant) -> SystemTime {
        match t.checked_duration_since(self.anchor.0) {
            Some(d) => self.anchor.1 + d,
            None => self.anchor.1 - self.anchor.0.duration_since(t),
        }
    }

    /// A finished child span of `parent` (the request span when `None`) from `start` to
    /// `end`; returns its context, to hang children on.
    pub fn stage(
        &self,
        name: &'static str,
        start: Instant,
        end: Instant,
        attributes: Vec<KeyValue>,
        parent: Option<&Context>,
    ) -> Context {
        let parent = parent.unwrap_or(&self.cx);
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(self.at(start))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent);
        span.end_with_timestamp(self.at(end));
        parent.with_span(span)
    }

    /// Add attributes to the request span.
    pub fn annotate(&self, attributes: Vec<KeyValue>) {
        self.cx.span().set_attributes(attributes);
    }

    /// The `traceresponse` value: this trace, the server span, its flags.
    pub fn traceresponse(&self) -> String {
        let sc = self.cx.span().span_context().clone();
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    }

    /// End the request span with its transport's status attribute (`error`: the failure's
    /// message, if it failed); returns the `traceresponse` value for the answer.
    pub fn finish(self, status: KeyValue, error: Option<&str>) -> String {
        self.annotate(vec![status]);
        let tr = self.traceresponse();
        self.end(error);
        tr
    }

    /// End the request span: `error` is the failure's message, if it failed. The end time
    /// comes from the same anchored monotonic clock as the stages', so a step of the wall
    /// clock mid-request cannot put a stage outside its request.
    pub fn end(self, error: Option<&str>) {
        let span = self.cx.span();
        if let Some(e) = error {
            span.set_status(Status::error(e.to_string()));
        }
        span.end_with_timestamp(self.at(Instant::now()));
    }
}

/// The span context of a W3C `traceparent` header (`version-traceid-parentid-flags`, lowercase
/// hex), or `None` when it is not one the specification accepts: version `ff`, wrong lengths,
/// upper-case or non-hex digits, an all-zero trace or parent id; a version-00 header with
/// anything after the flags. A later version may append fields, which are ignored.
/// `tracestate` is kept when it parses.
pub fn parse_traceparent(tp: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let tp = tp.trim_matches([' ', '\t']);
    let b = tp.as_bytes();
    if b.len() < 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return None;
    }
    let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    let (version, trace, parent, flags) = (&b[..2], &b[3..35], &b[36..52], &b[53..55]);
    if !(hex(version) && hex(trace) && hex(parent) && hex(flags)) || version == b"ff" {
        return None;
    }
    if (version == b"00" && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
        return None;
    }
    let trace_id = TraceId::from_hex(&tp[3..35]).ok()?;
    let span_id = SpanId::from_hex(&tp[36..52]).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(&tp[53..55], 16).ok()?;
    let state = tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags) & TraceFlags::SAMPLED,
        true,
        state,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn resolve(cfg: &TraceConfig, pairs: &[(&str, &str)]) -> Result<Option<ResolvedTrace>, String> {
        cfg.resolve(&env_of(pairs)).map_err(|e| e.to_string())
    }

    #[test]
    fn tracing_is_off_without_an_endpoint_flag_or_variable() {
        assert_eq!(resolve(&TraceConfig::default(), &[]), Ok(None));
        // Variables that configure but do not turn it on.
        let only = [
            ("OTEL_SERVICE_NAME", "x"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
        ];
        assert_eq!(resolve(&TraceConfig::default(), &only), Ok(None));
        let off = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        assert_eq!(resolve(&TraceConfig::default(), &off), Ok(None));
        let none = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
            ("OTEL_TRACES_EXPORTER", "none"),
        ];
        assert_eq!(resolve(&TraceConfig::default(), &none), Ok(None));
        // An empty variable is unset.
        let empty = [("OTEL_EXPORTER_OTLP_ENDPOINT", " ")];
        assert_eq!(resolve(&TraceConfig::default(), &empty), Ok(None));
    }

    #[test]
    fn the_standard_variables_configure_tracing() {
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "fraud-scorer"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "service.name=ignored, deployment.environment.name=prod,team=ml%20ops",
            ),
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ];
        let r = resolve(&TraceConfig::default(), &env).unwrap().unwrap();
        assert_eq!(r.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(r.endpoint, "http://collector:4318/v1/traces");
        assert_eq!(
            r.sampler,
            TraceSampler {
                parent_based: false,
                ratio: 0.25
            }
        );
        assert_eq!(r.service_name(), "fraud-scorer");
        assert_eq!(
            r.resource,
            [
                ("service.name".to_string(), "fraud-scorer".to_string()),
                ("deployment.environment.name".into(), "prod".into()),
                ("team".into(), "ml ops".into()),
            ]
        );
        // The signal-specific variables win over the general ones, and the traces endpoint
        // is taken as is.
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://general:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:9999/custom",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes"),
        ];
        let r = resolve(&TraceConfig::default(), &env).unwrap().unwrap();
        assert_eq!(r.endpoint, "http://traces:9999/custom");
        assert_eq!(r.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(r.service_name(), "from-attributes");
        assert_eq!(r.sampler, TraceSampler::default());
        assert!(r.headers.is_empty());
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20x,tenant=a",
            ),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "tenant=b"),
        ];
        let r = resolve(&TraceConfig::default(), &env).unwrap().unwrap();
        assert_eq!(r.headers, [("tenant".to_string(), "b".to_string())]);
        // OTEL_TRACES_EXPORTER=otlp alone: the protocol's default endpoint.
        let r = resolve(&TraceConfig::default(), &[("OTEL_TRACES_EXPORTER", "otlp")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.endpoint.as_str(), r.protocol, r.service_name()),
            (
                "http://localhost:4317",
                OtlpProtocol::Grpc,
                DEFAULT_SERVICE_NAME
            )
        );
    }

    #[test]
    fn kilns_own_settings_win_over_the_environment() {
        let env = [
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:4318/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "from-env"),
            ("OTEL_TRACES_SAMPLER", "always_off"),
            ("OTEL_SDK_DISABLED", "true"),
        ];
        let cfg = TraceConfig {
            endpoint: Some("http://mine:4317".into()),
            protocol: Some(OtlpProtocol::Grpc),
            sample_ratio: Some(0.5),
            service_name: Some("mine".into()),
        };
        let r = resolve(&cfg, &env).unwrap().unwrap();
        assert_eq!(r.endpoint, "http://mine:4317");
        assert_eq!(r.protocol, OtlpProtocol::Grpc);
        assert_eq!(
            r.sampler,
            TraceSampler {
                parent_based: true,
                ratio: 0.5
            }
        );
        assert_eq!(r.service_name(), "mine");
        // The flag's endpoint is a base URL for HTTP, like OTEL_EXPORTER_OTLP_ENDPOINT.
        let cfg = TraceConfig {
            endpoint: Some("http://mine:4318".into()),
            protocol: Some(OtlpProtocol::HttpProtobuf),
            ..Default::default()
        };
        assert_eq!(
            resolve(&cfg, &[]).unwrap().unwrap().endpoint,
            "http://mine:4318/v1/traces"
        );
    }

    #[test]
    fn samplers_follow_the_specification() {
        let s = |n: &str, a: Option<&str>| TraceSampler::from_env_values(n, a);
        let t = |parent_based, ratio| {
            Ok(TraceSampler {
                parent_based,
                ratio,
            })
        };
        assert_eq!(s("always_on", None), t(false, 1.0));
        assert_eq!(s("always_off", Some("0.5")), t(false, 0.0));
        assert_eq!(s("traceidratio", None), t(false, 1.0));
        assert_eq!(s("traceidratio", Some("0.1")), t(false, 0.1));
        assert_eq!(s("parentbased_always_on", None), t(true, 1.0));
        assert_eq!(s("parentbased_always_off", None), t(true, 0.0));
        assert_eq!(s("parentbased_traceidratio", Some(" 0.3 ")), t(true, 0.3));
        assert!(matches!(
            s("sometimes", None).unwrap_err(),
            e if e.contains("OTEL_TRACES_SAMPLER is `sometimes`")
        ));
        for bad in ["1.5", "-0.1", "half"] {
            let e = s("traceidratio", Some(bad)).unwrap_err();
            assert!(
                e.contains("OTEL_TRACES_SAMPLER_ARG") && e.contains(bad),
                "{e}"
            );
        }
        // The SDK samplers they map to.
        assert!(matches!(t(false, 1.0).unwrap().sdk(), Sampler::AlwaysOn));
        assert!(matches!(t(false, 0.0).unwrap().sdk(), Sampler::AlwaysOff));
        assert!(matches!(
            t(true, 0.5).unwrap().sdk(),
            Sampler::ParentBased(_)
        ));
        assert!(matches!(
            t(false, 0.5).unwrap().sdk(),
            Sampler::TraceIdRatioBased(r) if r == 0.5
        ));
    }

    #[test]
    fn malformed_variables_are_errors_naming_them() {
        let cases: [(&[(&str, &str)], &str); 5] = [
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4317")],
                "OTEL_EXPORTER_OTLP_ENDPOINT is `c:4317`",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL is `http/json` is not supported",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "udp"),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is `udp`",
            ),
            (
                &[("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER is `zipkin`",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                    ("OTEL_RESOURCE_ATTRIBUTES", "a=1,broken"),
                ],
                "OTEL_RESOURCE_ATTRIBUTES: item 2 (`broken`) is not `key=value`",
            ),
        ];
        for (env, want) in cases {
            let e = resolve(&TraceConfig::default(), env).unwrap_err();
            assert!(e.contains(want), "{e} does not say {want}");
        }
        assert!(parse_resource_attributes("k=%zz").is_err());
        assert!(parse_resource_attributes("=v").is_err());
        assert_eq!(
            parse_resource_attributes("a=1,,a=2"),
            Ok(vec![("a".to_string(), "2".to_string())])
        );
    }

    #[test]
    fn traceparent_is_parsed_as_the_w3c_specification_says() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(ok, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(sc.is_sampled() && sc.is_remote());
        assert_eq!(sc.trace_state().get("congo"), Some("t61rcWkgMzE"));
        let unsampled = parse_traceparent(&ok.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.is_sampled());
        // Unknown flag bits are not sampled-ness: 0x02 alone is not sampled, 0x03 is.
        assert!(
            !parse_traceparent(&ok.replace("-01", "-02"), None)
                .unwrap()
                .is_sampled()
        );
        assert!(
            parse_traceparent(&ok.replace("-01", "-03"), None)
                .unwrap()
                .is_sampled()
        );
        // A later version may append fields.
        assert!(parse_traceparent(&format!("01{}-extra", &ok[2..]), None).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert!(parse_traceparent(bad, None).is_none(), "{bad}");
        }
    }
}
