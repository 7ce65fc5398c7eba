"""The API keys new projects issue (sb_secret_..., sb_publishable_...), the legacy JWT keys, and user
tokens signed HS256 or ES256, end to end through the gateway rules of tests/doubles/router.py into real SQL."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg
import pytest
import respx
from cryptography.hazmat.primitives.asymmetric import ec

from pgjobkit import UserJobs
from pgjobkit.core.models import NewJob
from pgjobkit.errors import PermissionDenied
from pgjobkit.stores.supabase import SupabaseStore
from tests.doubles.router import BASE_URL, PUBLISHABLE_KEY, SECRET_KEY, SIGNING_KID, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user


@pytest.fixture
def owner(pg: psycopg.Connection[Any], router: SupabaseRouter) -> tuple[uuid.UUID, uuid.UUID]:
    """A user and the id of the one job they own (enqueued with the secret key)."""
    user = uuid.UUID(make_user(pg))
    store = SupabaseStore(BASE_URL, SECRET_KEY)
    job = store.enqueue(NewJob(type="embed", user_id=user)).id
    store.enqueue(NewJob(type="embed"))  # nobody's
    store.close()
    return user, job


def test_legacy_service_role_jwt_still_works(router: SupabaseRouter) -> None:
    store = SupabaseStore(BASE_URL, make_jwt("service_role"))
    assert store.enqueue(NewJob(type="t")).inserted
    assert store.stats().count() == 1
    store.close()


@pytest.mark.parametrize("algorithm", ["ES256", "HS256"])
def test_user_token_with_the_publishable_key(owner: tuple[uuid.UUID, uuid.UUID], algorithm: str) -> None:
    user, job = owner
    token = make_jwt("authenticated", sub=str(user), algorithm=algorithm)
    view = UserJobs(BASE_URL, PUBLISHABLE_KEY, token)
    assert [j.id for j in view.list()] == [job]
    view.close()


def test_a_token_signed_by_another_key_is_refused(owner: tuple[uuid.UUID, uuid.UUID]) -> None:
    import jwt

    user, _ = owner
    stranger = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode(
        {"role": "authenticated", "sub": str(user), "exp": 2_000_000_000},
        stranger,
        algorithm="ES256",
        headers={"kid": SIGNING_KID},
    )
    with pytest.raises(PermissionDenied) as info:
        UserJobs(BASE_URL, PUBLISHABLE_KEY, token).list()
    assert info.value.code == "PGRST301"


def test_an_expired_token_is_refused(owner: tuple[uuid.UUID, uuid.UUID]) -> None:
    user, _ = owner
    token = make_jwt("authenticated", sub=str(user), ttl=-120, algorithm="ES256")
    with pytest.raises(PermissionDenied) as info:
        UserJobs(BASE_URL, PUBLISHABLE_KEY, token).list()
    assert info.value.code == "PGRST303"


def test_the_publishable_key_alone_is_anon(owner: tuple[uuid.UUID, uuid.UUID]) -> None:
    with pytest.raises(PermissionDenied) as info:
        SupabaseStore(BASE_URL, PUBLISHABLE_KEY).stats()
    assert info.value.code == "42501" and "HTTP 401" in str(info.value)  # anon: 401, not 403


def test_an_unknown_sb_key_is_refused_by_the_gateway(router: SupabaseRouter) -> None:
    with pytest.raises(PermissionDenied, match="Invalid API key") as info:
        SupabaseStore(BASE_URL, "sb_secret_revoked0123456789").stats()
    assert info.value.code is None and len(router.requests) == 1  # refused, never retried


def test_gateway_rules(router: SupabaseRouter, owner: tuple[uuid.UUID, uuid.UUID]) -> None:
    user, job = owner
    url = f"{BASE_URL}/rest/v1/rpc/jobkit_get"
    body = {"p_id": str(job)}
    with httpx.Client() as http:

        def post(headers: dict[str, str]) -> httpx.Response:
            return http.post(url, json=body, headers=headers)

        assert post({}).status_code == 401  # no apikey
        assert post({"apikey": SECRET_KEY}).json()[0]["id"] == str(job)  # the secret key is service_role
        mismatch = post({"apikey": SECRET_KEY, "Authorization": f"Bearer {PUBLISHABLE_KEY}"})
        assert mismatch.status_code == 401
        as_user = post(
            {"apikey": SECRET_KEY, "Authorization": f"Bearer {make_jwt('authenticated', str(user))}"}
        )
        assert as_user.status_code == 403 and as_user.json()["code"] == "42501"  # the user's JWT wins


def test_supabase_py_sends_the_secret_key_in_both_headers() -> None:
    with respx.mock() as mock:
        route = mock.post("https://p.supabase.co/rest/v1/rpc/jobkit_stats").respond(200, json=[])
        SupabaseStore("https://p.supabase.co", SECRET_KEY).stats()
    request = route.calls.last.request
    assert request.headers["apikey"] == SECRET_KEY
    assert request.headers["authorization"] == f"Bearer {SECRET_KEY}"
    assert request.headers["x-client-info"].startswith("supabase-py/")
