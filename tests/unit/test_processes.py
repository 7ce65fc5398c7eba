"""The command line of the other worker processes `pgjobkit worker --processes N` starts."""

from __future__ import annotations

from datetime import timedelta

from pgjobkit.cli.processes import child_args


def test_off_flags_are_said_and_the_rest_carried() -> None:
    args = child_args(
        ".env",
        "app:worker",
        {
            "target": "app:worker",
            "processes": 4,
            "types": ("a", "b"),
            "lease": timedelta(seconds=30),
            "schedules": False,
            "tracing": False,
            "until_empty": False,
            "delete_succeeded": True,
            "metrics_port": 9465,
            "metrics_host": None,
        },
    )
    assert args == [
        "--env-file", ".env", "worker", "app:worker", "--processes", "1",
        "--types", "a", "--types", "b", "--lease", "30.0s", "--no-schedules", "--no-tracing",
        "--delete-succeeded", "--metrics-port", "9465",
    ]  # fmt: skip
    on = child_args(".env", "app:worker", {"schedules": True, "tracing": True, "concurrency": None})
    assert on[-2:] == ["--schedules", "--tracing"]
