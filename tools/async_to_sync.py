"""Write the blocking twin of each async source module: ``python tools/async_to_sync.py`` writes them,
``--check`` fails (exit 1) when one on disk differs from what its source makes (``make test`` runs it).

The async module is the source of truth; its twin is generated (psycopg's approach, tools/async_to_sync.py
in psycopg 3; here line by line, like unasync): ``async def``/``with``/``for`` lose ``async``, ``await``
goes, the names in RENAMES take their blocking form (in code, docstrings and comments alike), a line
ending in ``# ASYNC`` is dropped, a line ``# SYNC: <code>`` becomes ``<code>``. ruff formats the result.
The module docstring is copied as it is, so it can name both twins: write it true of both files.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# source -> generated
MODULES = {
    "pgjobkit/stores/base_async.py": "pgjobkit/stores/base.py",
    "pgjobkit/stores/postgres/store_async.py": "pgjobkit/stores/postgres/store.py",
    "pgjobkit/stores/supabase/http_async.py": "pgjobkit/stores/supabase/http.py",
    "pgjobkit/stores/supabase/store_async.py": "pgjobkit/stores/supabase/store.py",
    "pgjobkit/users_async.py": "pgjobkit/users.py",
    "pgjobkit/worker/calls_async.py": "pgjobkit/worker/calls.py",
}
RENAMES = {
    "AsyncJobStore": "JobStore",
    "AsyncSubscription": "Subscription",
    "AsyncPostgresStore": "PostgresStore",
    "AsyncSupabaseStore": "SupabaseStore",
    "AsyncUserJobs": "UserJobs",
    "AsyncWorkerCalls": "WorkerCalls",
    "calls_async": "calls",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncConnection": "Connection",
    "AsyncCursor": "Cursor",
    "AsyncClient": "Client",
    "AsyncClientOptions": "ClientOptions",
    "AsyncBaseTransport": "BaseTransport",
    "AsyncHTTPTransport": "HTTPTransport",
    "AsyncRetrying": "Retrying",
    "AsyncRetryingTransport": "RetryingTransport",
    "AsyncListener": "Listener",
    "AsyncNoWakeups": "NoWakeups",
    "async_supabase_client": "supabase_client",
    "acreate_client": "create_client",
    "araise_for_answer": "raise_for_answer",
    "handle_async_request": "handle_request",
    "adrive": "drive",
    "aread": "read",
    "aclose": "close",
    "arun": "run",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "base_async": "base",
    "store_async": "store",
    "http_async": "http",
    "users_async": "users",
    "asleep": "sleep",
}
_NAMES = re.compile(r"\b(" + "|".join(sorted(map(re.escape, RENAMES), key=len, reverse=True)) + r")\b")
_HEADER = (
    "# WARNING: this file is generated from {source} by tools/async_to_sync.py: DO NOT CHANGE.\n"
    "# Change {source} and run `python tools/async_to_sync.py`.\n"
)


def convert(text: str, source: str) -> str:
    """The blocking twin of the async module ``text`` (unformatted)."""
    out = [_HEADER.format(source=source)]
    body = ast.parse(text).body
    docstring = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    keep = range(body[0].lineno, (body[0].end_lineno or 0) + 1) if docstring else range(0)
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if number in keep:  # the module docstring, as written
            out.append(line)
            continue
        if line.rstrip().endswith("# ASYNC"):
            continue
        sync = re.match(r"^(\s*)# SYNC: ?(.*)$", line.rstrip("\n"))
        if sync:
            out.append(sync.group(1) + sync.group(2) + "\n")
            continue
        line = re.sub(r"\basync (def|with|for)\b", r"\1", line)
        line = re.sub(r"\bawait ", "", line)
        out.append(_NAMES.sub(lambda m: RENAMES[m.group(1)], line))
    return "".join(out)


def generated(source: str) -> str:
    """What ``source``'s twin must hold: converted, then formatted and import-sorted by ruff."""
    text = convert((ROOT / source).read_text(), source)
    ruff = [sys.executable, "-m", "ruff"]
    target = ROOT / MODULES[source]
    for args in (["check", "--fix", "--select", "I,F401", "--quiet"], ["format", "--quiet"]):
        done = subprocess.run(
            [*ruff, *args, "--stdin-filename", str(target), "-"],
            input=text,
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        if done.returncode not in (0, 1) or not done.stdout:
            raise SystemExit(f"ruff failed on the twin of {source}:\n{done.stderr}")
        text = done.stdout
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a generated file is stale")
    args = parser.parse_args()
    stale = 0
    for source, target in MODULES.items():
        want = generated(source)
        path = ROOT / target
        have = path.read_text() if path.exists() else ""
        if have == want:
            continue
        if args.check:
            stale += 1
            diff = difflib.unified_diff(
                have.splitlines(), want.splitlines(), target, f"{target} (from {source})"
            )
            print("\n".join(list(diff)[:40]), file=sys.stderr)
        else:
            path.write_text(want)
            print(f"wrote {target}")
    if stale:
        print(f"{stale} generated file(s) are stale: run `python tools/async_to_sync.py`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
