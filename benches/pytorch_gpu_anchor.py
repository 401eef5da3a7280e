#!/usr/bin/env python3
"""PyTorch on the GPU: the anchor for kiln's CUDA engines (benches/gpu_check.sh runs it).

The network is kiln's reference network (`kiln bench infer --reference`): 20 -> 48 -> 48 ->
(3 mean + 3 log-variance), ReLU, 3,654 parameters, seeded weights (the timing does not depend
on the values). Measured like kiln's GPU engines, host -> host: one call copies a pinned host
input to the device, runs the network, copies both heads back to pinned host memory and
synchronises; the p50 of per-call wall times (`time.perf_counter_ns`) after a warm-up.

Modes, each in f32 and bf16 (`--dtypes`), at batches 1 / 1,024 / 65,536 (`--batch`):
  * eager: `torch.inference_mode()`, the module called per request;
  * graph: one CUDA graph per batch size captured once (static input/output buffers), each
    call = H2D copy into the static input, `graph.replay()`, D2H copies, synchronize;
  * device_only_us (graph): the replay alone, timed with CUDA events (no copies).

    /opt/torch/.venv/bin/python benches/pytorch_gpu_anchor.py --json
    ... --batch 1,1024,65536 --min-time 0.5 --dtypes f32,bf16

Prints one JSON document (a list of settings) with --json, else a table. Exit 1 with one line
on stderr when torch or CUDA is missing.
"""

import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,1024,65536")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per setting")
    ap.add_argument("--min-samples", type=int, default=200)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        from torch import nn
    except Exception as e:  # noqa: BLE001
        print(f"pytorch_gpu_anchor: torch is not importable: {e}", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("pytorch_gpu_anchor: torch.cuda.is_available() is False", file=sys.stderr)
        return 1

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = nn.Sequential(
                nn.Linear(20, 48), nn.ReLU(), nn.Linear(48, 48), nn.ReLU()
            )
            self.mean_head = nn.Linear(48, 3)
            self.logvar_head = nn.Linear(48, 3)

        def forward(self, x):
            h = self.backbone(x)
            return self.mean_head(h), self.logvar_head(h)

    torch.manual_seed(2024)
    dev = torch.device("cuda")
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}
    batches = [int(b) for b in args.batch.split(",") if b]
    results = []

    def p50(samples):
        s = sorted(samples)
        return s[len(s) // 2] / 1e3

    def timed(call):
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        samples = []
        start = time.perf_counter()
        while time.perf_counter() - start < args.min_time or len(samples) < args.min_samples:
            t0 = time.perf_counter_ns()
            call()
            samples.append(time.perf_counter_ns() - t0)
        return samples

    for dname in args.dtypes.split(","):
        dt = dtypes[dname]
        model = Reference().to(dev, dt).eval()
        for b in batches:
            host_in = torch.randn(b, 20).to(dt).pin_memory()
            host_mean = torch.empty(b, 3, dtype=dt).pin_memory()
            host_lv = torch.empty(b, 3, dtype=dt).pin_memory()

            def eager():
                with torch.inference_mode():
                    x = host_in.to(dev, non_blocking=True)
                    m, lv = model(x)
                    host_mean.copy_(m, non_blocking=True)
                    host_lv.copy_(lv, non_blocking=True)
                    torch.cuda.synchronize()

            s = timed(eager)
            results.append({"framework": "pytorch", "mode": "eager", "dtype": dname,
                            "batch": b, "p50_us": p50(s), "samples": len(s)})

            static_in = torch.zeros(b, 20, dtype=dt, device=dev)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.inference_mode(), torch.cuda.stream(stream):
                for _ in range(3):
                    model(static_in)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(graph):
                static_mean, static_lv = model(static_in)

            def replay():
                static_in.copy_(host_in, non_blocking=True)
                graph.replay()
                host_mean.copy_(static_mean, non_blocking=True)
                host_lv.copy_(static_lv, non_blocking=True)
                torch.cuda.synchronize()

            s = timed(replay)
            start_ev = torch.cuda.Event(enable_timing=True)
            end_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
            reps = 200
            for _ in range(reps):
                graph.replay()
            end_ev.record()
            torch.cuda.synchronize()
            results.append({"framework": "pytorch", "mode": "cuda_graph", "dtype": dname,
                            "batch": b, "p50_us": p50(s), "samples": len(s),
                            "device_only_us": start_ev.elapsed_time(end_ev) * 1e3 / reps})

    meta = {"torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0)}
    if args.json:
        print(json.dumps({"anchor": meta, "results": results}))
    else:
        print(meta)
        for r in results:
            print(f"{r['mode']:>10} {r['dtype']:>4} batch {r['batch']:>6}: p50 {r['p50_us']:9.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
