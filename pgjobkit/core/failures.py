"""What a failed attempt leaves for operators beside its job's one-line error: its traceback
(``JobTraceback``), kept as PostgreSQL text holds it and bounded to its end (``storable_traceback``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from pgjobkit.core.bounds import (
    MAX_TRACEBACK_LENGTH as MAX_TRACEBACK_LENGTH,  # re-exported: written in bounds
)

CUT = "[earlier lines cut]\n"
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class JobTraceback:
    """The traceback of a job's latest failed attempt that recorded one: which ``attempt``, and when."""

    job_id: UUID
    attempt: int
    text: str
    failed_at: datetime


def storable_traceback(text: str) -> str:
    """``text`` as PostgreSQL text holds it (NUL written as \\0, lone surrogates as U+FFFD), at most
    MAX_TRACEBACK_LENGTH characters: its end, where the frame that raised and the error are, from the start
    of a line, after CUT."""
    text = text[-4 * MAX_TRACEBACK_LENGTH :]  # the end is what is kept: a megabyte is not read whole
    text = _SURROGATE.sub("\ufffd", text.replace("\x00", "\\0"))
    if len(text) <= MAX_TRACEBACK_LENGTH:
        return text
    tail = text[len(text) - (MAX_TRACEBACK_LENGTH - len(CUT)) :]
    newline = tail.find("\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1 :]
    return CUT + tail
