#!/usr/bin/env python3
"""Quality benchmark: the model `kiln init` configures against gradient boosting and ridge.

    suite.py KILN OUT.json [--role tune|check|fresh|fresh2|all] [--only a,b] [--set KEY=VALUE ...]
             [--anchors CACHE.json] [--seeds 7,8] [--tables DIR] [--work DIR] [--jobs N]

For each table of DIR/tables.json (built by tables.py when missing) every method fits the
training rows, may look at the validation rows, and is scored on the test rows of the
table's `__split` column:

  kiln         `kiln init --data CSV --target T`; only the feature list, the categorical
               list, the split (ranges on `__split`) and `export.dir` are edited; then
               `kiln config check`, `kiln train` (with any `--set` overrides) and
               `kiln predict` on the test rows: metrics come from the predicted mean and std.
  lgbm_default LGBMRegressor() with its defaults.
  lgbm_tuned   learning rate 0.05, num_leaves {15,31,63} × min_child_samples {5,20}, up to
               5,000 trees, early stopping (100 rounds) on the validation rows; the grid point
               with the best validation RMSE.
  hgb          HistGradientBoostingRegressor() defaults.
  ridge        one-hot categories, median imputation with indicators, standardised; alpha
               chosen on the validation rows.

Anchors are point models; their NLL/CRPS/coverage use a Gaussian with one variance, the mean
squared validation residual. `--anchors` reuses the anchors of an earlier OUT.json (they do
not depend on kiln), so comparing kiln configs costs only kiln's time.
"""

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import norm

HERE = Path(__file__).resolve().parent
SPLIT = "__split"
ANCHORS = ["lgbm_default", "lgbm_tuned", "hgb", "ridge"]
METHODS = ["kiln"] + ANCHORS
# The cell spellings kiln reads as missing.
NA = ["", "NA", "na", "Na", "NaN", "nan", "NAN", "null", "NULL", "Null"]


def scores(y, mu, sd):
    """RMSE, MAE, R², mean NLL (with ½ ln 2π), mean CRPS and central-interval coverage of
    Gaussian forecasts N(mu, sd²)."""
    r = y - mu
    sd = np.maximum(sd, 1e-12)
    z = r / sd
    ss = float(np.sum((y - y.mean()) ** 2))
    out = dict(rmse=float(np.sqrt(np.mean(r ** 2))), mae=float(np.mean(np.abs(r))),
               r2=1.0 - float(np.sum(r ** 2)) / ss if ss > 0 else float("nan"),
               nll=float(np.mean(0.5 * np.log(2 * np.pi) + np.log(sd) + 0.5 * z ** 2)),
               crps=float(np.mean(sd * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z)
                                        - 1 / math.sqrt(math.pi)))))
    for level in (50, 90):
        out[f"coverage{level}"] = float(np.mean(np.abs(z) <= norm.ppf(0.5 + level / 200)))
    return out


def read_table(tables: Path, spec: dict) -> pd.DataFrame:
    frame = pd.read_csv(tables / spec["csv"], keep_default_na=False, na_values=NA,
                        low_memory=False)
    for col in spec["features"]:
        if col in spec["categorical"]:
            # kiln reads `3` and `3.0` as the same category "3".
            def label(v):
                if pd.isna(v):
                    return None
                if isinstance(v, float) and v.is_integer():
                    return str(int(v))
                return str(v).strip()
            text = frame[col].map(label)
            frame[col] = pd.Categorical(text, categories=sorted(text.dropna().unique()))
        else:
            frame[col] = pd.to_numeric(frame[col], errors="raise").astype(float)
    return frame


def xy(frame, spec, part):
    rows = frame[frame[SPLIT] == part]
    return rows[spec["features"]], rows[spec["target"]].to_numpy(dtype=float)


def anchors(frame: pd.DataFrame, spec: dict, jobs: int) -> dict:
    import lightgbm as lgb
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer, OneHotEncoder, StandardScaler

    (xt, yt), (xv, yv), (xs, ys) = (xy(frame, spec, p) for p in (0, 1, 2))
    out = {}

    def score(name, model, started, **extra):
        sd = float(np.sqrt(np.mean((yv - model.predict(xv)) ** 2)))
        out[name] = scores(ys, model.predict(xs), np.full(len(ys), sd))
        out[name].update(seconds=round(time.time() - started, 2), **extra)

    t = time.time()
    score("lgbm_default", lgb.LGBMRegressor(n_jobs=jobs, verbose=-1).fit(xt, yt), t)

    t = time.time()
    best = None
    for leaves in (15, 31, 63):
        for min_child in (5, 20):
            m = lgb.LGBMRegressor(learning_rate=0.05, n_estimators=5000, num_leaves=leaves,
                                  min_child_samples=min_child, random_state=0, n_jobs=jobs,
                                  verbose=-1)
            m.fit(xt, yt, eval_X=xv, eval_y=yv, eval_metric="l2",
                  callbacks=[lgb.early_stopping(100, verbose=False)])
            v = float(np.sqrt(np.mean((m.predict(xv) - yv) ** 2)))
            if best is None or v < best[0]:
                best = (v, m, dict(num_leaves=leaves, min_child_samples=min_child,
                                   trees=int(m.best_iteration_)))
    score("lgbm_tuned", best[1], t, params=best[2])

    t = time.time()
    score("hgb", HistGradientBoostingRegressor(random_state=0).fit(xt, yt), t)

    t = time.time()
    cats = spec["categorical"]
    nums = [c for c in spec["features"] if c not in cats]

    def as_text(x):
        return x.astype(object).where(x.notna(), "__missing__").astype(str)

    def ridge(alpha):
        parts = [("num", make_pipeline(SimpleImputer(strategy="median", add_indicator=True),
                                       StandardScaler()), nums)]
        if cats:
            parts.append(("cat", make_pipeline(
                FunctionTransformer(as_text, feature_names_out="one-to-one"),
                OneHotEncoder(handle_unknown="ignore", sparse_output=False)), cats))
        return make_pipeline(ColumnTransformer(parts), Ridge(alpha=alpha))

    fits = [(a, ridge(a).fit(xt, yt)) for a in np.logspace(-3, 4, 15)]
    alpha, model = min(fits, key=lambda f: float(np.mean((f[1].predict(xv) - yv) ** 2)))
    score("ridge", model, t, alpha=float(alpha))
    return out


def sh(cmd, cwd: Path, log: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True)
    (cwd / log).write_text(f"$ {' '.join(map(str, cmd))}\nexit {proc.returncode}\n"
                           f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}")
    return proc


def flow(names) -> str:
    return "[" + ", ".join(json.dumps(n) for n in names) + "]"


def edit(config: str, spec: dict, export: Path) -> str:
    """The user's choices only: features, categories, the split, where runs go."""
    def sub(pattern, text, required=True):
        nonlocal config
        config, n = re.subn(pattern, lambda _: text, config, count=1, flags=re.M)
        if required and n != 1:
            raise SystemExit(f"init config has no line matching {pattern!r}")
        return n

    sub(r"^  features: .*$", f"  features: {flow(spec['features'])}")
    if not sub(r"^  categorical: .*$", f"  categorical: {flow(spec['categorical'])}",
               required=False) and spec["categorical"]:
        config = re.sub(r"^(  targets: .*)$",
                        lambda m: f"  categorical: {flow(spec['categorical'])}\n{m.group(1)}",
                        config, count=1, flags=re.M)
    sub(r"^  split:\n(?:    .*\n)+",
        f"  split:\n    column: {SPLIT}\n    train: {{to: 0}}\n"
        f"    validation: {{from: 1, to: 1}}\n    test: {{from: 2}}\n")
    sub(r"^  dir: .*$", f"  dir: {json.dumps(str(export))}")
    return config


def kiln(binary: str, tables: Path, spec: dict, frame, work: Path, overrides, seeds,
         append=()) -> dict:
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    csv = (tables / spec["csv"]).resolve()
    out = dict(status="failed")
    p = sh([binary, "init", "--data", csv, "--target", spec["target"], "--out", "init.yaml"],
           work, "init.log")
    if p.returncode:
        return dict(out, stage="init", error=p.stderr[-1500:])
    (work / "kiln.yaml").write_text(edit((work / "init.yaml").read_text(), spec,
                                         work / "export") + "".join(f"{a}\n" for a in append))
    p = sh([binary, "config", "check", "kiln.yaml"], work, "check.log")
    if p.returncode:
        return dict(out, stage="config check", error=p.stderr[-1500:])
    sets = [a for o in overrides for a in ("--set", o)]
    t = time.time()
    p = sh([binary, "train", "--plain", *sets, "kiln.yaml"], work, "train.log")
    seconds = time.time() - t
    if p.returncode:
        return dict(out, stage="train", error=p.stderr[-1500:])
    export = Path(p.stdout.strip().splitlines()[-1])
    export = export if export.is_absolute() else work / export
    raw = pd.read_csv(csv, keep_default_na=False, dtype=str)
    raw[raw[SPLIT].astype(int) == 2].to_csv(work / "test.csv", index=False)
    p = sh([binary, "predict", "--checkpoint", export, "--input", "test.csv", "--out",
            "pred.csv"], work, "predict.log")
    if p.returncode:
        return dict(out, stage="predict", error=p.stderr[-1500:])
    pred = pd.read_csv(work / "pred.csv")
    target = spec["target"]
    y = frame.loc[frame[SPLIT] == 2, target].to_numpy(dtype=float)
    out = scores(y, pred[f"{target}_mean"].to_numpy(float), pred[f"{target}_std"].to_numpy(float))
    manifest = json.loads((export / "manifest.json").read_text())
    test = manifest["metrics"]["test"]["targets"][0]
    out.update(status="ok", train_seconds=round(seconds, 2), export=str(export),
               nll_constant_variance=test.get("nll_constant_variance"),
               parameters=manifest.get("parameter_count"),
               stages=[ln for ln in p.stderr.splitlines() if "best epoch" in ln][:4])
    out["seed_rmse"] = {}
    for seed in seeds:
        p = sh([binary, "train", "--plain", *sets, "--set", f"seed={seed}", "kiln.yaml"],
               work, f"train_seed{seed}.log")
        if p.returncode == 0:
            m = json.loads((Path(p.stdout.strip().splitlines()[-1]) / "manifest.json")
                           .read_text())
            out["seed_rmse"][str(seed)] = m["metrics"]["test"]["targets"][0]["rmse_model"]
    return out


def fmt(x, w=9):
    if x is None or not math.isfinite(x):
        return "—".rjust(w)
    return (" " + (f"{x:.4g}" if abs(x) < 1e5 else f"{x:.3e}")).rjust(w)


def report(results: list) -> dict:
    """Print the per-table table and the summary; return the summary."""
    print("\nTest RMSE (lower is better), kiln's rank among the five by RMSE, R², and kiln's "
          "probabilistic scores\n(NLL, CRPS, 90 % coverage) beside tuned LightGBM with a "
          "constant variance from its validation residuals.")
    head = (f"{'table':16s}{'role':>6s}{'rows':>7s} |" + "".join(f"{m:>13s}" for m in METHODS)
            + f" |{'rank':>5s}{'R²':>7s} |{'NLL':>8s}{'NLLcv':>8s}{'CRPS':>9s}{'CRPScv':>9s}"
            f"{'cov90':>7s}")
    print(head)
    print("-" * len(head))
    gaps = {a: [] for a in ANCHORS}
    ranks, nll_wins, covs, within = [], 0, [], 0
    for r in results:
        m = r["methods"]
        k = m["kiln"]
        ok = k.get("status") == "ok"
        rank = 1 + sum(m[a]["rmse"] < k["rmse"] for a in ANCHORS) if ok else None
        row = (f"{r['name']:16s}{r['role']:>6s}{r['rows']:7d} |"
               + "".join(fmt(m[x].get("rmse"), 13) for x in METHODS)
               + f" |{(str(rank) if ok else 'FAIL'):>5s}{fmt(k.get('r2'), 7)} |"
               f"{fmt(k.get('nll'), 8)}{fmt(m['lgbm_tuned']['nll'], 8)}"
               f"{fmt(k.get('crps'), 10)}{fmt(m['lgbm_tuned']['crps'], 10)}"
               f"{fmt(k.get('coverage90'), 7)}")
        print(row)
        if not ok:
            print(f"    kiln failed at {k.get('stage')}: {str(k.get('error'))[-300:]}")
            continue
        ranks.append(rank)
        nll_wins += k["nll"] < m["lgbm_tuned"]["nll"]
        covs.append(k["coverage90"])
        within += k["rmse"] <= 1.02 * m["lgbm_default"]["rmse"]
        for a in ANCHORS:
            gaps[a].append(k["rmse"] / m[a]["rmse"])
    summary = {}
    if ranks:
        geo = {a: 100 * (math.exp(np.mean(np.log(v))) - 1) for a, v in gaps.items()}
        summary = dict(tables=len(ranks), mean_rank=float(np.mean(ranks)),
                       best_on=ranks.count(1),
                       within_2pct_of_lgbm_default=within,
                       nll_below_constant_variance_lgbm_tuned=nll_wins,
                       mean_coverage90=float(np.mean(covs)),
                       geomean_rmse_gap_pct={a: round(g, 2) for a, g in geo.items()})
        print("\nkiln's test RMSE / anchor's, geometric mean over tables (+ = kiln worse): "
              + ", ".join(f"{a} {g:+.1f}%" for a, g in geo.items()))
        print(f"kiln ran on {len(ranks)}/{len(results)} tables: mean rank {np.mean(ranks):.2f}"
              f" of 5, best on {ranks.count(1)}, at or within 2 % of LightGBM's default RMSE "
              f"on {within}, NLL below constant-variance tuned LightGBM on {nll_wins}, mean "
              f"90 % coverage {np.mean(covs):.3f}")
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kiln", help="kiln binary")
    ap.add_argument("out", help="results JSON")
    ap.add_argument("--role", default="all", choices=["tune", "check", "fresh", "fresh2", "all"])
    ap.add_argument("--only", default="", help="comma-separated table names")
    ap.add_argument("--set", action="append", default=[], dest="overrides",
                    help="a `kiln train --set` override applied to every table (repeatable)")
    ap.add_argument("--append", action="append", default=[],
                    help="a top-level YAML line appended to every config, for keys --set "
                         "cannot reach because the config leaves them out "
                         "(e.g. 'calibration: variance_scaling'; repeatable)")
    ap.add_argument("--anchors", help="reuse the anchors of this earlier results JSON")
    ap.add_argument("--seeds", default="", help="extra kiln seeds (test RMSE only)")
    ap.add_argument("--tables", default=str(HERE / "tables"))
    ap.add_argument("--work", default=str(HERE / "runs"))
    ap.add_argument("--jobs", type=int, default=1, help="threads of the Python anchors")
    a = ap.parse_args()

    binary = shutil.which(a.kiln) or str(Path(a.kiln).resolve())
    tables = Path(a.tables).resolve()
    if not (tables / "tables.json").exists():
        subprocess.run([sys.executable, str(HERE / "tables.py"), str(tables)], check=True)
    specs = json.loads((tables / "tables.json").read_text())
    specs = [s for s in specs if a.role in ("all", s["role"])]
    if a.only:
        specs = [s for s in specs if s["name"] in a.only.split(",")]
    cached = {}
    if a.anchors:
        cached = {r["name"]: {k: v for k, v in r["methods"].items() if k != "kiln"}
                  for r in json.loads(Path(a.anchors).read_text())["results"]}
    seeds = [int(s) for s in a.seeds.split(",") if s]
    from threadpoolctl import threadpool_limits

    started, results = time.time(), []
    for spec in specs:
        t = time.time()
        frame = read_table(tables, spec)
        methods = cached.get(spec["name"])
        if methods is None:
            with threadpool_limits(limits=a.jobs):
                methods = anchors(frame, spec, a.jobs)
        methods = dict(methods, kiln=kiln(binary, tables, spec, frame,
                                          Path(a.work).resolve() / spec["name"], a.overrides,
                                          seeds, a.append))
        k = methods["kiln"]
        print(f"{spec['name']:16s} kiln {k['status']:6s} rmse {fmt(k.get('rmse'))}  "
              f"LightGBM default {fmt(methods['lgbm_default']['rmse'])}  "
              f"({time.time() - t:.1f} s)", flush=True)
        results.append(dict(name=spec["name"], role=spec["role"], rows=spec["rows"],
                            split=spec["split"], methods=methods))
    summary = {}
    for role in ("tune", "check", "fresh", "fresh2"):
        part = [r for r in results if r["role"] == role]
        if part:
            print(f"\n=== {role} tables ===")
            summary[role] = report(part)
    kiln_version = subprocess.run([binary, "--version"], capture_output=True,
                                  text=True).stdout.strip()
    Path(a.out).write_text(json.dumps(dict(kiln=kiln_version, overrides=a.overrides,
                                           append=a.append,
                                           seconds=round(time.time() - started, 1),
                                           summary=summary, results=results), indent=2) + "\n")
    print(f"\n{len(results)} tables in {time.time() - started:.0f} s; results in {a.out}")


if __name__ == "__main__":
    main()
