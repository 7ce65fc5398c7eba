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
