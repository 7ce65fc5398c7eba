"""The schema check a worker makes at start: it passes its own version and says what to run otherwise."""

from __future__ import annotations

import pytest

from pgjobkit.errors import ConfigurationError
from pgjobkit.version import SCHEMA_VERSION, check_schema


def test_its_own_schema_passes() -> None:
    check_schema(SCHEMA_VERSION)


@pytest.mark.parametrize(
    ("found", "says"),
    [
        (None, "no jobkit schema, or one older than 0.2.0.*run `pgjobkit migrate`"),
        ("0.1.9", "schema 0.1.9.*run `pgjobkit migrate`.*`supabase db push`"),
        ("0.10.0", "newer than pgjobkit .* knows.*upgrade pgjobkit"),
    ],
)
def test_any_other_schema_is_refused_saying_what_to_do(found: str | None, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        check_schema(found)
