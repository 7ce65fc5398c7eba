"""A worker's defaults are written once: Worker(), WorkerOptions, the settings and `pgjobkit worker` agree."""

from __future__ import annotations

import dataclasses
import os
from datetime import timedelta

import pytest

from pgjobkit import MemoryStore, Settings, Worker, WorkerOptions
from pgjobkit.cli.worker import worker as worker_command
from pgjobkit.core import bounds
from pgjobkit.errors import InvalidArgument


def test_worker_settings_and_options_share_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("JOBKIT_", "SUPABASE_")):
            monkeypatch.delenv(name)
    from_settings = WorkerOptions.from_settings(Settings.load(env_file=None))
    assert from_settings == WorkerOptions() == Worker(MemoryStore()).options
    assert (from_settings.concurrency, from_settings.batch_size, from_settings.lease) == (
        bounds.DEFAULT_CONCURRENCY,
        bounds.DEFAULT_BATCH_SIZE,
        timedelta(seconds=bounds.DEFAULT_LEASE_SECONDS),
    )
    assert (from_settings.jitter, from_settings.schedules) == (
        bounds.DEFAULT_JITTER,
        bounds.DEFAULT_SCHEDULES,
    )


def test_the_cli_sets_no_default_of_its_own() -> None:
    """Every `pgjobkit worker` flag that maps to an option defaults to None (or off): unset, the Worker's own
    options, and so the settings, stand."""
    fields = {f.name for f in dataclasses.fields(WorkerOptions)}
    mapped = {"types": "types", "concurrency": "concurrency", "batch": "batch_size", "lease": "lease"}
    mapped |= {"poll": "poll_interval", "schedules": "schedules", "delete_succeeded": "delete_succeeded"}
    given = worker_command.make_context("worker", ["app.jobs:worker"]).params  # no flag given
    for flag, option in mapped.items():
        assert option in fields, option
        assert given[flag] in (None, False, ()), flag


def test_options_are_checked_when_made() -> None:
    with pytest.raises(InvalidArgument, match="concurrency"):
        WorkerOptions(concurrency=0)
    with pytest.raises(InvalidArgument, match="jitter"):
        WorkerOptions(jitter=2.0)
    worker = Worker(MemoryStore(), concurrency=3)
    worker.register("a", lambda payload: None)
    worker.configure(batch_size=7, types=("a",))
    assert (worker.options.concurrency, worker.options.batch_size, worker.options.types) == (3, 7, ("a",))
    with pytest.raises(InvalidArgument, match="no handler for type"):
        worker.configure(types=("b",))
