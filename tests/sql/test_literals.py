"""Where Python writes down a literal of the SQL's own (a channel name, a key format), the two agree."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from pgjobkit.core import bounds
from pgjobkit.core.job_rules import RULES
from pgjobkit.core.schedules import job_key
from pgjobkit.stores.postgres.copy import NOTIFY
from pgjobkit.stores.postgres.listen import CHANNEL
from tests.doubles import pgtemplate


def test_every_notify_is_on_the_channel_workers_listen_on() -> None:
    schema = _schema()
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


# --- caps and defaults (pgjobkit.core.bounds) ----------------------------------------------------------------
_N = r"(-?\d+)"
# each cap and default, and the places in the schema's sources that write it (each pattern's one group is the
# literal); a pattern that finds nothing fails too, so a rewritten statement is looked at again
CAPS: dict[str, tuple[int, tuple[str, ...]]] = {
    "DEFAULT_MAX_ATTEMPTS": (
        bounds.DEFAULT_MAX_ATTEMPTS,
        (rf"p_max_attempts integer default {_N}", rf"coalesce\(\(o\.e ->> 'max_attempts'\)::integer, {_N}\)"),
    ),
    "DEFAULT_STALE_SECONDS": (
        int(bounds.DEFAULT_STALE_SECONDS),
        (rf"p_stale_seconds double precision default {_N}",),
    ),
    "DEFAULT_PRUNE_LIMIT": (
        bounds.DEFAULT_PRUNE_LIMIT,
        (rf"p_limit integer default {_N}\n\)\nreturns bigint",),
    ),
    "MAX_TYPE_LENGTH": (
        bounds.MAX_TYPE_LENGTH,
        (rf"jobkit_jobs_type_valid check \(char_length\(value\) between 1 and {_N}\)",),
    ),
    "MAX_KEY_LENGTH": (
        bounds.MAX_KEY_LENGTH,
        (
            rf"jobkit_jobs_key_valid check \(char_length\(value\) between 1 and {_N}\)",
            rf"jobkit_jobs_fair_key_valid check \(char_length\(value\) between 1 and {_N}\)",
        ),
    ),
    "MAX_WORKER_LENGTH": (
        bounds.MAX_WORKER_LENGTH,
        (rf"jobkit_jobs_claimed_by_valid check \(char_length\(value\) between 1 and {_N}\)",),
    ),
    "MAX_ERROR_LENGTH": (
        bounds.MAX_ERROR_LENGTH,
        (rf"jobkit_jobs_error_bounded check \(char_length\(value\) <= {_N}\)",),
    ),
    "MAX_PRIORITY": (
        bounds.MAX_PRIORITY,
        (
            rf"jobkit_jobs_priority_valid check \(value between -\d+ and {_N}\)",
            rf"priority_valid check \(value between -{_N}",
        ),
    ),
    "MAX_ATTEMPTS_LIMIT": (
        bounds.MAX_ATTEMPTS_LIMIT,
        (rf"jobkit_jobs_max_attempts_valid check \(value between 1 and {_N}\)",),
    ),
    "MAX_PAYLOAD_BYTES": (
        bounds.MAX_PAYLOAD_BYTES,
        (rf"octet_length\(\(o\.e -> 'payload'\)::text\) > {_N}", rf"octet_length\(v_payload::text\) > {_N}"),
    ),
    "MAX_RESULT_BYTES": (
        bounds.MAX_RESULT_BYTES,
        (rf"jobkit_jobs_result_bounded check \(octet_length\(value::text\) <= {_N}\)",),
    ),
    "MAX_PROGRESS_MESSAGE": (
        bounds.MAX_PROGRESS_MESSAGE,
        (rf"jobkit_jobs_progress_message_bounded check \(char_length\(value\) <= {_N}\)",),
    ),
    "MAX_TRACE_CONTEXT_BYTES": (
        bounds.MAX_TRACE_CONTEXT_BYTES,
        (
            rf"jobkit_jobs_trace_context_valid\s+check \(jsonb_typeof\(value\) = 'object' and octet_length\(value::text\) <= {_N}",
            rf"octet_length\(\(o\.e -> 'trace_context'\)::text\) > {_N}",
        ),
    ),
    "MAX_TRACEBACK_LENGTH": (
        bounds.MAX_TRACEBACK_LENGTH,
        (
            rf"jobkit_tracebacks_bounded check \(char_length\(traceback\) <= {_N}\)",
            rf"right\(p_traceback, {_N}\)",
        ),
    ),
    "MAX_DELAY_SECONDS": (bounds.MAX_DELAY_SECONDS, (rf"'delay_seconds'\)::numeric not between 0 and {_N}",)),
    "MAX_JSON_DEPTH": (bounds.MAX_JSON_DEPTH, (rf"strict \$\.\*\*\{{{_N}\}}",)),
    "MAX_ROWS": (bounds.MAX_ROWS, (rf"cardinality\(p_done_ids\) > {_N}", rf"least\(p_limit, \d+, {_N} - ")),
    "CLAIM_LIMIT_CAP": (bounds.CLAIM_LIMIT_CAP, (rf"least\(p_limit, {_N}, \d+ - ",)),
    "BATCH_LIMIT": (bounds.BATCH_LIMIT, (rf"if v_n > {_N} then",)),
    "MAX_LEASE": (
        int(bounds.MAX_LEASE.total_seconds()),
        (rf"p_lease_seconds > 0 and p_lease_seconds <= {_N}",),
    ),
    "MAX_RETRY_DELAY": (int(bounds.MAX_RETRY_DELAY.total_seconds()), (rf"p_retry_delay_seconds <= {_N}\)",)),
    "MAX_DEPENDENCIES": (bounds.MAX_DEPENDENCIES, (rf"then 'depends_on must name at most {_N} jobs'",)),
    "MAX_EDGES": (bounds.MAX_EDGES, (rf"waits for more than {_N} jobs in all",)),
    "MAX_REF_LENGTH": (bounds.MAX_REF_LENGTH, (rf"char_length\(o\.e ->> 'ref'\) not between 1 and {_N}",)),
    "PASS_BUDGET": (bounds.PASS_BUDGET, (rf"limit v_\w+ \+ {_N} - v_passed",)),
    "MAX_FIRE": (bounds.MAX_FIRE, (rf"cardinality\(p_due\) > {_N}",)),
    "MAX_STARTS": (
        bounds.MAX_STARTS,
        (rf"jobkit_limits_starts_valid check \(max_starts between 1 and {_N}\)",),
    ),
    "MAX_RUNNING": (
        bounds.MAX_RUNNING,
        (
            rf"jobkit_limits_running_valid check \(max_running between 0 and {_N}\)",
            rf"jobkit_limits_per_key_valid check \(max_running_per_key between 1 and {_N}\)",
        ),
    ),
    "MAX_RATE_WINDOW": (
        int(bounds.MAX_RATE_WINDOW.total_seconds()),
        (rf"jobkit_limits_per_valid check \(per_seconds > 0 and per_seconds <= {_N}\)",),
    ),
    "ACTIVITY_KEPT": (bounds.ACTIVITY_KEPT.days, (rf"a\.minute < now\(\) - interval '{_N} day'",)),
    "MAX_STALE_SECONDS": (bounds.MAX_STALE_SECONDS, (rf"p_stale_seconds between 1 and {_N}",)),
    "MAX_WORKER_TYPES": (
        bounds.MAX_WORKER_TYPES,
        (rf"jobkit_workers_types_bounded check \(cardinality\(types\) <= {_N}\)", rf"p_types\[1:{_N}\]"),
    ),
    "MAX_HOST_LENGTH": (bounds.MAX_HOST_LENGTH, (rf"left\(p_host, {_N}\)",)),
    "MAX_VERSION_LENGTH": (bounds.MAX_VERSION_LENGTH, (rf"left\(p_version, {_N}\)",)),
}


def _schema() -> str:
    return "\n".join(path.read_text() for path in pgtemplate.SCHEMA_SOURCES)


@pytest.mark.parametrize("name", sorted(CAPS))
def test_each_cap_and_default_is_the_schemas_literal(name: str) -> None:
    value, patterns = CAPS[name]
    schema = _schema()
    for pattern in patterns:
        found = [int(n) for n in re.findall(pattern, schema)]
        assert found, f"{name}: {pattern!r} is nowhere in pgjobkit/sql/schema/"
        assert set(found) == {value}, f"{name} is {value} in bounds.py, {found} in the schema ({pattern!r})"


def test_every_cap_of_bounds_is_held_to_the_schema() -> None:
    """A cap or default added to bounds.py gets its row in CAPS (or a test below); the worker's own options
    and the embedded port are not the schema's."""
    own = {"DEFAULT_CONCURRENCY", "DEFAULT_BATCH_SIZE", "DEFAULT_POLL_INTERVAL", "DEFAULT_LEASE_SECONDS"}
    own |= {
        "DEFAULT_BACKOFF_BASE",
        "DEFAULT_BACKOFF_CAP",
        "DEFAULT_JITTER",
        "DEFAULT_SCHEDULES",
        "DEFAULT_BEAT",
    }
    own |= {"DEFAULT_EMBEDDED_PORT"}
    # The JetStream store's, checked by settings and the store; no SQL holds it.
    own |= {"MAX_NATS_PARTITIONS"}
    below = {"RUN_AFTER_RANGE", "MAX_JSON_NUMBER"}
    names = {
        n for n, v in vars(bounds).items() if n.isupper() and isinstance(v, int | float | timedelta | tuple)
    }
    assert names - own - below == CAPS.keys()


def test_run_after_range_is_the_schemas() -> None:
    low, high = (t.strftime("%Y-%m-%d %H:%M:%S+00") for t in bounds.RUN_AFTER_RANGE)
    assert f"check (run_after >= '{low}' and run_after < '{high}')" in _schema()


def test_the_largest_json_number_is_the_schemas() -> None:
    found = re.findall(r"@ > ([\d.e]+) \|\| @ < -([\d.e]+)", _schema())
    assert found and {int(Decimal(n)) for pair in found for n in pair} == {bounds.MAX_JSON_NUMBER}


# --- a job's rules (pgjobkit.core.job_rules) --------------------------------------------------------------------
def test_the_table_of_job_rules_holds_every_rule_of_jobkit_check_jobs_in_its_order() -> None:
    """Each message jobkit_check_jobs can answer is a row of RULES, in the SQL's order (a rule added to the
    SQL without its row fails here; each row's bad examples are sent to every store in
    tests/contract/test_job_rules.py)."""
    schema = _schema()
    start = schema.index("create function public.jobkit_check_jobs(")
    body = schema[start : schema.index("$$;", start)]
    literals = re.findall(r"\bthen\s+((?:'(?:[^']|'')*'\s*)+)", body)
    messages = ["".join(re.findall(r"'((?:[^']|'')*)'", lit)).replace("''", "'") for lit in literals]
    assert messages == [rule.message for rule in RULES]
