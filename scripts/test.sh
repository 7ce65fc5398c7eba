#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs ruff, mypy --strict, the import
# contracts, the check that generated files are fresh, and the whole pytest suite. Uses the PostgreSQL at
# JOBKIT_TEST_DATABASE_URL (default: 127.0.0.1:5432, user postgres); when none answers (or with
# JOBKIT_TEST_EMBEDDED=1), starts the embedded PostgreSQL 17 the demo uses. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --tests

export JOBKIT_TEST_DATABASE_URL=${JOBKIT_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
if [ "${JOBKIT_TEST_EMBEDDED:-}" = 1 ]; then
  # The suite on the embedded PostgreSQL 17 (what Supabase runs), even where a local server answers.
  JOBKIT_TEST_DATABASE_URL=$(.venv/bin/python -m pgjobkit.embedded start)
  export JOBKIT_TEST_DATABASE_URL
elif ! .venv/bin/python - <<'PY'
import os, sys, psycopg
try:
    psycopg.connect(os.environ["JOBKIT_TEST_DATABASE_URL"], connect_timeout=3).close()
except psycopg.OperationalError:
    sys.exit(1)
PY
then
  echo "no PostgreSQL answers at $JOBKIT_TEST_DATABASE_URL: starting the embedded one" >&2
  JOBKIT_TEST_DATABASE_URL=$(.venv/bin/python -m pgjobkit.embedded start)
  export JOBKIT_TEST_DATABASE_URL
fi

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/python tools/async_to_sync.py --check
exec .venv/bin/python -m pytest "$@"
