"""The dashboard in a real headless Chromium (selenium), served by uvicorn on PostgreSQL: an operator signs
in, reads the counts, requeues a dead job a real Worker then runs, cancels a running one; requests without
the session or its CSRF token are refused; a type with a bidi override is drawn as its escape; and a
screenshot of the overview (docs/dashboard.png when JOBKIT_UPDATE_SCREENSHOT=1)."""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.core.workers import Activity
from pgjobkit.dashboard import create_app
from pgjobkit.stores.postgres import AsyncPostgresStore, PostgresStore
from pgjobkit.worker import Worker
from pgjobkit.worker.calls import WorkerCalls
from tests.dashboard.conftest import TOKEN, served

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ROOT = Path(__file__).resolve().parents[2]
LEASE = timedelta(minutes=5)
WAIT = 15.0  # seconds a page may take to load; a wait, not a measured bound


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """The dashboard on the test's database, served as ``pgjobkit dashboard`` serves it, by uvicorn in a
    thread on 127.0.0.1; its base URL."""
    with served(create_app(AsyncPostgresStore(db_url, max_size=2), TOKEN)) as port:
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """Headless Chromium through Debian's chromedriver, 1280x900."""
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.exists():
            pytest.fail(
                f"{binary} is missing: the browser test needs `apt-get install chromium chromium-driver`"
            )
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    )
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def store(db_url: str) -> Iterator[PostgresStore]:
    """A blocking store on the same database, to arrange jobs as an app and its workers would."""
    opened = PostgresStore(db_url, max_size=2)
    try:
        yield opened
    finally:
        opened.close()


def dead(store: PostgresStore, type_: str, error: str) -> UUID:
    enqueued = store.enqueue(NewJob(type=type_, max_attempts=1))
    [job] = WorkerCalls(store).claim([type_], "worker-a", LEASE)
    assert job.id == enqueued.id and job.lease_token is not None
    assert WorkerCalls(store).fail(job.id, job.lease_token, error, timedelta(0)).status == JobStatus.DEAD
    return job.id


def running(store: PostgresStore, type_: str, worker: str = "worker-a") -> UUID:
    enqueued = store.enqueue(NewJob(type=type_))
    [job] = WorkerCalls(store).claim([type_], worker, LEASE)
    assert job.id == enqueued.id
    return job.id


def status_in_db(pg: psycopg.Connection[dict[str, Any]], job_id: UUID) -> str:
    row = pg.execute(
        "select status::text as status from public.jobkit_jobs where id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return str(row["status"])


def sign_in(browser: WebDriver, server: str) -> None:
    browser.get(f"{server}/")
    assert browser.current_url == f"{server}/login"
    browser.find_element(By.NAME, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "form[action='/login'] button[type=submit]").click()
    WebDriverWait(browser, WAIT).until(lambda d: d.current_url == f"{server}/")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Overview"


def click_and_wait(browser: WebDriver, selector: str, message: str) -> None:
    """Click the button ``selector`` names and wait for the page that says ``message``."""
    browser.find_element(By.CSS_SELECTOR, selector).click()
    WebDriverWait(browser, WAIT).until(
        lambda d: any(message in p.text for p in d.find_elements(By.CSS_SELECTOR, "p.flash"))
    )


def test_an_operator_signs_in_reads_the_counts_requeues_and_cancels(
    server: str, browser: WebDriver, store: PostgresStore, pg: psycopg.Connection[dict[str, Any]], db_url: str
) -> None:
    store.enqueue_many(
        [NewJob(type="embed") for _ in range(4)] + [NewJob(type="reindex", delay=timedelta(hours=1))]
    )
    dead_id = dead(store, "email", "SMTP 550: mailbox unavailable")
    running_id = running(store, "transcode")
    queued_id = store.enqueue(NewJob(type="sync")).id

    sign_in(browser, server)  # 1. / sends to the login; the token brings the overview

    # 2. the counts shown per (type, status) are the database's
    shown = {}
    for cell in browser.find_elements(By.CSS_SELECTOR, "#counts td[data-type][data-status]"):
        counts = cell.find_elements(By.CSS_SELECTOR, ".count")
        if counts:
            shown[(cell.get_attribute("data-type"), cell.get_attribute("data-status"))] = int(counts[0].text)
    rows = pg.execute(
        "select type, status::text as status, count(*) as n from public.jobkit_jobs group by 1, 2"
    )
    assert shown == {(r["type"], r["status"]): r["n"] for r in rows}

    # 3. requeue the dead job from /failing; a real Worker runs it; its page says succeeded
    browser.get(f"{server}/failing")
    click_and_wait(browser, f"button.requeue[data-job='{dead_id}']", "Requeued 1 job(s).")
    assert status_in_db(pg, dead_id) == "queued"
    worker = Worker(PostgresStore(db_url, max_size=2), poll_interval=0.05)
    worker.register("email", lambda payload: {"sent": True})
    summary = worker.run(until_empty=True, install_signals=False)
    assert summary.succeeded == 1
    browser.get(f"{server}/jobs/{dead_id}")
    assert browser.find_element(By.CSS_SELECTOR, "dd[data-field='status']").text == "succeeded"

    # 4. cancel the running job from /running
    browser.get(f"{server}/running")
    click_and_wait(browser, f"button.cancel[data-job='{running_id}']", "Cancelled 1 job(s).")
    assert status_in_db(pg, running_id) == "cancelled"

    # 5. without the session: sent to the login, or refused; with it but without the CSRF token: refused
    with httpx.Client(base_url=server) as plain:
        page = plain.get("/")
        assert (page.status_code, page.headers["location"]) == (303, "/login")
        assert plain.post("/actions/cancel", data={"id": str(queued_id)}).status_code == 403
    session = browser.get_cookie("jobkit_session")
    assert session is not None and session["httpOnly"] and session["sameSite"] == "Strict"
    with httpx.Client(base_url=server, cookies={"jobkit_session": session["value"]}) as stolen:
        assert stolen.get("/").status_code == 200  # the cookie is a live session
        refused = stolen.post("/actions/cancel", data={"id": str(queued_id)})
        assert refused.status_code == 403
        forged = stolen.post("/actions/cancel", data={"id": str(queued_id), "csrf": "guessed"})
        assert forged.status_code == 403
    assert status_in_db(pg, queued_id) == "queued"


def test_a_screenshot_of_the_overview_after_an_hour_of_work(
    server: str,
    browser: WebDriver,
    store: PostgresStore,
    pg: psycopg.Connection[dict[str, Any]],
    tmp_path: Path,
) -> None:
    dead(store, "sync-connector", "HTTP 401 from the Notion API: token expired")
    dead(store, "sync-connector", "HTTP 401 from the Notion API: token expired")
    dead(store, "transcribe-audio", "ffmpeg: invalid data found when processing input")
    for _ in range(3):
        running(store, "transcribe-audio", "worker-b")
    running(store, "embed-document", "worker-a")
    store.enqueue_many(
        [NewJob(type="embed-document") for _ in range(180)]
        + [NewJob(type="transcribe-audio") for _ in range(24)]
        + [NewJob(type="sync-connector") for _ in range(7)]
        + [NewJob(type="reindex", delay=timedelta(minutes=30)) for _ in range(3)]
    )
    pg.execute(  # an hour in: the oldest jobs have waited a while, the running ones run for minutes
        "update public.jobkit_jobs set created_at = created_at - interval '9 minutes', "
        "run_after = run_after - interval '9 minutes', started_at = started_at - interval '3 minutes' "
        "where type <> 'reindex'"
    )
    now = datetime.now(UTC)
    activity = Activity()
    for minute in range(60):  # a busy hour: a wave of embeddings, a few retries, two dead, one lost
        at = (now - timedelta(minutes=59 - minute)).timestamp()
        wave = 0.5 + 0.5 * math.sin(minute / 7)
        for _ in range(int(8 + 30 * wave)):
            activity.add(at, "embed-document", "succeeded", run=0.4 + 0.6 * wave, wait=0.2 + 4 * wave)
        for _ in range(2 + minute % 3):
            activity.add(at, "transcribe-audio", "succeeded", run=12 + minute % 9, wait=1.5)
        if minute % 11 == 3:
            activity.add(at, "sync-connector", "retrying", run=2.0, wait=0.5)
        if minute in (17, 44):
            activity.add(at, "sync-connector", "dead", run=1.0, wait=0.5)
        if minute == 30:
            activity.add(at, "transcribe-audio", "lost", run=60.0, wait=2.0)
    tallies = activity.take()
    half = len(tallies) // 2
    store.worker_beat(
        "worker-a",
        host="app-1",
        pid=4121,
        version="0.5.0",
        types=["embed-document"],
        concurrency=16,
        activity=tallies[:half],
    )
    store.worker_beat(
        "worker-b",
        host="app-2",
        pid=977,
        version="0.5.0",
        types=["transcribe-audio", "sync-connector"],
        concurrency=4,
        activity=tallies[half:],
    )

    browser.execute_cdp_cmd(  # the page itself 1280x900, whatever the window's frame takes
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    sign_in(browser, server)
    assert browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    shot = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    if os.environ.get("JOBKIT_UPDATE_SCREENSHOT") == "1":
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(shot, ROOT / "docs" / "dashboard.png")


def test_a_type_with_a_bidi_override_is_drawn_as_its_escape_and_not_reordered(
    server: str, browser: WebDriver, store: PostgresStore
) -> None:
    """U+202E would draw ``invoice<RLO>fdp.exe`` as ``invoiceexe.pdf``: the page shows its escape."""
    job_id = dead(store, "invoice\u202efdp.exe", "quota\u2066 exceeded\u2069 for\u200b you")
    sign_in(browser, server)
    assert browser.find_element(By.CSS_SELECTOR, "#counts th.type").text == "invoice\\u202efdp.exe"
    browser.get(f"{server}/failing")
    [cell] = browser.find_elements(By.CSS_SELECTOR, "td.type")
    assert cell.text == "invoice\\u202efdp.exe"
    assert [m.text for m in cell.find_elements(By.CSS_SELECTOR, ".cc")] == ["\\u202e"]
    key = browser.find_element(By.CSS_SELECTOR, "h2.error-key").text
    assert key == "quota\\u2066 exceeded\\u2069 for\\u200b you"
    browser.get(f"{server}/jobs/{job_id}")
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "invoice\\u202efdp.exe" in page and "\\u2066 exceeded\\u2069" in page
    assert not any(c in page for c in "\u202e\u2066\u2069\u200b")
