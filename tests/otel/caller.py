"""An instrumented HTTP client for tests/it/serve_trace.rs, on the official OpenTelemetry Python SDK.

Usage: python caller.py --url URL --body FILE --otlp-endpoint http://127.0.0.1:PORT
                        [--header K=V ...] [--sampled 0|1]

Starts a CLIENT span `caller-request` (service.name kiln-test-caller), injects the W3C
traceparent with the SDK's default propagator, POSTs FILE to URL, ends the span, exports it over
OTLP/gRPC and prints one JSON line: trace_id, span_id, traceparent, status, response,
response_headers. An HTTP error status is reported the same way, not raised. --sampled 0 uses the
ALWAYS_OFF sampler (traceparent flags 00, nothing exported).
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

from opentelemetry import propagate, trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--body", required=True, help="file whose bytes are POSTed")
    ap.add_argument("--otlp-endpoint", required=True, help="OTLP/gRPC endpoint, http://127.0.0.1:PORT")
    ap.add_argument("--header", action="append", default=[], metavar="K=V")
    ap.add_argument("--sampled", choices=["0", "1"], default="1")
    args = ap.parse_args()

    provider = TracerProvider(
        resource=Resource.create({"service.name": "kiln-test-caller"}),
        sampler=ALWAYS_ON if args.sampled == "1" else ALWAYS_OFF,
    )
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=args.otlp_endpoint, insecure=True)))
    tracer = provider.get_tracer("kiln-test-caller")
    with open(args.body, "rb") as f:
        body = f.read()

    with tracer.start_as_current_span("caller-request", kind=trace.SpanKind.CLIENT) as span:
        headers = {"Content-Type": "application/json"}
        for h in args.header:
            k, sep, v = h.partition("=")
            if not sep:
                ap.error(f"--header {h!r} is not K=V")
            headers[k] = v
        propagate.inject(headers)
        req = urllib.request.Request(args.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                status, raw, resp_headers = resp.status, resp.read(), resp.headers
        except urllib.error.HTTPError as e:
            status, raw, resp_headers = e.code, e.read(), e.headers
        ctx = span.get_span_context()

    provider.force_flush()
    provider.shutdown()

    text = raw.decode("utf-8", errors="replace")
    try:
        response = json.loads(text)
    except ValueError:
        response = text
    print(json.dumps({
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "traceparent": headers.get("traceparent", ""),
        "status": status,
        "response": response,
        "response_headers": {k.lower(): v for k, v in resp_headers.items()},
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
