"""CPU time of a PostgreSQL server running on this machine, read from /proc: the postmaster's own, that of its
children alive now, and that of the children it has reaped (a backend that came and went during a run counts
through the postmaster's cumulative child times). Linux only; a server elsewhere gives None."""

from __future__ import annotations

import os
from collections.abc import Callable

import psycopg

_TICK = os.sysconf("SC_CLK_TCK")


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
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("select pg_backend_pid()").fetchone()
    if row is None or (fields := _stat(int(row[0]))) is None:
        return None
    return int(fields[1])


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
        fields = _stat(postmaster)
        if fields is None:
            raise RuntimeError(f"PostgreSQL's postmaster (pid {postmaster}) has gone")
        ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime, stime, reaped children's both
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (child := _stat(int(entry))) is not None and child[1] == str(postmaster):
                ticks += int(child[11]) + int(child[12])
        return ticks / _TICK  # each process's figure is truncated to a tick (10 ms): time whole runs

    return seconds


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""
