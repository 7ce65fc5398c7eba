"""Store adapters behind the one JobStore seam."""

from jobkit.stores.base import JobStore, Subscription
from jobkit.stores.memory import MemoryStore

__all__ = ["JobStore", "MemoryStore", "Subscription"]
