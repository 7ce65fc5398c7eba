"""Reading an answer Python's JSON decoder refuses as a whole, one value at a time.

PostgreSQL can hold JSON that Python's ``json`` cannot read (an integer of more than 4,300 digits, nesting
near a thousand deep). jobkit's domains refuse both at every write, but a row written before those bounds
held, or by the table's owner around them, must still fail alone: when a whole answer does not decode,
``read_value_by_value`` decodes it row by row, and within a row that still fails, column by column. A value that does not
decode is left out of its row, and the row says what was wrong under ``pgjobkit.ops.UNREADABLE``; the claim
then fails that job alone (``pgjobkit.ops``). Only the path of an answer that failed pays for this.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pgjobkit.errors import StoreError
from pgjobkit.ops import UNREADABLE

_DECODE = json.JSONDecoder().raw_decode
_SPACE = re.compile(r"\s*")
# strings whole (so a bracket inside one is not counted), and brackets
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')
_SCALAR = re.compile(r'"(?:[^"\\]|\\.)*"|[^,\]}\s]+')


def problem(column: str, exc: BaseException) -> str:
    """What was wrong with one value, as a row's UNREADABLE entry says it."""
    return f"{column}: {type(exc).__name__}: {str(exc)[:200]}"


def read_value_by_value(text: str) -> list[Any]:
    """The top-level JSON array ``text`` (PostgREST's answer), each element decoded on its own; an object
    that does not decode is read key by key, marked with what could not be read."""
    i = _skip_space(text, 0)
    if not text.startswith("[", i):
        raise StoreError("jobkit: the answer is neither a JSON array nor readable JSON")
    out: list[Any] = []
    i = _skip_space(text, i + 1)
    while not text.startswith("]", i):
        try:
            value, i = _DECODE(text, i)
        except (ValueError, RecursionError):
            value, i = _object(text, i)
        out.append(value)
        i = _skip_space(text, i)
        if text.startswith(",", i):
            i = _skip_space(text, i + 1)
    return out


def _object(text: str, i: int) -> tuple[dict[str, Any], int]:
    """The JSON object at ``i``, each value decoded on its own; what does not decode is left out and named
    under UNREADABLE. Returns the object and the index after it."""
    if not text.startswith("{", i):
        raise StoreError("jobkit: an answer's row is not a JSON object")
    row: dict[str, Any] = {}
    problems: list[str] = []
    i = _skip_space(text, i + 1)
    while not text.startswith("}", i):
        key, i = _DECODE(text, i)
        i = _skip_space(text, _skip_space(text, i) + 1)  # past the colon
        try:
            row[key], i = _DECODE(text, i)
        except (ValueError, RecursionError) as exc:
            problems.append(problem(key, exc))
            i = _past_value(text, i)
        i = _skip_space(text, i)
        if text.startswith(",", i):
            i = _skip_space(text, i + 1)
    if problems:
        row[UNREADABLE] = "; ".join(problems)
    return row, i + 1


def _past_value(text: str, i: int) -> int:
    """The index just after the JSON value that starts at ``i``, found without decoding it."""
    if text[i] not in "[{":
        match = _SCALAR.match(text, i)
        if match is None:
            raise StoreError("jobkit: an answer holds a value that is not JSON")
        return match.end()
    depth = 0
    for token in _TOKEN.finditer(text, i):
        if token.group() in "[{":
            depth += 1
        elif token.group() in "]}":
            depth -= 1
            if depth == 0:
                return token.end()
    raise StoreError("jobkit: an answer ends inside a JSON value")


def _skip_space(text: str, i: int) -> int:
    match = _SPACE.match(text, i)
    return match.end() if match else i
