"""Run SQL the way PostgREST runs one request, against a real database (test-only).

PostgREST cannot be installed here, so tests reproduce what it does per request (read from its source,
see ../shared/reference/supabase-facts.md): one transaction, READ ONLY for GET and for STABLE functions;
``set_config`` of ``search_path``, ``role`` and ``request.jwt.claims`` (never the per-claim GUCs); an RPC
is ``select * from fn(arg := value, ...)`` with the JSON body's keys as named arguments, typed by the
function's own parameter types. It connects as ``authenticator`` (login, noinherit), like PostgREST.

Not covered: JWT signatures (the HTTP router in tests/router.py checks those), response shaping beyond
rows as dicts, per-role settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

# PostgREST's max-rows on Supabase: set-returning RPCs return at most this many rows.
MAX_ROWS = 1000


@dataclass
class PostgrestError(Exception):
    """What PostgREST would answer: the SQLSTATE (or PGRST code), message and HTTP status."""

    code: str
    message: str
    status: int
    details: str | None = None
    hint: str | None = None

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details, "hint": self.hint}


def http_status(sqlstate: str) -> int:
    """PostgREST's SQLSTATE → HTTP status mapping (the codes jobkit can meet)."""
    if sqlstate == "42501":
        return 403  # PostgREST answers 401 for anon, 403 otherwise; jobkit treats both alike
    if sqlstate in ("23505", "23503"):
        return 409
    if sqlstate == "42883" or sqlstate == "42P01":
        return 404
    if sqlstate.startswith("08") or sqlstate.startswith("53"):
        return 503
    if sqlstate == "57014":
        return 500
    if sqlstate in ("40001", "40P01"):
        return 500
    return 400


def claims_for(role: str, sub: str | None = None) -> dict[str, Any]:
    claims: dict[str, Any] = {"role": role}
    if sub is not None:
        claims["sub"] = sub
    return claims


class Postgrest:
    """Executes requests as PostgREST would, over one ``authenticator`` connection."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._arg_types: dict[str, dict[str, str]] = {}
        self._volatility: dict[str, str] = {}
        self._returns_set: dict[str, bool] = {}

    @property
    def conn(self) -> psycopg.Connection[dict[str, Any]]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.conninfo, user="authenticator", row_factory=dict_row, autocommit=True
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def _describe(self, fn: str) -> tuple[dict[str, str], str]:
        if fn not in self._arg_types:
            row = self.conn.execute(
                """select p.provolatile, p.proretset,
                          coalesce(p.proargnames, '{}') as names,
                          coalesce(array(select format_type(t, null)
                                         from unnest(p.proargtypes) t), '{}') as types
                   from pg_proc p where p.pronamespace = 'public'::regnamespace and p.proname = %s""",
                (fn,),
            ).fetchall()
            if len(row) != 1:
                raise PostgrestError("PGRST202", f"Could not find the function public.{fn}", 404)
            names = row[0]["names"][: len(row[0]["types"])]
            self._arg_types[fn] = dict(zip(names, row[0]["types"], strict=True))
            self._volatility[fn] = row[0]["provolatile"]
            self._returns_set[fn] = row[0]["proretset"]
        return self._arg_types[fn], self._volatility[fn]

    def transaction(
        self,
        claims: Mapping[str, Any],
        *,
        method: str,
        path: str,
        read_only: bool,
        query: sql.Composed | sql.SQL,
        params: Sequence[Any],
    ) -> list[dict[str, Any]]:
        """One request: BEGIN, set_config(...) as PostgREST does, the query, COMMIT (ROLLBACK on error)."""
        conn = self.conn
        try:
            conn.execute("begin read only" if read_only else "begin")
            conn.execute(
                """select set_config('search_path', 'public, extensions', true),
                          set_config('role', %s, true),
                          set_config('request.jwt.claims', %s, true),
                          set_config('request.method', %s, true),
                          set_config('request.path', %s, true),
                          set_config('request.headers', '{}', true)""",
                (claims.get("role", "anon"), json.dumps(dict(claims)), method, path),
            )
            cur = conn.execute(query, params)
            rows = cur.fetchall() if cur.description else []
            conn.execute("commit")
        except psycopg.Error as exc:
            conn.execute("rollback")
            diag = exc.diag
            code = diag.sqlstate or "XX000"
            raise PostgrestError(
                code,
                diag.message_primary or str(exc),
                http_status(code),
                diag.message_detail,
                diag.message_hint,
            ) from exc
        return rows

    def rpc(self, fn: str, args: Mapping[str, Any], claims: Mapping[str, Any], method: str = "POST") -> Any:
        """``POST /rest/v1/rpc/<fn>`` with JSON body ``args``: a list of rows (dicts, JSON-typed) for a
        set-returning function, the bare value for one returning a scalar."""
        types, volatility = self._describe(fn)
        unknown = set(args) - set(types)
        if unknown:
            raise PostgrestError(
                "PGRST202", f"Could not find the function public.{fn}({', '.join(args)})", 404
            )
        names = list(args)
        if names:
            columns = sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(types[n])) for n in names
            )
            call = sql.SQL(", ").join(
                sql.SQL("{} := _.{}").format(sql.Identifier(n), sql.Identifier(n)) for n in names
            )
            query = sql.SQL(
                "select to_jsonb(r) as row from json_to_record(%s::json) as _({}), "
                "lateral public.{}({}) r limit {}"
            ).format(columns, sql.Identifier(fn), call, sql.Literal(MAX_ROWS))
            params: list[Any] = [json.dumps(dict(args))]
        else:
            query = sql.SQL("select to_jsonb(r) as row from public.{}() r limit {}").format(
                sql.Identifier(fn), sql.Literal(MAX_ROWS)
            )
            params = []
        read_only = method in ("GET", "HEAD") or volatility in ("s", "i")
        rows = self.transaction(
            claims, method=method, path=f"/rpc/{fn}", read_only=read_only, query=query, params=params
        )
        out = [r["row"] for r in rows]
        if self._returns_set[fn]:
            return out
        # PostgREST answers a function returning one scalar with the bare JSON value.
        [value] = out
        return value[fn] if isinstance(value, dict) and list(value) == [fn] else value

    def select(
        self,
        table: str,
        columns: Sequence[str],
        claims: Mapping[str, Any],
        *,
        where: sql.Composable | None = None,
        params: Sequence[Any] = (),
        order: sql.Composable | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """``GET /rest/v1/<table>?select=...``: a read-only select under the claims' role."""
        query = sql.SQL("select to_jsonb(r) as row from (select {} from public.{}{}{}{}) r").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            sql.Identifier(table),
            sql.SQL(" where ") + where if where is not None else sql.SQL(""),
            sql.SQL(" order by ") + order if order is not None else sql.SQL(""),
            sql.SQL(" limit {}").format(sql.Literal(min(limit or MAX_ROWS, MAX_ROWS))),
        )
        rows = self.transaction(
            claims, method="GET", path=f"/{table}", read_only=True, query=query, params=params
        )
        return [r["row"] for r in rows]

    def execute(
        self, query: str, params: Sequence[Any], claims: Mapping[str, Any], *, method: str = "POST"
    ) -> list[dict[str, Any]]:
        """Any statement under the claims' role, in PostgREST's transaction shape (for grant tests)."""
        return self.transaction(
            claims, method=method, path="/", read_only=method == "GET", query=sql.SQL(query), params=params
        )
