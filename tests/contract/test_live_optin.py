"""Says, once, whether the contract also ran against a real Supabase stack (marker ``supabase``)."""

from __future__ import annotations

import pytest

from tests.contract.conftest import LIVE_MISSING, STORES


@pytest.mark.supabase
def test_real_supabase_contract_is_opt_in() -> None:
    if LIVE_MISSING:
        pytest.skip(
            f"real-Supabase contract suite not run: set {', '.join(LIVE_MISSING)} "
            "(from `supabase status` of a dev stack; the suite empties its jobkit_jobs) and run "
            "`scripts/test.sh -m supabase`"
        )
    assert any(getattr(p, "values", None) == ("supabase-live",) for p in STORES)
