"""How many jobs a worker's next claim asks for (``exchange.claim_size``), rule by rule, as a table."""

from __future__ import annotations

import pytest

from pgjobkit.worker.exchange import AHEAD, claim_size

B = 10  # the batch size of most rows; concurrency 10 too, so the capacity is 10


@pytest.mark.parametrize(
    ("held", "asked", "in_flight", "capacity", "batch", "ahead", "left", "want"),
    [
        # nothing held or asked: whatever is free, up to a batch
        (0, 0, 0, B, B, False, None, B),
        (0, 0, 0, 3 * B, B, False, None, B),  # concurrency 30: still a batch at a time
        (0, 0, 0, B, B, False, 4, 4),  # max_jobs leaves 4
        (0, 0, 0, B, B, False, 0, 0),  # nothing left: never negative
        # otherwise only once half a batch is free, so that claims are not sent a job at a time
        (5, 0, 0, B, B, False, None, 5),
        (6, 0, 0, B, B, False, None, 0),
        (2, 0, 0, 5, 5, False, None, 3),  # an odd batch's half rounds up: 3 of 5
        (3, 0, 0, 5, 5, False, None, 0),
        (0, 4, 1, B, B, False, None, 6),  # jobs asked for by a claim in flight count as held
        (0, 6, 1, B, B, False, None, 0),
        (B, 0, 0, B, B, False, None, 0),  # every slot busy
        # ahead (the jobs run quick, the queue is not drained): AHEAD batches more room
        (B, 0, 0, B, B, True, None, B),
        (B + AHEAD * B - 5, 0, 0, B, B, True, None, 5),
        (B + AHEAD * B - 4, 0, 0, B, B, True, None, 0),
        # ahead with a round trip in flight (a claim, or only a completion): a whole batch free
        (B, B, 1, B, B, True, None, B),
        (B, B + 1, 1, B, B, True, None, 0),
        (B + 1, 0, 1, B, B, True, None, B),  # a completion in flight asked for none
        (B + AHEAD * B - 9, 0, 1, B, B, True, None, 0),  # 9 free: enough without one in flight
        # left: what max_jobs leaves beyond the jobs already asked for
        (5, 5, 1, 2 * B, B, False, 8, 0),  # 3 left, under half a batch
        (0, 5, 1, 2 * B, B, False, 10, 5),
        (0, 5, 1, 2 * B, B, False, 9, 0),
    ],
)
def test_claim_size(
    held: int, asked: int, in_flight: int, capacity: int, batch: int, ahead: bool, left: int | None, want: int
) -> None:
    got = claim_size(
        held=held, asked=asked, in_flight=in_flight, capacity=capacity, batch=batch, ahead=ahead, left=left
    )
    assert got == want
