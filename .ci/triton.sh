# Sourced by .ci/run: Triton's own Python clients for tests/it/grpc.rs
# (tritonclient_grpc_answers_equal_tritonclient_http), which starts `kiln serve` itself on
# loopback, so there is no server to start or stop here.
#
# Creates (or reuses) a venv with a pinned tritonclient[grpc,http] and exports
# KILN_TEST_TRITON_PYTHON. There is no skip: a failed install fails the sourcing shell (and
# CI).
#
# Measured on the 2-core build machine (2026-12, tritonclient 2.73.0): a fresh venv install
# took 3 min 29 s with 8 helpers compiling (load average 12); the venv is cached under ~/.cache/kiln,
# so later runs only check that it imports (under a second).

KILN_TRITONCLIENT_VERSION=2.73.0

echo "== tritonclient[grpc,http]==$KILN_TRITONCLIENT_VERSION for tests/it/grpc.rs"
kiln_triton_venv="${KILN_TRITON_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/tritonclient-$KILN_TRITONCLIENT_VERSION}"
if ! "$kiln_triton_venv/bin/python" -c "import tritonclient.grpc, tritonclient.http, numpy" 2>/dev/null; then
  python3 -m venv "$kiln_triton_venv"
  "$kiln_triton_venv/bin/pip" install --quiet --disable-pip-version-check \
    "tritonclient[grpc,http]==$KILN_TRITONCLIENT_VERSION"
fi
export KILN_TEST_TRITON_PYTHON="$kiln_triton_venv/bin/python"
echo "tritonclient $KILN_TRITONCLIENT_VERSION at $KILN_TEST_TRITON_PYTHON"
