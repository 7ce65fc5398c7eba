"""A test-only stand-in for Supabase's API gateway + PostgREST, as a respx side effect.

Narrow on purpose: it serves exactly what jobkit sends and refuses anything else.
- ``POST /rest/v1/rpc/<fn>`` with a JSON object body: the RPC, run by ``tests.doubles.postgrest.Postgrest`` in
  the real database as PostgREST v14 would (one transaction, role settings, role and claims, named
  arguments, max-rows, its status table).
- ``GET /rest/v1/jobkit_jobs`` with the query parameters ``UserJobs`` sends (select, eq filters on id,
  status and type, the keyset ``or``, order created_at.desc,id.desc, limit).

The gateway's key rules, as the Supabase CLI's gateway applies them (supabase/cli
``internal/start/start.go``, the Lua ``BearerToken`` expression of its Kong config) and as hosted projects
document them, the stricter reading where the two differ:
- ``apikey`` is required (hosted answers 401 "No API key found in request"; the CLI passes it on).
- ``apikey: sb_secret_...`` stands for a service_role JWT, ``sb_publishable_...`` for an anon JWT; an
  ``sb_`` key that is not the project's is refused with 401 "Invalid API key" (hosted; the CLI would pass
  it on raw, and PostgREST refuse it). A legacy JWT apikey is passed on and verified like any JWT.
- An ``Authorization`` that is not ``Bearer sb_...`` passes through as the user's JWT, whatever the apikey.
  A ``Bearer sb_...`` Authorization is replaced by the apikey's JWT, and is allowed only when it equals
  the apikey (supabase-py 2.34 sends both equal unless told otherwise).
Then PostgREST verifies the JWT (``Auth/Jwt.hs``): against the project's JWKS, which holds the legacy HS256
secret and an ES256 signing key (the CLI's default for user tokens, ``pkg/config``), with ``exp`` checked;
errors are PGRST301 / PGRST303 with 401. Errors come back as PostgREST's JSON body with its status and its
``Proxy-Status`` header. It is serialised by a lock (one database connection).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from psycopg import sql

from pgjobkit import UserJob
from tests.doubles.postgrest import Postgrest, PostgrestError

TEST_JWT_SECRET = "jobkit-test-secret-with-at-least-32-characters"
SIGNING_KEY = ec.generate_private_key(ec.SECP256R1())  # the project's ES256 key for user tokens
SIGNING_KID = "jobkit-test-es256"
SECRET_KEY = "sb_secret_jobkitTestSecretKey0123456789"
PUBLISHABLE_KEY = "sb_publishable_jobkitTestPublishableKey0123"
BASE_URL = "http://supabase.test"
USER_COLUMNS = set(UserJob.model_fields)  # what UserJobs may select
_KEYSET = re.compile(
    r'^\(created_at\.lt\."([^"]+)",and\(created_at\.eq\."([^"]+)",id\.lt\.([0-9a-f-]{36})\)\)$'
)


def make_jwt(
    role: str,
    sub: str | None = None,
    secret: str = TEST_JWT_SECRET,
    ttl: int = 3600,
    algorithm: str = "HS256",
) -> str:
    """A Supabase-style access token or legacy API key: HS256 with ``secret``, or ES256 with the project's
    signing key (as GoTrue signs user tokens on new projects)."""
    claims: dict[str, Any] = {"iss": "supabase", "role": role, "exp": int(time.time()) + ttl}
    if sub is not None:
        claims |= {"sub": sub, "aud": "authenticated"}
    if algorithm == "ES256":
        return jwt.encode(claims, SIGNING_KEY, algorithm="ES256", headers={"kid": SIGNING_KID})
    return jwt.encode(claims, secret, algorithm="HS256")


def _gateway_error(status: int, message: str, hint: str) -> httpx.Response:
    return httpx.Response(status, json={"message": message, "hint": hint})


class SupabaseRouter:
    """Carries jobkit's HTTP requests into the real database under the JWT's role (see module doc)."""

    def __init__(self, db_url: str, secret: str = TEST_JWT_SECRET, max_rows: int = 1000) -> None:
        self.api = Postgrest(db_url, max_rows=max_rows)
        self.secret = secret
        self.requests: list[httpx.Request] = []
        self._lock = threading.Lock()
        self._role_jwts = {
            SECRET_KEY: make_jwt("service_role", secret=secret, ttl=10**8),
            PUBLISHABLE_KEY: make_jwt("anon", secret=secret, ttl=10**8),
        }

    def close(self) -> None:
        self.api.close()

    def _claims(self, token: str) -> dict[str, Any]:
        """PostgREST's JWT check against the JWKS (HS256 secret, ES256 key)."""
        try:
            header = jwt.get_unverified_header(token)
            key: Any = SIGNING_KEY.public_key() if header.get("alg") == "ES256" else self.secret
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=["HS256", "ES256"], options={"verify_aud": False}, leeway=30
            )
        except jwt.ExpiredSignatureError as exc:
            raise PostgrestError("PGRST303", "JWT expired", 401) from exc
        except jwt.PyJWTError as exc:
            raise PostgrestError("PGRST301", "No suitable key or wrong key type", 401) from exc
        claims.setdefault("role", "anon")
        if claims["role"] not in ("anon", "authenticated", "service_role"):
            raise PostgrestError("22023", f'role "{claims["role"]}" does not exist', 401)
        return claims

    def _token(self, request: httpx.Request) -> str | httpx.Response:
        """The JWT the gateway hands PostgREST, or the gateway's own refusal."""
        apikey = request.headers.get("apikey")
        if not apikey:
            return _gateway_error(
                401, "No API key found in request", "No `apikey` request header or url param was found."
            )
        if apikey.startswith("sb_") and apikey not in self._role_jwts:
            return _gateway_error(401, "Invalid API key", "Double check your Supabase API key.")
        auth = request.headers.get("authorization")
        if auth is not None and not auth.startswith("Bearer sb_"):
            return str(auth).removeprefix("Bearer ")  # the user's JWT, passed through
        if auth is not None and auth != f"Bearer {apikey}":
            return _gateway_error(
                401, "Invalid API key", "An sb_ key in Authorization must equal the apikey header."
            )
        return self._role_jwts.get(apikey, str(apikey))

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            self.requests.append(request)
            token = self._token(request)
            if isinstance(token, httpx.Response):
                return token
            try:
                return self._route(request, self._claims(token))
            except PostgrestError as exc:
                return httpx.Response(
                    exc.status, json=exc.body(), headers={"Proxy-Status": f"PostgREST; error={exc.code}"}
                )

    def _route(self, request: httpx.Request, claims: dict[str, Any]) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path.startswith("/rest/v1/rpc/"):
            fn = path.removeprefix("/rest/v1/rpc/")
            if not fn.startswith("jobkit_"):
                raise PostgrestError("PGRST202", f"Could not find the function public.{fn}", 404)
            try:
                body = json.loads(request.content or b"{}")
            except ValueError as exc:
                raise PostgrestError("PGRST102", "Empty or invalid json", 400) from exc
            if not isinstance(body, dict):
                raise PostgrestError("PGRST102", "All object keys must match", 400)
            return httpx.Response(
                200,
                content=self.api.rpc_body(fn, body, claims).encode(),
                headers={"Content-Type": "application/json; charset=utf-8"},
            )
        if request.method == "GET" and path == "/rest/v1/jobkit_jobs":
            return httpx.Response(200, json=self._select(request, claims))
        raise PostgrestError("PGRST125", f"jobkit's test router does not serve {request.method} {path}", 404)

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
