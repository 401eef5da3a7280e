# Sourced by .ci/run: ONNX Runtime from PyPI for tests/it/onnx.rs (the exported graph checked by
# an independent ONNX implementation).
#
# Creates (or reuses) a venv with pinned onnxruntime and numpy under ~/.cache/kiln and exports
# KILN_TEST_ORT_PYTHON (its interpreter). No server, nothing to stop. There is no skip: a
# failed install fails the sourcing shell (and CI).
#
# Measured on the 2-core build machine (2026-12, onnxruntime 1.32.0, numpy 2.4.6): a fresh
# venv install took 10 s on a quiet machine and 71 s with 8 compilers running (two wheels,
# ~35 MB); later runs reuse the cached venv (< 1 s).

KILN_ORT_VERSION=1.32.0
KILN_ORT_NUMPY_VERSION=2.4.6

echo "== ONNX Runtime (onnxruntime==$KILN_ORT_VERSION) for tests/it/onnx.rs"
kiln_ort_venv="${KILN_ORT_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/onnxruntime-$KILN_ORT_VERSION}"
if ! "$kiln_ort_venv/bin/python" -c "import onnxruntime, numpy" 2>/dev/null; then
  rm -rf "$kiln_ort_venv"
  python3 -m venv "$kiln_ort_venv"
  "$kiln_ort_venv/bin/pip" install --quiet --disable-pip-version-check \
    "onnxruntime==$KILN_ORT_VERSION" "numpy==$KILN_ORT_NUMPY_VERSION"
fi
export KILN_TEST_ORT_PYTHON="$kiln_ort_venv/bin/python"
echo "ONNX Runtime $("$KILN_TEST_ORT_PYTHON" -c 'import onnxruntime; print(onnxruntime.__version__)') at $KILN_TEST_ORT_PYTHON"
