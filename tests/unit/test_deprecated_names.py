"""Each public name renamed in 0.6 still works under its old name, and warns with the new one."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from pgjobkit import AttemptReport, MemoryStore, Worker, WorkerOptions


@pytest.mark.parametrize("module", ["pgjobkit", "pgjobkit.worker", "pgjobkit.worker.results"])
def test_job_result_is_attempt_report(module: str) -> None:
    with pytest.warns(DeprecationWarning, match=r"JobResult is now .*AttemptReport"):
        old = importlib.import_module(module).JobResult
    assert old is AttemptReport


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        importlib.import_module("pgjobkit").Nothing  # noqa: B018


def test_heartbeat_option_is_extend_leases() -> None:
    with pytest.warns(
        DeprecationWarning, match=r"WorkerOptions\.heartbeat is now WorkerOptions\.extend_leases"
    ):
        options = WorkerOptions(heartbeat=False)  # type: ignore[call-arg]
    assert options == WorkerOptions(extend_leases=False)
    with pytest.warns(DeprecationWarning, match="extend_leases"):
        assert options.heartbeat is False
    with pytest.warns(DeprecationWarning, match="extend_leases"):
        assert Worker(MemoryStore(), heartbeat=False).options.extend_leases is False


def test_beat_option_is_presence_every() -> None:
    with pytest.warns(DeprecationWarning, match=r"WorkerOptions\.beat is now WorkerOptions\.presence_every"):
        options = WorkerOptions(beat=0)  # type: ignore[call-arg]
    assert options == WorkerOptions(presence_every=0)
    with pytest.warns(DeprecationWarning, match="presence_every"):
        assert options.beat == 0
    with pytest.warns(DeprecationWarning, match="presence_every"):
        assert dataclasses.replace(WorkerOptions(), beat=5).presence_every == 5  # type: ignore[call-arg]
    with pytest.warns(DeprecationWarning, match="presence_every"):
        worker = Worker(MemoryStore(), beat=0)
    with pytest.warns(DeprecationWarning, match="presence_every"):
        worker.configure(beat=3)
    assert worker.options.presence_every == 3


def test_the_new_names_do_not_warn(recwarn: pytest.WarningsRecorder) -> None:
    Worker(MemoryStore(), extend_leases=False, presence_every=0).configure(presence_every=2)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
