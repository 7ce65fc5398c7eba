"""``pgjobkit worker --processes N``: one command on every core. The command's own process runs a worker;
N - 1 children run the same command with ``--processes 1``. When the parent's worker stops (SIGINT or
SIGTERM), it stops the children the same way (a second signal, which gives jobs back, is passed on
too); the parent exits non-zero if any child did. A terminal's Ctrl-C reaches them all at once anyway."""

from __future__ import annotations

import logging
import signal as signals
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

log = logging.getLogger("pgjobkit.worker")


def child_args(env_file: str, target: str, params: Mapping[str, Any]) -> list[str]:
    """The ``pgjobkit worker`` command line of one more process like this one (``params``: its options)."""
    args = ["--env-file", env_file, "worker", target, "--processes", "1"]
    for name, value in params.items():
        if name in ("target", "processes") or value is None or value == ():
            continue
        flag = "--" + name.replace("_", "-")
        if name in ("schedules", "tracing"):  # on/off flags: off is said, not left out
            args.append(f"--{name}" if value else f"--no-{name}")
        elif value is False:
            continue
        elif value is True:
            args.append(flag)
        elif isinstance(value, tuple):
            for item in value:
                args += [flag, str(item)]
        else:
            args += [flag, f"{value.total_seconds()}s" if isinstance(value, timedelta) else str(value)]
    return args


def spawn(args: Sequence[str], count: int) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` children running ``jobkit`` with ``args``."""
    code = "import sys; from pgjobkit.cli import main; sys.exit(main())"
    return [subprocess.Popen([sys.executable, "-c", code, *args]) for _ in range(count)]


def stop(children: Sequence[subprocess.Popen[bytes]], *, abandon: bool, signal: bool = True) -> int:
    """Stop every child as the parent was stopped (``abandon``: twice; ``signal`` False: let them finish
    by themselves), wait for them; how many failed."""
    for _ in range((2 if abandon else 1) if signal else 0):
        for child in children:
            if child.poll() is None:
                child.send_signal(signals.SIGTERM)
    failed = 0
    for child in children:
        code = child.wait()
        if code != 0:
            log.warning("worker process %d exited with %d", child.pid, code)
            failed += 1
    return failed
