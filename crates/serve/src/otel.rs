//! OpenTelemetry tracing of inference requests (`kiln serve --otlp-endpoint URL`).
//!
//! An inference request that arrives with a W3C `traceparent` (HTTP header or gRPC metadata;
//! `tracestate` is carried along) gets a SERVER span that is the caller's child, so kiln's part
//! joins the caller's trace; one without starts a new trace. Sampling is parent-based: a caller's
//! sampled flag decides, and a request without a parent is sampled with probability
//! `--trace-sample-ratio` (by trace id, so the decision is the same on every hop). A sampled
//! request's span has one child per stage, with the stage's own measured start and end:
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
//! exporter; nothing on the request path waits for the collector.
//!
//! With tracing off (no `--otlp-endpoint`) a request costs one branch on a `None`; with it on and
//! a request not sampled, parsing the header and the sampler's decision. `kiln bench serve`
//! measures both.

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

/// Tracing settings.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceConfig {
    /// The OTLP/gRPC collector (`http://host:4317`); `None`: tracing is off.
    pub endpoint: Option<String>,
    /// Probability that a request without a sampled parent is traced (0 to 1).
    pub sample_ratio: f64,
    /// `service.name` of the spans.
    pub service_name: String,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            sample_ratio: 1.0,
            service_name: "kiln-serve".into(),
        }
    }
}

/// The server's tracer (one per server).
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracing")
    }
}

impl Tracing {
    /// Start the exporter and the batch processor; must run inside the server's tokio runtime
    /// (the exporter's gRPC channel lives there). `Ok(None)` when tracing is off.
    pub fn start(cfg: &TraceConfig) -> Result<Option<Self>, ServeError> {
        let Some(endpoint) = &cfg.endpoint else {
            return Ok(None);
        };
        use opentelemetry_otlp::WithExportConfig as _;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.clone())
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| {
                ServeError::Config(format!(
                    "--otlp-endpoint {endpoint}: cannot build the OTLP exporter: {e}"
                ))
            })?;
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(8192)
                    .with_scheduled_delay(Duration::from_millis(500))
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(batch)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                cfg.sample_ratio,
            ))))
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(cfg.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("kiln-serve");
        Ok(Some(Self { provider, tracer }))
    }

    /// Begin a request's SERVER span named `name`, child of the caller's `traceparent` (and
    /// `tracestate`) when they are valid; `None` when the sampler leaves the request out.
    pub fn request(
        &self,
        name: &'static str,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
        transport: &'static str,
    ) -> Option<RequestTrace> {
        let start = Instant::now();
        let remote = traceparent.and_then(|tp| parse_traceparent(tp, tracestate));
        // The sampler is parent-based: an unsampled caller's request is not traced, so skip
        // building a span only to drop it.
        if remote.as_ref().is_some_and(|sc| !sc.is_sampled()) {
            return None;
        }
        let parent = remote
            .map(|sc| Context::new().with_remote_span_context(sc))
            .unwrap_or_default();
        let anchor = (start, SystemTime::now());
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(anchor.1)
            .with_attributes([KeyValue::new("kiln.transport", transport)])
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
