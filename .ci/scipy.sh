# Sourced by .ci/run: SciPy from PyPI for tests/it/mvn.rs's anchor test (`kiln bench mvn
# --anchor-scipy`: SciPy's multivariate_normal.cdf at its defaults on the realistic fixture,
# run by benches/scipy_mvn_reference.py, compared at matched accuracy).
#
# Creates (or reuses) a venv with pinned scipy and numpy under ~/.cache/kiln and exports
# KILN_TEST_SCIPY_PYTHON (its interpreter). No server, nothing to stop. There is no skip: a
# failed install fails the sourcing shell (and CI).

KILN_SCIPY_VERSION=1.17.1
KILN_SCIPY_NUMPY_VERSION=2.4.6

echo "== SciPy (scipy==$KILN_SCIPY_VERSION) for tests/it/mvn.rs"
kiln_scipy_venv="${KILN_SCIPY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/scipy-$KILN_SCIPY_VERSION}"
if ! "$kiln_scipy_venv/bin/python" -c "import scipy, numpy" 2>/dev/null; then
  rm -rf "$kiln_scipy_venv"
  python3 -m venv "$kiln_scipy_venv"
  "$kiln_scipy_venv/bin/pip" install --quiet --disable-pip-version-check \
    "scipy==$KILN_SCIPY_VERSION" "numpy==$KILN_SCIPY_NUMPY_VERSION"
fi
export KILN_TEST_SCIPY_PYTHON="$kiln_scipy_venv/bin/python"
echo "SciPy $("$KILN_TEST_SCIPY_PYTHON" -c 'import scipy; print(scipy.__version__)') at $KILN_TEST_SCIPY_PYTHON"
