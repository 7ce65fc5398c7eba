"""Run the real ``jobkit`` console script in a subprocess, configured only through its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

JOBKIT = Path(sys.executable).parent / "pgjobkit"
Run = Callable[..., subprocess.CompletedProcess[str]]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPABASE_", "JOBKIT_"))}
    return env | extra


@pytest.fixture
def jobkit(db_url: str, tmp_path: Path) -> Run:
    """``jobkit(*args)``: the console script against the test's database (JOBKIT_DATABASE_URL)."""
    assert JOBKIT.exists(), f"{JOBKIT} missing: `pip install -e .` installs the console script"

    def run(
        *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(JOBKIT), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
            env=env if env is not None else clean_env(JOBKIT_DATABASE_URL=db_url),
            check=False,
        )

    return run


def parse(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
