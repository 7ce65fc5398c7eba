"""Old names kept working for a release: a module's ``__getattr__`` that finds a renamed name where it now
lives, with a DeprecationWarning naming the new one."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def renamed(module: str, names: Mapping[str, str], *, stacklevel: int = 2) -> Callable[[str], Any]:
    """The ``__getattr__`` of ``module`` for ``names``, old -> "package.module:NewName" (``stacklevel``: 3
    when another ``__getattr__`` calls it)."""

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, new = names[name].split(":")
        warnings.warn(f"{module}.{name} is now {where}.{new}", DeprecationWarning, stacklevel=stacklevel)
        return getattr(importlib.import_module(where), new)

    return __getattr__
