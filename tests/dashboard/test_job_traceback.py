"""The job page shows the traceback the job's latest failed attempt left, escaped like everything else."""

from __future__ import annotations

from datetime import timedelta

from pgjobkit.core.models import NewJob
from pgjobkit.worker.calls import WorkerCalls
from tests.dashboard.conftest import HOSTILE, Dash


def test_the_job_page_shows_the_latest_traceback_escaped(dash: Dash) -> None:
    dash.login()
    job = dash.store.enqueue(NewJob(type="embed", max_attempts=3))
    assert "None kept." in dash.get(f"/jobs/{job.id}").text
    [claimed] = WorkerCalls(dash.store).claim(["embed"], "w", timedelta(seconds=30))
    assert claimed.lease_token is not None
    text = f'Traceback (most recent call last):\n  File "/srv/app/handlers.py", line 42, in embed\nKeyError: {HOSTILE}\n'
    WorkerCalls(dash.store).fail(job.id, claimed.lease_token, "KeyError: 's'", timedelta(0), traceback=text)
    page = dash.get(f"/jobs/{job.id}").text
    assert "File &#34;/srv/app/handlers.py&#34;, line 42, in embed" in page
    assert "Attempt 1," in page
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
