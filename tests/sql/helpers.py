"""Small helpers shared by the SQL tests."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

SERVICE = {"role": "service_role"}


def make_user(pg: psycopg.Connection[Any]) -> str:
    """Insert a user into auth.users (as GoTrue would) and return its id."""
    user_id = str(uuid.uuid4())
    pg.execute("insert into auth.users (id, email) values (%s, %s)", (user_id, f"{user_id}@example.test"))
    return user_id


def user_claims(user_id: str) -> dict[str, Any]:
    return {"role": "authenticated", "sub": user_id, "aud": "authenticated"}


def expire_lease(pg: psycopg.Connection[Any], job_id: str) -> None:
    """Move a running job's lease into the past (what waiting out the lease would do)."""
    pg.execute(
        "update public.jobkit_jobs set lease_until = now() - interval '1 second', updated_at = now() "
        "where id = %s and status = 'running'",
        (job_id,),
    )


def make_runnable(pg: psycopg.Connection[Any], job_id: str) -> None:
    """Bring a retrying job's run_after to now (what waiting out its backoff would do)."""
    pg.execute("update public.jobkit_jobs set run_after = now(), updated_at = now() where id = %s", (job_id,))
