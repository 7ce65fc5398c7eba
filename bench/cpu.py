"""CPU time of a PostgreSQL server running on this machine, read from /proc: the postmaster's own, that of its
children alive now, and that of the children it has reaped (a backend that came and went during a run counts
through the postmaster's cumulative child times). Linux only; a server elsewhere gives None."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psycopg

_TICK = os.sysconf("SC_CLK_TCK")
_SETTLE = 0.02  # seconds the set of backends must stay the same for a reading
_READS = 100


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state is [0], ppid [1]), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _postmaster(url: str) -> int | None:
    """The pid of the postmaster serving ``url``, if it runs on this machine and /proc shows it."""
    with psycopg.connect(url, autocommit=True) as conn:  # the backend is read while it is there
        row = conn.execute("select pg_backend_pid()").fetchone()
        fields = None if row is None else _stat(int(row[0]))
    return None if fields is None else int(fields[1])


def server_cpu(url: str) -> Callable[[], float] | None:
    """A clock of the server's CPU seconds (user + system) so far, or None when it cannot be read here (a
    remote server, or no /proc). The difference of two readings is what the server spent between them."""
    try:
        postmaster = _postmaster(url)
    except (psycopg.Error, ValueError):
        return None
    if postmaster is None or _stat(postmaster) is None or "postgres" not in _comm(postmaster):
        return None

    def seconds() -> float:
        # A backend that is exiting can be in neither place for a moment: gone from /proc (or a zombie that
        # shows no CPU) while the postmaster's child times do not have it yet. So a reading counts once the
        # set of children has stayed the same, with no zombie, over SETTLE seconds.
        last: frozenset[int] | None = None
        for _ in range(_READS):
            ticks, children, zombie = _read(postmaster)
            if children == last and not zombie:
                return ticks / _TICK  # each process's figure is truncated to a tick (10 ms): time whole runs
            last = None if zombie else children
            time.sleep(_SETTLE)
        raise RuntimeError(
            f"PostgreSQL's backends (postmaster pid {postmaster}) did not settle in {_READS} reads"
        )

    return seconds


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _read(postmaster: int) -> tuple[int, frozenset[int], bool]:
    """Clock ticks of the postmaster, its children alive now and those it has reaped; the children's pids;
    whether one of them is a zombie."""
    fields = _stat(postmaster)
    if fields is None:
        raise RuntimeError(f"PostgreSQL's postmaster (pid {postmaster}) has gone")
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, reaped children's both
    children, zombie = set(), False
    for entry in os.listdir("/proc"):
        child = _stat(int(entry)) if entry.isdigit() else None
        if child is not None and child[1] == str(postmaster):
            ticks += int(child[11]) + int(child[12])
            children.add(int(entry))
            zombie = zombie or child[0] in "ZX"
    return ticks, frozenset(children), zombie
