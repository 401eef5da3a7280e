#!/usr/bin/env bash
# GPU check of the CUDA engines (issue 5, item 6). Run from anywhere on a machine with an
# NVIDIA GPU and driver; CI never runs it. Prints, in order:
#   1. the GPU (nvidia-smi),
#   2. cuda-bf16 (and cuda-f32) vs the Burn f32 CPU forward: the agreement test, which asserts
#      ≤ 1e-2 relative and prints the worst error as a fraction of that bound,
#   3. `kiln bench infer --engine fused,cuda-f32,cuda-bf16 --batch 1,1024,65536`,
#   4. bf16 training throughput (samples/s and optimizer steps/s) on configs/tiny.yaml.
#
# Binaries: $KILN (default target/release/kiln) and $ENGINES_TEST (the integration-test
# binary `it`, whose `engines::cuda…` test runs here). When either is missing and cargo is
# available, both are built with `--features cuda`. To carry prebuilt binaries to a GPU machine:
#   cargo build --release --features cuda
#   cargo test --release --features cuda --test it --no-run   # prints the test binary
#   KILN=target/release/kiln ENGINES_TEST=target/release/deps/it-<hash> benches/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

KILN=${KILN:-target/release/kiln}
ENGINES_TEST=${ENGINES_TEST:-}
if [ -z "$ENGINES_TEST" ]; then
    ENGINES_TEST=$(ls -t target/release/deps/it-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
fi
if { [ ! -x "$KILN" ] || [ -z "$ENGINES_TEST" ]; } && command -v cargo >/dev/null; then
    echo "== building with --features cuda"
    cargo build --release --features cuda
    ENGINES_TEST=$(cargo test --release --features cuda --test it --no-run 2>&1 \
        | sed -n 's/.*(\(target[^)]*it-[^)]*\)).*/\1/p' | tail -1)
fi

echo "== 1. GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi not found"

echo "== 2. cuda-bf16 / cuda-f32 vs f32 (CPU Burn) agreement"
if [ -n "$ENGINES_TEST" ] && [ -x "$ENGINES_TEST" ]; then
    "$ENGINES_TEST" engines::cuda --nocapture --test-threads 1 2>&1 | grep -E "cuda|test result|panicked|note" || true
else
    echo "engines test binary not found (set ENGINES_TEST)"
fi

echo "== 3. kiln bench infer (reference network)"
"$KILN" bench infer --reference --engine fused,cuda-f32,cuda-bf16 --batch 1,1024,65536 \
    --threads 1 --min-time 2 --json

echo "== 4. bf16 training steps/s on configs/tiny.yaml"
work=$(mktemp -d)
sed -e "s|^  dir: checkpoints|  dir: $work/out|" configs/tiny.yaml > "$work/tiny-bf16.yaml"
printf 'device: cuda\nprecision: bf16\n' >> "$work/tiny-bf16.yaml"
export_dir=$("$KILN" train "$work/tiny-bf16.yaml" --plain 2>"$work/train.log" | tail -1) || {
    echo "training failed:"; tail -5 "$work/train.log"; exit 1; }
run_dir=$(dirname "$export_dir")
batch=$(sed -n 's/^  batch_size: *\([0-9]*\).*/\1/p' configs/tiny.yaml)
echo "run: $run_dir (batch $batch)"
if command -v python3 >/dev/null; then
    python3 - "$run_dir/epochs.jsonl" "$batch" <<'EOF'
import json, sys
b = int(sys.argv[2])
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"stage {r['stage']} epoch {r['epoch']}: {r['samples_per_s']:.0f} samples/s, "
          f"{r['samples_per_s'] / b:.1f} steps/s, data wait {100 * r['data_wait_frac']:.1f} %")
EOF
else
    cat "$run_dir/epochs.jsonl"
fi
rm -rf "$work"
