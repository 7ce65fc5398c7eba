"""Table health under churn: claims stay cheap after 100k jobs went through, and prune keeps the table bounded.

"Cost" is counted in buffers (pages) a claim cycle touches, read from EXPLAIN (ANALYZE, BUFFERS): exact and
repeatable, unlike a timing. The benchmark (bench/) reports the timings. The bound is for 100k jobs with no
vacuum at all, in every mode: at 1,000,000 jobs and 2,000,000 dead tuples with no vacuum a cycle touches
about 13 times the pages (measured: 40 -> 510 on this code, 35 -> 484 on 7b6e91e), which is what the
table's autovacuum settings (1% of rows) are there to prevent.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg


def _buffers(plan: Any) -> int:
    node = plan[0]["Plan"]
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


def cycle_buffers(conn: psycopg.Connection[Any], rounds: int = 20) -> float:
    """Pages touched by enqueue + claim + complete of one job, averaged over ``rounds``."""
    total = 0
    for _ in range(rounds):
        plan = conn.execute(
            "explain (analyze, buffers, format json) select * from public.jobkit_enqueue('probe')"
        ).fetchone()
        total += _buffers(plan[0] if plan else None)
        plan = conn.execute(
            "explain (analyze, buffers, format json) "
            "select * from public.jobkit_claim(array['probe'], 'w', 30, 1)"
        ).fetchone()
        total += _buffers(plan[0] if plan else None)
        row = conn.execute(
            "select id, lease_token from public.jobkit_jobs where status = 'running' and type = 'probe'"
        ).fetchone()
        assert row is not None
        plan = conn.execute(
            "explain (analyze, buffers, format json) select * from public.jobkit_complete("
            "array[%s]::uuid[], array[%s]::uuid[])",
            (row[0], row[1]),
        ).fetchone()
        total += _buffers(plan[0] if plan else None)
    return total / rounds


def churn(conn: psycopg.Connection[Any], jobs: int) -> None:
    """Enqueue, claim and complete ``jobs`` jobs in batches of 1000, as a busy fleet would."""
    for _ in range(jobs // 1000):
        conn.execute(
            "select count(*) from public.jobkit_enqueue_many(%s::jsonb)",
            (json.dumps([{"type": "bulk"}] * 1000),),
        )
        while rows := conn.execute(
            "select id, lease_token from public.jobkit_claim(array['bulk'], 'w', 30, 999)"
        ).fetchall():
            conn.execute(
                "select count(*) from public.jobkit_complete(%s::uuid[], %s::uuid[])",
                ([r[0] for r in rows], [r[1] for r in rows]),
            )


def test_claim_cost_stays_flat_after_100k_jobs(db_url: str) -> None:
    jobs = 100_000
    with psycopg.connect(db_url, autocommit=True) as conn:
        # No autovacuum during the run: the claim path must stay cheap on its own (index kill bits,
        # plans sized to the table), not because a vacuum happened to come by.
        conn.execute("alter table public.jobkit_jobs set (autovacuum_enabled = false)")
        for _ in range(5):
            cycle_buffers(conn, 2)  # warm the session's caches
        empty = cycle_buffers(conn)
        churn(conn, jobs)
        after = cycle_buffers(conn)
        dead = conn.execute(
            "select n_dead_tup from pg_stat_user_tables where relname = 'jobkit_jobs'"
        ).fetchone()
    print(
        f"\nhealth: pages per enqueue+claim+complete: empty {empty:.0f}, after {jobs} jobs {after:.0f} "
        f"(ratio {after / empty:.2f}; {dead[0] if dead else '?'} dead tuples, no vacuum)"
    )
    assert after <= 2 * empty


def test_prune_keeps_the_table_bounded(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        sizes = []
        for _ in range(4):
            churn(conn, 20_000)
            while conn.execute("select public.jobkit_prune(0)").fetchone() != (0,):
                pass
            conn.execute("vacuum public.jobkit_jobs")  # what autovacuum does on its next round
            size = conn.execute("select pg_total_relation_size('public.jobkit_jobs')").fetchone()
            assert size is not None
            sizes.append(int(size[0]))
        count = conn.execute("select count(*) from public.jobkit_jobs").fetchone()
    print(f"\nhealth: table size after each of 4 rounds of 20k jobs + prune + vacuum: {sizes}")
    assert count == (0,)
    # The first round leaves pages that the next rounds reuse: from then on the size holds still.
    assert max(sizes[2:]) <= sizes[1] * 1.25, "space is reused, not grown"


def test_churn_settings_are_on_the_table(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "select reloptions from pg_class where oid = 'public.jobkit_jobs'::regclass"
        ).fetchone()
    assert row is not None
    assert {
        "fillfactor=80",
        "autovacuum_vacuum_scale_factor=0.01",
        "autovacuum_vacuum_threshold=1000",
        "autovacuum_analyze_scale_factor=0.02",
        "autovacuum_vacuum_cost_delay=1",
    } <= set(row[0])
