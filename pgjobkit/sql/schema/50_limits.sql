-- Per-type limits (the table is in 10_tables.sql; jobkit_claim obeys them).

-- limit_set: set a type's limits, every kind at once (a null removes that kind).
create function public.jobkit_set_limit(
  p_type text,
  p_max_running integer default null,
  p_max_starts integer default null,
  p_per_seconds double precision default null,
  p_max_running_per_key integer default null
)
returns setof public.jobkit_limits
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_type is null or char_length(p_type) not between 1 and 200 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_type must be a job type of 1 to 200 characters';
  end if;
  if p_max_running is not null and p_max_running not between 0 and 1000000 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_max_running must be between 0 (paused) and 1000000, or null for no limit';
  end if;
  if (p_max_starts is null) <> (p_per_seconds is null) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: give p_max_starts and p_per_seconds together (a rate: 3000 per 60 seconds), or neither';
  end if;
  if p_max_starts is not null and p_max_starts not between 1 and 100000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_max_starts must be between 1 and 100000';
  end if;
  if p_per_seconds is not null and not (p_per_seconds > 0 and p_per_seconds <= 86400) then
    raise exception using errcode = 'JK001', message = 'jobkit: p_per_seconds must be > 0 and <= 86400';
  end if;
  if p_max_running_per_key is not null and p_max_running_per_key not between 1 and 1000000 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_max_running_per_key must be between 1 and 1000000, or null for no limit';
  end if;
  if num_nonnulls(p_max_running, p_max_starts, p_max_running_per_key) = 0 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: give at least one limit; jobkit_delete_limit removes a type''s limits';
  end if;
  return query
  insert into public.jobkit_limits as l (type, max_running, max_starts, per_seconds, max_running_per_key, started)
  values (p_type, p_max_running, p_max_starts, p_per_seconds, p_max_running_per_key,
          (select count(*) from public.jobkit_starts s where s.type = p_type))
  on conflict (type) do update
  set max_running = excluded.max_running, max_starts = excluded.max_starts,
      per_seconds = excluded.per_seconds, max_running_per_key = excluded.max_running_per_key,
      updated_at = now()
  returning l.*;
end;
$$;

-- limit_delete: a type's limits are gone (true when it had some).
create function public.jobkit_delete_limit(p_type text)
returns boolean
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  delete from public.jobkit_limits l where l.type = p_type;
  if not found then
    return false;
  end if;
  delete from public.jobkit_starts s where s.type = p_type;
  return true;
end;
$$;

-- limit_list: every limit (at most 1000 types), with the type's running jobs and its starts in the window.
create function public.jobkit_list_limits()
returns table (
  type text, max_running integer, max_starts integer, per_seconds double precision,
  max_running_per_key integer, running bigint, started bigint, updated_at timestamptz
)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select l.type, l.max_running, l.max_starts, l.per_seconds, l.max_running_per_key,
         (select count(*) from public.jobkit_jobs j where j.status = 'running' and j.type = l.type),
         (select count(*) from public.jobkit_starts s
          where s.type = l.type and s.started_at > now() - make_interval(secs => l.per_seconds)),
         l.updated_at
  from public.jobkit_limits l
  order by l.type
  limit 1000
$$;
