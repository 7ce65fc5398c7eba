"""What the JetStream tests share: a store on a queue of its own, a claim that waits, the CLI in a child."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from pgjobkit.core.models import Job
from pgjobkit.natscluster import LocalCluster
from pgjobkit.stores.jetstream import AsyncJetStreamStore
from pgjobkit.worker.calls_async import AsyncWorkerCalls

ROOT = Path(__file__).resolve().parents[2]


def fresh_store(cluster: LocalCluster, *, ack_wait: float = 30.0, partitions: int = 1) -> AsyncJetStreamStore:
    """A store on its own streams and subjects (a queue no other test sees); ``migrate`` it once open."""
    name = uuid.uuid4().hex[:12]
    return AsyncJetStreamStore(
        cluster.url, prefix=f"t{name}", stream=f"T{name}", ack_wait=ack_wait, partitions=partitions
    )


async def claim_until(
    calls: AsyncWorkerCalls,
    types: Sequence[str],
    want: int,
    *,
    worker: str = "w",
    lease: timedelta = timedelta(seconds=30),
    within: float = 10.0,
) -> list[Job]:
    """Claim until ``want`` jobs came (or ``within`` seconds passed): what a worker's loop does."""
    got: list[Job] = []
    deadline = time.monotonic() + within
    while len(got) < want and time.monotonic() < deadline:
        got += await calls.claim(types, worker, lease, want - len(got))
        if len(got) < want:
            await asyncio.sleep(0.02)
    return got


def run_cli(
    *args: str, nats_url: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``pgjobkit *args`` in a child process with JOBKIT_NATS_URL (and ``env``) as its only jobkit
    settings."""
    clean = clean_env()
    return subprocess.run(
        [sys.executable, "-c", "from pgjobkit.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=clean | {"JOBKIT_NATS_URL": nats_url, "PYTHONPATH": str(ROOT)} | (env or {}),
        check=False,
    )


def clean_env() -> dict[str, str]:
    """This process's environment without any jobkit or Supabase setting, jobkit's checkout importable."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SUPABASE_", "JOBKIT_"))} | {
        "PYTHONPATH": str(ROOT)
    }
