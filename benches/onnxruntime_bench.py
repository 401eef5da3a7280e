#!/usr/bin/env python3
"""ONNX Runtime on a model written by `kiln export onnx`, measured like `kiln bench infer`.

    kiln export onnx --checkpoint DIR --out /tmp/m.onnx
    python benches/onnxruntime_bench.py --model /tmp/m.onnx --batch 1,32,1024   # JSON lines

Method, identical to kiln's `src/bench/infer.rs` and `benches/pytorch_reference.py`: one
thread (`intra_op_num_threads = inter_op_num_threads = 1`, sequential execution, graph
optimisation ALL), seeded N(0, 1) inputs built once (the graph normalises them itself),
50 ms of discarded warm-up calls per round, then samples until both the minimum time and the
minimum sample count are reached; a sample is one `run_with_iobinding` call (input and both
outputs bound to preallocated buffers) timed with `time.perf_counter_ns`, or the mean of a
group of calls when a call takes under 5 us; all batches measured in interleaved rounds.
Reported per batch: p50, p99, mean, rows/s = batch / p50, FLOP per row (2·in·out summed
over the Gemm weights) and GFLOP/s.

Note the exported graph does more than `kiln bench infer`'s engines: the feature
normalisation, the f64 de-normalisation and exp(½·logvar) are inside it (kiln's engines are
timed on normalised features to head outputs). Needs `numpy` and `onnxruntime` (the venv of
`.ci/onnxruntime.sh` has both). Measurement only: no test depends on it.
"""

import argparse
import json
import time

import numpy as np
import onnxruntime as ort

GROUP_TARGET_NS = 5_000


def sample(call, time_s, min_samples, warmup_s, state):
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        call()
    if state["group"] == 0:
        t = time.perf_counter_ns()
        n = 0
        while n < 3 or time.perf_counter_ns() - t < 200_000:
            call()
            n += 1
        per_call = (time.perf_counter_ns() - t) / n
        state["group"] = max(1, min(1000, int(-(-GROUP_TARGET_NS // max(per_call, 1)))))
    g = state["group"]
    start = time.perf_counter()
    taken = 0
    pc = time.perf_counter_ns
    while time.perf_counter() - start < time_s or taken < min_samples:
        t = pc()
        for _ in range(g):
            call()
        state["us"].append((pc() - t) / 1e3 / g)
        taken += 1


def percentile(sorted_us, p):
    return sorted_us[int(round((len(sorted_us) - 1) * p))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="an ONNX file written by `kiln export onnx`")
    ap.add_argument("--batch", default="1,32,1024")
    ap.add_argument("--min-time", type=float, default=1.5, help="seconds per setting")
    ap.add_argument("--iters", type=int, default=300, help="minimum samples per setting")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
    (inp,) = sess.get_inputs()
    n_features = int(inp.shape[1])
    n_targets = int(sess.get_outputs()[0].shape[1])
    meta = sess.get_modelmeta().custom_metadata_map

    # FLOP per row from the Gemm weights' shapes ([out, in], PyTorch layout).
    flop_per_row = None
    try:
        import onnx  # optional: only for the FLOP count

        m = onnx.load(args.model)
        flop_per_row = sum(
            2 * int(t.dims[0]) * int(t.dims[1])
            for t in m.graph.initializer
            if t.name.endswith(".weight") and len(t.dims) == 2
        )
    except ImportError:
        pass

    rng = np.random.default_rng(args.seed)
    calls = {}
    for b in batches:
        io = sess.io_binding()
        x = rng.standard_normal((b, n_features)).astype(np.float32)
        io.bind_ortvalue_input("features", ort.OrtValue.ortvalue_from_numpy(x))
        for name in ("mean", "std"):
            io.bind_ortvalue_output(
                name, ort.OrtValue.ortvalue_from_shape_and_type([b, n_targets], np.float32)
            )
        calls[b] = (lambda io=io: sess.run_with_iobinding(io))
    states = {b: {"us": [], "group": 0} for b in batches}
    per_round = args.min_time / max(1, args.rounds)
    per_round_samples = -(-args.iters // max(1, args.rounds))
    for _ in range(max(1, args.rounds)):
        for b in batches:
            sample(calls[b], per_round, per_round_samples, 0.05, states[b])
    for b in batches:
        us = sorted(states[b]["us"])
        p50 = percentile(us, 0.5)
        out = {
            "bench": "infer",
            "engine": "onnxruntime-kiln-export",
            "onnxruntime": ort.__version__,
            "run_id": meta.get("run_id"),
            "batch": b,
            "threads": 1,
            "p50_us": p50,
            "p99_us": percentile(us, 0.99),
            "mean_us": sum(us) / len(us),
            "rows_per_s": b / (p50 * 1e-6),
            "samples": len(us),
            "calls_per_sample": states[b]["group"],
        }
        if flop_per_row:
            out["flop_per_row"] = flop_per_row
            out["gflops"] = flop_per_row * b / (p50 * 1e-6) / 1e9
        print(json.dumps(out))


if __name__ == "__main__":
    main()
