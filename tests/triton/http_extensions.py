"""Triton's own HTTP client (tritonclient.http) against a running `kiln serve`.

Usage: python tests/triton/http_extensions.py HOST:PORT MODEL [--explicit]

Checks that the statistics extension, the model repository extension and inference answer
as tritonclient expects them: the server metadata lists `statistics` and `model_repository`;
inference_count grows by the rows sent and success by the requests sent; the repository index
parses; with --explicit (a server started with --model-control-mode explicit, MODEL not yet
loaded) the model is loaded, served, unloaded and reported unavailable. Exits non-zero on the
first mismatch. Run by tests/serve_triton.rs when KILN_TEST_TRITON_PYTHON names a Python with
tritonclient (.ci/triton.sh installs one).
"""

import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def stats_of(client, model):
    s = client.get_inference_statistics(model_name=model)["model_stats"]
    assert len(s) == 1, s
    return s[0]


def main():
    url, model = sys.argv[1], sys.argv[2]
    explicit = "--explicit" in sys.argv[3:]
    client = httpclient.InferenceServerClient(url=url)
    meta = client.get_server_metadata()
    for ext in ("statistics", "model_repository"):
        assert ext in meta["extensions"], meta
    if explicit:
        assert not client.is_model_ready(model), "loaded before the load call"
        client.load_model(model)
    assert client.is_model_ready(model)
    features = len(client.get_model_metadata(model)["inputs"][0]["shape"]) and int(
        client.get_model_metadata(model)["inputs"][0]["shape"][1]
    )
    before = stats_of(client, model)
    rows = 0
    for n in (1, 3, 5):
        x = np.linspace(-0.5, 0.5, n * features, dtype=np.float32).reshape(n, features)
        inp = httpclient.InferInput("features", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        out = client.infer(model, [inp])
        assert out.as_numpy("mean").shape[0] == n
        rows += n
    after = stats_of(client, model)
    assert after["inference_count"] - before["inference_count"] == rows, (before, after)
    ok = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert ok == 3, (before, after)
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert after["inference_stats"][k]["count"] >= 3, after
    index = client.get_model_repository_index()
    assert any(e["name"] == model and e.get("state") == "READY" for e in index), index
    if explicit:
        client.unload_model(model)
        assert not client.is_model_ready(model)
        index = client.get_model_repository_index()
        entry = [e for e in index if e["name"] == model][0]
        assert entry["state"] == "UNAVAILABLE" and entry["reason"] == "unloaded", entry
        try:
            client.get_inference_statistics(model_name=model)
            raise AssertionError("statistics of an unloaded model")
        except InferenceServerException:
            pass
    print(f"tritonclient.http against {url}: statistics, repository and inference agree")


if __name__ == "__main__":
    main()
