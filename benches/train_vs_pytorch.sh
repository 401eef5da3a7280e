#!/usr/bin/env bash
# Stage-1 training throughput, kiln beside PyTorch's tightest loop, in one run on one machine:
#   benches/train_vs_pytorch.sh PYTHON [KILN]
# PYTHON: an interpreter with torch (CPU); KILN: the kiln binary (default target/release/kiln).
# Prints kiln's `bench train` JSON lines (workers 0, 1, 2), PyTorch's `train_bench` at 1 and 2
# threads (benches/pytorch_reference.py), and the ratio of the best of each.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:?usage: benches/train_vs_pytorch.sh PYTHON [KILN]}
kiln=${2:-target/release/kiln}
rows=${ROWS:-200000}
kiln_json=$("$kiln" bench train --json --workers 0,1,2 --rows "$rows")
echo "$kiln_json"
torch_json=$(PYTHONPATH=benches "$py" - "$rows" <<'PY'
import json, sys, torch
import pytorch_reference as ref
rows = int(sys.argv[1])
for threads in (1, 2):
    torch.set_num_threads(threads)
    r = ref.train_bench(rows, 128, 7)
    r["threads"] = threads
    print(json.dumps(r))
PY
)
echo "$torch_json"
python3 - "$kiln_json" "$torch_json" <<'PY'
import json, sys
k = max(json.loads(l)["samples_per_s"] for l in sys.argv[1].splitlines() if l.strip())
t = max(json.loads(l)["samples_per_s"] for l in sys.argv[2].splitlines() if l.strip())
print(json.dumps({"bench": "train_vs_pytorch", "kiln_samples_per_s": round(k),
                  "pytorch_samples_per_s": round(t), "ratio": round(k / t, 2)}))
PY
