# Sourced by .ci/run: a throwaway PostgreSQL cluster on loopback for the PostgreSQL half of
# the registry conformance suite (tests/it/registry_conformance.rs) and the indexed-sweep test
# (tests/it/sweep_indexed.rs).
#
# Installs Debian's `postgresql` package when no server binaries are found (apt-get, through
# sudo when not root), creates a cluster in a temporary directory as an unprivileged user
# (initdb refuses root: as root the cluster belongs to the `postgres` system user, else to
# `nobody`), starts it on a free loopback port with its socket in that directory and `trust`
# authentication for the `kiln` superuser, exports KILN_TEST_POSTGRES_URL, and stops the
# server and removes its files when the sourcing shell exits (chained before any EXIT trap
# already set, e.g. .ci/mlflow.sh's). There is no skip: a failed install or start fails the
# sourcing shell (and CI).
#
# Measured on the 2-core build machine (2026-12, PostgreSQL 15 already installed, 8 compilers
# running): initdb + start to accepting connections took 4-6 s. A fresh `apt-get install
# postgresql` on a clean Debian image is ~40 MB of packages (typically 30-60 s).

echo "== PostgreSQL (throwaway cluster) for the registry conformance suite"
kiln_pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
if [ -z "$kiln_pg_bin" ] && command -v initdb >/dev/null 2>&1; then
  kiln_pg_bin="$(dirname "$(command -v initdb)")"
fi
if [ -z "$kiln_pg_bin" ]; then
  kiln_pg_sudo=""
  if [ "$(id -u)" != 0 ]; then kiln_pg_sudo="sudo -n"; fi
  kiln_pg_t0=$SECONDS
  $kiln_pg_sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $kiln_pg_sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  kiln_pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
  echo "installed PostgreSQL in $((SECONDS - kiln_pg_t0)) s"
fi

kiln_pg_dir="$(mktemp -d)"
kiln_pg_port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
kiln_pg_as=""
if [ "$(id -u)" = 0 ]; then
  kiln_pg_user=postgres
  id -u postgres >/dev/null 2>&1 || kiln_pg_user=nobody
  chown "$kiln_pg_user" "$kiln_pg_dir"
  kiln_pg_as="runuser -u $kiln_pg_user --"
fi
$kiln_pg_as "$kiln_pg_bin/initdb" -D "$kiln_pg_dir/data" -U kiln -A trust --no-sync -E UTF8 >"$kiln_pg_dir/initdb.log" 2>&1 || {
  echo "initdb failed; its log:" >&2
  cat "$kiln_pg_dir/initdb.log" >&2
  exit 1
}
# fsync off: a throwaway cluster; the tests check what the registry writes, not disk crashes.
$kiln_pg_as "$kiln_pg_bin/pg_ctl" -D "$kiln_pg_dir/data" -l "$kiln_pg_dir/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $kiln_pg_port -k $kiln_pg_dir -c fsync=off -c max_connections=200" \
  start >/dev/null || {
  echo "PostgreSQL did not start; its log:" >&2
  cat "$kiln_pg_dir/server.log" >&2
  exit 1
}
kiln_pg_stop() {
  $kiln_pg_as "$kiln_pg_bin/pg_ctl" -D "$kiln_pg_dir/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$kiln_pg_dir"
}
# Chain: keep whatever EXIT trap an earlier script set (mlflow.sh stops its server there).
kiln_pg_prev_exit="$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")"
trap "kiln_pg_stop; ${kiln_pg_prev_exit}" EXIT
export KILN_TEST_POSTGRES_URL="postgres://kiln@127.0.0.1:$kiln_pg_port/postgres"
echo "PostgreSQL $("$kiln_pg_bin/postgres" --version | awk '{print $3}') at $KILN_TEST_POSTGRES_URL"
