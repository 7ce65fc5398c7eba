-- Names kept for one release after a rename, so that a function body of the release before, still running
-- while the migration that renamed them commits, finds what it calls when its plans are made again (a name
-- it cannot find is 42883, which a worker takes for a missing migration and stops on). Each forwards to the
-- new name; nothing of this release calls them. The next schema release drops them.

-- 0.5.1's settle: release_waiters (45_pipelines.sql) since 0.6.0.
create function jobkit_private.settle(p_ids uuid[])
returns void
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$ select jobkit_private.release_waiters(p_ids) $$;

-- 0.5.1's complete_held: complete_after_lock_wait (30_worker.sql) since 0.6.0.
create function jobkit_private.complete_held(
  p_ids uuid[], p_lease_tokens uuid[], p_results jsonb, p_delete boolean
)
returns uuid[]
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$ select jobkit_private.complete_after_lock_wait(p_ids, p_lease_tokens, p_results, p_delete) $$;
