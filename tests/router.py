"""A test-only stand-in for Supabase's API gateway + PostgREST, as a respx side effect.

Narrow on purpose: it serves exactly what jobkit sends and refuses anything else.
- ``POST /rest/v1/rpc/<fn>`` with a JSON object body: the RPC, run by ``tests.postgrest.Postgrest`` in
  the real database as PostgREST would (one transaction, role and claims set, named arguments).
- ``GET /rest/v1/jobkit_jobs`` with the query parameters ``UserJobs`` sends (select, eq filters on id,
  status and type, the keyset ``or``, order created_at.desc,id.desc, limit).
Like Supabase it requires an ``apikey`` header, checks every JWT's HS256 signature against the test
secret, and takes the role from the ``Authorization`` token (else from the apikey). Errors come back as
PostgREST's JSON body with its HTTP status. It is serialised by a lock (one database connection).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
import jwt
from psycopg import sql

from jobkit.listing import UserJob
from tests.postgrest import Postgrest, PostgrestError

TEST_JWT_SECRET = "jobkit-test-secret-with-at-least-32-characters"
BASE_URL = "http://supabase.test"
USER_COLUMNS = set(UserJob.model_fields)  # what UserJobs may select
_KEYSET = re.compile(
    r'^\(created_at\.lt\."([^"]+)",and\(created_at\.eq\."([^"]+)",id\.lt\.([0-9a-f-]{36})\)\)$'
)


def make_jwt(role: str, sub: str | None = None, secret: str = TEST_JWT_SECRET, ttl: int = 3600) -> str:
    """A Supabase-style access token / API key signed with ``secret``."""
    claims: dict[str, Any] = {"iss": "supabase", "role": role, "exp": int(time.time()) + ttl}
    if sub is not None:
        claims |= {"sub": sub, "aud": "authenticated"}
    return jwt.encode(claims, secret, algorithm="HS256")


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"code": code, "message": message, "details": None, "hint": None})


class SupabaseRouter:
    """Carries jobkit's HTTP requests into the real database under the JWT's role (see module doc)."""

    def __init__(self, db_url: str, secret: str = TEST_JWT_SECRET) -> None:
        self.api = Postgrest(db_url)
        self.secret = secret
        self.requests: list[httpx.Request] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        self.api.close()

    def _claims(self, token: str) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token, self.secret, algorithms=["HS256"], options={"verify_aud": False}
            )
        except jwt.PyJWTError as exc:
            raise PostgrestError("PGRST301", f"JWT invalid: {type(exc).__name__}", 401) from exc
        if claims.get("role") not in ("anon", "authenticated", "service_role"):
            raise PostgrestError("PGRST301", "JWT role not allowed", 401)
        return claims

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append(request)
            try:
                apikey = request.headers.get("apikey")
                if not apikey:
                    return _error(401, "PGRST301", "No API key found in request")
                self._claims(apikey)
                auth = request.headers.get("authorization", "")
                token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else apikey
                claims = self._claims(token)
                return self._route(request, claims)
            except PostgrestError as exc:
                return httpx.Response(exc.status, json=exc.body())

    def _route(self, request: httpx.Request, claims: dict[str, Any]) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path.startswith("/rest/v1/rpc/"):
            fn = path.removeprefix("/rest/v1/rpc/")
            if not fn.startswith("jobkit_"):
                return _error(404, "PGRST202", f"Could not find the function public.{fn}")
            body = json.loads(request.content or b"{}")
            if not isinstance(body, dict):
                return _error(400, "PGRST102", "RPC body must be a JSON object")
            return httpx.Response(200, json=self.api.rpc(fn, body, claims))
        if request.method == "GET" and path == "/rest/v1/jobkit_jobs":
            return httpx.Response(200, json=self._select(request, claims))
        return _error(404, "PGRST125", f"jobkit's test router does not serve {request.method} {path}")

    def _select(self, request: httpx.Request, claims: dict[str, Any]) -> list[dict[str, Any]]:
        params = request.url.params
        unknown = set(params.keys()) - {"select", "id", "status", "type", "or", "order", "limit"}
        if unknown:
            raise PostgrestError("PGRST100", f"unexpected query parameters {sorted(unknown)}", 400)
        columns = params.get("select", "").split(",")
        if not columns or not set(columns) <= USER_COLUMNS:
            raise PostgrestError("PGRST100", f"unexpected select {columns}", 400)
        where: list[sql.Composable] = []
        values: list[Any] = []
        for column in ("id", "status", "type"):
            if column in params:
                op, _, value = params[column].partition(".")
                if op != "eq":
                    raise PostgrestError("PGRST100", f"unexpected filter {column}={params[column]}", 400)
                where.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
                values.append(value)
        if "or" in params:
            match = _KEYSET.match(params["or"])
            if not match or match.group(1) != match.group(2):
                raise PostgrestError("PGRST100", f"unexpected or={params['or']}", 400)
            where.append(sql.SQL("(created_at < %s or (created_at = %s and id < %s))"))
            values += [match.group(1), match.group(1), match.group(3)]
        if params.get("order", "created_at.desc,id.desc") != "created_at.desc,id.desc":
            raise PostgrestError("PGRST100", f"unexpected order={params['order']}", 400)
        return self.api.select(
            "jobkit_jobs",
            columns,
            claims,
            where=sql.SQL(" and ").join(where) if where else None,
            params=values,
            order=sql.SQL("created_at desc, id desc"),
            limit=int(params.get("limit", "1000")),
        )
