-- Triggers on the jobs table (Realtime's are in 80_realtime.sql).

-- updated_at is kept current. jobkit's functions set it themselves (so the hot path runs no trigger
-- function); the WHEN clause makes the trigger fire only for an update that left it unchanged.
create function public.jobkit_touch() returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  new.updated_at := now();
  return new;
end;
$$;

create trigger jobkit_jobs_touch
  before update on public.jobkit_jobs
  for each row
  when (old.updated_at is not distinct from new.updated_at)
  execute function public.jobkit_touch();

-- A job deleted before it ended settles the jobs that wait for it as its cancellation would (0.5.1): those
-- with on_failure 'cancel' end cancelled, in cascade, and those with 'run' count it as ended. A user deleted
-- from auth.users takes their jobs with them (the foreign key's on delete cascade), and a job of another
-- owner, or of the app, that waited for one of them waited for ever (0.5.0). Row by row, and only for a job
-- that may be waited for without having ended: not for a finished one (prune's, whose waits were settled
-- when it ended), nor for the app's running ones, which jobkit deletes only as a completion with p_delete,
-- never while one waits for it (a delete of one by hand: cancel it first). So a worker's completions
-- pay a comparison per row and nothing more. As the owner: the cascade, or whoever deletes, may hold no
-- right on the pipeline tables.
create function jobkit_private.settle_deleted() returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if exists (select from public.jobkit_dependencies d where d.depends_on = old.id and d.outcome is null) then
    perform jobkit_private.release_waiters(array[old.id]);
  end if;
  return null;
end;
$$;

create trigger jobkit_jobs_settle_deleted
  after delete on public.jobkit_jobs
  for each row
  when (old.status in ('waiting', 'queued', 'retrying') or (old.status = 'running' and old.user_id is not null))
  execute function jobkit_private.settle_deleted();
