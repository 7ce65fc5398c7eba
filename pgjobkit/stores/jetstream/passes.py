"""The loop the projector and the relay each run in ``pgjobkit nats project``: a pass, again and again until
told to stop, a fault that passes (``TransientError``: the database or the cluster not answering) waited
out with a growing pause and said in the log; any other error ends the loop (a configuration error stops
at once)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pgjobkit.errors import TransientError

FIRST_PAUSE, LAST_PAUSE = 0.1, 5.0  # seconds after a fault: doubling from the first, at most the last


async def keep_passing(
    stop: asyncio.Event, one: Callable[[], Awaitable[Any]], log: logging.Logger, what: str, every: float = 0.0
) -> None:
    """``one()`` until ``stop`` is set, ``every`` seconds apart (0: at once; a pass that waits for work,
    as a long poll does, needs no pause of its own); a fault said on ``log``."""
    pause = FIRST_PAUSE
    while not stop.is_set():
        try:
            await one()
            pause, wait = FIRST_PAUSE, every
        except TransientError as exc:
            log.warning("jobkit: %s paused, retrying in %.1fs: %s", what, pause, exc)
            wait, pause = pause, min(pause * 2, LAST_PAUSE)
        if wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
