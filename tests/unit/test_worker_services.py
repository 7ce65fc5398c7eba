"""The worker's parts one at a time: the executor's lists behind its methods, and the side services started
and stopped in one place (``pgjobkit.worker.services``)."""

from __future__ import annotations

import asyncio
import signal
import socket
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest

from pgjobkit import ConfigurationError, JobStatus, MemoryStore, NewJob, Worker
from pgjobkit.worker import services
from pgjobkit.worker.calls import WorkerCalls
from pgjobkit.worker.executor import Backoff, JobExecutor
from pgjobkit.worker.registry import Registry


async def _no_dependencies(_: Any) -> list[Any]:
    return []


def test_the_executor_keeps_its_lists_and_a_put_back_goes_first() -> None:
    store = MemoryStore()
    store.enqueue_many([NewJob(type="t", payload={"n": n}) for n in range(4)])
    jobs = WorkerCalls(store).claim(["t"], "w", timedelta(seconds=30), 4)
    handlers = Registry()

    async def main() -> None:
        gate = asyncio.Event()  # holds the last job running

        @handlers.handler("t")
        async def handler(payload: dict[str, int]) -> None:
            if payload["n"] == 3:
                await gate.wait()

        with ThreadPoolExecutor(1) as threads:
            executor = JobExecutor(
                handlers=handlers,
                concurrency=4,
                batch_size=10,
                backoff=Backoff(1, 1, 0, lambda: 0.5),
                threads=threads,
                wake=asyncio.Event(),
                dependencies=_no_dependencies,
            )
            runs = [executor.start(job) for job in jobs]
            assert executor.running_jobs() == runs and executor.running_count == 4
            while executor.done_count < 3:
                await asyncio.sleep(0)
            assert executor.running_jobs() == runs[3:]
            taken = executor.take_done()
            assert taken == runs[:3] and executor.done_count == 0 and executor.oldest_done is None
            gate.set()
            while executor.running_count:
                await asyncio.sleep(0)
            executor.put_back(taken[1:])  # a completion that failed: those jobs go first next time
            assert executor.oldest_done == runs[1].finished
            assert executor.take_done() == [runs[1], runs[2], runs[3]]
            executor.lose(runs[0], JobStatus.CANCELLED)  # it ended: nothing to stop, nothing to record
            assert not runs[0].lost and not executor.has_outcomes
            await executor.wind_down()

    asyncio.run(main())


def test_services_stop_in_reverse_order_and_one_that_fails_to_start_stops_those_before_it() -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def service(name: str, fail: bool = False) -> AsyncIterator[None]:
        if fail:
            raise RuntimeError(f"{name} failed")
        seen.append(f"start {name}")
        try:
            yield
        finally:
            seen.append(f"stop {name}")

    async def main() -> None:
        beside: list[AbstractAsyncContextManager[None]] = [service("a"), service("b")]
        async with await services.start(beside):
            seen.append("run")
        with pytest.raises(RuntimeError, match="c failed"):
            await services.start([service("a"), service("b"), service("c", fail=True), service("d")])

    asyncio.run(main())
    ran = ["start a", "start b", "run", "stop b", "stop a"]
    failed = ["start a", "start b", "stop b", "stop a"]  # c never started, d was never tried
    assert seen == ran + failed


def test_a_run_that_cannot_start_leaves_no_signal_handler_and_runs_no_hook() -> None:
    """The metrics port is taken: the signal handlers installed before it are removed again (they were
    left on the loop, calling into a worker no longer running), and the on_stop hooks, for a run that
    finished its jobs, do not run."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    hooks: list[str] = []
    worker = Worker(MemoryStore(), name="w", metrics_port=taken.getsockname()[1])
    worker.register("t", lambda p: None)
    worker.on_stop(lambda: hooks.append("hook"))

    async def main() -> bool:
        with pytest.raises(ConfigurationError, match="cannot serve metrics"):
            await worker.arun(install_signals=True, until_empty=True)
        await worker.aclose()
        loop = asyncio.get_running_loop()
        return loop.remove_signal_handler(signal.SIGINT) or loop.remove_signal_handler(signal.SIGTERM)

    try:
        assert asyncio.run(main()) is False
    finally:
        taken.close()
    assert hooks == []


def test_the_hooks_run_once_every_service_has_stopped() -> None:
    store = MemoryStore()
    worker = Worker(store, name="w", metrics_port=0)
    worker.register("t", lambda p: None)
    seen: list[object] = []
    worker.on_stop(lambda: seen.append((worker.metrics_port, list(store._state.listeners))))
    store.enqueue(NewJob(type="t"))
    assert worker.run(install_signals=False, until_empty=True).succeeded == 1
    assert seen == [(None, [])]  # the metrics endpoint closed and the subscription left before the hook
