#!/usr/bin/env bash
# The GPU check, one call of at most ~8 minutes on a machine with an NVIDIA GPU (issue 44):
#   1. preflight: the binary, an NVIDIA device, no toolkit stub first on LD_LIBRARY_PATH
#      (fails fast, in one line, when any is missing: a dry run without a GPU stops here);
#   2. `kiln doctor --gpu` (libraries, device, cuda-bf16/cuda-f32 agreement, bench infer, a
#      short bf16 training run), guarded: its JSON is kept whatever happens;
#   3. trains configs/baseball.yaml on the CPU, on the GPU in f32 and in bf16 (concurrently)
#      and compares the test MSE per target of each GPU run with the CPU run's;
#   4. `kiln bench infer` on every engine (burn, fused, int8, auto, cuda-f32, cuda-bf16) at
#      batches 1 / 1,024 / 65,536 on the reference network — the cuda engines are the fused
#      CubeCL kernel (one launch per call) — then cuda-f32/cuda-bf16 again with
#      KILN_GPU_ENGINE=burn (the Burn-module engine, for comparison; "(burn module)" in the
#      speed table);
#   5. `kiln bench serve` with `--engine cuda-bf16` and `--engine fused` on the baseball model;
#   6. the PyTorch anchor (benches/pytorch_gpu_anchor.py: the same network, eager and CUDA
#      graph, f32 and bf16, host -> host p50) when torch imports (PY, default
#      /opt/torch/.venv/bin/python);
# and writes everything to ONE JSON document, $OUT/gpu_check.json (OUT defaults to
# target/gpu_check), with a `speed_table` (p50 µs per batch: kiln's engines beside PyTorch's).
# Every step has its own timeout; a failed step is recorded (its reason, its log's tail) and
# the independent ones still run. Exit 0 only when every step passed, else 1 with the first
# failure in one line on stderr.
#
# Prepare the binary here (CUDA 13 image: build NVRTC's name for CUDA 13 into cudarc), then
# carry it with the working tree (a stripped release binary is well under the 64 MiB limit):
#   CUDARC_CUDA_VERSION=13000 cargo build --release --features cuda
#   mkdir -p bin && strip -o bin/kiln-cuda target/release/kiln
# On the GPU machine (never put the toolkit's stubs/ directory on LD_LIBRARY_PATH):
#   OUT=$OUT benches/gpu_check.sh        # KILN=bin/kiln-cuda by default
# Dry runs without a GPU: it stops at the preflight in one line (exit 1) and still writes the
# JSON; GPU_CHECK_NO_DEVICE_PREFLIGHT=1 runs every step anyway (the GPU ones then fail, each
# recorded), to exercise the script itself.
set -uo pipefail
cd "$(dirname "$0")/.."

KILN=${KILN:-bin/kiln-cuda}
OUT=${OUT:-target/gpu_check}
PY=${PY:-/opt/torch/.venv/bin/python}
mkdir -p "$OUT"
work="$OUT/gpu_check.d"
rm -rf "$work"
mkdir -p "$work"
json="$OUT/gpu_check.json"
steps="$work/steps.tsv"
: >"$steps"
started=$(date +%s)

# One python for the JSON (the system's, else the PyTorch venv's); without any, a minimal
# JSON is written by the shell.
JPY=""
for p in python3 "$PY"; do
    if command -v "$p" >/dev/null 2>&1 || [ -x "$p" ]; then JPY=$p; break; fi
done

# record NAME ok|failed|skipped SECONDS REASON
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$steps"; }

# run_step NAME TIMEOUT_S OUTFILE CMD...: stdout to OUTFILE, stderr to NAME.log.
run_step() {
    local name=$1 limit=$2 out=$3
    shift 3
    local t0 rc why
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$out" 2>"$work/$name.log"
    rc=$?
    if [ $rc -eq 0 ]; then
        record "$name" ok $(($(date +%s) - t0)) ""
    else
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            why="timed out after ${limit}s"
        else
            why="exit $rc: $(grep -v '^\s*$' "$work/$name.log" | tail -n 1 | cut -c1-300)"
        fi
        record "$name" failed $(($(date +%s) - t0)) "$why"
    fi
    return $rc
}

finish() {
    if [ -n "$JPY" ]; then
        "$JPY" - "$work" "$json" "$started" <<'PYEOF'
import glob, json, os, sys, time
work, out, started = sys.argv[1], sys.argv[2], int(sys.argv[3])
def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        rows = []
        for line in text.splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
        return rows or None
steps = []
with open(os.path.join(work, "steps.tsv")) as f:
    for line in f:
        name, status, secs, reason = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
        steps.append({"step": name, "status": status, "seconds": int(secs or 0),
                      **({"reason": reason} if reason else {})})
failed = [s for s in steps if s["status"] != "ok"]
doc = {"check": "benches/gpu_check.sh", "ok": not failed and bool(steps),
       "wall_s": int(time.time()) - started, "steps": steps}
if failed:
    doc["failed_step"] = failed[0]["step"]
    doc["error"] = failed[0].get("reason", "")
doc["doctor"] = load(os.path.join(work, "doctor.json"))
# Training: test MSE per target, each GPU run against the CPU run.
def test_mse(kind):
    for m in glob.glob(os.path.join(work, f"runs-{kind}", "**", "manifest.json"), recursive=True):
        d = load(m) or {}
        t = ((d.get("metrics") or {}).get("test") or {}).get("targets") or []
        if t:
            return {r["target"]: r["mse_model"] for r in t}
    return None
train = {k: test_mse(k) for k in ["cpu", "cuda-f32", "cuda-bf16"]}
cmp = []
for k in ["cuda-f32", "cuda-bf16"]:
    if train["cpu"] and train[k]:
        for t, v in train["cpu"].items():
            g = train[k].get(t)
            if g is not None:
                cmp.append({"run": k, "target": t, "cpu_test_mse": v, "gpu_test_mse": g,
                            "rel_diff": (g - v) / v if v else None})
doc["train"] = {"test_mse": train, "vs_cpu": cmp}
doc["bench_infer"] = load(os.path.join(work, "bench_infer.jsonl"))
doc["bench_infer_burn_module"] = load(os.path.join(work, "bench_infer_burn.jsonl"))
doc["bench_serve"] = {e: load(os.path.join(work, f"bench_serve_{e}.json"))
                      for e in ["cuda-bf16", "fused"]}
doc["pytorch"] = load(os.path.join(work, "pytorch.json"))
table = {}
for r in doc["bench_infer"] or []:
    if isinstance(r, dict) and "engine" in r:
        table.setdefault(str(r["batch"]), {})[f"kiln {r['engine']}"] = r.get("p50_us")
for r in doc["bench_infer_burn_module"] or []:
    if isinstance(r, dict) and "engine" in r:
        table.setdefault(str(r["batch"]), {})[f"kiln {r['engine']} (burn module)"] = r.get("p50_us")
for r in ((doc["pytorch"] or {}).get("results") or []) if isinstance(doc["pytorch"], dict) else []:
    table.setdefault(str(r["batch"]), {})[f"pytorch {r['mode']} {r['dtype']}"] = r.get("p50_us")
doc["speed_table"] = {"unit": "p50 us per call, host -> host", "by_batch": table}
serve = {}
for e, rep in doc["bench_serve"].items():
    for rt in (rep or {}).get("round_trips", []) if isinstance(rep, dict) else []:
        serve.setdefault(e, {})[rt.get("name", "?")] = rt.get("p50_us", rt.get("p50"))
doc["serve_round_trips_p50_us"] = serve
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
PYEOF
    else
        local first
        first=$(awk -F'\t' '$2 != "ok" {print $1 ": " $4; exit}' "$steps" | sed 's/["\\]/ /g')
        printf '{"check": "benches/gpu_check.sh", "ok": false, "error": "%s", "note": "no python for the full report"}\n' "$first" >"$json"
    fi
    local first_fail
    first_fail=$(awk -F'\t' '$2 != "ok" {print $1 ": " $4; exit}' "$steps")
    if [ -n "$first_fail" ]; then
        echo "gpu_check: $first_fail (report: $json)" >&2
        exit 1
    fi
    echo "gpu_check: every step passed in $(($(date +%s) - started)) s (report: $json)" >&2
    exit 0
}

# 1. Preflight: fail fast, in one line, when the GPU check cannot run at all.
preflight_fail=""
if [ ! -x "$KILN" ]; then
    preflight_fail="$KILN is not an executable (build it as this script's header says, or set KILN)"
elif ! "$KILN" doctor >/dev/null 2>&1; then
    preflight_fail="$KILN does not run on this machine ($KILN doctor failed)"
elif [ -z "${GPU_CHECK_NO_DEVICE_PREFLIGHT:-}" ] && [ ! -e /dev/nvidiactl ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    preflight_fail="no NVIDIA GPU here (no /dev/nvidiactl, no nvidia-smi)"
else
    IFS=: read -r -a ldp <<<"${LD_LIBRARY_PATH:-}"
    for d in "${ldp[@]}"; do
        if [ -e "$d/libcuda.so.1" ] || [ -e "$d/libcuda.so" ]; then
            case "$d" in
            */stubs | */stubs/*) preflight_fail="LD_LIBRARY_PATH puts the CUDA toolkit's stub libcuda first ($d): remove stubs/ from it" ;;
            esac
            break
        fi
    done
fi
if [ -n "$preflight_fail" ]; then
    record preflight failed 0 "$preflight_fail"
    for s in doctor train_cpu train_cuda_f32 train_cuda_bf16 bench_infer bench_infer_burn bench_serve_cuda-bf16 bench_serve_fused pytorch; do
        record "$s" skipped 0 "preflight failed"
    done
    finish
fi
record preflight ok 0 ""
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$work/nvidia-smi.txt" 2>&1 || true

# 2. The readiness check (guarded steps; its JSON always comes out).
run_step doctor 150 "$work/doctor.json" "$KILN" doctor --gpu --gpu-config configs/tiny.yaml --gpu-bench-seconds 0.3

# 3. configs/baseball.yaml on the CPU and on the GPU (f32, bf16), concurrently.
train() { # KIND DEVICE PRECISION
    run_step "train_$(echo "$1" | tr - _)" 240 "$work/train_$1.out" \
        "$KILN" train configs/baseball.yaml --set "device=$2" --set "precision=$3" \
        --set "export.dir=$work/runs-$1"
}
train cpu cpu f32 &
train cuda-f32 cuda f32 &
train cuda-bf16 cuda bf16 &
wait

# 4. Inference speed, every engine, the reference network.
run_step bench_infer 150 "$work/bench_infer.jsonl" "$KILN" bench infer --reference \
    --engine burn,fused,int8,auto,cuda-f32,cuda-bf16 --batch 1,1024,65536 \
    --min-time 0.3 --iters 50 --rounds 2 --json
# The same GPU engines as the Burn module (the engine before the fused kernel), for comparison.
run_step bench_infer_burn 90 "$work/bench_infer_burn.jsonl" env KILN_GPU_ENGINE=burn "$KILN" \
    bench infer --reference --engine cuda-f32,cuda-bf16 --batch 1,1024,65536 \
    --min-time 0.3 --iters 50 --rounds 2 --json

# 5. The serving path with the GPU engine and with fused, on the baseball model.
model=$(find "$work/runs-cuda-bf16" "$work/runs-cuda-f32" "$work/runs-cpu" -name manifest.json -path '*export*' 2>/dev/null | head -n 1)
if [ -n "$model" ]; then
    mkdir -p "$work/repo/baseball"
    cp -r "$(dirname "$model")" "$work/repo/baseball/1"
    for e in cuda-bf16 fused; do
        run_step "bench_serve_$e" 90 "$work/bench_serve_$e.json" "$KILN" bench serve \
            --repository "$work/repo" --model baseball --engine "$e" --requests 300 \
            --rounds 2 --connections 4 --closed-seconds 1 --fractions 0.5 \
            --sweep-seconds 1 --stage-iters 50 --json
    done
else
    record bench_serve_cuda-bf16 skipped 0 "no trained baseball export"
    record bench_serve_fused skipped 0 "no trained baseball export"
fi

# 6. The PyTorch anchor.
if [ -x "$PY" ] && "$PY" -c 'import torch' >/dev/null 2>&1; then
    run_step pytorch 120 "$work/pytorch.json" "$PY" benches/pytorch_gpu_anchor.py --json --min-time 0.3
else
    record pytorch skipped 0 "torch is not importable with $PY"
fi
finish
