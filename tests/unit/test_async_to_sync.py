"""tools/async_to_sync.py: the blocking twin's code takes the blocking names, its module docstring is kept."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", ROOT / "tools" / "async_to_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = '''"""``AsyncJobStore`` in ``base_async``, the source, and ``JobStore`` in ``base``, generated."""

async def adrive(store: AsyncJobStore) -> None:
    """Drive ``AsyncJobStore``."""
    await store.aclose()  # AsyncJobStore
'''


def test_the_module_docstring_is_kept_and_the_rest_converted() -> None:
    twin = _tool().convert(SOURCE, "pgjobkit/stores/base_async.py")
    assert SOURCE.splitlines()[0] in twin.splitlines()
    assert "def drive(store: JobStore) -> None:" in twin
    assert '"""Drive ``JobStore``."""' in twin and "store.close()  # JobStore" in twin


def test_each_twin_says_of_itself_what_its_source_says() -> None:
    tool = _tool()
    for source, target in tool.MODULES.items():
        first = ((ROOT / source).read_text().split('"""')[1]).strip()
        assert first in (ROOT / target).read_text(), target
