# Sourced by .ci/run: an offline Kubernetes schema validator for tests/it/deploy.rs.
#
# Creates (or reuses) a venv with a pinned kubernetes-validate (it ships the Kubernetes JSON
# schemas, so validation needs no cluster and no network once installed) and exports
# KILN_TEST_KUBERNETES_VALIDATE, the validator's path; tests/it/deploy.rs then validates the
# core objects under deploy/kubernetes/ against the schemas of Kubernetes
# $KILN_KUBERNETES_SCHEMA_VERSION. The KServe InferenceService is a custom resource and is
# checked by tests/it/deploy.rs against the CLI only. There is no skip: when the install fails,
# sourcing fails and so does CI.
#
# Measured on the 2-core build machine (2026-12, kubernetes-validate 1.37.0, 8 compilers
# running): a fresh venv install took 110 s; the venv is cached under
# ~/.cache/kiln, so later runs cost nothing.

KILN_KUBERNETES_VALIDATE_VERSION=1.37.0
export KILN_KUBERNETES_SCHEMA_VERSION="${KILN_KUBERNETES_SCHEMA_VERSION:-1.33.0}"

echo "== kubernetes-validate $KILN_KUBERNETES_VALIDATE_VERSION for tests/it/deploy.rs"
kiln_k8s_venv="${KILN_KUBERNETES_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln/kubernetes-validate-$KILN_KUBERNETES_VALIDATE_VERSION}"
if [ ! -x "$kiln_k8s_venv/bin/kubernetes-validate" ]; then
  python3 -m venv "$kiln_k8s_venv"
  "$kiln_k8s_venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$KILN_KUBERNETES_VALIDATE_VERSION"
fi
export KILN_TEST_KUBERNETES_VALIDATE="$kiln_k8s_venv/bin/kubernetes-validate"
