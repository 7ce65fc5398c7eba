"""Where Python writes down a literal of the SQL's own (a channel name, a key format), the two agree."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from pgjobkit.core.schedules import job_key
from pgjobkit.stores.postgres.copy import NOTIFY
from pgjobkit.stores.postgres.listen import CHANNEL
from tests.doubles import pgtemplate


def test_every_notify_is_on_the_channel_workers_listen_on() -> None:
    schema = "\n".join(path.read_text() for path in pgtemplate.SCHEMA_SOURCES)
    assert set(re.findall(r"pg_notify\('(\w+)'", schema)) == {CHANNEL}
    assert f"pg_notify('{CHANNEL}'" in NOTIFY


def test_a_schedules_job_key_is_the_one_the_sql_writes(pg: psycopg.Connection[dict[str, Any]]) -> None:
    pg.execute("select * from public.jobkit_set_schedule('nightly', '* * * * *', 'tick')")
    last = datetime(2026, 12, 6, 3, 0, 0, 123456, tzinfo=UTC)
    pg.execute("update public.jobkit_schedules set last_due_at = %s", (last,))
    due = last + timedelta(minutes=1)
    pg.execute(
        "select * from public.jobkit_fire_schedule('nightly', %s, array[%s]::timestamptz[])", (last, due)
    )
    row = pg.execute("select idempotency_key from public.jobkit_jobs").fetchone()
    assert row == {"idempotency_key": job_key("nightly", due)}
