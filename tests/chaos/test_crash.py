"""Crash chaos: workers SIGKILLed at random while they work through thousands of jobs.

CI size: 2,000 jobs; ``JOBKIT_CHAOS_FULL=1`` runs 20,000.
"""

from __future__ import annotations

import random
from typing import Any

import psycopg

from tests.chaos.conftest import Fleet, chaos_jobs, prepare_chaos

# concurrency 4, batch 4, 40 ms jobs (too slow to be claimed ahead, see pgjobkit.worker.exchange): at most 4 jobs per
# process run and not yet completed
IN_FLIGHT_PER_WORKER = 4


def test_sigkilled_workers_lose_nothing(
    db_url: str, pg: psycopg.Connection[Any], fleet_factory: list[Fleet]
) -> None:
    total = chaos_jobs(2000, 20000)
    prepare_chaos(db_url, total)

    fleet = Fleet(db_url, CHAOS_LEASE="1.5", CHAOS_WORK_SECONDS="0.04")
    fleet_factory.append(fleet)
    for _ in range(4):
        fleet.start()

    def done() -> bool:
        row = pg.execute("select count(*) as n from public.jobkit_jobs where status = 'succeeded'").fetchone()
        return row is not None and row["n"] == total

    fleet.churn(random.Random(1), done, seconds=120)
    fleet.stop_all()

    statuses = {
        r["status"]: r["n"]
        for r in pg.execute("select status, count(*) as n from public.jobkit_jobs group by status").fetchall()
    }
    runs = pg.execute("select count(*) as runs, count(distinct job_id) as jobs from chaos_runs").fetchone()
    assert runs is not None
    extra = runs["runs"] - runs["jobs"]
    bound = fleet.kills * IN_FLIGHT_PER_WORKER
    print(
        f"\nchaos: {total} jobs, {fleet.kills} SIGKILLs, {runs['runs']} executions, "
        f"{extra} extra (bound {bound}), statuses {statuses}"
    )
    assert fleet.kills >= 3, "the run was too short to be chaos"
    assert statuses == {"succeeded": total}, "every job succeeded: none lost, none stuck in running"
    assert runs["jobs"] == total, "every job ran"
    assert extra <= bound, "each job ran once, except jobs held by a killed worker"
