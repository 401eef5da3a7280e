"""tritonclient sends a categorical model's raw columns (BYTES and FP32) to a live `kiln serve`.

Usage: raw_columns.py HTTP_HOST:PORT GRPC_HOST:PORT ROWS_JSON [MODEL]

Run by tests/it/own_data.rs (tritonclient_sends_raw_bytes_columns) with the Python of
.ci/triton.sh. ROWS_JSON is a list of [store, kind, price] (price "" = missing, sent as NaN).
Checks the metadata names BYTES for the categorical inputs, then sends the rows three ways —
HTTP with JSON data, HTTP with binary data, gRPC — and prints each answer as one JSON line:
[[mean, std], ...].
"""

import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def main():
    http_url, grpc_url, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    model = sys.argv[4] if len(sys.argv) > 4 else "shop"
    h = httpclient.InferenceServerClient(url=http_url)
    g = grpcclient.InferenceServerClient(url=grpc_url)
    meta = h.get_model_metadata(model)
    kinds = {t["name"]: t["datatype"] for t in meta["inputs"]}
    assert kinds == {"store": "BYTES", "kind": "BYTES", "price": "FP32"}, kinds
    store = np.array([r[0].encode() for r in rows], dtype=np.object_)
    kind = np.array([r[1].encode() for r in rows], dtype=np.object_)
    price = np.array([float(r[2]) if r[2] else np.nan for r in rows], dtype=np.float32)

    def answer(result):
        mean, std = result.as_numpy("mean"), result.as_numpy("std")
        return json.dumps([[float(m[0]), float(s[0])] for m, s in zip(mean, std)])

    # JSON has no NaN: with JSON data the BYTES columns go as JSON strings and the prices
    # (one of them NaN) as binary data in the same request.
    for binary in (False, True):
        inputs = []
        for name, arr, dt in (("store", store, "BYTES"), ("kind", kind, "BYTES"), ("price", price, "FP32")):
            i = httpclient.InferInput(name, [len(rows)], dt)
            i.set_data_from_numpy(arr, binary_data=binary or dt == "FP32")
            inputs.append(i)
        outs = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in ("mean", "std")]
        print(answer(h.infer(model, inputs, outputs=outs)))
    inputs = []
    for name, arr, dt in (("store", store, "BYTES"), ("kind", kind, "BYTES"), ("price", price, "FP32")):
        i = grpcclient.InferInput(name, [len(rows)], dt)
        i.set_data_from_numpy(arr)
        inputs.append(i)
    print(answer(g.infer(model, inputs)))


if __name__ == "__main__":
    main()
