#!/usr/bin/env python3
"""SciPy's multivariate-normal CDF on the cases of `kiln bench mvn`, for a same-session ratio.

    /tmp/torchenv/bin/pip install scipy numpy
    /tmp/torchenv/bin/python benches/scipy_mvn_reference.py --d 2,4,8,10,12 --json

Cases (as in `kiln::model::mvn::bench::equicorrelated_cases`): unit variances, equal
correlation rho = 1/2, upper limits only. `orthant` is b = 0 (exact answer 1/(d + 1));
`random` draws every upper limit uniformly from [-1, 1.5] (numpy, seeded; exact answer from the
one-dimensional representation P(X <= b) = int phi(t) prod_i Phi((b_i - sqrt(rho) t)/sqrt(1 - rho))
dt by the trapezoidal rule on [-12, 12], accurate to about 1e-14).

SciPy is called exactly as a user would: `multivariate_normal(mean=0, cov=C).cdf(b)` with its
defaults (abseps = 1e-5, releps = 1e-5, maxpts = 1e6 d; since SciPy 1.10 that is Genz's
randomised lattice rule (`_qmvn`) rerun by `_qauto` until 3 standard errors are below abseps;
d = 2 uses the exact bivariate routine `_bvn`). A call with a (batch, d) array of limits
answers the rows one after another (`np.apply_along_axis`), which is what is timed: one call
per batch, repeated until --min-time seconds, median ms/query over --rounds rounds.

Output: one JSON line per (kind, d):
{"bench": "mvn-scipy", "kind": ..., "d": ..., "batch": ..., "ms_per_query": ...,
 "evals_per_s": ..., "max_abs_err": ..., "rms_err": ..., "scipy": "<version>"}
Realistic families (issue 11), as subcommands; the fixture they share with `kiln bench mvn
--realistic` and tests/mvn.rs is benches/mvn_realistic.json:

  python benches/scipy_mvn_reference.py reference [--out benches/mvn_realistic.json]
      generates the seeded queries and their high-accuracy references (run once; slow);
  python benches/scipy_mvn_reference.py time [--d 4,8]
      SciPy's default `multivariate_normal.cdf` on the fixture's queries of each d;
  python benches/scipy_mvn_reference.py process --kiln target/release/kiln [--n 1024]
      1,024 fresh realistic d = 4 queries: SciPy's default time for all of them and `kiln mvn`
      answering them from stdin as a process, start-up included.
See `REALISTIC_DOC` below for the families and references.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import scipy
from scipy.special import ndtr
from scipy.stats import multivariate_normal
from scipy.stats._qmvnt import _qauto, _qmvn


def equicorrelated_cdf(b, rho):
    sr, sc = np.sqrt(rho), np.sqrt(1.0 - rho)
    h = 0.004
    t = -12.0 + h * np.arange(int(24.0 / h) + 1)
    f = np.exp(-0.5 * t * t) / np.sqrt(2.0 * np.pi)
    for bi in b:
        f = f * ndtr((bi - sr * t) / sc)
    return float(f.sum() * h)


def cases(kind, d, batch, seed):
    rng = np.random.default_rng(seed + 1000 * d)
    if kind == "orthant":
        upper = np.zeros((batch, d))
        exact = np.full(batch, 1.0 / (d + 1.0))
    else:
        upper = -1.0 + 2.5 * rng.random((batch, d))
        exact = np.array([equicorrelated_cdf(b, 0.5) for b in upper])
    return upper, exact


REALISTIC_DOC = """Realistic multivariate-normal queries for `kiln bench mvn --realistic`, their reference
answers, and SciPy's timings on them (issue 11).

Families (seeded, d in {2, 4, 8, 12, 16}):
  wishart       normalised Wishart correlation (df = d + 2)
  ar1           AR(1) correlation rho^|i-j|, rho ~ U[0.7, 0.9]
  factor_pos    one-factor corr = l l^T off the diagonal, loadings ~ U[0.3, 0.95]
  factor_mixed  the same with random signs on the loadings
Limits: upper ~ U[-1.5, 2.5]; in every fourth query each coordinate is, with probability 1/2,
the one-sided lower tail X_i >= -u instead.

References: one-factor families by the exact one-dimensional integral
  P = int phi(t) prod_i [Phi((b_i - l_i t)/s_i) - Phi((a_i - l_i t)/s_i)] dt,  s_i = sqrt(1 - l_i^2)
(trapezoidal rule on [-12, 12], h = 0.004: about 1e-14); the others by SciPy's own estimator
(`multivariate_normal.cdf` calls `_qauto(_qmvn, ...)`; called directly here to keep its error
estimate) at abseps = 1e-8 (1e-7 for d >= 12, where 1e-8 costs ~25 s a query).

Usage (venv with numpy + scipy, e.g. ~/.cache/kiln/scipy-venv):
  python benches/scipy_mvn_reference.py reference [--out benches/mvn_realistic.json]
  python benches/scipy_mvn_reference.py time [--fixture ...] [--d 4,8]
      SciPy's default multivariate_normal.cdf on the fixture's queries of each d: time per
      query (mean, p50, p99) and max/mean error against the reference, one JSON line per d.
  python benches/scipy_mvn_reference.py process --kiln target/release/kiln [--n 1024]
      1,024 fresh realistic d = 4 queries (seeded): SciPy's default time for all of them, and
      `kiln mvn` answering them from stdin as a process (start-up included); one JSON line.
"""

FAMILIES = ["wishart", "ar1", "factor_pos", "factor_mixed"]
DIMS = [2, 4, 8, 12, 16]
SEED = 20261101


def count_for(d):
    return 16 if d <= 8 else 8


def make_case(rng, family, d, index):
    case = {"family": family, "d": d}
    if family == "wishart":
        g = rng.standard_normal((d, d + 2))
        w = g @ g.T
        s = np.sqrt(np.diag(w))
        c = np.round(w / np.outer(s, s), 6)
        np.fill_diagonal(c, 1.0)
        case["corr"] = [float(v) for v in c.ravel()]
    elif family == "ar1":
        rho = round(float(rng.uniform(0.7, 0.9)), 4)
        idx = np.arange(d)
        c = np.round(rho ** np.abs(np.subtract.outer(idx, idx)), 6)
        np.fill_diagonal(c, 1.0)
        case["rho"] = rho
        case["corr"] = [float(v) for v in c.ravel()]
    else:
        lam = np.round(rng.uniform(0.3, 0.95, d), 4)
        if family == "factor_mixed":
            lam = lam * np.where(rng.uniform(size=d) < 0.5, -1.0, 1.0)
        case["loadings"] = [float(v) for v in lam]
    u = np.round(rng.uniform(-1.5, 2.5, d), 4)
    lower = [None] * d
    upper = [float(v) for v in u]
    if index % 4 == 3:
        flip = rng.uniform(size=d) < 0.5
        for i in range(d):
            if flip[i]:
                lower[i] = -upper[i]
                upper[i] = None
    case["lower"] = lower
    case["upper"] = upper
    return case


def corr_of(case):
    d = case["d"]
    if "loadings" in case:
        lam = np.array(case["loadings"])
        c = np.outer(lam, lam)
        np.fill_diagonal(c, 1.0)
        return c
    return np.array(case["corr"]).reshape(d, d)


def limits_of(case):
    a = np.array([-np.inf if v is None else v for v in case["lower"]])
    b = np.array([np.inf if v is None else v for v in case["upper"]])
    return a, b


def norm_cdf(x):
    return 0.5 * scipy.special.erfc(-x / math.sqrt(2.0))


def one_factor(case):
    lam = np.array(case["loadings"])
    a, b = limits_of(case)
    s = np.sqrt(1.0 - lam * lam)
    t = np.linspace(-12.0, 12.0, 6001)
    f = np.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    for i in range(len(lam)):
        f = f * (norm_cdf((b[i] - lam[i] * t) / s[i]) - norm_cdf((a[i] - lam[i] * t) / s[i]))
    return float(np.sum(f) * (t[1] - t[0]))


def generate(seed=SEED):
    rng = np.random.default_rng(seed)
    cases = []
    for family in FAMILIES:
        for d in DIMS:
            for k in range(count_for(d)):
                cases.append(make_case(rng, family, d, k))
    return cases


def reference(args):
    cases = generate()
    t0 = time.time()
    for i, case in enumerate(cases):
        if "loadings" in case:
            case["reference"] = one_factor(case)
            case["ref_err"] = 1e-13
            case["source"] = "one-factor integral"
        else:
            a, b = limits_of(case)
            eps = 1e-8 if case["d"] <= 8 else 1e-7
            p, err, _ = _qauto(_qmvn, corr_of(case), a, b, np.random.default_rng(i),
                               error=eps, limit=1_000_000 * case["d"], n_batches=10)
            case["reference"] = float(p)
            case["ref_err"] = float(err)
            case["source"] = f"scipy {scipy.__version__} abseps={eps:g}"
        print(f"{i + 1}/{len(cases)} {case['family']} d={case['d']} p={case['reference']:.10f} "
              f"err={case['ref_err']:.1e} ({time.time() - t0:.0f} s)", file=sys.stderr)
    fixture = {"seed": SEED, "generator": "benches/scipy_mvn_reference.py", "cases": cases}
    with open(args.out + ".tmp", "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
        os.replace(args.out + ".tmp", args.out)


def scipy_default(case):
    a, b = limits_of(case)
    return multivariate_normal.cdf(b, mean=np.zeros(case["d"]), cov=corr_of(case), lower_limit=a,
                                   rng=np.random.default_rng(0))


def time_scipy(args):
    with open(args.fixture) as f:
        cases = json.load(f)["cases"]
    for d in [int(x) for x in args.d.split(",")]:
        sel = [c for c in cases if c["d"] == d]
        if not sel:
            continue
        # Every query timed in each of --rounds passes; its time is the median over passes
        # (SciPy's answers are seeded, so every pass does the same work).
        per_round, errs = [], []
        for k in range(max(1, args.rounds)):
            times = []
            for c in sel:
                t = time.perf_counter()
                p = scipy_default(c)
                times.append(time.perf_counter() - t)
                if k == 0:
                    errs.append(abs(p - c["reference"]))
            per_round.append(times)
        times = np.median(np.array(per_round), axis=0) * 1e3
        errs = np.array(errs)
        print(json.dumps({"bench": "scipy-mvn", "scipy": scipy.__version__, "algorithm": "default",
                          "d": d, "queries": len(sel), "rounds": max(1, args.rounds),
                          "ms_per_query_mean": float(times.mean()),
                          "ms_p50": float(np.percentile(times, 50)),
                          "ms_p99": float(np.percentile(times, 99)),
                          "max_abs_err": float(errs.max()), "mean_abs_err": float(errs.mean()),
                          "rms_err": float(np.sqrt(np.mean(errs ** 2)))}), flush=True)


def process(args):
    rng = np.random.default_rng(args.seed)
    cases = [make_case(rng, FAMILIES[k % 4], 4, k // 4) for k in range(args.n)]
    lines = []
    for c in cases:
        lines.append(json.dumps({"corr": corr_of(c).tolist(), "lower": c["lower"],
                                 "upper": c["upper"]}))
    text = "\n".join(lines) + "\n"
    t = time.perf_counter()
    sp = [scipy_default(c) for c in cases]
    t_scipy = time.perf_counter() - t
    out = {"bench": "mvn-process", "d": 4, "queries": args.n, "scipy_s": t_scipy}
    settings = [("kiln_default", []),
                ("kiln_adaptive", ["--tolerance", "2e-6", "--points", "16384"]),
                ("kiln_fast", ["--tolerance", "2e-5"])]
    for name, extra in settings:
        best = None
        for _ in range(3):
            t = time.perf_counter()
            r = subprocess.run([args.kiln, "mvn", *extra], input=text.encode(),
                               capture_output=True, check=True)
            el = time.perf_counter() - t
            best = el if best is None else min(best, el)
        ps = [json.loads(l)["p"] for l in r.stdout.decode().splitlines()]
        out[name + "_s"] = best
        out[name + "_ratio"] = t_scipy / best
        out[name + "_max_diff_vs_scipy"] = float(max(abs(x - y) for x, y in zip(ps, sp)))
    print(json.dumps(out))


def realistic_main(argv):
    ap = argparse.ArgumentParser(description="realistic MVN families (issue 11)")
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("reference")
    r.add_argument("--out", default="benches/mvn_realistic.json")
    t = sub.add_parser("time")
    t.add_argument("--fixture", default="benches/mvn_realistic.json")
    t.add_argument("--d", default="4,8")
    t.add_argument("--rounds", type=int, default=5, help="timed passes; per-query median")
    p = sub.add_parser("process")
    p.add_argument("--kiln", default="target/release/kiln")
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    {"reference": reference, "time": time_scipy, "process": process}[args.mode](args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", default="2,4,8,10,12")
    ap.add_argument("--kind", default="orthant,random")
    ap.add_argument("--batch", type=int, default=64, help="queries per timed call")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    dims = [int(v) for v in args.d.split(",")]
    kinds = args.kind.split(",")
    if not args.json:
        print(f"{'kind':<8} {'d':>3} {'batch':>5} {'ms/query':>9} {'q/s':>9} "
              f"{'max_err':>9} {'rms_err':>9}")
    for kind in kinds:
        for d in dims:
            cov = np.full((d, d), 0.5) + 0.5 * np.eye(d)
            upper, exact = cases(kind, d, args.batch, args.seed)
            dist = multivariate_normal(mean=np.zeros(d), cov=cov, seed=args.seed)
            errs = []
            per_round = []
            for _ in range(args.rounds):
                calls = 0
                start = time.perf_counter()
                while True:
                    p = np.atleast_1d(dist.cdf(upper))
                    errs.append(p - exact)
                    calls += 1
                    if time.perf_counter() - start >= args.min_time:
                        break
                per_round.append((time.perf_counter() - start) / (calls * args.batch))
            per_q = float(np.median(per_round))
            errs = np.concatenate(errs)
            rec = {
                "bench": "mvn-scipy",
                "kind": kind,
                "d": d,
                "batch": args.batch,
                "ms_per_query": 1e3 * per_q,
                "evals_per_s": 1.0 / per_q,
                "max_abs_err": float(np.abs(errs).max()),
                "rms_err": float(np.sqrt(np.mean(errs ** 2))),
                "answers": int(errs.size),
                "scipy": scipy.__version__,
            }
            if args.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{kind:<8} {d:>3} {args.batch:>5} {rec['ms_per_query']:>9.3f} "
                      f"{rec['evals_per_s']:>9.1f} {rec['max_abs_err']:>9.2e} "
                      f"{rec['rms_err']:>9.2e}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("reference", "time", "process"):
        realistic_main(sys.argv[1:])
    else:
        main()
