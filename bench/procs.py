"""Worker processes for the side-by-side figures: spawn them, release them together once each is set up,
and time until the last has drained the queue. CLOCK_MONOTONIC is one clock for all processes."""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

START_TIMEOUT = 120.0  # seconds for the workers to set up
RUN_TIMEOUT = 1800.0  # and to drain the queue

# consume(url, batch, ready) -> jobs its handler saw; it calls ready() once set up, then drains the queue
Consumer = Callable[[str, int, Callable[[], object]], int]
Report = tuple[float, int, float, str]  # a worker's end time, jobs, CPU seconds, error ("" for none)


@dataclass(frozen=True)
class Drained:
    """What ``run_workers`` measured: seconds from the start until the last worker finished, jobs the
    handlers saw, the CPU seconds the worker processes spent draining (every thread, setup excluded), and
    the server's over the same span when it was given a clock of them (else None)."""

    seconds: float
    jobs: int
    cpu: float
    server_cpu: float | None


def _child(consume: Consumer, peer: str, url: str, batch: int, go: Event, out: Queue[Report]) -> None:
    """One worker process: set up, report ready, wait for ``go``, drain the queue, report (end time, jobs its
    handler saw, CPU seconds this process spent draining, error)."""
    began = [0.0]

    def ready() -> None:
        out.put((time.monotonic(), 0, 0.0, ""))
        go.wait()
        began[0] = time.process_time()

    try:
        handled = consume(url, batch, ready)
        out.put((time.monotonic(), handled, time.process_time() - began[0], ""))
    except BaseException as exc:
        out.put((time.monotonic(), 0, 0.0, f"{type(exc).__name__}: {exc}"))


def _gather(peer: str, out: Queue[Report], workers: list[BaseProcess], deadline: float) -> list[Report]:
    """One message from each worker; raises on a worker's error, death or the deadline."""
    got: list[Report] = []
    while len(got) < len(workers):
        try:
            msg = out.get(timeout=0.5)
        except queue.Empty:
            if codes := [w.exitcode for w in workers if w.exitcode]:
                raise RuntimeError(f"{peer} worker died, exit code {codes[0]}") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"{peer} workers still running at the deadline") from None
            continue
        if msg[3]:
            raise RuntimeError(f"{peer} worker failed: {msg[3]}")
        got.append(msg)
    return got


def run_workers(
    consume: Consumer, peer: str, url: str, batch: int, procs: int, server: Callable[[], float] | None = None
) -> Drained:
    """Start ``procs`` spawned processes running ``consume``, release them together once all are set up, and
    wait until every one has drained the queue; ``server``, a clock of the server's CPU seconds, is read as
    they are released and once they are done."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    out: Queue[Report] = ctx.Queue()
    workers: list[BaseProcess] = [
        ctx.Process(target=_child, args=(consume, peer, url, batch, go, out)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    done = False
    try:
        _gather(peer, out, workers, time.monotonic() + START_TIMEOUT)
        before = server() if server else 0.0
        start = time.monotonic()
        go.set()
        results = _gather(peer, out, workers, start + RUN_TIMEOUT)
        spent = server() - before if server else None
        done = True
    finally:
        go.set()
        for w in workers:
            w.join(30 if done else 0)
            if w.is_alive():
                w.kill()
                w.join()
    return Drained(
        max(r[0] for r in results) - start, sum(r[1] for r in results), sum(r[2] for r in results), spent
    )
