"""The loop of ``pgjobkit nats project``'s projector and relay (``pgjobkit.stores.jetstream.passes``)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pgjobkit.errors import ConfigurationError, TransientError
from pgjobkit.stores.jetstream.passes import keep_passing

log = logging.getLogger("tests.passes")


def test_a_fault_that_passes_is_waited_out_and_said_and_the_passes_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> int:
        stop, calls = asyncio.Event(), 0

        async def one() -> None:
            nonlocal calls
            calls += 1
            if calls <= 2:
                raise TransientError("the database did not answer")
            if calls == 4:
                stop.set()

        await asyncio.wait_for(keep_passing(stop, one, log, "the test", every=0.01), 5)
        return calls

    with caplog.at_level(logging.WARNING, logger="tests.passes"):
        assert asyncio.run(main()) == 4
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "jobkit: the test paused, retrying in 0.1s: the database did not answer",
        "jobkit: the test paused, retrying in 0.2s: the database did not answer",
    ]


def test_any_other_error_ends_the_loop_at_once() -> None:
    async def one() -> None:
        raise ConfigurationError("jobkit: JOBKIT_NATS_URL is wrong")

    with pytest.raises(ConfigurationError, match="JOBKIT_NATS_URL"):
        asyncio.run(asyncio.wait_for(keep_passing(asyncio.Event(), one, log, "the test"), 5))
