"""This jobkit's version, and the schema version it needs in the database (``jobkit_schema_version()``)."""

from __future__ import annotations

from pgjobkit.errors import ConfigurationError

__version__ = "0.5.1"
SCHEMA_VERSION = "0.6.0"  # what the newest migration's public.jobkit_schema_version() returns

UPGRADE = (
    "run `pgjobkit migrate` (a database URL: JOBKIT_DATABASE_URL), or `pgjobkit init supabase` then "
    "`supabase db push` (a Supabase project)"
)


def check_schema(found: str | None) -> None:
    """Refuse a database whose jobkit schema is not this jobkit's (``found`` None: before 0.2.0, or none),
    saying exactly what to run."""
    if found == SCHEMA_VERSION:
        return
    if found is None or _parts(found) < _parts(SCHEMA_VERSION):
        have = "no jobkit schema, or one older than 0.2.0" if found is None else f"jobkit schema {found}"
        raise ConfigurationError(
            f"jobkit: this database has {have}; pgjobkit {__version__} needs schema {SCHEMA_VERSION}: "
            f"{UPGRADE}. Workers of the version before keep running through the upgrade."
        )
    raise ConfigurationError(
        f"jobkit: this database's jobkit schema is at {found}, newer than pgjobkit {__version__} knows "
        f"({SCHEMA_VERSION}): upgrade pgjobkit where this worker runs."
    )


def _parts(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())
