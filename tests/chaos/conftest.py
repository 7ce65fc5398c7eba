"""Shared pieces of the chaos tests: worker processes, and the ``--chaos-full`` size flag."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from pgjobkit import NewJob
from pgjobkit.stores.postgres import PostgresStore

ROOT = Path(__file__).resolve().parents[2]


def chaos_jobs(default: int, full: int) -> int:
    """CI runs ``default`` jobs; JOBKIT_CHAOS_FULL=1 runs ``full``."""
    return full if os.environ.get("JOBKIT_CHAOS_FULL") == "1" else default


CHAOS_TABLE = "create table chaos_runs (job_id uuid not null, pid int not null, at timestamptz default now())"


def prepare_chaos(url: str, total: int) -> None:
    """The executions table and ``total`` chaos jobs. max_attempts 20: a reclaim after a crash counts as an
    attempt, and these tests kill far more often than any real fleet; with the default 3 an unlucky job
    would (rightly) end dead as poison."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(CHAOS_TABLE)
    store = PostgresStore(url)
    try:
        for start in range(0, total, 1000):
            batch = range(start, min(total, start + 1000))
            store.enqueue_many([NewJob(type="chaos", payload={"n": i}, max_attempts=20) for i in batch])
    finally:
        store.close()


class Fleet:
    """Worker processes (tests/chaos/worker_proc.py) that can be killed and replaced."""

    def __init__(self, url: str, mode: str = "record", **env: str) -> None:
        self.url, self.mode = url, mode
        self.env = os.environ | env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.kills = 0

    def start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.chaos.worker_proc", self.url, self.mode],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def churn(self, rng: random.Random, done: Callable[[], bool], seconds: float) -> None:
        """Every 0.5 to 1 s until ``done()`` (or ``seconds`` pass), SIGKILL a worker at random and start
        another in its place."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.5, 1.0))
            if done():
                return
            victim = rng.choice(self.alive())
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
            self.kills += 1
            self.start()

    def stop_all(self) -> None:
        for p in self.alive():
            p.kill()
        for p in self.procs:
            p.wait(10)


@pytest.fixture
def fleet_factory() -> Iterator[list[Fleet]]:
    fleets: list[Fleet] = []
    try:
        yield fleets
    finally:
        for f in fleets:
            f.stop_all()
