"""Run SQL the way PostgREST v14 runs one request, against a real database (test-only).

PostgREST cannot be installed here, so this reproduces what v14.12 (the version the Supabase CLI pins) does
per request, read from its source (tag v14.12, commit 6200fbad):
- One transaction (``MainTx.mainTx``), READ ONLY for GET/HEAD and for STABLE/IMMUTABLE functions
  (``Plan.callReadPlan``); an error rolls it back whole.
- First one statement of ``set_config(..., true)`` (``PreQuery.txVarQuery``): ``search_path``, then the
  impersonated role's own settings, then ``role``, ``request.jwt.claims`` (never the per-claim GUCs),
  ``request.method``, ``request.path``, ``request.headers``, ``request.cookies``. Role settings are the
  cluster-wide ``ALTER ROLE ... SET`` values (``pg_roles.rolconfig``) of the roles the authenticator is a
  direct member of, of context ``user`` (``Config/Database.queryRoleSettings``): on Supabase that is
  ``statement_timeout`` 3 s for anon and 8 s for authenticated. service_role has none, so the
  authenticator's own 8 s (applied at its login, as by any PostgreSQL session) holds for it.
- An RPC is ``Statements.mainCall`` over ``QueryBuilder.callPlanToQuery``: the JSON body's keys become
  named arguments through ``json_to_record``, typed by the function's declared parameter types; the
  function runs to completion inside the ``pgrst_source`` CTE and **max-rows (1000 on Supabase) is the
  LIMIT of the outer read**, so a longer answer is cut while every row it changed stays changed. A scalar
  result is one row (``pgrst_scalar``), never cut. The body is ``json_agg`` of what is left.
- An error answers with PostgREST's JSON body (code, message, details, hint) and the status of
  ``Error.pgErrorStatus``, reproduced whole in ``http_status``.
It connects as ``authenticator`` (login, noinherit), like PostgREST. Not covered: JWT verification and the
gateway's key rules (tests/doubles/router.py does those), response headers beyond the status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

# PostgREST's max-rows on Supabase: an RPC answer holds at most this many rows.
MAX_ROWS = 1000
ANON_ROLE = "anon"

# Error.hs pgErrorStatus, in its order: (prefix, status). Exact codes before the classes they sit in.
_STATUS: tuple[tuple[str, int], ...] = (
    ("08", 503),
    ("09", 500),
    ("0L", 403),
    ("0P", 403),
    ("23503", 409),
    ("23505", 409),
    ("25006", 405),
    ("25", 500),
    ("28", 403),
    ("2D", 500),
    ("38", 500),
    ("39", 500),
    ("3B", 500),
    ("40", 500),
    ("53400", 500),
    ("53", 503),
    ("54", 500),
    ("55", 500),
    ("57P01", 503),
    ("57", 500),
    ("58", 500),
    ("F0", 500),
    ("HV", 500),
    ("P0001", 400),
    ("P0", 500),
    ("XX", 500),
    ("42883", 404),
    ("42P01", 404),
    ("42P17", 500),
)


@dataclass
class PostgrestError(Exception):
    """What PostgREST would answer: the SQLSTATE (or PGRST code), message and HTTP status."""

    code: str
    message: str
    status: int
    details: str | None = None
    hint: str | None = None

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "details": self.details, "hint": self.hint, "message": self.message}


def http_status(sqlstate: str, message: str = "", *, authenticated: bool = True) -> int:
    """PostgREST v14.12's HTTP status for a SQLSTATE (Error.hs ``pgErrorStatus``). ``authenticated``:
    the request's role is not the anon role (42501 is 401 for anon, 403 otherwise)."""
    if sqlstate == "42501":
        return 403 if authenticated else 401
    if sqlstate == "21000":
        return 400 if message.endswith("requires a WHERE clause") else 500
    if sqlstate == "22023":
        return 401 if message.startswith("role") and message.endswith("does not exist") else 400
    if sqlstate.startswith("PT"):
        return int(sqlstate[2:]) if sqlstate[2:].isdigit() else 500
    for prefix, status in _STATUS:
        if sqlstate.startswith(prefix):
            return status
    return 400  # any other code, jobkit's JK001 and JK002 included


@dataclass(frozen=True)
class Raw:
    """An argument sent as this JSON text, as any client may send it (``{"n": 1e4300}``, nesting a
    thousand deep): what Python's json could not write."""

    text: str


def body_of(args: Mapping[str, Any]) -> str:
    """The JSON body of a request with these named arguments."""
    return (
        "{"
        + ", ".join(
            f"{json.dumps(k)}: {v.text if isinstance(v, Raw) else json.dumps(v)}" for k, v in args.items()
        )
        + "}"
    )


def claims_for(role: str, sub: str | None = None) -> dict[str, Any]:
    claims: dict[str, Any] = {"role": role}
    if sub is not None:
        claims["sub"] = sub
    return claims


@dataclass(frozen=True)
class _Function:
    arg_types: dict[str, str]
    volatility: str
    returns_set: bool
    returns_composite: bool


class Postgrest:
    """Executes requests as PostgREST would, over one ``authenticator`` connection."""

    def __init__(self, conninfo: str, max_rows: int = MAX_ROWS) -> None:
        self.conninfo = conninfo
        self.max_rows = max_rows
        self._conn: psycopg.Connection[dict[str, Any]] | None = None
        self._functions: dict[str, _Function] = {}
        self._role_settings: dict[str, list[tuple[str, str]]] | None = None

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

    def role_settings(self, role: str) -> list[tuple[str, str]]:
        """The settings PostgREST applies when impersonating ``role``, read once as it does at startup."""
        if self._role_settings is None:
            rows = self.conn.execute(
                """with role_setting as (
                     select r.rolname, unnest(r.rolconfig) as setting
                     from pg_auth_members m join pg_roles r on r.oid = m.roleid
                     where m.member = current_user::regrole::oid)
                   select rs.rolname, split_part(rs.setting, '=', 1) as key,
                          lower(substr(rs.setting, strpos(rs.setting, '=') + 1)) as value
                   from role_setting rs
                   join pg_settings ps on ps.name = split_part(rs.setting, '=', 1)
                   where ps.context = 'user' or has_parameter_privilege(ps.name, 'set')"""
            ).fetchall()
            self._role_settings = {}
            for r in rows:
                self._role_settings.setdefault(r["rolname"], []).append((r["key"], r["value"]))
        return self._role_settings.get(role, [])

    def _describe(self, fn: str) -> _Function:
        if fn not in self._functions:
            rows = self.conn.execute(
                """select p.provolatile, p.proretset,
                          coalesce(p.proargnames, '{}') as names,
                          coalesce(array(select format_type(t, null)
                                         from unnest(p.proargtypes) t), '{}') as types,
                          t.typtype = 'c' or p.proallargtypes is not null as composite
                   from pg_proc p join pg_type t on t.oid = p.prorettype
                   where p.pronamespace = 'public'::regnamespace and p.proname = %s""",
                (fn,),
            ).fetchall()
            if len(rows) != 1:
                raise PostgrestError(
                    "PGRST202" if not rows else "PGRST203",
                    f"Could not find the function public.{fn} in the schema cache",
                    404 if not rows else 300,
                )
            row = rows[0]
            names = row["names"][: len(row["types"])]
            self._functions[fn] = _Function(
                dict(zip(names, row["types"], strict=True)),
                row["provolatile"],
                row["proretset"],
                row["composite"],
            )
        return self._functions[fn]

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
        role = str(claims.get("role", ANON_ROLE))
        settings = self.role_settings(role)
        setters = sql.SQL(", ").join(
            [sql.SQL("set_config('search_path', 'public, extensions', true)")]
            + [sql.SQL("set_config(%s, %s, true)")] * len(settings)
            + [
                sql.SQL("set_config('role', %s, true)"),
                sql.SQL("set_config('request.jwt.claims', %s, true)"),
                sql.SQL("set_config('request.method', %s, true)"),
                sql.SQL("set_config('request.path', %s, true)"),
                sql.SQL("set_config('request.headers', '{}', true)"),
                sql.SQL("set_config('request.cookies', '{}', true)"),
            ]
        )
        values = [v for kv in settings for v in kv] + [role, json.dumps(dict(claims)), method, path]
        try:
            conn.execute("begin read only" if read_only else "begin")
            conn.execute(sql.SQL("select {}").format(setters), values)
            cur = conn.execute(query, params)
            rows = cur.fetchall() if cur.description else []
            conn.execute("commit")
        except psycopg.Error as exc:
            conn.execute("rollback")
            diag = exc.diag
            code = diag.sqlstate or "XX000"
            message = diag.message_primary or str(exc)
            raise PostgrestError(
                code,
                message,
                http_status(code, message, authenticated=role != ANON_ROLE),
                diag.message_detail,
                diag.message_hint,
            ) from exc
        return rows

    def rpc_body(
        self, fn: str, args: Mapping[str, Any], claims: Mapping[str, Any], method: str = "POST"
    ) -> str:
        """``POST /rest/v1/rpc/<fn>`` with JSON body ``args``: the JSON text PostgREST answers with."""
        f = self._describe(fn)
        unknown = set(args) - set(f.arg_types)
        if unknown:
            raise PostgrestError(
                "PGRST202",
                f"Could not find the function public.{fn}({', '.join(args)}) in the schema cache",
                404,
            )
        names = list(args)
        scalar = not f.returns_composite
        call_args = sql.SQL(", ").join(
            sql.SQL("{} := pgrst_body.{}").format(sql.Identifier(n), sql.Identifier(n)) for n in names
        )
        function = sql.SQL("public.{}({})").format(sql.Identifier(fn), call_args)
        call = (
            sql.SQL("lateral (select {} pgrst_scalar) pgrst_call").format(function)
            if scalar
            else sql.SQL("lateral {} pgrst_call").format(function)
        )
        body_columns = (
            sql.SQL(", ").join(sql.Identifier(n) for n in names) if names else sql.SQL("null as _none")
        )
        record = (
            sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(f.arg_types[n])) for n in names
            )
            if names
            else sql.SQL("_none text")
        )
        if scalar and f.returns_set:
            body = sql.SQL("coalesce(json_agg(_postgrest_t.pgrst_scalar), '[]')")
        elif scalar:
            body = sql.SQL("coalesce(json_agg(_postgrest_t.pgrst_scalar)->0, 'null')")
        elif f.returns_set:
            body = sql.SQL("coalesce(json_agg(_postgrest_t), '[]')")
        else:
            body = sql.SQL("coalesce(json_agg(_postgrest_t)->0, 'null')")
        query = sql.SQL(
            "with pgrst_source as (select {select} from (select %s::json as json_data) pgrst_payload, "
            "lateral (select {columns} from json_to_record(pgrst_payload.json_data) as _({record}) limit 1) "
            "pgrst_body, {call}) "
            "select ({body})::text as body from (select * from pgrst_source limit {limit}) _postgrest_t"
        ).format(
            select=sql.SQL("pgrst_call.pgrst_scalar" if scalar else "pgrst_call.*"),
            columns=body_columns,
            record=record,
            call=call,
            body=body,
            limit=sql.Literal(self.max_rows),
        )
        read_only = method in ("GET", "HEAD") or f.volatility in ("s", "i")
        rows = self.transaction(
            claims,
            method=method,
            path=f"/rpc/{fn}",
            read_only=read_only,
            query=query,
            params=[body_of(args)],
        )
        return str(rows[0]["body"])

    def rpc(self, fn: str, args: Mapping[str, Any], claims: Mapping[str, Any], method: str = "POST") -> Any:
        """The RPC's answer as Python values: a list of rows (dicts) for a set-returning function, the bare
        value for one returning a scalar. An argument may be ``Raw`` JSON text."""
        return json.loads(self.rpc_body(fn, args, claims, method))

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
        """``GET /rest/v1/<table>?select=...``: a read-only select under the claims' role, cut at max-rows."""
        query = sql.SQL("select to_jsonb(r) as row from (select {} from public.{}{}{}{}) r").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in columns),
            sql.Identifier(table),
            sql.SQL(" where ") + where if where is not None else sql.SQL(""),
            sql.SQL(" order by ") + order if order is not None else sql.SQL(""),
            sql.SQL(" limit {}").format(sql.Literal(min(limit or self.max_rows, self.max_rows))),
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
