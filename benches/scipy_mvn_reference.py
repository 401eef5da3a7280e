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
"""

import argparse
import json
import time

import numpy as np
import scipy
from scipy.special import ndtr
from scipy.stats import multivariate_normal


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
    main()
