# Sourced by .ci/run: Prometheus' `promtool` for the exposition check in
# tests/it/serve_triton.rs (`promtool check metrics` on a live /metrics).
#
# Uses the promtool on PATH, else installs Debian's `prometheus` package (which ships it;
# apt-get through sudo -n when not root), and exports KILN_TEST_PROMTOOL. If it cannot be
# installed, the sourcing shell fails (and CI with it): there is no skip. Measured on the 2-core build machine (2026-12,
# Debian 12): the package is ~25 MB to download, ~96 MB installed (prometheus 2.42).

echo "== promtool for the /metrics exposition check"
if ! command -v promtool >/dev/null 2>&1; then
  kiln_prom_sudo=""
  if [ "$(id -u)" != 0 ]; then kiln_prom_sudo="sudo -n"; fi
  if ! { $kiln_prom_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    $kiln_prom_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }; then
    echo "promtool could not be installed (apt-get failed); the /metrics exposition check needs it" >&2
    exit 1
  fi
fi
if ! command -v promtool >/dev/null 2>&1; then
  echo "promtool is not on PATH after installing Debian's prometheus package" >&2
  exit 1
fi
export KILN_TEST_PROMTOOL="$(command -v promtool)"
echo "promtool at $KILN_TEST_PROMTOOL ($(promtool --version 2>&1 | head -n 1))"
