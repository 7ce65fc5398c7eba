-- jobkit 0.4.0, from 0.3.0: storage built for the hot path (issue 34; in progress, not released).
--
-- Locks, on a database with jobs in it:
-- * New functions: nothing anyone holds. Nothing here touches jobkit_jobs.
-- * jobkit_schema_version is replaced in place; a 0.3.0 worker keeps working through the upgrade.

-- A lock this migration must wait for, it waits for at most 5 s (unless whoever runs it set a bound of
-- their own, as `pgjobkit migrate --lock-timeout` does): then it fails, changing nothing, rather than queue
-- every worker behind a long transaction. Run it again when the database is quieter.
select set_config('lock_timeout', '5s', true) where current_setting('lock_timeout') = '0';

-- enqueue_many_ids_json: what an enqueue_many caller needs, as one JSON array in input order: each job's
-- id, whether this call inserted it, and its status ([{"id": ..., "inserted": ..., "status": ...}, ...]).
-- The payloads do not travel back (the whole job is jobkit_get's). One value, as jobkit_enqueue_many_json.
create function public.jobkit_enqueue_many_ids_json(p_jobs jsonb)
returns jsonb
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(jsonb_agg(jsonb_build_object('id', e.id, 'inserted', e.inserted, 'status', e.status)
                            order by e.ord), '[]'::jsonb)
  from public.jobkit_enqueue_many(p_jobs) e
$$;

revoke execute on function public.jobkit_enqueue_many_ids_json(jsonb) from public, anon, authenticated;

grant execute on function public.jobkit_enqueue_many_ids_json(jsonb) to service_role;

-- schema_version: the jobkit schema this database holds. Each migration from 0.2.0 on replaces it with
-- its own version; a worker reads it at start and refuses a database that is not at its version.
create or replace function public.jobkit_schema_version() returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '0.4.0' $$;
