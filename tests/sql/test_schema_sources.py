"""The schema sources (pgjobkit/sql/schema/, what a reader reads) and the migrations (what `supabase db push`
and `pgjobkit migrate` apply, append-only) build the same database."""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgjobkit.version import SCHEMA_VERSION
from tests.doubles import catalog, pgtemplate


@pytest.fixture
def from_sources(templates: pgtemplate.Templates) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    name = f"{templates.prefix}_sources"
    pgtemplate.create_database(name)
    pgtemplate.bootstrap(name, "current")
    try:
        with psycopg.connect(pgtemplate.db_url(name), autocommit=True, row_factory=dict_row) as conn:
            with conn.transaction():
                for path in pgtemplate.SCHEMA_SOURCES:
                    conn.execute(path.read_text().encode())  # our own files
            yield conn
    finally:
        pgtemplate.drop_database(name)


def test_the_schema_sources_build_what_the_migrations_build(
    from_sources: psycopg.Connection[dict[str, Any]], pg: psycopg.Connection[dict[str, Any]]
) -> None:
    built, migrated = catalog.snapshot(from_sources), catalog.snapshot(pg)
    assert len(built) > 100  # every table, column, function, policy and grant: not an empty read
    assert built == migrated, "\n".join(difflib.unified_diff(migrated, built, "migrations", "sources", n=0))


def test_the_comparison_sees_a_change_in_a_function_body(
    from_sources: psycopg.Connection[dict[str, Any]], pg: psycopg.Connection[dict[str, Any]]
) -> None:
    """Guards the test above: one changed line in one function makes the two differ."""
    body = pg.execute("select pg_get_functiondef('public.jobkit_schema_version()'::regprocedure) as d")
    row = body.fetchone()
    assert row is not None
    pg.execute(row["d"].replace(f"'{SCHEMA_VERSION}'", "'9.9.9'"))
    assert catalog.snapshot(from_sources) != catalog.snapshot(pg)


# Every migration as it was released. A released migration never changes (databases hold what it made):
# a change to the schema is a new migration, added here with its checksum once it is released.
RELEASED = {
    "20261203000000_jobkit.sql": "2d21cb10d90727753f38e13c266edc1d16e660d60fe68742b1e416ba0600beab",
    "20261206000000_jobkit_0_2_0.sql": "f184c21781ac667858948a04761c9859e97f724dabf43a0346003c48385b897d",
    "20261206000001_jobkit_0_2_0_validate.sql": "b715476b9c31712b18506a98f93074dc99e94037e57379456a7e5b3bff48959f",
    "20261206120000_jobkit_0_3_0.sql": "281a2368d4ae61712fffa4b8c9c4f586179a1633b4985385e9a9d46df9f858e6",
    "20261207000000_jobkit_0_4_0.sql": "413501688f03ac1491101fa4350102c1475999d4e225cf7524524ef3738be2c0",
    "20261208000000_jobkit_0_5_0.sql": "bcf67f77aaabc0adee1c55e644d59cec0b958afaeb8d62d2f6f0c5d44d44c8ca",
    "20261209000000_jobkit_0_5_1.sql": "288b04bbb3b27929508e98faf0162c852f175a32b739f85dd2d889ef1f789d1e",
}


def test_migrations_are_append_only_from_0_2_0() -> None:
    """0.1's file stays as 0.1 shipped it (users' databases and projects hold it); later ones are added
    after it, in version order, and none changes once released."""
    names = [path.name for path in pgtemplate.MIGRATIONS]
    assert names == sorted(names) and names[: len(RELEASED)] == list(RELEASED)
    for path in pgtemplate.MIGRATIONS:
        if path.name in RELEASED:
            assert hashlib.sha256(path.read_bytes()).hexdigest() == RELEASED[path.name], path.name
