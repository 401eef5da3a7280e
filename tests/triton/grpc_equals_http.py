"""tritonclient.grpc answers equal tritonclient.http answers against a live `kiln serve`.

Usage: grpc_equals_http.py HTTP_HOST:PORT GRPC_HOST:PORT [MODEL]

Run by tests/grpc.rs (tritonclient_grpc_answers_equal_tritonclient_http) with the Python of
.ci/triton.sh. Checks liveness, readiness, metadata and, for several batch sizes, that both
protocols return bit-identical outputs (binary and JSON on HTTP). Prints `OK grpc == http`.
Then the same over tritonclient's stream API (ModelStreamInfer), a bad request in the stream,
and the `priority` / `timeout` parameters as tritonclient sends them on both protocols; prints
`OK grpc stream == unary`.
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
    # The same requests over one bidirectional stream (ModelStreamInfer), answered by request
    # id, bit-identical to the unary answers; a bad request in the stream is answered with its
    # error and the stream goes on. Then Triton's scheduling parameters as tritonclient sends
    # them (priority uint64, timeout int64 µs).
    import queue

    answers_q = queue.Queue()
    g.start_stream(callback=lambda result, error: answers_q.put((result, error)))
    sent = {}
    for n in (1, 5, 64):
        x = rng.normal(size=(n, cols)).astype(np.float32)
        gi = grpcclient.InferInput(inp["name"], list(x.shape), "FP32")
        gi.set_data_from_numpy(x)
        sent[f"s{n}"] = g.infer(model, [gi])
        g.async_stream_infer(model, [gi], request_id=f"s{n}")
    bad = grpcclient.InferInput(inp["name"], [2, cols + 1], "FP32")
    bad.set_data_from_numpy(np.zeros((2, cols + 1), dtype=np.float32))
    g.async_stream_infer(model, [bad], request_id="bad")
    got, errors = {}, []
    for _ in range(len(sent) + 1):
        result, error = answers_q.get(timeout=60)
        if error is not None:
            errors.append(str(error))
        else:
            got[result.get_response().id] = result
    g.stop_stream()
    assert sorted(got) == sorted(sent), (sorted(got), errors)
    assert len(errors) == 1 and "features" in errors[0], errors
    for rid, ref in sent.items():
        for o in outputs:
            assert got[rid].as_numpy(o).tobytes() == ref.as_numpy(o).tobytes(), (rid, o)
    x = rng.normal(size=(3, cols)).astype(np.float32)
    gi = grpcclient.InferInput(inp["name"], list(x.shape), "FP32")
    gi.set_data_from_numpy(x)
    r = g.infer(model, [gi], priority=1, timeout=5_000_000)
    assert r.as_numpy(outputs[0]).shape[0] == 3
    try:
        g.infer(model, [gi], priority=99)
        raise AssertionError("priority 99 was accepted")
    except grpcclient.InferenceServerException as e:
        assert "priority" in str(e), e
    hi = httpclient.InferInput(inp["name"], list(x.shape), "FP32")
    hi.set_data_from_numpy(x)
    r = h.infer(model, [hi], priority=3, timeout=5_000_000)
    assert r.as_numpy(outputs[0]).shape[0] == 3
    print("OK grpc stream == unary")


if __name__ == "__main__":
    main()
