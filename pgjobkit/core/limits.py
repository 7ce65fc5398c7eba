"""Per-type limits every claim obeys, as a value: ``Limit``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pgjobkit.core.models import Answer


class Limit(Answer):
    """Limits on one job type, held by every claim on every worker: at most ``max_running`` running at once
    (0 pauses the type), at most ``max_starts`` starts in any window of ``per``, at most
    ``max_running_per_key`` running per fairness key. None: no limit of that kind. ``running`` and
    ``started`` (within the current window) are read with the limits."""

    type: str
    max_running: int | None = None
    max_starts: int | None = None
    per: timedelta | None = None
    max_running_per_key: int | None = None
    running: int = 0
    started: int = 0
    updated_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Limit:
        per = row.get("per_seconds")
        fields = {k: v for k, v in row.items() if k in cls.model_fields}
        return cls.model_validate(fields | {"per": timedelta(seconds=per) if per is not None else None})
