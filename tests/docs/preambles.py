"""What a fragment of the manual takes from its page, keyed by the NAME of its ``run:KIND:NAME`` marker.

A page's python blocks run in order in one namespace, as a reader types them into one session, so a block
may use what an earlier one made. A preamble runs first, in that namespace, and gives a fragment the
names its page leaves to the reader (a helper such as ``load_document``, a signed-in ``session``): stand-ins
that do nothing, never a friendlier jobkit. The namespace starts with ``_db_url`` (the test's own migrated
database, also in ``JOBKIT_DATABASE_URL``) and ``_pg`` (an autocommit superuser connection to it); user
clients reach that database through the test router (tests/doubles/router.py) at ``BASE_URL``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

PYTHON: dict[str, str] = {
    # an in-process store, the one users' own tests use
    "memory-store": """
from pgjobkit import MemoryStore
store = MemoryStore()
""",
    # a worker over the in-process store, and the helpers the page's handlers call
    "worker": """
from pgjobkit import MemoryStore, Worker
worker = Worker(MemoryStore())
def list_pages(folder): return ["page-1", "page-2"]
def import_page(page): pass
def split(text): return text.split(". ")
""",
    # the Supabase quickstart's worker: what its handler calls (the worker itself reads the environment)
    "supabase-worker": """
def load_document(document_id): return f"document {document_id}"
def rate_limited(): return False
def embed_text(text): return [0.0] * 3
def store_embedding(document_id, vector): pass
""",
    # examples/worker.py's names around its handler
    "async-worker": """
import os
import httpx
from pydantic import BaseModel
from pgjobkit import AsyncPostgresStore, Retry, Worker
class Embed(BaseModel):
    document_id: int
async def load_text(document_id): return f"document {document_id}"
async def save_embedding(document_id, vector): pass
""",
    # examples/app.py's names around its endpoint
    "fastapi-app": """
from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from pgjobkit import AsyncPostgresStore, NewJob
app = FastAPI()
db = AsyncConnectionPool(_db_url, open=False)
jobs = AsyncPostgresStore(_db_url, listen=False)
class Document(BaseModel):
    body: str
""",
    # a signed-in user of a project whose 'transcribe' type is open to users, and the app's settings
    "signed-in-user": """
from types import SimpleNamespace
from pgjobkit import UserJobs
from tests.doubles.router import BASE_URL, PUBLISHABLE_KEY, make_jwt
from tests.sql.helpers import make_user
_pg.execute("insert into public.jobkit_user_types (type) values ('transcribe') on conflict do nothing")
url, publishable_key = BASE_URL, PUBLISHABLE_KEY
settings = SimpleNamespace(url=url, supabase_anon_key=publishable_key)
session = SimpleNamespace(access_token=make_jwt("authenticated", sub=make_user(_pg)))
""",
    # the same, with a job of theirs running and reporting progress
    "signed-in-user-job": """
from types import SimpleNamespace
from pgjobkit import UserJobs
from tests.doubles.router import BASE_URL, PUBLISHABLE_KEY, make_jwt
from tests.sql.helpers import make_user
_pg.execute("insert into public.jobkit_user_types (type) values ('transcribe') on conflict do nothing")
url, publishable_key = BASE_URL, PUBLISHABLE_KEY
session = SimpleNamespace(access_token=make_jwt("authenticated", sub=make_user(_pg)))
_me = UserJobs(url, publishable_key, session.access_token)
job_id = _me.enqueue("transcribe", {"upload_id": 7}).job.id
""",
}


def _documents_check(pg: psycopg.Connection[Any]) -> None:
    """The trigger's promise: the document's insert and its embed job commit together."""
    doc = pg.execute("insert into public.documents (body) values ('hello') returning id").fetchone()
    assert doc is not None
    job = pg.execute(
        "select type, payload from public.jobkit_jobs where idempotency_key = %s", (f"embed:{doc['id']}",)
    ).fetchone()
    assert job == {"type": "embed", "payload": {"document_id": doc["id"]}}, job


def _pg_cron_check(pg: psycopg.Connection[Any]) -> None:
    """Each scheduled command runs against the migrated database, as pg_cron would run it."""
    commands = [r["command"] for r in pg.execute("select command from cron.job order by jobname")]
    assert len(commands) == 2, commands
    for command in commands:
        pg.execute(command)


# name: (SQL run before the block, a check run after it)
SQL: dict[str, tuple[str, Callable[[psycopg.Connection[Any]], None] | None]] = {
    # the app's own table the trigger example enqueues for
    "documents": (
        "create table public.documents (id bigint generated always as identity primary key, body text)",
        _documents_check,
    ),
    # pg_cron is not installed here: a cron.schedule that records what it is given, as cron.job does
    "pg-cron": (
        """create schema cron;
        create table cron.job (jobname text primary key, schedule text not null, command text not null);
        create function cron.schedule(p_name text, p_schedule text, p_command text) returns bigint
        language sql as $$ insert into cron.job values (p_name, p_schedule, p_command) returning 1::bigint $$;""",
        _pg_cron_check,
    ),
}
