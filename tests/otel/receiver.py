"""OTLP/gRPC trace receiver for tests/it/serve_trace.rs, built on the official opentelemetry-proto.

Usage: python receiver.py --out FILE

Serves opentelemetry.proto.collector.trace.v1.TraceService/Export on 127.0.0.1 at a port the OS
picks, prints exactly one line `PORT <n>` to stdout, then appends one JSON line per received span
to FILE (flushed and fsynced after every Export call). Runs until SIGTERM/SIGINT, then stops the
server and exits 0.
"""

import argparse
import json
import os
import signal
import sys
import threading
from concurrent import futures

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


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()

    def Export(self, request, context):
        lines = []
        for rs in request.resource_spans:
            service = ""
            for kv in rs.resource.attributes:
                if kv.key == "service.name":
                    service = str(any_value(kv.value))
            for ss in rs.scope_spans:
                for s in ss.spans:
                    lines.append(json.dumps({
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "name": s.name,
                        "service_name": service,
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
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON-lines file the spans are appended to")
    args = ap.parse_args()

    out = open(args.out, "a", encoding="utf-8")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(out), server)
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        print("receiver: could not bind 127.0.0.1:0", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    print(f"PORT {port}", flush=True)
    while not stop.wait(0.2):
        pass
    server.stop(grace=2).wait()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
