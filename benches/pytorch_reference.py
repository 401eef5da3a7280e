#!/usr/bin/env python3
"""PyTorch eager and ONNX Runtime on kiln's reference network, measured like `kiln bench infer`.

The network is the one `kiln bench infer --reference` runs: 20 -> 48 -> 48 -> (3 mean + 3
log-variance), ReLU, 3,654 parameters, two heads as two `nn.Linear` (PyTorch's natural
form). Weights are seeded (not kiln's values: the timing does not depend on them).

Method, identical to kiln's `src/bench/infer.rs`: one thread (`torch.set_num_threads(1)`;
ONNX Runtime `intra_op_num_threads = inter_op_num_threads = 1`), seeded N(0, 1) inputs built
once, 50 ms of discarded warm-up calls per round, then samples until both the minimum time
and the minimum sample count are reached; a sample is one call timed with
`time.perf_counter_ns`, or the mean of a group of calls when a call takes under 5 us; all
settings measured in interleaved rounds. Reported per setting: p50, p99, mean, rows/s =
batch / p50, GFLOP/s for 7,104 FLOP per row and, given `--peak-gflops` (kiln prints its
measured one-core peak in each JSON line), floor_frac.

PyTorch runs under `torch.inference_mode()`; ONNX Runtime runs the model exported with
`torch.onnx.export` at graph optimisation level ALL, sequential execution, one
`run_with_iobinding` per call with the input and both outputs bound to preallocated
buffers (its fastest call path; plain `session.run` adds ~4 us per call here).

    python benches/pytorch_reference.py                 # JSON lines on stdout
    python benches/pytorch_reference.py --batch 1,32,1024 --min-time 1.5 --peak-gflops 170
    python benches/pytorch_reference.py --train     # + stage-1 training samples/s

Needs `torch`; `numpy`, `onnx` and `onnxruntime` for the ONNX Runtime rows (skipped with a
note on stderr when missing). Measurement only: no kiln test depends on it.
"""

import argparse
import json
import os
import sys
import tempfile
import time

import torch
from torch import nn

FLOP_PER_ROW = 7104
GROUP_TARGET_NS = 5_000


class Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(20, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU())
        self.mean_head = nn.Linear(48, 3)
        self.logvar_head = nn.Linear(48, 3)

    def forward(self, x):
        h = self.backbone(x)
        return self.mean_head(h), self.logvar_head(h)


class Samples:
    def __init__(self):
        self.us = []
        self.group = 0


def sample(call, time_s, min_samples, warmup_s, s):
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        call()
    if s.group == 0:
        t = time.perf_counter_ns()
        n = 0
        while n < 3 or time.perf_counter_ns() - t < 200_000:
            call()
            n += 1
        per_call = (time.perf_counter_ns() - t) / n
        s.group = max(1, min(1000, int(-(-GROUP_TARGET_NS // max(per_call, 1)))))
    g = s.group
    start = time.perf_counter()
    taken = 0
    pc = time.perf_counter_ns
    while time.perf_counter() - start < time_s or taken < min_samples:
        t = pc()
        for _ in range(g):
            call()
        s.us.append((pc() - t) / 1e3 / g)
        taken += 1


def percentile(sorted_us, p):
    return sorted_us[int(round((len(sorted_us) - 1) * p))]


def summarise(engine, batch, s, peak):
    us = sorted(s.us)
    p50 = percentile(us, 0.5)
    gflops = FLOP_PER_ROW * batch / (p50 * 1e-6) / 1e9
    out = {
        "bench": "infer",
        "engine": engine,
        "batch": batch,
        "threads": 1,
        "p50_us": p50,
        "p99_us": percentile(us, 0.99),
        "mean_us": sum(us) / len(us),
        "rows_per_s": batch / (p50 * 1e-6),
        "gflops": gflops,
        "flop_per_row": FLOP_PER_ROW,
        "samples": len(us),
        "calls_per_sample": s.group,
    }
    if peak:
        out["floor_frac"] = gflops / peak
        out["peak_gflops"] = peak
    return out


def onnx_session(model, path):
    try:
        import numpy  # noqa: F401
        import onnxruntime as ort
    except ImportError as e:
        print(f"note: ONNX Runtime rows skipped ({e})", file=sys.stderr)
        return None
    x = torch.randn(4, 20)
    kwargs = dict(
        input_names=["x"],
        output_names=["mean", "log_var"],
        dynamic_axes={"x": {0: "batch"}, "mean": {0: "batch"}, "log_var": {0: "batch"}},
        opset_version=17,
    )
    try:
        torch.onnx.export(model, (x,), path, dynamo=False, **kwargs)
    except TypeError:
        torch.onnx.export(model, (x,), path, **kwargs)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def train_bench(rows, batch, seed):
    """Stage-1 samples/s of PyTorch's tightest loop on the same shape: the table as tensors in
    memory, a shuffled index per epoch, slicing (no DataLoader), MSE on the mean head, AdamW
    (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 1e-2), clip_grad_norm_(1.0)."""
    torch.manual_seed(seed)
    model = Reference()
    for p in model.logvar_head.parameters():
        p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2)
    x = torch.randn(rows, 20)
    y = torch.randn(rows, 3)
    order = torch.randperm(rows)
    t = time.perf_counter()
    for i in range(0, rows, batch):
        idx = order[i : i + batch]
        xb, yb = x[idx], y[idx]
        opt.zero_grad(set_to_none=True)
        mean, _ = model(xb)
        loss = torch.nn.functional.mse_loss(mean, yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    dt = time.perf_counter() - t
    return {
        "bench": "train",
        "engine": "pytorch-eager",
        "workers": 0,
        "samples_per_s": rows / dt,
        "train_rows": rows,
        "batch_size": batch,
        "epochs": 1,
        "steps": -(-rows // batch),
        "wall_s": dt,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,32,1024")
    ap.add_argument("--min-time", type=float, default=1.5, help="seconds per setting")
    ap.add_argument("--iters", type=int, default=300, help="minimum samples per setting")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--peak-gflops", type=float, default=None)
    ap.add_argument("--no-onnx", action="store_true")
    ap.add_argument("--train", action="store_true",
                    help="also measure stage-1 training samples/s (200,000 rows, batch 128)")
    ap.add_argument("--train-rows", type=int, default=200_000)
    args = ap.parse_args()
    batches = [int(b) for b in args.batch.split(",")]

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    model = Reference().eval()
    assert sum(p.numel() for p in model.parameters()) == 3654
    gen = torch.Generator().manual_seed(args.seed)
    xs = {b: torch.randn(b, 20, generator=gen) for b in batches}

    engines = []

    def eager(b):
        x = xs[b]

        def call():
            with torch.inference_mode():
                model(x)

        return call

    engines.append(("pytorch-eager", eager))

    sess = None
    if not args.no_onnx:
        tmp = tempfile.mkdtemp(prefix="kiln-onnx-")
        sess = onnx_session(model, os.path.join(tmp, "reference.onnx"))
    if sess is not None:
        import numpy as np
        import onnxruntime as ort

        def onnx(b):
            # IOBinding with preallocated input and outputs: ONNX Runtime's fastest call path
            # (kiln's engines reuse their output buffers too).
            io = sess.io_binding()
            io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(xs[b].numpy().copy()))
            for name in ("mean", "log_var"):
                io.bind_ortvalue_output(
                    name, ort.OrtValue.ortvalue_from_shape_and_type([b, 3], np.float32)
                )

            def call():
                sess.run_with_iobinding(io)

            return call

        engines.append(("onnxruntime", onnx))

    calls = {(e, b): f(b) for e, f in engines for b in batches}
    samples = {(e, b): Samples() for e, _ in engines for b in batches}
    per_round = args.min_time / max(1, args.rounds)
    per_round_samples = -(-args.iters // max(1, args.rounds))
    for _ in range(max(1, args.rounds)):
        for b in batches:
            for e, _ in engines:
                sample(calls[(e, b)], per_round, per_round_samples, 0.05, samples[(e, b)])
    for b in batches:
        for e, _ in engines:
            print(json.dumps(summarise(e, b, samples[(e, b)], args.peak_gflops)))
    if args.train:
        print(json.dumps(train_bench(args.train_rows, 128, args.seed)))


if __name__ == "__main__":
    main()
