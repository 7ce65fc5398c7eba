"""The exact HTTP requests jobkit sends through supabase-py, and how it retries and maps errors (respx)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any
from uuid import UUID

import httpx
import pytest
import respx

from pgjobkit import UserJobs
from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.errors import (
    ConfigurationError,
    InvalidArgument,
    JobNotFound,
    PermissionDenied,
    StoreError,
    TransientError,
)
from pgjobkit.stores.supabase import RetryPolicy, SupabaseStore
from pgjobkit.worker.calls import WorkerCalls

URL = "https://project.supabase.co"
SERVICE_KEY = "sb_secret_service-key-do-not-leak"
ANON_KEY = "sb_publishable_anon-key"
USER_TOKEN = "user.jwt.token-do-not-leak"
JOB_ID = UUID("11111111-1111-1111-1111-111111111111")
TOKEN = UUID("22222222-2222-2222-2222-222222222222")


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def store(sleeps: Sleeps | None = None, **policy: Any) -> SupabaseStore:
    return SupabaseStore(
        URL, SERVICE_KEY, retry=RetryPolicy(sleep=Sleeps() if sleeps is None else sleeps, **policy)
    )


def test_claim_request_shape() -> None:
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_claim").respond(200, json=[])
        assert WorkerCalls(store()).claim(["embed", "sync"], "w1", timedelta(seconds=30), 20) == []
    request = route.calls.last.request
    assert request.method == "POST"
    assert request.url == f"{URL}/rest/v1/rpc/jobkit_claim"
    assert json.loads(request.content) == {
        "p_types": ["embed", "sync"],
        "p_worker": "w1",
        "p_lease_seconds": 30.0,
        "p_limit": 20,
    }
    assert request.headers["apikey"] == SERVICE_KEY
    assert request.headers["authorization"] == f"Bearer {SERVICE_KEY}"
    assert request.headers["content-profile"] == "public"
    assert request.headers["content-type"] == "application/json"


def test_enqueue_and_complete_bodies() -> None:
    with respx.mock() as mock:
        enq = mock.post(f"{URL}/rest/v1/rpc/jobkit_enqueue_many_ids_json").respond(200, json=[])
        done = mock.post(f"{URL}/rest/v1/rpc/jobkit_complete").respond(
            200, json=[{"id": str(JOB_ID), "ok": True}]
        )
        s = store()
        s.enqueue_many([NewJob(type="embed", payload={"doc": 1}, idempotency_key="k", priority=3)] * 2)
        assert WorkerCalls(s).complete_many([(JOB_ID, TOKEN)]) == {JOB_ID: True}
    assert json.loads(enq.calls.last.request.content) == {
        "p_jobs": [{"type": "embed", "payload": {"doc": 1}, "idempotency_key": "k", "priority": 3}] * 2
    }
    assert json.loads(done.calls.last.request.content) == {
        "p_ids": [str(JOB_ID)],
        "p_lease_tokens": [str(TOKEN)],
    }


def test_single_enqueue_calls_jobkit_enqueue_with_named_arguments() -> None:
    row = {
        "inserted": True,
        "id": str(JOB_ID),
        "user_id": None,
        "type": "embed",
        "status": "queued",
        "payload": {"doc": 1},
        "idempotency_key": None,
        "attempts": 0,
        "max_attempts": 5,
        "priority": 0,
        "run_after": "2026-12-02T18:00:05+00:00",
        "lease_until": None,
        "lease_token": None,
        "claimed_by": None,
        "error": None,
        "created_at": "2026-12-02T18:00:00+00:00",
        "updated_at": "2026-12-02T18:00:00+00:00",
    }
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_enqueue").respond(200, json=[row])
        result = store().enqueue(
            NewJob(type="embed", payload={"doc": 1}, max_attempts=5, delay=timedelta(seconds=5))
        )
    assert result.inserted and result.id == JOB_ID and result.status == JobStatus.QUEUED
    assert json.loads(route.calls.last.request.content) == {
        "p_type": "embed",
        "p_payload": {"doc": 1},
        "p_max_attempts": 5,
        "p_delay_seconds": 5.0,
    }


def test_listing_request_uses_anon_key_and_user_token() -> None:
    with respx.mock() as mock:
        route = mock.get(f"{URL}/rest/v1/jobkit_jobs").respond(200, json=[])
        UserJobs(URL, ANON_KEY, USER_TOKEN).list(status="queued", type="embed", limit=20)
    request = route.calls.last.request
    assert request.method == "GET"
    assert request.headers["apikey"] == ANON_KEY
    assert request.headers["authorization"] == f"Bearer {USER_TOKEN}"
    params = request.url.params
    assert params["select"] == (
        "id,user_id,type,status,payload,idempotency_key,attempts,max_attempts,"
        "priority,run_after,error,created_at,updated_at,progress,progress_message,result"
    )
    assert (params["status"], params["type"], params["order"], params["limit"]) == (
        "eq.queued",
        "eq.embed",
        "created_at.desc,id.desc",
        "20",
    )
    assert "lease_token" not in params["select"]


def test_listing_without_token_fails_before_any_request() -> None:
    with respx.mock() as mock:
        with pytest.raises(PermissionDenied, match="access token"):
            UserJobs(URL, ANON_KEY, None)
        with pytest.raises(PermissionDenied):
            UserJobs(URL, ANON_KEY, "")
        assert mock.calls.call_count == 0


def test_retries_503_then_succeeds() -> None:
    sleeps = Sleeps()
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").mock(
            side_effect=[httpx.Response(503), httpx.Response(502), httpx.Response(200, json=[])]
        )
        assert store(sleeps).stats().rows == ()
    assert route.call_count == 3
    assert len(sleeps) == 2 and all(0 <= s <= 5 for s in sleeps)


def test_retries_timeouts_and_connection_errors() -> None:
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").mock(
            side_effect=[
                httpx.ReadTimeout("slow"),
                httpx.ConnectError("refused"),
                httpx.Response(200, json=[]),
            ]
        )
        store().stats()
    assert route.call_count == 3


def test_gives_up_within_the_attempt_bound() -> None:
    sleeps = Sleeps()
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").respond(504)
        with pytest.raises(TransientError):
            store(sleeps, attempts=4).stats()
    assert route.call_count == 4 and len(sleeps) == 3


def test_gives_up_within_the_time_bound() -> None:
    sleeps = Sleeps()
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").mock(side_effect=httpx.ConnectTimeout("down"))
        with pytest.raises(TransientError, match="ConnectTimeout"):
            store(sleeps, attempts=100, max_total=0.05, base=0.01, cap=0.02).stats()
    assert 1 < route.call_count < 100


def test_429_honours_retry_after() -> None:
    sleeps = Sleeps()
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").mock(
            side_effect=[httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(200, json=[])]
        )
        store(sleeps).stats()
    assert route.call_count == 2 and sleeps[0] >= 2


def test_retry_after_beyond_the_budget_stops_at_once() -> None:
    sleeps = Sleeps()
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").respond(429, headers={"Retry-After": "3600"})
        with pytest.raises(TransientError):
            store(sleeps).stats()
    assert route.call_count == 1 and sleeps == []


@pytest.mark.parametrize(
    ("status", "code", "error"),
    [
        (400, "JK001", InvalidArgument),
        (400, "JK002", JobNotFound),
        (400, "22P02", InvalidArgument),
        (401, "PGRST301", PermissionDenied),
        (403, "42501", PermissionDenied),
        (409, "23503", InvalidArgument),
        (404, "PGRST202", ConfigurationError),
    ],
)
def test_client_errors_are_mapped_and_never_retried(status: int, code: str, error: type[Exception]) -> None:
    sleeps = Sleeps()
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").respond(
            status, json={"code": code, "message": "nope", "details": None, "hint": None}
        )
        with pytest.raises(error):
            store(sleeps).stats()
    assert route.call_count == 1 and sleeps == []


def test_an_error_quotes_a_bounded_prefix_of_what_the_server_echoed() -> None:
    """PostgreSQL's own messages echo bad input whole (invalid input syntax for type uuid: "<1 MB>"): the
    error jobkit raises, and so the log line it becomes, keeps the first 2,000 characters."""
    echoed = 'invalid input syntax for type uuid: "' + "x" * 1_000_000 + '"'
    with respx.mock() as mock:
        mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").respond(400, json={"code": "22P02", "message": echoed})
        with pytest.raises(InvalidArgument) as info:
            store().stats()
    assert len(str(info.value)) < 2100 and str(info.value).endswith("characters, cut)")


def test_non_json_gateway_errors_map_by_status() -> None:
    with respx.mock() as mock:
        mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").respond(403, text="<html>forbidden</html>")
        with pytest.raises(PermissionDenied):
            store().stats()


PAGE = "<html><body>Cloudflare: origin unreachable</body></html>"
TRANSIENT_ANSWERS = [  # (status, JSON body or a proxy's page) as PostgREST, the gateway or a proxy sends them
    (504, {"code": "PGRST003", "message": "Timed out acquiring connection from connection pool."}),
    (503, {"code": "PGRST000", "message": "Database connection error."}),
    (503, {"code": "57P01", "message": "terminating connection due to administrator command"}),
    (500, {"code": "57014", "message": "canceling statement due to statement timeout"}),
    (500, {"code": "40001", "message": "could not serialize access"}),
    (500, {"code": "XX000", "message": "internal error"}),
    (500, {"message": "an error without a code"}),
    (502, PAGE),
    (520, PAGE),
    (522, PAGE),
    (524, PAGE),
]


def _answer(status: int, body: object) -> httpx.Response:
    if isinstance(body, str):
        return httpx.Response(status, text=body, headers={"Content-Type": "text/html"})
    return httpx.Response(status, json=body)


@pytest.mark.parametrize(("status", "body"), TRANSIENT_ANSWERS)
def test_every_passing_fault_is_retried_then_transient(status: int, body: object) -> None:
    sleeps = Sleeps()
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").mock(
            side_effect=[_answer(status, body), httpx.Response(200, json=[])]
        )
        assert store(sleeps).stats().rows == ()
        assert route.call_count == 2 and len(sleeps) == 1
        route.mock(side_effect=None, return_value=_answer(status, body))
        with pytest.raises(TransientError) as info:
            store(Sleeps(), attempts=3).stats()
    assert str(status) in str(info.value)
    if isinstance(body, dict) and "code" in body:
        assert info.value.code == body["code"]


@pytest.mark.parametrize(
    ("status", "error"),
    [(401, PermissionDenied), (403, PermissionDenied), (400, StoreError), (404, StoreError)],
)
def test_an_error_body_without_a_code_maps_by_status(status: int, error: type[Exception]) -> None:
    with respx.mock() as mock:
        route = mock.post(f"{URL}/rest/v1/rpc/jobkit_stats").respond(
            status, json={"message": "Invalid API key"}
        )
        with pytest.raises(error, match="Invalid API key"):
            store().stats()
    assert route.call_count == 1


def test_no_secret_in_reprs_errors_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    s = store()
    listing = UserJobs(URL, ANON_KEY, USER_TOKEN)
    texts = [repr(s), repr(listing), str(s), str(listing)]
    with caplog.at_level(logging.DEBUG), respx.mock() as mock:
        mock.post(f"{URL}/rest/v1/rpc/jobkit_claim").mock(
            side_effect=[
                httpx.Response(503),
                httpx.Response(403, json={"code": "42501", "message": "denied"}),
            ]
        )
        mock.get(f"{URL}/rest/v1/jobkit_jobs").respond(401, json={"code": "PGRST301", "message": "bad jwt"})
        with pytest.raises(PermissionDenied) as a:
            WorkerCalls(s).claim(["embed"], "w", timedelta(seconds=5))
        with pytest.raises(PermissionDenied) as b:
            listing.list()
    texts += [str(a.value), repr(a.value), str(b.value), repr(b.value), caplog.text]
    for text in texts:
        for secret in (SERVICE_KEY, USER_TOKEN, "do-not-leak"):
            assert secret not in text, text
