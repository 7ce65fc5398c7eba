-- Schedules: recurring jobs, fired by the workers' schedulers through jobkit_fire_schedule.

-- schedule_set: create a schedule, or update the one of that name. The cron expression is parsed by
-- jobkit's schedulers (5 fields, or 6 with seconds first); here only its shape is checked. A new schedule,
-- a changed cron or time zone, and a schedule enabled again all start from now: nothing before is due.
create function public.jobkit_set_schedule(
  p_name text,
  p_cron text,
  p_type text,
  p_payload jsonb default '{}',
  p_timezone text default 'UTC',
  p_priority integer default 0,
  p_max_attempts integer default 3,
  p_misfire text default 'skip',
  p_enabled boolean default true
)
returns setof public.jobkit_schedules
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_problem text;
begin
  if p_name is null or char_length(p_name) not between 1 and 150 or p_name ~ '[\u0001-\u001f\u007f-\u009f]' then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_name must be 1 to 150 characters without control characters';
  end if;
  if p_cron is null or p_cron !~ '^\s*(\S+\s+){4,5}\S+\s*$' or char_length(p_cron) > 200 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_cron must be a cron expression of 5 fields (minute hour day month weekday) or 6 (seconds first)';
  end if;
  if p_timezone is null or char_length(p_timezone) not between 1 and 100
     or not exists (select from pg_catalog.pg_timezone_names z where z.name = p_timezone) then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_timezone %s is not a time zone; use an IANA name such as Europe/Berlin or UTC',
                       coalesce(quote_literal(left(p_timezone, 100)), 'null'));
  end if;
  if p_misfire is null or p_misfire not in ('skip', 'catch_up') then
    raise exception using errcode = 'JK001', message = 'jobkit: p_misfire must be skip or catch_up';
  end if;
  if p_enabled is null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_enabled must be true or false';
  end if;
  if p_payload is null or jsonb_typeof(p_payload) <> 'object' or octet_length(p_payload::text) > 65536 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_payload must be a JSON object of at most 64 KiB';
  end if;
  -- the job's own rules, as every enqueue checks them
  select c.problem into v_problem from public.jobkit_check_jobs(jsonb_build_array(jsonb_build_object(
    'type', p_type, 'priority', p_priority, 'max_attempts', p_max_attempts))) c;
  if found then
    raise exception using errcode = 'JK001', message = format('jobkit: %s', v_problem);
  end if;
  return query
  insert into public.jobkit_schedules as s
    (name, cron, timezone, type, payload, priority, max_attempts, misfire, enabled)
  values (p_name, p_cron, p_timezone, p_type, p_payload, coalesce(p_priority, 0), coalesce(p_max_attempts, 3),
          p_misfire, p_enabled)
  on conflict (name) do update
  set cron = excluded.cron, timezone = excluded.timezone, type = excluded.type, payload = excluded.payload,
      priority = excluded.priority, max_attempts = excluded.max_attempts, misfire = excluded.misfire,
      enabled = excluded.enabled, updated_at = now(),
      last_due_at = case when (s.cron, s.timezone) is distinct from (excluded.cron, excluded.timezone)
                              or (excluded.enabled and not s.enabled)
                         then greatest(s.last_due_at, now()) else s.last_due_at end
  returning s.*;
end;
$$;

-- schedule_delete: the schedule is gone (true when it existed); jobs it enqueued stay.
create function public.jobkit_delete_schedule(p_name text)
returns boolean
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  delete from public.jobkit_schedules s where s.name = p_name;
  return found;
end;
$$;

-- schedule_list: every schedule (at most 1000), by name, with the database's clock (db_now), which
-- schedulers compute due times against.
create function public.jobkit_list_schedules()
returns table (
  name text, cron text, timezone text, type text, payload jsonb, priority integer, max_attempts integer,
  misfire text, enabled boolean, last_due_at timestamptz, created_at timestamptz, updated_at timestamptz,
  db_now timestamptz
)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select s.name, s.cron, s.timezone, s.type, s.payload, s.priority, s.max_attempts, s.misfire, s.enabled,
         s.last_due_at, s.created_at, s.updated_at, now()
  from public.jobkit_schedules s
  order by s.name
  limit 1000
$$;

-- schedule_fire: enqueue the schedule's jobs for p_due (1 to 1000 due times, ascending, after last_due_at
-- and not after now()), each with run_after its due time and the idempotency key
-- 'jobkit:schedule:<name>:<due time in UTC>', and move last_due_at to the last of them; all under the
-- schedule's row lock, and only while last_due_at is still p_last_due_at. fired = false: another scheduler
-- fired first, or the schedule is disabled (nothing was enqueued; read the schedule again).
create function public.jobkit_fire_schedule(p_name text, p_last_due_at timestamptz, p_due timestamptz[])
returns table (fired boolean, enqueued integer, last_due_at timestamptz)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
#variable_conflict use_column
declare
  v_s public.jobkit_schedules;
  v_n integer;
begin
  select * into v_s from public.jobkit_schedules s where s.name = p_name for update;
  if not found then
    raise exception using errcode = 'JK002',
      message = format('jobkit: no schedule named %s', coalesce(quote_literal(left(p_name, 100)), 'null'));
  end if;
  if p_last_due_at is null or v_s.last_due_at <> p_last_due_at or not v_s.enabled then
    return query select false, 0, v_s.last_due_at;
    return;
  end if;
  if p_due is null or coalesce(array_ndims(p_due), 0) <> 1 or cardinality(p_due) > 1000
     or array_position(p_due, null) is not null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_due must be an array of 1 to 1000 due times';
  end if;
  if p_due[1] <= v_s.last_due_at or p_due[cardinality(p_due)] > now() or exists (
       select from unnest(p_due) with ordinality as d(t, i) where d.i > 1 and d.t <= p_due[d.i - 1]) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_due must be ascending, after the schedule''s last_due_at and not after now()';
  end if;
  select count(*) filter (where e.inserted) into v_n
  from public.jobkit_enqueue_many((
    select jsonb_agg(jsonb_build_object(
             'type', v_s.type, 'payload', v_s.payload, 'priority', v_s.priority,
             'max_attempts', v_s.max_attempts, 'run_after', d.t,
             'idempotency_key', 'jobkit:schedule:' || v_s.name || ':'
                                || to_char(d.t at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
           order by d.t)
    from unnest(p_due) as d(t))) e;
  update public.jobkit_schedules s
  set last_due_at = p_due[cardinality(p_due)], updated_at = now()
  where s.name = p_name;
  return query select true, v_n, p_due[cardinality(p_due)];
end;
$$;
