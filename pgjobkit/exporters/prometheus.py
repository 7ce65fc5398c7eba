"""Counters, gauges and histograms, rendered in Prometheus's text exposition format 0.0.4.

Thread-safe: one lock per family, held only to add to a number (and while the family renders)."""

from __future__ import annotations

import math
import re
import threading
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Content-Type of what ``Registry.render`` returns."""

DEFAULT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
                                      900, 3600)  # fmt: skip
"""A histogram's default upper bounds, in seconds: from a quick job's 5 ms to an hour."""

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape(value: str, quote: bool = True) -> str:
    value = value.replace("\\", "\\\\").replace("\n", "\\n")
    return value.replace('"', '\\"') if quote else value


class _Child:
    __slots__ = ("_labels", "_lock")

    def __init__(self, lock: threading.Lock, labels: str) -> None:
        self._lock = lock
        self._labels = labels  # the series' labels, escaped: 'a="x",b="y"' (or "")

    def _braces(self, extra: str = "") -> str:
        inner = ",".join(part for part in (self._labels, extra) if part)
        return f"{{{inner}}}" if inner else ""

    def _render(self, name: str, out: list[str]) -> None:  # called with the family's lock held
        raise NotImplementedError


class _Scalar(_Child):
    __slots__ = ("_value",)

    def __init__(self, lock: threading.Lock, labels: str) -> None:
        super().__init__(lock, labels)
        self._value = 0.0

    def _render(self, name: str, out: list[str]) -> None:
        out.append(f"{name}{self._braces()} {_number(self._value)}")


class CounterChild(_Scalar):
    """One counter series: a number that only goes up."""

    __slots__ = ()

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount`` (0 or more; a negative amount or NaN raises ValueError)."""
        if not amount >= 0:
            raise ValueError(f"a counter only goes up: inc({amount!r})")
        with self._lock:
            self._value += amount


class GaugeChild(_Scalar):
    """One gauge series: a number that is set, or goes up and down."""

    __slots__ = ()

    def set(self, value: float) -> None:
        """Make the gauge ``value``."""
        with self._lock:
            self._value = float(value)

    def inc(self, amount: float = 1.0) -> None:
        """Add ``amount``."""
        with self._lock:
            self._value += amount

    def dec(self, amount: float = 1.0) -> None:
        """Subtract ``amount``."""
        with self._lock:
            self._value -= amount


class HistogramChild(_Child):
    """One histogram series: how many observations fell at or under each bucket's bound, their sum and count."""

    __slots__ = ("_bounds", "_counts", "_le", "_sum")

    def __init__(self, lock: threading.Lock, labels: str, bounds: tuple[float, ...], le: list[str]) -> None:
        super().__init__(lock, labels)
        self._bounds, self._le = bounds, le
        self._counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; the last one is +Inf's
        self._sum = 0.0

    def observe(self, value: float) -> None:
        """Count ``value`` in the first bucket whose bound is at least ``value`` (NaN: only in +Inf)."""
        i = bisect_left(self._bounds, value) if value == value else len(self._bounds)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def _render(self, name: str, out: list[str]) -> None:
        total = 0
        for le, count in zip(self._le, self._counts, strict=True):
            total += count
            out.append(f"{name}_bucket{self._braces(le)} {total}")
        out.append(f"{name}_sum{self._braces()} {_number(self._sum)}")
        out.append(f"{name}_count{self._braces()} {total}")


C = TypeVar("C", bound=_Child)


class Family(Generic[C]):
    """A metric: its name, help and label names, and one child (series) per tuple of label values."""

    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        if not _NAME.fullmatch(name):
            raise ValueError(f"metric name {name!r} does not match [a-zA-Z_:][a-zA-Z0-9_:]*")
        if isinstance(labels, str):
            raise TypeError(f"labels is a sequence of label names, not the string {labels!r}")
        for label in labels:
            if not _LABEL.fullmatch(label) or label.startswith("__"):
                raise ValueError(
                    f"{name}: label name {label!r} does not match [a-zA-Z_][a-zA-Z0-9_]* or starts with __"
                )
        if len(set(labels)) != len(labels):
            raise ValueError(f"{name}: label names repeat: {list(labels)}")
        self.name, self.help, self.label_names = name, help, tuple(labels)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], C] = {}

    def labels(self, *values: str) -> C:
        """The series for these label values, one per label name in order (created the first time)."""
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.label_names):
                raise ValueError(f"{self.name} has labels {self.label_names}, given {len(values)} values")
            if not all(isinstance(v, str) for v in values):
                raise TypeError(f"{self.name}: label values are str, given {values!r}")
            text = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(self.label_names, values, strict=True))
            with self._lock:
                child = self._children.setdefault(values, self._child(text))
        return child

    def remove(self, *values: str) -> None:
        """Forget the series for these label values (nothing happens if there is none)."""
        if len(values) != len(self.label_names):
            raise ValueError(f"{self.name} has labels {self.label_names}, given {len(values)} values")
        with self._lock:
            self._children.pop(values, None)

    def clear(self) -> None:
        """Forget every series."""
        with self._lock:
            self._children.clear()

    def _child(self, labels: str) -> C:
        raise NotImplementedError

    def _render(self, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {_escape(self.help, quote=False)}")
        out.append(f"# TYPE {self.name} {self.kind}")
        with self._lock:
            for child in self._children.values():
                child._render(self.name, out)


class Counter(Family[CounterChild]):
    """A counter metric; its name ends in ``_total``."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        if not name.endswith("_total") or not _NAME.fullmatch(name.removesuffix("_total")):
            raise ValueError(f"a counter's name ends in _total, after a name of its own: {name!r}")
        super().__init__(name, help, labels)

    def _child(self, labels: str) -> CounterChild:
        return CounterChild(self._lock, labels)

    def inc(self, amount: float = 1.0) -> None:
        """``labels().inc(amount)``, for a counter without labels."""
        self.labels().inc(amount)


class Gauge(Family[GaugeChild]):
    """A gauge metric."""

    kind = "gauge"

    def _child(self, labels: str) -> GaugeChild:
        return GaugeChild(self._lock, labels)

    def set(self, value: float) -> None:
        """``labels().set(value)``, for a gauge without labels."""
        self.labels().set(value)


class Histogram(Family[HistogramChild]):
    """A histogram metric, with the same bucket bounds for each of its series."""

    kind = "histogram"

    def __init__(
        self, name: str, help: str, labels: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_BUCKETS
    ) -> None:
        super().__init__(name, help, labels)
        if "le" in self.label_names:
            raise ValueError(f"{name}: le is the histogram's own label")
        bounds = tuple(float(b) for b in buckets)
        if not bounds or not all(math.isfinite(b) for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: buckets are finite, increasing and at least one: {list(buckets)}")
        self.buckets = bounds
        self._le = [f'le="{_number(b)}"' for b in bounds] + ['le="+Inf"']

    def _child(self, labels: str) -> HistogramChild:
        return HistogramChild(self._lock, labels, self.buckets, self._le)

    def observe(self, value: float) -> None:
        """``labels().observe(value)``, for a histogram without labels."""
        self.labels().observe(value)


class Registry:
    """The metrics one endpoint serves, in the order they were registered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[Family[Any]] = []
        self._taken: set[str] = set()  # every name a family's samples use, so that no two collide

    def _add(self, family: Family[Any], names: set[str]) -> None:
        with self._lock:
            if taken := names & self._taken:
                raise ValueError(f"{family.name}: the name {sorted(taken)[0]} is already registered")
            self._taken |= names
            self._families.append(family)

    def counter(self, name: str, help: str, labels: Sequence[str] = ()) -> Counter:
        """Register a counter (its name ends in ``_total``)."""
        family = Counter(name, help, labels)
        self._add(family, {name, name.removesuffix("_total")})
        return family

    def gauge(self, name: str, help: str, labels: Sequence[str] = ()) -> Gauge:
        """Register a gauge."""
        family = Gauge(name, help, labels)
        self._add(family, {name})
        return family

    def histogram(
        self, name: str, help: str, labels: Sequence[str] = (), buckets: Sequence[float] = DEFAULT_BUCKETS
    ) -> Histogram:
        """Register a histogram (``+Inf`` is a bucket of every histogram; don't list it)."""
        family = Histogram(name, help, labels, buckets)
        self._add(family, {name, f"{name}_bucket", f"{name}_sum", f"{name}_count"})
        return family

    def render(self) -> bytes:
        """Every family and series, in the text exposition format 0.0.4 (``CONTENT_TYPE``)."""
        with self._lock:
            families = list(self._families)
        out: list[str] = []
        for family in families:
            family._render(out)
        # UTF-8; a lone surrogate (from a str decoded with surrogateescape) becomes "?" rather than fail the scrape.
        return "".join(line + "\n" for line in out).encode("utf-8", "replace")
