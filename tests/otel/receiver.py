"""OTLP trace receiver (gRPC or HTTP) for tests/it/serve_trace.rs, built on the official opentelemetry-proto.

Usage: python receiver.py --out FILE [--protocol grpc|http]

grpc (the default) serves opentelemetry.proto.collector.trace.v1.TraceService/Export; http serves
OTLP/HTTP with protobuf bodies: POST /v1/traces with Content-Type application/x-protobuf, whose
body is an ExportTraceServiceRequest (answered 200 with an ExportTraceServiceResponse; another
path is 404, another content type 415, a body that does not decode 400). Either listens on
127.0.0.1 at a port the OS picks, prints exactly one line `PORT <n>` to stdout, then appends one
JSON line per received span to FILE (flushed and fsynced after every export; each line also
carries the resource's attributes and the protocol it came by). Runs until SIGTERM/SIGINT, then
stops the server and exits 0.
"""

import argparse
import json
import os
import signal
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def any_value(v):
    """An OTLP AnyValue as a JSON scalar (arrays/kvlists/bytes, unused by kiln, as text)."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return int(v.int_value)
    if which == "double_value":
        return float(v.double_value)
    if which == "bool_value":
        return bool(v.bool_value)
    if which == "bytes_value":
        return v.bytes_value.hex()
    if which == "array_value":
        return json.dumps([any_value(x) for x in v.array_value.values])
    if which == "kvlist_value":
        return json.dumps({kv.key: any_value(kv.value) for kv in v.kvlist_value.values})
    return None


class Sink:
    """Appends the spans of ExportTraceServiceRequests to the output file, one JSON line each."""

    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()

    def write(self, request, protocol):
        lines = []
        for rs in request.resource_spans:
            resource = {kv.key: any_value(kv.value) for kv in rs.resource.attributes}
            service = str(resource.get("service.name", ""))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "service_name": service,
                        "resource": resource,
                        "protocol": protocol,
                        "kind": int(s.kind),
                        "start_ns": int(s.start_time_unix_nano),
                        "end_ns": int(s.end_time_unix_nano),
                        "attributes": {kv.key: any_value(kv.value) for kv in s.attributes},
                        "status_code": int(s.status.code),
                    }, sort_keys=True))
        with self.lock:
            if lines:
                self.out.write("".join(line + "\n" for line in lines))
            self.out.flush()
            os.fsync(self.out.fileno())


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink):
        self.sink = sink

    def Export(self, request, context):
        self.sink.write(request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


def http_handler(sink):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, code, body=b"", content_type="text/plain"):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path != "/v1/traces":
                return self.answer(404, b"not found")
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype != "application/x-protobuf":
                return self.answer(415, f"content type {ctype!r}".encode())
            request = trace_service_pb2.ExportTraceServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception as e:  # a body that is not an ExportTraceServiceRequest
                return self.answer(400, str(e).encode())
            sink.write(request, "http/protobuf")
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.answer(200, reply, "application/x-protobuf")

        def log_message(self, *args):
            pass

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON-lines file the spans are appended to")
    ap.add_argument("--protocol", choices=["grpc", "http"], default="grpc",
                    help="OTLP/gRPC or OTLP/HTTP (protobuf)")
    args = ap.parse_args()

    out = open(args.out, "a", encoding="utf-8")
    sink = Sink(out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if args.protocol == "http":
        server = ThreadingHTTPServer(("127.0.0.1", 0), http_handler(sink))
        server.daemon_threads = True
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        print(f"PORT {port}", flush=True)
        while not stop.wait(0.2):
            pass
        server.shutdown()
        server.server_close()
    else:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(sink), server)
        port = server.add_insecure_port("127.0.0.1:0")
        if port == 0:
            print("receiver: could not bind 127.0.0.1:0", file=sys.stderr)
            return 1
        server.start()
        print(f"PORT {port}", flush=True)
        while not stop.wait(0.2):
            pass
        server.stop(grace=2).wait()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
