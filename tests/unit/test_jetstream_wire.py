"""A compare-and-set on JetStream that lost (``pgjobkit.stores.jetstream.wire.Wire.put``): the answer is
None, whichever of the two codes the server gives."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.js.errors import APIError, BadRequestError

from pgjobkit.stores.jetstream.layout import BATCH_WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE, Layout
from pgjobkit.stores.jetstream.wire import Wire


class LostPublish:
    """A connection whose every JetStream publish is refused as nats-py raises it
    (``APIError.from_error`` of the server's JSON answer): ``code=400 err_code=... description='wrong last
    sequence'``, as nats-server 2.15.1 answered in the leader-kill chaos run (err_code 10164 for a single
    conditional publish) and answers any lost compare-and-set (10071)."""

    def __init__(self, err_code: int) -> None:
        self.err_code = err_code

    def jetstream(self, timeout: float) -> LostPublish:
        return self

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        raise APIError.from_error(
            {"code": 400, "err_code": self.err_code, "description": "wrong last sequence"}
        )


@pytest.mark.parametrize("err_code", [WRONG_LAST_SEQUENCE, BATCH_WRONG_LAST_SEQUENCE])
def test_a_lost_compare_and_set_answers_none(err_code: int) -> None:
    wire = Wire(LostPublish(err_code), Layout())  # type: ignore[arg-type]
    assert asyncio.run(wire.put("jobkit.job.x", b"{}", 3)) is None


def test_any_other_refusal_is_raised() -> None:
    wire = Wire(LostPublish(10999), Layout())  # type: ignore[arg-type]
    with pytest.raises(BadRequestError):
        asyncio.run(wire.put("jobkit.job.x", b"{}", 3))
