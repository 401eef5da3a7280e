"""tritonclient.grpc answers equal tritonclient.http answers against a live `kiln serve`.

Usage: grpc_equals_http.py HTTP_HOST:PORT GRPC_HOST:PORT [MODEL]

Run by tests/grpc.rs (tritonclient_grpc_answers_equal_tritonclient_http) with the Python of
.ci/triton.sh. Checks liveness, readiness, metadata and, for several batch sizes, that both
protocols return bit-identical outputs (binary and JSON on HTTP). Prints `OK grpc == http`.
"""

import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient


def main():
    http_url, grpc_url = sys.argv[1], sys.argv[2]
    model = sys.argv[3] if len(sys.argv) > 3 else "tiny"
    h = httpclient.InferenceServerClient(url=http_url)
    g = grpcclient.InferenceServerClient(url=grpc_url)
    assert h.is_server_live() and g.is_server_live()
    assert h.is_server_ready() and g.is_server_ready()
    assert h.is_model_ready(model) and g.is_model_ready(model)
    hm = h.get_model_metadata(model)
    gm = g.get_model_metadata(model, as_json=True)
    assert hm["name"] == gm["name"] == model, (hm, gm)
    assert hm["versions"] == gm["versions"], (hm, gm)
    for side in ("inputs", "outputs"):
        hs = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in hm[side]]
        gs = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in gm[side]]
        assert hs == gs, (side, hs, gs)
    gc = g.get_model_config(model, as_json=True)["config"]
    assert gc["name"] == model, gc
    inp = hm["inputs"][0]
    cols = int(inp["shape"][-1])
    outputs = [t["name"] for t in hm["outputs"]]
    rng = np.random.default_rng(7)
    for n in (1, 5, 64):
        x = rng.normal(size=(n, cols)).astype(np.float32)
        hi = httpclient.InferInput(inp["name"], list(x.shape), "FP32")
        gi = grpcclient.InferInput(inp["name"], list(x.shape), "FP32")
        gi.set_data_from_numpy(x)
        answers = {}
        for binary in (True, False):
            hi.set_data_from_numpy(x, binary_data=binary)
            ho = [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]
            answers["http-binary" if binary else "http-json"] = h.infer(model, [hi], outputs=ho)
        answers["grpc"] = g.infer(
            model, [gi], outputs=[grpcclient.InferRequestedOutput(o) for o in outputs]
        )
        for o in outputs:
            ref = answers["grpc"].as_numpy(o)
            assert ref is not None and ref.shape[0] == n, (o, ref)
            for name in ("http-binary", "http-json"):
                got = answers[name].as_numpy(o)
                assert got.dtype == ref.dtype and got.shape == ref.shape, (name, o)
                assert got.tobytes() == ref.tobytes(), (name, o, got, ref)
    print("OK grpc == http")


if __name__ == "__main__":
    main()
