#!/usr/bin/env python3
"""Compare kiln across runs of suite.py: per table, kiln's test RMSE relative to LightGBM's
default, NLL and 90 % coverage of each results file; then the geometric-mean RMSE ratio.

    compare.py BEFORE.json AFTER.json [MORE.json ...]
"""

import json
import math
import sys


def main(paths):
    runs = [json.loads(open(p).read()) for p in paths]
    names = [r["name"] for r in runs[0]["results"]]
    print(f"{'table':16s}{'role':>6s} | " + " | ".join(f"{p[-28:]:>28s}" for p in paths))
    print(f"{'':22s} | " + " | ".join(f"{'RMSE/lgbm':>10s}{'NLL':>9s}{'cov90':>9s}"
                                      for _ in paths))
    logs = [[] for _ in paths]
    for name in names:
        cells, role = [], ""
        for i, run in enumerate(runs):
            r = next((x for x in run["results"] if x["name"] == name), None)
            k = r and r["methods"]["kiln"]
            if not k or k.get("status") != "ok":
                cells.append(f"{'—':>28s}")
                continue
            role = r["role"]
            ratio = k["rmse"] / r["methods"]["lgbm_default"]["rmse"]
            logs[i].append((role, math.log(ratio)))
            cells.append(f"{100 * (ratio - 1):>+9.1f}%{k['nll']:>9.4g}{k['coverage90']:>9.3f}")
        print(f"{name:16s}{role:>6s} | " + " | ".join(cells))
    for role in ("tune", "check"):
        geo = []
        for lg in logs:
            v = [x for r, x in lg if r == role]
            geo.append(f"{100 * (math.exp(sum(v) / len(v)) - 1):>+27.1f}%" if v else f"{'—':>28s}")
        print(f"{'geomean ' + role:22s} | " + " | ".join(geo))


if __name__ == "__main__":
    main(sys.argv[1:])
