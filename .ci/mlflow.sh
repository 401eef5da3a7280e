# Sourced by .ci/run: a real MLflow tracking server on loopback for tests/it/mlflow_real.rs.
#
# Creates (or reuses) a venv with a pinned mlflow, starts `mlflow server` on a free loopback
# port with a temporary SQLite backend and a proxied artifact store, waits for /health,
# exports KILN_TEST_MLFLOW_URI, and stops the server (and removes its files) when the
# sourcing shell exits. There is no skip: an install or a server that does not become
# healthy fails the sourcing shell (and CI).
#
# Measured on the 2-core build machine (2026-12, mlflow 3.17.2): a fresh venv install took
# 61 s on an idle machine and 182 s (install + server healthy) with 8 compilers running; the
# venv is cached under ~/.cache/kiln, so later runs only start the server (a few seconds).

KILN_MLFLOW_VERSION=3.17.2

echo "== MLflow server (mlflow==$KILN_MLFLOW_VERSION) for tests/it/mlflow_real.rs"
kiln_mlflow_venv="${KILN_MLFLOW_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/mlflow-$KILN_MLFLOW_VERSION}"
if [ ! -x "$kiln_mlflow_venv/bin/mlflow" ]; then
  python3 -m venv "$kiln_mlflow_venv"
  "$kiln_mlflow_venv/bin/pip" install --quiet --disable-pip-version-check "mlflow==$KILN_MLFLOW_VERSION"
fi
kiln_mlflow_dir="$(mktemp -d)"
kiln_mlflow_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# setsid: the server and its uvicorn workers form one process group, stopped together.
setsid "$kiln_mlflow_venv/bin/mlflow" server \
  --host 127.0.0.1 --port "$kiln_mlflow_port" --workers 1 \
  --backend-store-uri "sqlite:///$kiln_mlflow_dir/mlflow.db" \
  --artifacts-destination "$kiln_mlflow_dir/artifacts" \
  >"$kiln_mlflow_dir/server.log" 2>&1 &
kiln_mlflow_pid=$!
kiln_mlflow_stop() {
  kill -TERM -- "-$kiln_mlflow_pid" 2>/dev/null || true
  wait "$kiln_mlflow_pid" 2>/dev/null || true
  rm -rf "$kiln_mlflow_dir"
}
trap kiln_mlflow_stop EXIT
export KILN_TEST_MLFLOW_URI="http://127.0.0.1:$kiln_mlflow_port"
kiln_mlflow_deadline=$((SECONDS + 120))
until python3 -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('$KILN_TEST_MLFLOW_URI/health', timeout=2).status != 200)" 2>/dev/null; do
  if ! kill -0 "$kiln_mlflow_pid" 2>/dev/null || [ "$SECONDS" -ge "$kiln_mlflow_deadline" ]; then
    echo "MLflow server did not become healthy at $KILN_TEST_MLFLOW_URI; its log:" >&2
    cat "$kiln_mlflow_dir/server.log" >&2
    exit 1
  fi
  sleep 1
done
echo "MLflow $KILN_MLFLOW_VERSION serving at $KILN_TEST_MLFLOW_URI (pid $kiln_mlflow_pid)"
