# Sourced by .ci/run: the official OpenTelemetry Python SDK and OTLP protos from PyPI for
# tests/it/serve_trace.rs (tests/otel/caller.py propagates W3C trace context into kiln serve
# and exports its own span; tests/otel/receiver.py is the OTLP trace receiver, gRPC or HTTP/protobuf, they export to).
#
# Creates (or reuses) a venv with pinned opentelemetry-{api,sdk,proto,exporter-otlp-proto-grpc},
# grpcio and protobuf under ~/.cache/kiln and exports KILN_TEST_OTEL_PYTHON (its interpreter).
# No server, nothing to stop. There is no skip: a failed install fails the sourcing shell (and CI).
#
# Measured on the 2-core build machine (2026-12, opentelemetry 1.45.2, grpcio 1.85.3, protobuf
# 7.36.2): a fresh venv install took 5 s on a quiet machine (11 wheels, ~8 MB to download,
# 54 MB installed); later runs reuse the cached venv (0.2 s).

KILN_OTEL_VERSION=1.45.2
KILN_OTEL_GRPCIO_VERSION=1.85.3
KILN_OTEL_PROTOBUF_VERSION=7.36.2

echo "== OpenTelemetry Python (opentelemetry-sdk==$KILN_OTEL_VERSION) for tests/it/serve_trace.rs"
kiln_otel_venv="${KILN_OTEL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/otel-$KILN_OTEL_VERSION}"
if ! "$kiln_otel_venv/bin/python" -c "import grpc, google.protobuf, opentelemetry.sdk.trace, opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc, opentelemetry.exporter.otlp.proto.grpc.trace_exporter" 2>/dev/null; then
  rm -rf "$kiln_otel_venv"
  python3 -m venv "$kiln_otel_venv"
  "$kiln_otel_venv/bin/pip" install --quiet --disable-pip-version-check \
    "opentelemetry-api==$KILN_OTEL_VERSION" "opentelemetry-sdk==$KILN_OTEL_VERSION" \
    "opentelemetry-proto==$KILN_OTEL_VERSION" "opentelemetry-exporter-otlp-proto-grpc==$KILN_OTEL_VERSION" \
    "grpcio==$KILN_OTEL_GRPCIO_VERSION" "protobuf==$KILN_OTEL_PROTOBUF_VERSION"
fi
export KILN_TEST_OTEL_PYTHON="$kiln_otel_venv/bin/python"
echo "OpenTelemetry SDK $("$KILN_TEST_OTEL_PYTHON" -c 'from importlib.metadata import version as v; print(v("opentelemetry-sdk"), "grpcio", v("grpcio"), "protobuf", v("protobuf"))') at $KILN_TEST_OTEL_PYTHON"
