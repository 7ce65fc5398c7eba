"""The dashboard in process, on a memory store and on PostgreSQL: sign-in, sessions and CSRF, what each page
shows, what each action changes, hostile data, headers, keys never sent, store failures; and its pure
parts (grouping, trees, minutes, forms)."""

from __future__ import annotations

import html
import re
import signal
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from click.testing import CliRunner

from pgjobkit.cli import main
from pgjobkit.cli.dashboard import is_loopback
from pgjobkit.core.models import Job, JobStatus, NewJob
from pgjobkit.core.pipelines import Pipeline, PipelineJob
from pgjobkit.core.schedules import Schedule
from pgjobkit.core.workers import Activity
from pgjobkit.dashboard import views
from pgjobkit.dashboard.auth import COOKIE, HEADERS
from pgjobkit.errors import InvalidArgument, TransientError
from pgjobkit.extras import missing
from pgjobkit.ops import Call
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.memory import AsyncMemoryStore, MemoryStore
from pgjobkit.stores.postgres import AsyncPostgresStore
from pgjobkit.stores.supabase import AsyncSupabaseStore, SupabaseStore
from pgjobkit.worker.calls import WorkerCalls
from tests.cli.conftest import JOBKIT, clean_env
from tests.dashboard.conftest import HOSTILE, ORIGIN, TOKEN, Dash, make_dash, with_password
from tests.doubles.router import BASE_URL, SECRET_KEY, SupabaseRouter

LEASE = timedelta(minutes=5)
RAW = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
PAGES = ("/", "/failing", "/running", "/pipelines", "/limits", "/schedules", "/workers")


# --- arranging jobs -------------------------------------------------------------------------------------------
def claimed(store: JobStore, type_: str, **fields: Any) -> Job:
    """A job of ``type_`` (the only runnable one of its type), claimed by worker w."""
    enqueued = store.enqueue(NewJob(type=type_, **fields))
    [job] = WorkerCalls(store).claim([type_], "w", LEASE)
    assert job.id == enqueued.id
    return job


def dead(store: JobStore, type_: str = "t", error: str = "boom") -> UUID:
    job = claimed(store, type_, max_attempts=1)
    assert job.lease_token is not None
    assert WorkerCalls(store).fail(job.id, job.lease_token, error, timedelta(0)).status == JobStatus.DEAD
    return job.id


def retrying(store: JobStore, type_: str = "t", error: str = "flaky") -> UUID:
    job = claimed(store, type_, max_attempts=5)
    assert job.lease_token is not None
    assert WorkerCalls(store).fail(job.id, job.lease_token, error, timedelta(hours=1)).status == (
        JobStatus.RETRYING
    )
    return job.id


def status(store: JobStore, job_id: UUID) -> JobStatus:
    job = store.get(job_id)
    assert job is not None
    return job.status


def cells(body: str) -> dict[tuple[str, str], int]:
    """The overview's counts, by (type, status), as its table's cells carry them."""
    found = re.findall(r'data-type="([^"]*)" data-status="([^"]*)" data-count="(\d+)"', body)
    return {(html.unescape(t), s): int(n) for t, s, n in found}


# --- signing in ------------------------------------------------------------------------------------------------
def test_signed_out_pages_redirect_to_login_and_actions_are_refused(dash: Dash) -> None:
    job_id = dead(dash.store)
    for path in (*PAGES, f"/jobs/{job_id}", f"/pipelines/{uuid4()}", "/no-such-page"):
        response = dash.get(path)
        assert (response.status_code, response.headers["location"]) == (303, "/login"), path
    dash.http.cookies.set(COOKIE, "a-session-id-the-server-never-gave")
    assert dash.get("/").status_code == 303
    for path in ("/actions/requeue", "/actions/cancel", "/limits", "/schedules", "/logout"):
        response = dash.post(
            path, {"id": str(job_id), "type": "t", "max_running": "1"}, headers={"Origin": ORIGIN}
        )
        assert response.status_code == 403, path
        assert "not signed in" in response.text
    assert status(dash.store, job_id) == JobStatus.DEAD
    assert dash.store.list_limits() == []


def test_the_public_paths_show_no_data(memory_dash: Dash) -> None:
    dead(memory_dash.store, "secret-type")
    health = memory_dash.get("/healthz")
    assert (health.status_code, health.text) == (200, "ok")
    css = memory_dash.get("/static/style.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    login = memory_dash.get("/login")
    assert login.status_code == 200 and 'name="token"' in login.text
    assert all("secret-type" not in body for body in memory_dash.bodies)


@pytest.mark.parametrize("given", ["", "x", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "é" * 40, "\x00" * 31])
def test_a_wrong_token_gets_one_generic_answer_and_no_session(memory_dash: Dash, given: str) -> None:
    response = memory_dash.post("/login", {"token": given})
    assert response.status_code == 403
    assert "That token is not right." in response.text
    assert "set-cookie" not in response.headers
    assert memory_dash.get("/").status_code == 303


def test_ten_failed_logins_in_a_minute_lock_that_address_for_the_rest_of_it(memory_dash: Dash) -> None:
    for _ in range(10):
        assert memory_dash.post("/login", {"token": "wrong"}).status_code == 403
    locked = memory_dash.post("/login", {"token": TOKEN})  # even the right token waits
    assert locked.status_code == 429 and "set-cookie" not in locked.headers
    assert 1 <= int(locked.headers["retry-after"]) <= 61
    memory_dash.clock.advance(timedelta(seconds=30))
    assert memory_dash.post("/login", {"token": TOKEN}).status_code == 429
    memory_dash.clock.advance(timedelta(seconds=31))
    memory_dash.login()
    assert memory_dash.get("/").status_code == 200


def test_the_session_cookie_is_random_httponly_strict_and_secure_over_https(memory_dash: Dash) -> None:
    first = memory_dash.post("/login", {"token": TOKEN}).headers["set-cookie"]
    second = memory_dash.post("/login", {"token": TOKEN}).headers["set-cookie"]
    for cookie in (first, second):
        attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
        assert {"httponly", "path", "samesite"} <= attributes and "secure" not in attributes
        assert "samesite=strict" in cookie.lower() and "path=/" in cookie.lower()
        assert len(cookie.split(";")[0].split("=", 1)[1]) >= 43  # token_urlsafe(32)
    assert first.split(";")[0] != second.split(";")[0]
    memory = MemoryStore()
    over_https = Dash(memory, memory.as_async(), base="https://testserver")
    try:
        cookie = over_https.post("/login", {"token": TOKEN}).headers["set-cookie"]
        assert "secure" in {a.strip().lower() for a in cookie.split(";")}
    finally:
        over_https.close()


def test_a_session_ends_after_twelve_hours(memory_dash: Dash) -> None:
    memory_dash.login()
    memory_dash.clock.advance(timedelta(hours=11, minutes=59))
    assert memory_dash.get("/").status_code == 200
    memory_dash.clock.advance(timedelta(minutes=2))
    assert memory_dash.get("/").status_code == 303


def test_logout_needs_the_csrf_token_and_ends_the_session_on_the_server(memory_dash: Dash) -> None:
    csrf = memory_dash.login()
    cookie = memory_dash.http.cookies[COOKIE]
    assert memory_dash.post("/logout", {}, headers={"Origin": ORIGIN}).status_code == 403
    assert memory_dash.get("/").status_code == 200
    response = memory_dash.act("/logout", {"csrf": csrf})
    assert response.headers["location"] == "/login"
    assert memory_dash.get("/").status_code == 303
    memory_dash.http.cookies.set(COOKIE, cookie)  # the old cookie, replayed
    assert memory_dash.get("/").status_code == 303


# --- CSRF and origins ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("csrf", [None, "", "wrong", "first-token-plus-one"])
def test_every_action_without_its_csrf_token_is_refused_and_changes_nothing(
    dash: Dash, csrf: str | None
) -> None:
    good = dash.login()
    store = dash.store
    dead_id, queued_id = dead(store), store.enqueue(NewJob(type="q")).id
    store.set_limit("kept", max_running=1)
    store.set_schedule(Schedule(name="kept", cron="0 3 * * *", type="t"))
    pipeline = store.enqueue_pipeline(_pipeline())
    assert pipeline.pipeline_id is not None
    given = {"first-token-plus-one": good + "x", "wrong": "x" * len(good)}.get(csrf or "", csrf)
    forms: list[tuple[str, dict[str, Any]]] = [
        ("/actions/requeue", {"id": str(dead_id)}),
        ("/actions/cancel", {"id": str(queued_id)}),
        ("/limits", {"type": "new", "max_running": "3"}),
        ("/limits/delete", {"type": "kept"}),
        ("/schedules", {"name": "new", "cron": "* * * * *", "type": "t"}),
        ("/schedules/delete", {"name": "kept"}),
        (f"/pipelines/{pipeline.pipeline_id}/cancel", {}),
        ("/logout", {}),
    ]
    for path, data in forms:
        body = data | ({"csrf": given} if given is not None else {})
        response = dash.post(path, body, headers={"Origin": ORIGIN})
        assert response.status_code == 403, path
    assert status(store, dead_id) == JobStatus.DEAD
    assert status(store, queued_id) == JobStatus.QUEUED
    assert [lim.type for lim in store.list_limits()] == ["kept"]
    assert [s.name for s in store.list_schedules()] == ["kept"]
    assert all(j.status != JobStatus.CANCELLED for j in store.get_pipeline(pipeline.pipeline_id))
    assert dash.get("/").status_code == 200  # still signed in


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.test"},
        {"Origin": "https://testserver"},  # another scheme is another origin
        {"Origin": "http://testserver:8080"},
        {"Origin": "null"},  # a sandboxed frame or a data: page elsewhere
        {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": ORIGIN, "Sec-Fetch-Site": "cross-site"},
    ],
)
def test_a_form_from_another_origin_is_refused_and_changes_nothing(
    dash: Dash, headers: dict[str, str]
) -> None:
    csrf = dash.login()
    job_id = dead(dash.store)
    response = dash.post("/actions/requeue", {"csrf": csrf, "id": str(job_id)}, headers=headers)
    assert response.status_code == 403 and "another site" in response.text
    assert status(dash.store, job_id) == JobStatus.DEAD
    refused = dash.post("/login", {"token": TOKEN}, headers=headers)
    assert refused.status_code == 403 and "set-cookie" not in refused.headers
    same = dash.post(
        "/actions/requeue",
        {"csrf": csrf, "id": str(job_id)},
        headers={"Origin": ORIGIN, "Sec-Fetch-Site": "same-origin"},
    )
    assert same.status_code == 303
    assert status(dash.store, job_id) == JobStatus.QUEUED


def test_a_browser_that_hides_the_origin_of_its_own_form_is_let_through(dash: Dash) -> None:
    """Under the dashboard's ``Referrer-Policy: no-referrer`` Chromium sends ``Origin: null`` for the
    dashboard's own forms, with ``Sec-Fetch-Site: same-origin`` (seen in test_browser.py)."""
    own_form = {"Origin": "null", "Sec-Fetch-Site": "same-origin"}
    assert dash.post("/login", {"token": TOKEN}, headers=own_form).status_code == 303
    csrf = dash.csrf()
    job_id = dead(dash.store)
    response = dash.post("/actions/requeue", {"csrf": csrf, "id": str(job_id)}, headers=own_form)
    assert response.status_code == 303
    assert status(dash.store, job_id) == JobStatus.QUEUED


# --- what the pages show, and what the actions do -------------------------------------------------------------------
def test_the_overview_counts_equal_the_stores_stats(dash: Dash) -> None:
    dash.login()
    store = dash.store
    store.enqueue_many([NewJob(type="embed") for _ in range(3)])
    claimed(store, "sync")
    dead(store, "mail")
    retrying(store, "mail")
    done = claimed(store, "report")
    assert done.lease_token is not None
    assert WorkerCalls(store).complete(done.id, done.lease_token)
    store.cancel([store.enqueue(NewJob(type="report", delay=timedelta(hours=1))).id])
    store.enqueue_pipeline(_pipeline())
    shown = cells(dash.get("/").text)
    counted = {(r.type, r.status.value): r.count for r in store.stats().rows}
    assert {k: n for k, n in shown.items() if n} == counted
    assert len(shown) == len({t for t, _ in counted}) * len(views.STATUS_ORDER)


def test_the_overview_says_when_there_was_no_activity_and_charts_it_when_there_was(dash: Dash) -> None:
    dash.login()
    quiet = dash.get("/").text
    assert "No activity in the last hour" in quiet and "<svg" not in quiet
    activity = Activity()
    now = datetime.now(UTC)
    for minute, outcome in enumerate(["succeeded", "succeeded", "retrying", "dead", "lost"]):
        activity.add((now - timedelta(minutes=minute)).timestamp(), "embed", outcome, run=1.5, wait=0.25)
    dash.store.worker_beat("w1", host="h", types=["embed"], concurrency=4, activity=activity.take())
    busy = dash.get("/").text
    assert "No activity in the last hour" not in busy
    svgs = re.findall(r"<svg.*?</svg>", busy, re.S)
    assert len(svgs) == 3
    for svg in svgs:
        ET.fromstring(svg)  # noqa: S314 (our own page, parsed to prove it well-formed)
    assert "5 in all" in busy
    assert "1 alive of 1" in busy


def test_requeue_one_dead_job_then_its_whole_group(dash: Dash) -> None:
    csrf = dash.login()
    store = dash.store
    group = [dead(store, "mail", f"SMTP 550: mailbox unavailable\nattempt {i}") for i in range(3)]
    other = dead(store, "embed", "model timed out")
    page = dash.get("/failing").text
    assert page.count('class="error-key"') == 2
    assert "SMTP 550: mailbox unavailable" in page and "3 job(s): 3 dead, 0 retrying" in page
    dash.act(
        "/actions/requeue",
        {"csrf": csrf, "only": str(group[0]), "id": [str(g) for g in group[1:]], "back": "/failing"},
    )
    assert [status(store, g) for g in group] == [JobStatus.QUEUED, JobStatus.DEAD, JobStatus.DEAD]
    assert dash.flash("/failing") == ["Requeued 1 job(s)."]
    dash.act("/actions/requeue", {"csrf": csrf, "id": [str(g) for g in group], "back": "/failing"})
    assert [status(store, g) for g in group] == [JobStatus.QUEUED] * 3
    assert status(store, other) == JobStatus.DEAD
    assert dash.flash("/failing") == ["Requeued 2 job(s). 1 were not dead, and were left as they were."]


def test_cancel_retrying_jobs_one_and_a_group_from_the_failing_page(dash: Dash) -> None:
    csrf = dash.login()
    ids = [retrying(dash.store, "sync", "HTTP 503 from upstream") for _ in range(3)]
    page = dash.get("/failing").text
    assert "Cancel all 3 retrying" in page
    dash.act("/actions/cancel", {"csrf": csrf, "only": str(ids[0])})
    assert [status(dash.store, i) for i in ids] == [
        JobStatus.CANCELLED,
        JobStatus.RETRYING,
        JobStatus.RETRYING,
    ]
    dash.act("/actions/cancel", {"csrf": csrf, "id": [str(i) for i in ids]})
    assert {status(dash.store, i) for i in ids} == {JobStatus.CANCELLED}
    job = dash.store.get(ids[1])
    assert job is not None and job.error == "cancelled from the dashboard"


def test_the_running_page_shows_each_job_and_cancels_one_or_the_selected(dash: Dash) -> None:
    csrf = dash.login()
    jobs = [claimed(dash.store, f"render-{i}") for i in range(3)]
    assert jobs[0].lease_token is not None
    WorkerCalls(dash.store).progress([(jobs[0].id, jobs[0].lease_token, 0.42, "page 42 of 100")])
    page = dash.get("/running").text
    assert '<progress max="1" value="0.42">' in page and "page 42 of 100" in page
    assert all(str(j.id) in page for j in jobs) and ">w<" in page
    dash.act(
        "/actions/cancel", {"csrf": csrf, "only": str(jobs[0].id), "id": str(jobs[1].id), "back": "/running"}
    )
    assert [status(dash.store, j.id) for j in jobs] == [
        JobStatus.CANCELLED,
        JobStatus.RUNNING,
        JobStatus.RUNNING,
    ]
    response = dash.act(
        "/actions/cancel", {"csrf": csrf, "id": [str(j.id) for j in jobs[1:]], "back": "/running"}
    )
    assert response.headers["location"] == "/running"
    assert {status(dash.store, j.id) for j in jobs} == {JobStatus.CANCELLED}
    assert "No job is running." in dash.get("/running").text


def test_the_job_page_shows_the_whole_job_but_its_lease_token(dash: Dash) -> None:
    csrf = dash.login()
    job = claimed(dash.store, "embed", payload={"doc": 7, "lang": "fr"}, idempotency_key="doc-7", priority=3)
    page = dash.get(f"/jobs/{job.id}").text
    assert str(job.lease_token) not in page and "lease token" not in page
    for shown in (
        'data-field="status">running',
        "doc-7",
        "&#34;lang&#34;: &#34;fr&#34;",
        'data-field="claimed_by">w',
    ):
        assert shown in page
    assert "Requeue</button>" not in page and 'class="danger cancel"' in page
    dash.act("/actions/cancel", {"csrf": csrf, "id": str(job.id), "back": f"/jobs/{job.id}"})
    after = dash.get(f"/jobs/{job.id}").text
    assert 'data-field="status">cancelled' in after and "cancelled from the dashboard" in after
    assert 'class="danger cancel"' not in after
    dead_id = dead(dash.store, "mail", "550")
    assert "Requeue</button>" in dash.get(f"/jobs/{dead_id}").text
    response = dash.act("/actions/requeue", {"csrf": csrf, "id": str(dead_id), "back": f"/jobs/{dead_id}"})
    assert response.headers["location"] == f"/jobs/{dead_id}"
    assert 'data-field="status">queued' in dash.get(f"/jobs/{dead_id}").text


def test_an_unknown_or_malformed_id_is_a_404_page(dash: Dash) -> None:
    dash.login()
    for path in (
        f"/jobs/{uuid4()}",
        "/jobs/not-a-uuid",
        f"/pipelines/{uuid4()}",
        "/pipelines/x",
        "/no-such-page",
    ):
        response = dash.get(path)
        assert response.status_code == 404, path
        assert "no such page, job or pipeline" in response.text
    assert dash.get("/pipelines?id=nope").status_code == 400
    some = uuid4()
    assert dash.get(f"/pipelines?id={some}").headers["location"] == f"/pipelines/{some}"


def test_the_pipeline_page_draws_the_tree_and_cancels_it(dash: Dash) -> None:
    csrf = dash.login()
    enqueued = dash.store.enqueue_pipeline(_pipeline())
    assert enqueued.pipeline_id is not None
    page = dash.get(f"/pipelines/{enqueued.pipeline_id}").text
    tree = page[page.index('<ul class="tree">') : page.rindex("</ul>") + 5]
    assert tree.count("<ul") == tree.count("</ul>") == 3  # extract, then load under it, then index under that
    assert tree.count("<li>") == tree.count("</li>") == 4
    assert all(str(j.id) in tree for j in enqueued.jobs)
    first = dash.get(f"/jobs/{enqueued.ids['load']}").text
    assert str(enqueued.ids["extract"]) in first  # what it waits for, linked
    assert f'data-pipeline="{enqueued.pipeline_id}"' in first  # and the pipeline it is part of
    alone = dash.store.enqueue(NewJob(type="alone")).id
    assert "data-pipeline" not in dash.get(f"/jobs/{alone}").text
    dash.act(f"/pipelines/{enqueued.pipeline_id}/cancel", {"csrf": csrf})
    assert {j.status for j in dash.store.get_pipeline(enqueued.pipeline_id)} == {JobStatus.CANCELLED}
    assert "Cancel the pipeline" not in dash.get(f"/pipelines/{enqueued.pipeline_id}").text


def test_a_job_whose_handler_added_jobs_links_the_pipeline_it_started(dash: Dash) -> None:
    dash.login()
    parent = claimed(dash.store, "crawl")
    assert parent.lease_token is not None
    added = Pipeline()
    added.add("fetch", ref="fetch")
    added.add("parse", after="fetch")
    ok, enqueued = WorkerCalls(dash.store).complete_adding(parent.id, parent.lease_token, None, added)
    assert ok and enqueued.pipeline_id == parent.id
    page = dash.get(f"/jobs/{parent.id}").text
    assert f'started pipeline <a href="/pipelines/{parent.id}">' in page
    tree = dash.get(f"/pipelines/{parent.id}").text
    assert all(str(j.id) in tree for j in enqueued.jobs)
    assert "started pipeline" not in dash.get(f"/jobs/{enqueued.ids['fetch']}").text


def test_limits_are_set_edited_and_deleted_and_bad_input_is_a_400_that_changes_nothing(dash: Dash) -> None:
    csrf = dash.login()
    form = {
        "csrf": csrf,
        "type": "embed",
        "max_running": "4",
        "max_starts": "100",
        "per_seconds": "60",
        "max_running_per_key": "",
    }
    dash.act("/limits", form)
    [limit] = dash.store.list_limits()
    assert (limit.type, limit.max_running, limit.max_starts, limit.per, limit.max_running_per_key) == (
        "embed",
        4,
        100,
        timedelta(seconds=60),
        None,
    )
    assert 'value="100"' in dash.get("/limits?edit=embed").text
    for bad, message in [
        ({"max_running": "-1"}, "max_running must be between 0 (paused) and 1000000"),
        ({"max_running": "four"}, "max_running must be a whole number"),
        ({"max_starts": "5", "per_seconds": ""}, "give max_starts and per together"),
        ({"per_seconds": "inf"}, "per_seconds must be a finite number"),
        ({"type": ""}, "give the job type to limit"),
    ]:
        response = dash.post("/limits", form | bad, headers={"Origin": ORIGIN})
        assert response.status_code == 400, bad
        assert message in html.unescape(response.text)
        assert f'value="{(form | bad)["max_running"]}"' in response.text  # what was sent, kept in the form
    assert dash.store.list_limits() == [limit]
    dash.act("/limits/delete", {"csrf": csrf, "type": "embed"})
    assert dash.store.list_limits() == []
    assert dash.flash("/limits") == ["Limits of embed removed."]


def test_schedules_are_set_and_deleted_and_bad_input_is_a_400_that_changes_nothing(dash: Dash) -> None:
    csrf = dash.login()
    form = {
        "csrf": csrf,
        "name": "nightly",
        "cron": "0 3 * * *",
        "type": "report",
        "payload": '{"kind": "daily"}',
        "timezone": "Europe/Paris",
        "priority": "2",
        "max_attempts": "4",
        "misfire": "catch_up",
        "enabled": "on",
    }
    dash.act("/schedules", form)
    [schedule] = dash.store.list_schedules()
    assert (schedule.name, schedule.cron, schedule.type, schedule.payload, schedule.timezone) == (
        "nightly",
        "0 3 * * *",
        "report",
        {"kind": "daily"},
        "Europe/Paris",
    )
    assert (schedule.priority, schedule.max_attempts, schedule.misfire, schedule.enabled) == (
        2,
        4,
        "catch_up",
        True,
    )
    assert "nightly" in dash.get("/schedules").text
    for bad, message in [
        ({"cron": "61 * * * *"}, "the minute field &#39;61&#39; is out of range"),
        ({"timezone": "Mars/Base"}, "unknown time zone"),
        ({"payload": "{not json"}, "payload is not valid JSON"),
        ({"payload": "[1, 2]"}, "payload must be a JSON object"),
        ({"payload": "[" * 100_000}, "payload is not valid JSON"),
        ({"misfire": "later"}, "misfire must be one of skip, catch_up"),
        ({"max_attempts": "0"}, "max_attempts"),
    ]:
        response = dash.post("/schedules", form | bad | {"name": "other"}, headers={"Origin": ORIGIN})
        assert response.status_code == 400, bad
        assert message in response.text, bad
    assert [s.name for s in dash.store.list_schedules()] == ["nightly"]
    dash.act("/schedules/delete", {"csrf": csrf, "name": "nightly"})
    assert dash.store.list_schedules() == []


def test_the_workers_page_lists_each_worker(dash: Dash) -> None:
    dash.login()
    claimed(dash.store, "embed")
    dash.store.worker_beat(
        "w", host="box-1", pid=4242, version="0.5.0", types=["embed", "mail"], concurrency=8
    )
    page = dash.get("/workers").text
    for shown in ("box-1", "4242", "0.5.0", "embed, mail", ">8<", "yes"):
        assert shown in page


def test_hostile_strings_are_escaped_everywhere_and_no_page_breaks(dash: Dash) -> None:
    csrf = dash.login()
    store = dash.store
    long_error = HOSTILE + "\n" + "x" * 3900
    running = claimed(store, HOSTILE, payload={HOSTILE: HOSTILE}, idempotency_key=HOSTILE, fair_key=HOSTILE)
    assert running.lease_token is not None
    WorkerCalls(store).progress([(running.id, running.lease_token, 0.5, HOSTILE)])
    dead_id = dead(store, HOSTILE + "-dead", long_error)
    retrying(store, HOSTILE + "-retry", "é" * 4000)
    store.set_limit(HOSTILE, max_running=1)
    store.set_schedule(Schedule(name=HOSTILE, cron="* * * * *", type=HOSTILE, payload={"x": HOSTILE}))
    pipeline = Pipeline()
    pipeline.add(HOSTILE, ref=HOSTILE)
    pipeline.add(HOSTILE + "2", after=HOSTILE)
    enqueued = store.enqueue_pipeline(pipeline)
    activity = Activity()
    activity.add(datetime.now(UTC).timestamp(), HOSTILE, "dead", run=1, wait=1)
    store.worker_beat(HOSTILE, host=HOSTILE, version=HOSTILE, types=[HOSTILE], activity=activity.take())
    paths = [
        *PAGES,
        f"/jobs/{running.id}",
        f"/jobs/{dead_id}",
        f"/pipelines/{enqueued.pipeline_id}",
        f"/limits?edit={HOSTILE}",
    ]
    for path in paths:
        response = dash.get(path)
        assert response.status_code == 200, path
        assert RAW not in response.text, path
        assert response.text.rstrip().endswith("</html>"), path
    for path in ("/", "/failing", "/running", "/limits", "/schedules", "/workers", f"/jobs/{running.id}"):
        assert ESCAPED in dash.get(path).text, path
    assert "x" * 3900 in dash.get(f"/jobs/{dead_id}").text
    bad = dash.post(
        "/schedules",
        {"csrf": csrf, "name": HOSTILE, "cron": HOSTILE, "type": "t"},
        headers={"Origin": ORIGIN},
    )
    assert bad.status_code == 400 and RAW not in bad.text


def test_every_response_carries_the_security_headers(dash: Dash) -> None:
    responses = [
        dash.get("/"),
        dash.get("/login"),
        dash.get("/healthz"),
        dash.get("/static/style.css"),
        dash.post("/login", {"token": "wrong"}),
        dash.post("/actions/requeue", {}),
    ]
    csrf = dash.login()
    responses += [dash.get(path) for path in (*PAGES, f"/jobs/{uuid4()}", "/nope")]
    responses += [
        dash.request("PUT", "/"),
        dash.post("/actions/cancel", {"csrf": csrf}, headers={"Origin": "http://evil.test"}),
        dash.post("/actions/cancel", content=b"{}", headers={"Content-Type": "application/json"}),
        dash.post("/actions/cancel", {"csrf": csrf, "id": "x" * 3_000_000}),
        dash.post("/actions/cancel", {"csrf": csrf}),
    ]
    assert {r.status_code for r in responses} >= {200, 303, 403, 404, 405, 413, 415}
    for response in responses:
        for name, value in HEADERS.items():
            assert response.headers.get(name) == value, (response.status_code, name)
    assert HEADERS["Content-Security-Policy"] == (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    )


def test_a_page_has_no_script_no_inline_style_and_nothing_from_elsewhere(dash: Dash) -> None:
    dash.login()
    dead(dash.store)
    dash.store.worker_beat("w", activity=_some_activity())
    for path in PAGES:
        body = dash.get(path).text
        assert "<script" not in body and "style=" not in body and "<style" not in body, path
        assert not re.search(r'(?:src|href|action)="(?:https?:)?//', body), path


def test_an_action_returns_only_to_the_dashboards_own_pages(memory_dash: Dash) -> None:
    csrf = memory_dash.login()
    for back, expected in [
        ("https://evil.test/", "/"),
        ("//evil.test/failing", "/"),
        ("/failing\r\nSet-Cookie: x=y", "/"),
        ("/failing\n", "/"),
        ("/jobs/../../evil", "/"),
        ("/failing", "/failing"),
        (f"/jobs/{uuid4()}", None),
    ]:
        response = memory_dash.act("/actions/cancel", {"csrf": csrf, "id": str(uuid4()), "back": back})
        assert response.headers["location"] == (expected or back)


def test_an_oversized_or_malformed_form_is_refused_before_the_store_sees_it(memory_dash: Dash) -> None:
    assert memory_dash.post("/login", {"token": "x" * 5000}).status_code == 413
    csrf = memory_dash.login()
    job_id = dead(memory_dash.store)
    response = memory_dash.post(
        "/actions/requeue", {"csrf": csrf, "id": [str(job_id), "not-a-uuid"]}, headers={"Origin": ORIGIN}
    )
    assert response.status_code == 400 and "&#39;not-a-uuid&#39; is not a job id" in response.text
    assert status(memory_dash.store, job_id) == JobStatus.DEAD
    huge = memory_dash.post(
        "/actions/requeue", {"csrf": csrf, "id": "x" * 3_000_000}, headers={"Origin": ORIGIN}
    )
    assert huge.status_code == 413


# --- keys and failures ------------------------------------------------------------------------------------------------
def test_no_page_shows_the_database_password(request: pytest.FixtureRequest) -> None:
    dash = make_dash("postgres", request)
    try:
        assert dash.secret is not None
        _crawl(dash)
        assert all(dash.secret not in body for body in dash.bodies)
        assert all("PostgresStore(" not in body for body in dash.bodies)
    finally:
        dash.close()
        dash.store.close()


def test_no_page_shows_the_supabase_secret_key(router: SupabaseRouter) -> None:
    store = SupabaseStore(BASE_URL, SECRET_KEY, realtime=False)
    dash = Dash(store, AsyncSupabaseStore(BASE_URL, SECRET_KEY, realtime=False), secret=SECRET_KEY)
    try:
        _crawl(dash)
        assert len(dash.bodies) > 10
        assert all(SECRET_KEY not in body and "supabase.test" not in body for body in dash.bodies)
    finally:
        dash.close()
        store.close()


def test_an_unreachable_database_is_a_503_page_without_its_password(db_url: str) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url, password = with_password(db_url)
    down = url.replace(":5432", f":{port}") if ":5432" in url else url + f" port={port}"
    memory = MemoryStore()
    dash = Dash(memory, AsyncPostgresStore(down, timeout=0.5), secret=password)
    try:
        dash.login()
        response = dash.get("/")
        assert response.status_code == 503
        assert "not answering (TransientError)" in response.text
        assert password not in response.text and "Traceback" not in response.text
    finally:
        dash.close()


class DownStore(AsyncMemoryStore):
    """A memory store whose database is down while ``down`` is set (every call raises TransientError), or
    that fails with ``fault``, a bug of its own, while that is set."""

    down = False
    fault: Exception | None = None

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        if self.down:
            raise TransientError("connection refused (the database is down)")
        if self.fault is not None:
            raise self.fault
        return await super()._execute(call, conn)


@pytest.fixture
def down_dash() -> Iterator[tuple[Dash, DownStore]]:
    memory = MemoryStore()
    store = DownStore(memory)
    dash = Dash(memory, store)
    try:
        yield dash, store
    finally:
        dash.close()


def test_a_store_failure_is_a_503_page_never_a_traceback(down_dash: tuple[Dash, DownStore]) -> None:
    dash, store = down_dash
    csrf = dash.login()
    job_id = dead(dash.store)
    store.down = True
    for path in (
        "/",
        "/failing",
        "/running",
        "/limits",
        "/schedules",
        "/workers",
        f"/jobs/{job_id}",
        f"/pipelines/{uuid4()}",
    ):
        response = dash.get(path)
        assert response.status_code == 503, path
        assert "The job store is not answering (TransientError)" in response.text
        assert "Traceback" not in response.text and "connection refused" not in response.text
        assert response.headers["content-security-policy"] == HEADERS["Content-Security-Policy"]
    response = dash.post("/actions/requeue", {"csrf": csrf, "id": str(job_id)}, headers={"Origin": ORIGIN})
    assert response.status_code == 503
    store.down = False
    assert status(dash.store, job_id) == JobStatus.DEAD
    assert dash.get("/").status_code == 200


def test_an_unexpected_error_is_a_plain_500_page_with_the_headers(down_dash: tuple[Dash, DownStore]) -> None:
    dash, store = down_dash
    dash.login()
    store.fault = RuntimeError("a bug that quotes postgresql://user:hunter2@db/x")
    response = dash.get("/")
    assert response.status_code == 500
    assert response.text == "Internal error: see the dashboard's log."
    assert all(response.headers[name] == value for name, value in HEADERS.items())


def test_a_token_shorter_than_sixteen_characters_is_refused() -> None:
    from pgjobkit.dashboard import create_app

    with pytest.raises(InvalidArgument, match="at least 16 characters"):
        create_app(AsyncMemoryStore(), "x" * 15)


# --- the pure parts --------------------------------------------------------------------------------------------------------
def test_failing_jobs_group_by_the_first_line_of_their_error() -> None:
    now = datetime.now(UTC)
    jobs = [
        _job("a", JobStatus.DEAD, "timeout\nat line 3", now),
        _job("b", JobStatus.RETRYING, "  timeout  \nelsewhere", now + timedelta(seconds=1)),
        _job("a", JobStatus.DEAD, "x" * 300, now),
        _job("a", JobStatus.DEAD, None, now),
        _job("a", JobStatus.DEAD, "\n\n", now),
    ]
    groups = views.group_by_error(jobs)
    assert [(g.key, len(g.jobs)) for g in groups] == [("timeout", 2), ("(no message)", 2), ("x" * 200, 1)]
    timeout = groups[0]
    assert (timeout.types, timeout.newest, timeout.oldest) == (["a", "b"], now + timedelta(seconds=1), now)
    assert (timeout.dead_ids, timeout.retrying_ids) == ([jobs[0].id], [jobs[1].id])


def test_a_pipeline_tree_nests_by_parent_then_dependency_and_draws_any_depth() -> None:
    now = datetime.now(UTC)
    a, b, c, d, e = (uuid4() for _ in range(5))
    jobs = [
        _pjob(1, a, now),
        _pjob(2, b, now, depends_on=(a,)),
        _pjob(3, c, now, depends_on=(b, a)),
        _pjob(4, d, now, depends_on=(a,)),
        _pjob(5, e, now, parent_id=c),
    ]
    rows, still_open = views.pipeline_tree(jobs)
    assert [(r.job.id, r.depth) for r in rows] == [(a, 0), (b, 1), (c, 2), (e, 3), (d, 1)]
    assert _balanced(rows, still_open)
    chain = [_pjob(1, uuid4(), now)]
    for seq in range(2, 5001):
        chain.append(_pjob(seq, uuid4(), now, depends_on=(chain[-1].id,)))
    rows, still_open = views.pipeline_tree(chain)
    assert [r.depth for r in rows] == list(range(5000))
    assert max(r.level for r in rows) == views.MAX_NESTING == still_open
    assert _balanced(rows, still_open)


def test_minutes_add_up_each_minute_across_types_and_leave_out_older_ones() -> None:
    from pgjobkit.core.workers import ActivityRow

    now = datetime(2026, 1, 1, 12, 30, 40, tzinfo=UTC)

    def row(minute: datetime, outcome: str, jobs: int, run: float, run_max: float) -> ActivityRow:
        return ActivityRow(
            minute=minute,
            type="t",
            outcome=outcome,
            jobs=jobs,
            run_seconds=run,
            run_max=run_max,
            wait_seconds=jobs * 2.0,
            wait_max=3.0,
        )

    at = datetime(2026, 1, 1, 12, 30, tzinfo=UTC)
    rows = [
        row(at, "succeeded", 3, 6.0, 4.0),
        row(at, "dead", 1, 10.0, 10.0),
        row(at - timedelta(minutes=59), "lost", 1, 1.0, 1.0),
        row(at - timedelta(minutes=60), "succeeded", 100, 1.0, 1.0),  # before the hour: left out
    ]
    minutes = views.minutes(rows, now)
    assert len(minutes) == 60 and minutes[-1].start == at and minutes[0].start == at - timedelta(minutes=59)
    last = minutes[-1]
    assert (last.jobs, last.ended["succeeded"], last.ended["dead"]) == (4, 3, 1)
    assert (last.run_mean, last.run_max, last.wait_mean, last.wait_max) == (4.0, 10.0, 2.0, 3.0)
    assert minutes[0].ended["lost"] == 1 and sum(m.jobs for m in minutes) == 5
    assert minutes[30].run_mean is None and minutes[30].jobs == 0


def test_forms_read_ids_limits_and_schedules_or_name_the_bad_field() -> None:
    form = views.Form.parse(b"id=1&id=2&only=&csrf=%C3%A9&bad=%ff")
    assert (
        form.getlist("id") == ["1", "2"]
        and form["csrf"] == "é"
        and form["only"] == ""
        and form["bad"] == "\ufffd"
    )
    with pytest.raises(InvalidArgument, match="more than 5000 fields"):
        views.Form.parse(b"&".join([b"id=1"] * 5001))
    one, two = uuid4(), uuid4()
    assert views.job_ids([str(one), str(two), str(one)]) == [one, two]
    with pytest.raises(InvalidArgument, match="is not a job id"):
        views.job_ids(["nope"])
    assert views.limit_arguments(
        {"type": "t", "max_running": " 3 ", "per_seconds": "0.5", "max_starts": "1"}
    ) == (
        "t",
        {"max_running": 3, "max_starts": 1, "per": timedelta(seconds=0.5), "max_running_per_key": None},
    )
    for bad in (
        {"max_running": "1" * 30},
        {"per_seconds": "nan"},
        {"per_seconds": "1e300"},
        {"max_starts": "1.5"},
    ):
        with pytest.raises(InvalidArgument):
            views.limit_arguments({"type": "t"} | bad)
    schedule = views.schedule_from({"name": "n", "cron": "*/5 * * * *", "type": "t"})
    assert (schedule.payload, schedule.timezone, schedule.misfire, schedule.enabled) == (
        {},
        "UTC",
        "skip",
        False,
    )


# --- pgjobkit dashboard, the command -----------------------------------------------------------------------------------------
def test_the_command_prints_where_and_a_new_token_serves_and_stops_on_ctrl_c(
    db_url: str, tmp_path: Path
) -> None:
    env = clean_env(JOBKIT_DATABASE_URL=db_url)
    command = [str(JOBKIT), "dashboard", "--port", "0", "--allowed-host", "dash.test"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env
    ) as proc:
        assert proc.stdout is not None
        try:
            url = proc.stdout.readline().removeprefix("jobkit dashboard: ").strip()
            token = proc.stdout.readline().removeprefix("token: ").strip()
            assert url.startswith("http://127.0.0.1:") and len(token) >= 32 and token not in url
            with httpx.Client(base_url=url) as client:
                assert client.get("/healthz").text == "ok"
                assert client.get("/").headers["location"] == "/login"
                assert client.post("/login", data={"token": token}).status_code == 303
                assert client.get("/").status_code == 200
                assert client.get("/healthz", headers={"Host": "evil.test"}).status_code == 421
                assert client.get("/healthz", headers={"Host": "dash.test"}).text == "ok"
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "jobkit dashboard stopped." in err and "Traceback" not in err


def test_the_command_takes_its_token_from_the_environment_and_refuses_a_short_one(
    db_url: str, tmp_path: Path
) -> None:
    short = subprocess.run(
        [str(JOBKIT), "dashboard"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        env=clean_env(JOBKIT_DATABASE_URL=db_url, JOBKIT_DASHBOARD_TOKEN="x" * 15),
    )
    assert short.returncode == 2
    assert "JOBKIT_DASHBOARD_TOKEN must be at least 16 characters (it has 15)" in short.stderr
    env = clean_env(JOBKIT_DATABASE_URL=db_url, JOBKIT_DASHBOARD_TOKEN=TOKEN)
    with subprocess.Popen(
        [str(JOBKIT), "dashboard", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    ) as proc:
        assert proc.stdout is not None
        try:
            url = proc.stdout.readline().removeprefix("jobkit dashboard: ").strip()
            assert proc.stdout.readline().strip() == "token: the one in JOBKIT_DASHBOARD_TOKEN"
            with httpx.Client(base_url=url) as client:
                assert client.post("/login", data={"token": TOKEN}).status_code == 303
        finally:
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate()
    assert TOKEN not in out


def test_the_command_warns_loudly_off_loopback(tmp_path: Path) -> None:
    everywhere = "0.0.0.0"  # noqa: S104 (nothing binds it: no store is configured, so it stops first)
    result = subprocess.run(
        [str(JOBKIT), "dashboard", "--host", everywhere],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(),
        check=False,
    )
    assert result.returncode == 2
    assert "WARNING: listening on 0.0.0.0, not on this machine alone" in result.stderr
    loopback = ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "LOCALHOST")
    elsewhere = (everywhere, "::", "10.0.0.2", "192.168.1.9", "example.com", "")
    assert all(map(is_loopback, loopback)) and not any(map(is_loopback, elsewhere))


def test_a_missing_dashboard_extra_is_named_with_the_line_that_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for module in [m for m in sys.modules if m.startswith(("pgjobkit.dashboard", "pgjobkit.cli.dashboard"))]:
        monkeypatch.delitem(sys.modules, module)
    for module in [m for m in sys.modules if m == "starlette" or m.startswith("starlette.")]:
        monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "starlette", None)
    result = CliRunner().invoke(main, ["dashboard"])
    assert result.exit_code == 2
    assert "pip install 'pgjobkit[dashboard]'" in result.output
    for name in ("starlette", "uvicorn", "jinja2", "python_multipart"):
        hint = missing(ModuleNotFoundError(name=name), "`pgjobkit dashboard`")
        assert hint is not None and hint.endswith("pip install 'pgjobkit[dashboard]'")


# --- helpers -----------------------------------------------------------------------------------------------------------------
def _pipeline() -> Pipeline:
    pipeline = Pipeline()
    pipeline.add("extract", ref="extract")
    pipeline.add("load", ref="load", after="extract")
    pipeline.add("index", ref="index", after="load")
    pipeline.add("notify", ref="notify", after="extract")
    return pipeline


def _some_activity() -> list[dict[str, Any]]:
    activity = Activity()
    activity.add(datetime.now(UTC).timestamp(), "t", "succeeded", run=1, wait=1)
    return activity.take()


def _crawl(dash: Dash) -> None:
    """Sign in, fill the store with a job of each kind, and open every page, including its error pages."""
    csrf = dash.login()
    store = dash.store
    running = claimed(store, "embed", payload={"doc": 1})
    dead_id = dead(store, "mail")
    store.set_limit("embed", max_running=2)
    store.set_schedule(Schedule(name="nightly", cron="0 3 * * *", type="report"))
    enqueued = store.enqueue_pipeline(_pipeline())
    store.worker_beat("w", host="h", activity=_some_activity())
    for path in (
        *PAGES,
        f"/jobs/{running.id}",
        f"/jobs/{dead_id}",
        f"/pipelines/{enqueued.pipeline_id}",
        f"/jobs/{uuid4()}",
        "/nope",
    ):
        assert dash.get(path).status_code in (200, 404), path
    dash.post("/limits", {"csrf": csrf, "type": "embed", "max_running": "-5"}, headers={"Origin": ORIGIN})
    dash.post(
        "/schedules", {"csrf": csrf, "name": "x", "cron": "bad", "type": "t"}, headers={"Origin": ORIGIN}
    )
    dash.act("/actions/requeue", {"csrf": csrf, "id": str(dead_id)})
    dash.get("/failing")
    dash.get("/login")


def _job(type_: str, status: JobStatus, error: str | None, updated: datetime) -> Job:
    return Job(
        id=uuid4(),
        type=type_,
        status=status,
        payload={},
        attempts=1,
        max_attempts=3,
        priority=0,
        run_after=updated,
        error=error,
        created_at=updated,
        updated_at=updated,
    )


def _pjob(
    seq: int, id_: UUID, now: datetime, depends_on: tuple[UUID, ...] = (), parent_id: UUID | None = None
) -> PipelineJob:
    return PipelineJob(
        seq=seq,
        id=id_,
        type=f"t{seq}",
        status=JobStatus.QUEUED,
        parent_id=parent_id,
        depends_on=depends_on,
        created_at=now,
        updated_at=now,
    )


def _balanced(rows: list[views.TreeRow], still_open: int) -> bool:
    """Whether the lists the rows open and close nest as the template writes them."""
    depth = 0
    for i, row in enumerate(rows):
        if row.opens:
            depth += 1
        elif i:
            depth -= row.closes
        if depth != row.level or depth < 0:
            return False
    return depth == still_open
