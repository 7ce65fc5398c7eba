"""What jobkit's schema is, read from the catalog, as sorted text lines: two databases hold the same jobkit
schema when their lines are equal. Covers every object jobkit creates (in public and jobkit_private, and
its policies on realtime.messages): types and domains with their checks, tables with their columns,
defaults, constraints, indexes, Row Level Security, policies, triggers and grants, functions as
pg_get_functiondef prints them (body, settings, security) with their grants, and comments. The catalog
rather than pg_dump, so it reads any server version the tests run on (15 locally, 17 embedded)."""

from __future__ import annotations

from typing import Any

import psycopg

_SCHEMAS = "('public', 'jobkit_private')"
_QUERIES = {
    "schema": f"""
        select n.nspname, coalesce(obj_description(n.oid, 'pg_namespace'), ''), coalesce(n.nspacl::text, '')
        from pg_namespace n where n.nspname in {_SCHEMAS}""",
    "domain": f"""
        select t.typname, format_type(t.typbasetype, t.typtypmod), t.typnotnull, coalesce(t.typdefault, ''),
               coalesce((select string_agg(c.conname || ' ' || pg_get_constraintdef(c.oid), '; ' order by c.conname)
                         from pg_constraint c where c.contypid = t.oid), '')
        from pg_type t join pg_namespace n on n.oid = t.typnamespace
        where n.nspname in {_SCHEMAS} and t.typtype = 'd'""",
    "column": f"""
        select c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(pg_get_expr(d.adbin, d.adrelid), ''), coalesce(a.attacl::text, ''),
               coalesce(col_description(c.oid, a.attnum), '')
        from pg_class c join pg_namespace n on n.oid = c.relnamespace
        join pg_attribute a on a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
        left join pg_attrdef d on d.adrelid = c.oid and d.adnum = a.attnum
        where n.nspname in {_SCHEMAS} and c.relkind in ('r', 'p', 'v', 'c')""",
    "relation": f"""
        select c.relname, c.relkind, c.relrowsecurity, c.relforcerowsecurity, coalesce(c.relacl::text, ''),
               coalesce(obj_description(c.oid, 'pg_class'), '')
        from pg_class c join pg_namespace n on n.oid = c.relnamespace
        where n.nspname in {_SCHEMAS} and c.relkind in ('r', 'p', 'v', 'S')""",
    "constraint": f"""
        select c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid)
        from pg_constraint c join pg_namespace n on n.oid = c.connamespace
        where n.nspname in {_SCHEMAS} and c.conrelid <> 0""",
    "index": f"""
        select indexdef from pg_indexes where schemaname in {_SCHEMAS}""",
    "policy": """
        select schemaname, tablename, policyname, permissive, roles::text, cmd, coalesce(qual, ''),
               coalesce(with_check, '')
        from pg_policies
        where schemaname in ('public', 'jobkit_private')
           or (schemaname = 'realtime' and policyname like 'jobkit%')""",
    "trigger": """
        select pg_get_triggerdef(t.oid) from pg_trigger t
        where not t.tgisinternal and t.tgrelid = 'public.jobkit_jobs'::regclass""",
    "function": f"""
        select p.oid::regprocedure::text, pg_get_functiondef(p.oid), coalesce(p.proacl::text, ''),
               coalesce(obj_description(p.oid, 'pg_proc'), '')
        from pg_proc p join pg_namespace n on n.oid = p.pronamespace
        where n.nspname in {_SCHEMAS}""",
}


def snapshot(conn: psycopg.Connection[Any]) -> list[str]:
    """The jobkit schema of ``conn``'s database, one sorted line per object."""
    lines = []
    for kind, query in _QUERIES.items():
        for row in conn.execute(query).fetchall():
            values = row.values() if isinstance(row, dict) else row
            lines.append(" | ".join([kind, *map(str, values)]))
    return sorted(lines)
