#!/usr/bin/env python3
"""Per-query time of two `kiln` binaries (e.g. before and after a change) on the realistic
fixture, measured the way a user sees it (issue 11): `kiln mvn` answering `--copies` identical
copies of one query from a file, minus the same binary's time for one copy (start-up), divided
by the copies. The time is the process's CPU time (user + system, from getrusage), with one
rayon thread (RAYON_NUM_THREADS=1), so that other work on a loaded machine does not count;
`--wall` uses wall-clock time with the default threads instead. The two binaries alternate
query by query, so machine load hits both alike.

  python3 benches/mvn_compare.py OLD_KILN NEW_KILN [--fixture benches/mvn_realistic.json]
      [--d 4,8] [--copies 64] [--extra "--points 4096"]

Prints one JSON line per (family, d): per-query ms p50 / p99 / max for each binary, and the
ratio of their means. Standard library only.
"""
import argparse
import json
import os
import resource
import subprocess
import tempfile
import time


def corr(case):
    d = case["d"]
    if "loadings" in case:
        lam = case["loadings"]
        return [[1.0 if i == j else lam[i] * lam[j] for j in range(d)] for i in range(d)]
    c = case["corr"]
    return [c[i * d:(i + 1) * d] for i in range(d)]


def quantile(xs, p):
    xs = sorted(xs)
    x = p * (len(xs) - 1)
    lo = int(x)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (x - lo) * (xs[hi] - xs[lo])


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(binary, path, extra, wall):
    env = dict(os.environ)
    if not wall:
        env["RAYON_NUM_THREADS"] = "1"
    t, c = time.perf_counter(), cpu_seconds()
    subprocess.run([binary, "mvn", "-i", path, *extra], check=True, stdout=subprocess.DEVNULL,
                   env=env)
    return time.perf_counter() - t if wall else cpu_seconds() - c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--fixture", default="benches/mvn_realistic.json")
    ap.add_argument("--d", default="4,8")
    ap.add_argument("--copies", type=int, default=64)
    ap.add_argument("--extra", default="")
    ap.add_argument("--wall", action="store_true")
    args = ap.parse_args()
    extra = args.extra.split()
    dims = {int(v) for v in args.d.split(",")}
    with open(args.fixture) as f:
        cases = [c for c in json.load(f)["cases"] if c["d"] in dims]
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        one = os.path.join(tmp, "one.jsonl")
        many = os.path.join(tmp, "many.jsonl")
        for case in cases:
            line = json.dumps({"corr": corr(case), "lower": case["lower"],
                               "upper": case["upper"]})
            with open(one, "w") as f:
                f.write(line + "\n")
            with open(many, "w") as f:
                f.write((line + "\n") * args.copies)
            key = (case["family"], case["d"])
            for name, binary in (("old", args.old), ("new", args.new)):
                base = min(run(binary, one, extra, args.wall) for _ in range(2))
                full = run(binary, many, extra, args.wall)
                per = max(full - base, 0.0) / (args.copies - 1) * 1e3
                times.setdefault(key, {}).setdefault(name, []).append(per)
    for (family, d), t in sorted(times.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rec = {"bench": "mvn-compare", "family": family, "d": d, "queries": len(t["old"]),
               "copies": args.copies, "clock": "wall" if args.wall else "cpu, 1 thread"}
        for name in ("old", "new"):
            xs = t[name]
            rec[name + "_ms_p50"] = quantile(xs, 0.5)
            rec[name + "_ms_p99"] = quantile(xs, 0.99)
            rec[name + "_ms_max"] = max(xs)
            rec[name + "_p99_over_p50"] = quantile(xs, 0.99) / max(quantile(xs, 0.5), 1e-9)
        rec["mean_speedup"] = sum(t["old"]) / max(sum(t["new"]), 1e-12)
        print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
