-- jobkit 0.2.0, from 0.1 (20261203000000_jobkit.sql as jobkit 0.1 shipped it). One transaction; the next
-- migration (jobkit_0_2_0_validate) then checks the rows written before it against its new rules.
--
-- Locks, on a database with jobs in it (both brief: nothing here reads or rewrites jobkit_jobs):
-- * jobkit_jobs: ACCESS EXCLUSIVE to add the run_after check NOT VALID (new rows obey it at once).
-- * jobkit_schedules (payload becomes the domain jobkit_payload; read once) and jobkit_user_types (two
--   columns with defaults, no rewrite): ACCESS EXCLUSIVE, brief (small tables).
-- * functions: replaced in place, signatures and row types unchanged for every function a 0.1 worker
--   calls, so a 0.1 worker keeps claiming, heartbeating and completing through the upgrade, and the
--   statements it prepared stay valid. Renamed ones are dropped:
--   jobkit_limit_set/_delete/_list -> jobkit_set_limit / jobkit_delete_limit / jobkit_list_limits,
--   jobkit_schedule_set/_delete/_list/_fire -> jobkit_set_schedule / jobkit_delete_schedule /
--   jobkit_list_schedules / jobkit_fire_schedule, jobkit_list -> jobkit_list_jobs; jobkit_extend_lease is
--   gone (jobkit_heartbeat extends leases).

-- A lock this migration must wait for, it waits for at most 5 s (unless whoever runs it set a bound of
-- their own, as `pgjobkit migrate --lock-timeout` does): then it fails, changing nothing, rather than queue
-- every worker behind a long transaction. Run it again when the database is quieter.
select set_config('lock_timeout', '5s', true) where current_setting('lock_timeout') = '0';

-- Rules on values: enforced on every new value now, checked against older rows by the next migration.
alter domain public.jobkit_payload add constraint jobkit_payload_nests_at_most_100_deep
  check (not jsonb_path_exists(value, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")'))
  not valid;
alter domain public.jobkit_payload add constraint jobkit_payload_numbers_within_double_range
  check (not jsonb_path_exists(value,
    'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))'))
  not valid;
alter domain public.jobkit_result add constraint jobkit_result_nests_at_most_100_deep
  check (not jsonb_path_exists(value, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")'))
  not valid;
alter domain public.jobkit_result add constraint jobkit_result_numbers_within_double_range
  check (not jsonb_path_exists(value,
    'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))'))
  not valid;

-- Tables ---------------------------------------------------------------------------------------------------
alter table public.jobkit_jobs add constraint jobkit_run_after_between_1970_and_9999
  check (run_after >= '1970-01-01 00:00:00+00' and run_after < '9999-01-01 00:00:00+00') not valid;
alter table public.jobkit_schedules alter column payload type public.jobkit_payload;

-- Users' jobs created per window, per type (cancelled ones count: no loop of enqueue and cancel).
alter table public.jobkit_user_types
  add column max_created_per_user integer not null default 60,
  add column per_seconds integer not null default 60,
  add constraint jobkit_user_types_created_valid check (max_created_per_user between 1 and 1000000),
  add constraint jobkit_user_types_per_seconds_valid check (per_seconds between 1 and 86400);

comment on schema jobkit_private is
  'jobkit: helpers and the checks behind the users'' functions; not exposed by the Data API.';
comment on table public.jobkit_limits is
  'jobkit: per-type limits every claim obeys (service_role; set them with jobkit_set_limit).';
comment on table public.jobkit_schedules is
  'jobkit: recurring jobs (service_role; manage them with jobkit_set_schedule / _delete).';

-- Functions ------------------------------------------------------------------------------------------------
drop function public.jobkit_extend_lease(uuid, uuid, double precision);
drop function public.jobkit_limit_set(text, integer, integer, double precision, integer);
drop function public.jobkit_limit_delete(text);
drop function public.jobkit_limit_list();
drop function public.jobkit_schedule_set(text, text, text, jsonb, text, integer, integer, text, boolean);
drop function public.jobkit_schedule_delete(text);
drop function public.jobkit_schedule_list();
drop function public.jobkit_schedule_fire(text, timestamptz, timestamptz[]);
drop function public.jobkit_list(text, text, uuid, timestamptz, uuid, integer);

-- Triggers on the jobs table (Realtime's are in 80_realtime.sql).

-- updated_at is kept current. jobkit's functions set it themselves (so the hot path runs no trigger
-- function); the WHEN clause makes the trigger fire only for an update that left it unchanged.
create or replace function public.jobkit_touch() returns trigger
language plpgsql
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  new.updated_at := now();
  return new;
end;
$$;

-- Enqueue: the rules a new job must meet, its fairness turn, and the enqueue functions.

-- How they plan. A queue table grows from empty to millions of rows within one worker session, and a plan
-- cached while it was small (a seq scan, a hash join) stays O(table) until the next ANALYZE (measured: a
-- single enqueue went from 0.8 ms to 55 ms after 100k jobs; again, by its fairness lookup, from 1.1 ms to
-- 2.8 ms within 5,000). So:
-- * functions whose every statement has an index made for it switch sequential scans off (and bitmap
--   scans, where a sort could follow), so whatever plan they cache reads by index: jobkit_enqueue,
--   jobkit_fair_round, the users' enqueue, and the hot path below;
-- * jobkit_claim and jobkit_complete, called once per batch by every worker, plan each statement once per
--   session (plan_cache_mode = force_generic_plan; PostgreSQL plans again after each VACUUM or ANALYZE of
--   the table): with those scans off, the index made for a statement is its only sensible plan, and
--   planning afresh on every call cost a fifth of a batch-50 claim (measured: 10,545 against 13,482 jobs/s);
-- * the other set-based ones plan each call afresh (force_custom_plan), sized from the table's current
--   pages, for a few tens of microseconds.

-- check_jobs: the rules every job to enqueue must meet, for a whole batch in one call: the first element
-- (0-based) with a problem, and the problem as text; no row when all are good. p_jobs is a JSON array of
-- objects with keys type (required), payload, idempotency_key, priority, max_attempts, user_id, fair_key,
-- and at most one of run_after (timestamp) / delay_seconds (number). JSON shapes are checked before the
-- values they guard are cast. One call per batch: a function with its own search_path is never inlined, so
-- a call per element would cost its overhead (about 4 us) on every job. PL/pgSQL, because it keeps its plan for the
-- session: a SQL function that is not inlined plans its body on every call (+0.35 ms per single enqueue).
create or replace function public.jobkit_check_jobs(p_jobs jsonb)
returns table (idx integer, problem text)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  return query
  select (o.ord - 1)::integer, p.problem
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  cross join lateral (select case
    when jsonb_typeof(o.e) <> 'object' then 'must be a JSON object'
    when o.e - '{type,payload,idempotency_key,priority,max_attempts,user_id,run_after,delay_seconds,fair_key}'::text[]
         <> '{}'::jsonb
      then 'has an unknown key; allowed: type, payload, idempotency_key, priority, max_attempts, '
           'user_id, run_after, delay_seconds, fair_key'
    when jsonb_typeof(o.e -> 'type') is distinct from 'string'
      then 'type is required and must be a string'
    when char_length(o.e ->> 'type') not between 1 and 200 then 'type must be 1 to 200 characters'
    -- explicit ranges (C0, DEL, C1), not [[:cntrl:]], whose meaning follows the database's locale
    when (o.e ->> 'type') ~ '[\u0001-\u001f\u007f-\u009f]' then 'type must not contain control characters'
    when coalesce(jsonb_typeof(o.e -> 'payload'), 'object') not in ('object', 'null')
      then 'payload must be a JSON object'
    when coalesce(jsonb_typeof(o.e -> 'idempotency_key'), 'null') not in ('string', 'null')
      then 'idempotency_key must be a string or null'
    when char_length(o.e ->> 'idempotency_key') not between 1 and 200
      then 'idempotency_key must be 1 to 200 characters'
    when coalesce(jsonb_typeof(o.e -> 'priority'), 'null') not in ('number', 'null')
      then 'priority must be an integer'
    when (o.e ->> 'priority')::numeric not between -1000000 and 1000000
      or (o.e ->> 'priority')::numeric <> trunc((o.e ->> 'priority')::numeric)
      then 'priority must be an integer between -1000000 and 1000000'
    when coalesce(jsonb_typeof(o.e -> 'max_attempts'), 'null') not in ('number', 'null')
      then 'max_attempts must be an integer'
    when (o.e ->> 'max_attempts')::numeric not between 1 and 1000
      or (o.e ->> 'max_attempts')::numeric <> trunc((o.e ->> 'max_attempts')::numeric)
      then 'max_attempts must be an integer between 1 and 1000'
    when coalesce(jsonb_typeof(o.e -> 'user_id'), 'null') not in ('string', 'null')
      then 'user_id must be a uuid string or null'
    when (o.e ->> 'user_id') !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
      then 'user_id must be a uuid'
    when coalesce(jsonb_typeof(o.e -> 'run_after'), 'null') not in ('string', 'null')
      then 'run_after must be an ISO 8601 timestamp string'
    when not ((o.e ->> 'run_after')::timestamptz >= '1970-01-01 00:00:00+00'
              and (o.e ->> 'run_after')::timestamptz < '9999-01-01 00:00:00+00')
      then 'run_after must be from 1970 to the end of 9998 (a time every client can read)'
    when coalesce(jsonb_typeof(o.e -> 'delay_seconds'), 'null') not in ('number', 'null')
      then 'delay_seconds must be a number'
    when (o.e ->> 'delay_seconds')::numeric not between 0 and 315576000
      then 'delay_seconds must be between 0 and 315576000 (ten years)'
    when jsonb_typeof(o.e -> 'run_after') = 'string' and jsonb_typeof(o.e -> 'delay_seconds') = 'number'
      then 'give run_after or delay_seconds, not both'
    when octet_length((o.e -> 'payload')::text) > 1048576
      then 'payload must be at most 1 MiB as JSON text'
    when coalesce(jsonb_typeof(o.e -> 'fair_key'), 'null') not in ('string', 'null')
      then 'fair_key must be a string or null'
    when char_length(o.e ->> 'fair_key') not between 1 and 200 then 'fair_key must be 1 to 200 characters'
  end as problem) p
  where p.problem is not null
  order by o.ord
  limit 1;
end;
$$;

-- fair_round: the turn a new job of (p_type, p_priority) takes. Jobs of equal priority are claimed turn by
-- turn (jobkit_jobs_claim's order), and a key's jobs take one turn each: its first waiting job the turn
-- being served now (the lowest turn among runnable jobs of the type and priority), each later one the turn
-- after its key's last waiting job. So a key with one job waits behind at most one job of each other key,
-- however many that key queued before it. A job without a key (no fair_key, no user_id) takes the turn being
-- served, like a key's first job. Keys name groups, not rows: a burst enqueued by several sessions at once
-- may share turns (one job per session and turn).
create or replace function public.jobkit_fair_round(p_type text, p_priority integer, p_fair_key text)
returns integer
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
  v_now  integer;
  v_last integer;
begin
  select j.fair_round into v_now from public.jobkit_jobs j
  where j.status in ('queued', 'retrying') and j.priority = p_priority and j.run_after <= now()
    and j.type = p_type
  order by j.priority desc, j.fair_round
  limit 1;
  if p_fair_key is not null then
    select j.fair_round + 1 into v_last from public.jobkit_jobs j
    where j.type = p_type and j.fair_key = p_fair_key and j.status in ('queued', 'retrying')
    order by j.type, j.fair_key, j.fair_round desc
    limit 1;
  end if;
  return greatest(coalesce(v_now, 0), coalesce(v_last, 0));
end;
$$;

-- enqueue_many: p_jobs as jobkit_check_jobs takes it, at most 10000 jobs. Returns one row per input
-- element, in input order: the job, and whether this call inserted it (false: a live job already held the
-- idempotency key, earlier in this batch or before). Nothing is written when any element is bad. Over
-- PostgREST call jobkit_enqueue_many_json instead (more than 1000 rows would be cut).
create or replace function public.jobkit_enqueue_many(p_jobs jsonb)
returns table (
  ord bigint, inserted boolean,
  id uuid, user_id uuid, type public.jobkit_type, status public.jobkit_status, payload public.jobkit_payload,
  idempotency_key public.jobkit_key, attempts integer, max_attempts public.jobkit_max_attempts,
  priority public.jobkit_priority, run_after timestamptz, lease_until timestamptz,
  lease_token uuid,
  claimed_by public.jobkit_worker, error public.jobkit_error, created_at timestamptz, updated_at timestamptz,
  fair_key public.jobkit_fair_key, fair_round public.jobkit_fair_round
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
#variable_conflict use_column
declare
  v_n        integer;
  v_ids      uuid[];
  v_bad      record;
  v_inserted integer;
  v_total    integer := 0;
  v_found    integer;
  v_types    text;
begin
  if p_jobs is null or jsonb_typeof(p_jobs) <> 'array' then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_jobs must be a JSON array of job objects',
      hint = 'pass [{"type": "embed", "payload": {...}}, ...]';
  end if;
  v_n := jsonb_array_length(p_jobs);
  if v_n = 0 then
    return;
  end if;
  if v_n > 10000 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_jobs holds %s jobs; at most 10000 per call', v_n),
      hint = 'split the batch';
  end if;

  -- Validate every element before writing anything; report the first problem with its index.
  select * into v_bad from public.jobkit_check_jobs(p_jobs);
  if found then
    raise exception using errcode = 'JK001',
      message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;

  -- Ids are chosen here so each inserted row maps back to its input element.
  v_ids := array(select gen_random_uuid() from generate_series(1, v_n));

  -- Insert what no live job holds yet; read back the job each element got. A conflicting job that
  -- turned dead between the two statements frees its key: loop and insert for the elements left.
  for v_attempt in 1..10 loop
    -- Turns (jobkit_fair_round) are looked up once per (type, priority, key) in the batch; a key's jobs
    -- then take consecutive turns in input order.
    with els as (
      select o.ord, o.e, o.e ->> 'type' as t, coalesce((o.e ->> 'priority')::integer, 0) as p,
             coalesce(o.e ->> 'fair_key', (o.e ->> 'user_id')::uuid::text) as k
      from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
      where v_attempt = 1 or not exists (select from public.jobkit_jobs j where j.id = v_ids[o.ord::integer])
    ), turns as materialized (  -- one call per group, not one per row of the join
      select g.t, g.p, g.k, public.jobkit_fair_round(g.t, g.p, g.k) as base
      from (select distinct els.t, els.p, els.k from els) g
    )
    insert into public.jobkit_jobs
      (id, user_id, type, payload, idempotency_key, priority, max_attempts, run_after, fair_key, fair_round)
    select v_ids[o.ord::integer], (o.e ->> 'user_id')::uuid, o.t,
           coalesce(nullif(o.e -> 'payload', 'null'::jsonb), '{}'::jsonb),
           o.e ->> 'idempotency_key', o.p,
           coalesce((o.e ->> 'max_attempts')::integer, 3),
           coalesce((o.e ->> 'run_after')::timestamptz,
                    now() + make_interval(secs => coalesce((o.e ->> 'delay_seconds')::double precision, 0))),
           o.k,
           t.base + case when o.k is null then 0
                         else (row_number() over (partition by o.t, o.p, o.k order by o.ord) - 1)::integer end
    from els o
    join turns t on t.t = o.t and t.p = o.p and t.k is not distinct from o.k
    order by o.ord
    on conflict (idempotency_key) where idempotency_key is not null and status not in ('dead', 'cancelled')
    do nothing;
    get diagnostics v_inserted = row_count;
    v_total := v_total + v_inserted;
    exit when v_total = v_n;  -- every element is a new job: nothing to settle

    select count(*) into v_found
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
    where exists (select from public.jobkit_jobs j where j.id = v_ids[o.ord::integer])
       or exists (select from public.jobkit_jobs j
                  where j.idempotency_key = o.e ->> 'idempotency_key' and j.status not in ('dead', 'cancelled'));
    exit when v_found = v_n;
    if v_attempt = 10 then
      raise exception using errcode = '40001',
        message = 'jobkit: enqueue could not settle idempotency keys under contention; retry';
    end if;
  end loop;

  -- Wake LISTENing workers once per type runnable now (a deduplicated element may wake them needlessly:
  -- a claim that finds nothing). The types are read from the input: looking the new rows up again by id
  -- became a 25 ms scan as the table grew.
  if v_total > 0 then
    select string_agg(distinct o.e ->> 'type', ',') into v_types
    from jsonb_array_elements(p_jobs) as o(e)
    where coalesce((o.e ->> 'run_after')::timestamptz <= now(), true)
      and coalesce((o.e ->> 'delay_seconds')::double precision <= 0, true);
    if v_types is not null then
      perform pg_notify('jobkit_jobs', v_types);
    end if;
  end if;

  return query
  select o.ord, m.inserted,
         m.id, m.user_id, m.type, m.status, m.payload, m.idempotency_key, m.attempts, m.max_attempts,
         m.priority, m.run_after, m.lease_until, m.lease_token, m.claimed_by, m.error,
         m.created_at, m.updated_at, m.fair_key, m.fair_round
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  cross join lateral (
    (select true as inserted, j.* from public.jobkit_jobs j where j.id = v_ids[o.ord::integer])
    union all
    (select false, j.* from public.jobkit_jobs j
     where j.idempotency_key = o.e ->> 'idempotency_key' and j.status not in ('dead', 'cancelled'))
    limit 1
  ) m
  order by o.ord;
end;
$$;

-- enqueue_many_json: jobkit_enqueue_many's rows as one JSON array, in input order. One value is one row to
-- PostgREST, whose max-rows would cut the set-returning call at 1000 rows while all of them were inserted.
create or replace function public.jobkit_enqueue_many_json(p_jobs jsonb)
returns jsonb
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(jsonb_agg(to_jsonb(e) order by e.ord), '[]'::jsonb)
  from public.jobkit_enqueue_many(p_jobs) e
$$;

-- enqueue: one job, the same rules (jobkit_check_jobs) and result as enqueue_many, in one insert. Its
-- statements each have an index, and sequential scans are off, so the session's cached plans stay index-bound
-- however the table grows.
create or replace function public.jobkit_enqueue(
  p_type text,
  p_payload jsonb default '{}',
  p_idempotency_key text default null,
  p_priority integer default 0,
  p_max_attempts integer default 3,
  p_user_id uuid default null,
  p_run_after timestamptz default null,
  p_delay_seconds double precision default null,
  p_fair_key text default null
)
returns table (
  inserted boolean,
  id uuid, user_id uuid, type public.jobkit_type, status public.jobkit_status, payload public.jobkit_payload,
  idempotency_key public.jobkit_key, attempts integer, max_attempts public.jobkit_max_attempts,
  priority public.jobkit_priority, run_after timestamptz, lease_until timestamptz,
  lease_token uuid,
  claimed_by public.jobkit_worker, error public.jobkit_error, created_at timestamptz, updated_at timestamptz,
  fair_key public.jobkit_fair_key, fair_round public.jobkit_fair_round
)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
#variable_conflict use_column
declare
  v_payload  jsonb := coalesce(nullif(p_payload, 'null'::jsonb), '{}'::jsonb);
  v_bad      record;
  v_job      public.jobkit_jobs;
  v_inserted boolean;
  v_key      text;
begin
  -- jobkit_check_jobs's rules for typed arguments, as one expression PL/pgSQL evaluates on its fast path
  -- (a few us, where calling jobkit_check_jobs costs 40-90 us of executor start-up). It is a filter, not the
  -- rules: a job it flags goes to jobkit_check_jobs, which names the problem. It must flag every job
  -- jobkit_check_jobs refuses (a test holds the two together); a null condition counts as not flagged.
  if p_type is null or char_length(p_type) not between 1 and 200 or p_type ~ '[\u0001-\u001f\u007f-\u009f]'
     or jsonb_typeof(v_payload) <> 'object' or octet_length(v_payload::text) > 1048576
     or char_length(p_idempotency_key) not between 1 and 200
     or p_priority not between -1000000 and 1000000 or p_max_attempts not between 1 and 1000
     or p_delay_seconds not between 0 and 315576000 or (p_run_after is not null and p_delay_seconds is not null)
     or not (p_run_after >= '1970-01-01 00:00:00+00' and p_run_after < '9999-01-01 00:00:00+00')
     or char_length(p_fair_key) not between 1 and 200
  then
    select * into v_bad from public.jobkit_check_jobs(jsonb_build_array(jsonb_build_object(
      'type', p_type, 'payload', v_payload, 'idempotency_key', p_idempotency_key, 'priority', p_priority,
      'max_attempts', p_max_attempts, 'user_id', p_user_id, 'run_after', p_run_after,
      'delay_seconds', p_delay_seconds, 'fair_key', p_fair_key)));
    if found then
      raise exception using errcode = 'JK001', message = format('jobkit: %s', v_bad.problem);
    end if;
  end if;

  v_key := coalesce(p_fair_key, p_user_id::text);

  -- One statement on the common path: each statement PL/pgSQL runs starts an executor, so the job's turn (as
  -- jobkit_fair_round takes it, without the cost of calling a function that has its own search_path) is
  -- looked up inside the insert, and the answer is the function's own output row, not a query (measured in
  -- make bench, one per call, prepared, with enqueue_ids reading back only the id: 0.68 -> 0.82-0.88x
  -- pgmq's send).
  -- A conflicting job that turned dead between the insert and the read frees its key: try again.
  for v_attempt in 1..10 loop
    insert into public.jobkit_jobs
      (user_id, type, payload, idempotency_key, priority, max_attempts, run_after, fair_key, fair_round)
    values (p_user_id, p_type, v_payload, p_idempotency_key, coalesce(p_priority, 0),
            coalesce(p_max_attempts, 3),
            coalesce(p_run_after, now() + make_interval(secs => coalesce(p_delay_seconds, 0))),
            v_key,
            greatest(
              coalesce((select j.fair_round from public.jobkit_jobs j
                        where j.status in ('queued', 'retrying') and j.priority = coalesce(p_priority, 0)
                          and j.run_after <= now() and j.type = p_type
                        order by j.priority desc, j.fair_round limit 1), 0),
              coalesce((select j.fair_round + 1 from public.jobkit_jobs j
                        where v_key is not null and j.type = p_type and j.fair_key = v_key
                          and j.status in ('queued', 'retrying')
                        order by j.type, j.fair_key, j.fair_round desc limit 1), 0)))
    on conflict (idempotency_key) where idempotency_key is not null and status not in ('dead', 'cancelled')
    do nothing
    returning * into v_job;
    v_inserted := found;
    if not v_inserted then
      select * into v_job from public.jobkit_jobs j
      where j.idempotency_key = p_idempotency_key and j.status not in ('dead', 'cancelled');
    end if;
    exit when v_job.id is not null;
    if v_attempt = 10 then
      raise exception using errcode = '40001',
        message = 'jobkit: enqueue could not settle its idempotency key under contention; retry';
    end if;
  end loop;

  if v_inserted and v_job.run_after <= now() then
    perform pg_notify('jobkit_jobs', v_job.type);  -- wake LISTENing workers
  end if;
  inserted := v_inserted; id := v_job.id; user_id := v_job.user_id; type := v_job.type;
  status := v_job.status; payload := v_job.payload; idempotency_key := v_job.idempotency_key;
  attempts := v_job.attempts; max_attempts := v_job.max_attempts; priority := v_job.priority;
  run_after := v_job.run_after; lease_until := v_job.lease_until; lease_token := v_job.lease_token;
  claimed_by := v_job.claimed_by; error := v_job.error; created_at := v_job.created_at;
  updated_at := v_job.updated_at; fair_key := v_job.fair_key; fair_round := v_job.fair_round;
  return next;
end;
$$;

-- The worker's functions: claim (with completions folded in), complete, fail, heartbeat, progress,
-- release, and taking back expired leases. Every change after a claim is fenced by the lease token.

-- reclaim_expired: running jobs whose lease ran out go back to retrying (runnable at once), or to
-- dead when their attempts are used up (a job that kills its worker every time ends dead). At most
-- least(p_limit, 1000) per call, oldest lease first: call again while it returns that many.
create or replace function public.jobkit_reclaim_expired(p_limit integer default 1000)
returns table (id uuid, status text, attempts integer)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
#variable_conflict use_column
begin
  if p_limit is null or p_limit < 1 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_limit must be >= 1 (got %s)', coalesce(p_limit::text, 'null'));
  end if;
  return query
  with expired as (
    select j.id from public.jobkit_jobs j
    where j.status = 'running' and j.lease_until <= now()
    order by j.lease_until
    limit least(p_limit, 1000)
    for update skip locked
  )
  update public.jobkit_jobs j
  set status = case when j.attempts >= j.max_attempts then 'dead' else 'retrying' end,
      run_after = now(),
      lease_until = null,
      lease_token = null,
      error = format('lease expired on attempt %s (its worker stopped or was too slow)', j.attempts),
      updated_at = now()
  from expired
  where j.id = expired.id
  returning j.id, j.status::text, j.attempts;
end;
$$;

-- complete_held: the completions of jobkit_complete and jobkit_claim that found their row held by another
-- transaction, one at a time, each waiting at most lock_timeout for it. A concurrent claim that passed over a
-- job it no longer wanted holds the row until it commits (PostgreSQL keeps the lock it took on the newest
-- version of a row that then failed the claim's conditions), for a moment; a transaction kept open on it
-- (a user's own cancel, on a direct SQL session) is waited for no longer than the bound, and the job counts
-- as lost, as the cancel makes it. The ids completed.
create or replace function jobkit_private.complete_held(
  p_ids uuid[], p_lease_tokens uuid[], p_results jsonb, p_delete boolean
)
returns uuid[]
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set lock_timeout = '250ms'
as $$
declare
  v_done uuid[] := '{}';
  v_pair record;
  v_owner uuid;
begin
  for v_pair in
    select i.id, i.token from unnest(p_ids, p_lease_tokens) as i(id, token)
    where exists (select from public.jobkit_jobs j where j.id = i.id and j.lease_token = i.token)
  loop
    begin
      select j.user_id into v_owner from public.jobkit_jobs j
      where j.id = v_pair.id and j.lease_token = v_pair.token
      for no key update;
      if found then
        if p_delete and v_owner is null then
          delete from public.jobkit_jobs j where j.id = v_pair.id;
        else
          update public.jobkit_jobs j
          set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now(), progress = 1,
              result = p_results -> j.id::text
          where j.id = v_pair.id;
        end if;
        v_done := v_done || v_pair.id;
      end if;
    exception when lock_not_available then
      null;  -- held past the bound: passed over, as lost
    end;
  end loop;
  return v_done;
end;
$$;

-- claim: up to p_limit runnable jobs of the given types: highest priority first, then the earliest turn
-- (jobkit_fair_round: keys take turns), then oldest run_after, then oldest created_at. Expired leases are
-- reclaimed first, in the same round trip.
-- With p_done_ids / p_done_tokens (at most 1000) it first completes those jobs exactly as jobkit_complete
-- does (p_done_delete as its p_delete) and returns each one completed (id and status succeeded, nothing
-- else) before the claimed rows (status running): one round trip and one commit per batch instead of two.
-- A done id not returned lost its lease.
-- The rows returned never exceed 1000: at most 999 are claimed, and no more than 1000 less the completed
-- rows, so no job is ever leased to a caller whose answer PostgREST cut.
--
-- Flow control: a type with a row in jobkit_limits is claimed holding that row's lock, so concurrent claims
-- of it take turns and none can exceed it. Under the lock it counts the type's running jobs (expired leases
-- were just reclaimed, so a lost worker's slots come back when its leases end) and its starts within the
-- last per_seconds (jobkit_starts, logged at clock_timestamp() taken under the lock). A type at a limit is
-- left out of the claim; a key at max_running_per_key is passed over (at most 1000 rows per claim). Types
-- without a row take no lock and pay one primary-key probe.
--
-- How it plans (measured under churn on the benchmark machine): the pick must be an ordered scan of
-- jobkit_jobs_claim that stops at p_limit rows. Statistics go stale between autovacuums and the planner
-- may pick a bitmap scan plus sort, which reads every dead entry of the index and cannot mark them dead
-- (30x slower after 100k jobs), or join the picked rows back by hashing a sequential scan of the whole
-- table (4.6 ms of a 50-job claim at 10k rows). Every statement here has an index made for it and the
-- queue's pages are in cache, so bitmap and sequential scans are switched off while it runs, and rows are
-- reached by primary key (test_migrations reads the plans it runs).
create or replace function public.jobkit_claim(
  p_types text[],
  p_worker text,
  p_lease_seconds double precision,
  p_limit integer default 1,
  p_done_ids uuid[] default null,
  p_done_tokens uuid[] default null,
  p_done_results jsonb default null,
  p_done_delete boolean default false
)
returns setof public.jobkit_jobs
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
set enable_bitmapscan = off
set enable_seqscan = off
as $$
declare
  v_completed integer := 0;
  v_need      integer;
  v_types     text[] := p_types;  -- the types this claim may still take
  v_now       timestamptz := now();
  v_lim       record;
  v_ltypes    text[] := '{}'::text[];     -- limited types still open; v_left: how many more of each may start
  v_left      integer[] := '{}'::integer[];
  v_kcap      integer[] := '{}'::integer[];  -- their max_running_per_key (null: none)
  v_rated     text[] := '{}'::text[];     -- types whose starts are logged
  v_keys      text[] := '{}'::text[];     -- type || chr(31) || key, for keys with running jobs of a capped type,
  v_kcount    integer[] := '{}'::integer[];  -- and how many they run (this claim's included)
  v_ids       uuid[] := '{}'::uuid[];
  v_row       record;
  v_i         integer;
  v_k         integer;
  v_more      boolean;
  v_passed    integer := 0;
  v_gone      integer;
  v_done      uuid[];
  v_rest      record;
begin
  if p_types is null or array_ndims(p_types) is distinct from 1 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_types must be a non-empty array of job types without nulls or empty strings';
  end if;
  if array_position(p_types, null) is not null or exists (select from unnest(p_types) t where t = '') then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_types must be a non-empty array of job types without nulls or empty strings';
  end if;
  if p_worker is null or char_length(p_worker) not between 1 and 200 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_worker must be a worker name of 1 to 200 characters';
  end if;
  if p_lease_seconds is null or not (p_lease_seconds > 0 and p_lease_seconds <= 86400) then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_lease_seconds must be > 0 and <= 86400 (got %s)',
                       coalesce(p_lease_seconds::text, 'null'));
  end if;
  if p_limit is null or p_limit < 1 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_limit must be >= 1 (got %s)', coalesce(p_limit::text, 'null'));
  end if;
  if p_done_delete is null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_done_delete must be true or false';
  end if;

  if p_done_ids is not null or p_done_tokens is not null then
    if p_done_ids is null or p_done_tokens is null or coalesce(array_ndims(p_done_ids), 1) <> 1
       or coalesce(array_ndims(p_done_tokens), 1) <> 1
       or cardinality(p_done_ids) <> cardinality(p_done_tokens) or cardinality(p_done_ids) > 1000 then
      raise exception using errcode = 'JK001',
        message = 'jobkit: p_done_ids and p_done_tokens must be arrays of equal length (at most 1000)';
    end if;
    -- jobkit_complete's statement, written out: calling jobkit_complete instead cost 3% of the batch-50
    -- database loop (measured; a contract test holds both paths to the same outcome). A completed job
    -- comes back as its id and status only, the other columns null: the caller knows the job, and a
    -- batch's payloads need not travel back to be ignored. The claim below is a second statement, so its
    -- snapshot sees these jobs finished. A lease token is set exactly when a job is running
    -- (jobkit_jobs_lease_iff_running), so matching it is the whole fence.
    with mine as (  -- rows another transaction holds are done after (jobkit_private.complete_held)
      select j.id, j.user_id from public.jobkit_jobs j
      where j.id = any(p_done_ids)
        and (j.id, j.lease_token) in (select * from unnest(p_done_ids, p_done_tokens))
      for no key update skip locked
    ), kept as (
      update public.jobkit_jobs j
      set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now(), progress = 1,
          result = p_done_results -> j.id::text
      from mine
      where j.id = mine.id and not (p_done_delete and mine.user_id is null)
      returning j.id
    ), deleted as (
      delete from public.jobkit_jobs j
      using mine
      where p_done_delete and mine.user_id is null and j.id = mine.id
      returning j.id
    ), done as (
      select kept.id from kept union all select deleted.id from deleted
    )
    select coalesce(array_agg(done.id), '{}') into v_done from done;
    if cardinality(v_done) < cardinality(p_done_ids) then
      select array_agg(i.id) as ids, array_agg(i.token) as tokens into v_rest
      from unnest(p_done_ids, p_done_tokens) as i(id, token) where i.id <> all(v_done);
      v_done := v_done || jobkit_private.complete_held(v_rest.ids, v_rest.tokens, p_done_results, p_done_delete);
    end if;
    return query
    select d.id, null::uuid, null::public.jobkit_type, 'succeeded'::public.jobkit_status,
           null::public.jobkit_payload, null::public.jobkit_key, null::integer, null::public.jobkit_max_attempts,
           null::public.jobkit_priority, null::timestamptz, null::timestamptz, null::uuid,
           null::public.jobkit_worker, null::public.jobkit_error, null::timestamptz, null::timestamptz,
           null::public.jobkit_progress, null::public.jobkit_progress_message, null::public.jobkit_result,
           null::public.jobkit_fair_key, null::public.jobkit_fair_round, null::timestamptz
    from unnest(v_done) as d(id);
    v_completed := cardinality(v_done);
  end if;

  -- Cheap when nothing expired: one probe of the lease index.
  if exists (select from public.jobkit_jobs j where j.status = 'running' and j.lease_until <= now()) then
    perform public.jobkit_reclaim_expired(1000);
  end if;

  v_need := least(p_limit, 999, 1000 - v_completed);
  if v_need < 1 then
    return;
  end if;

  if exists (select from public.jobkit_limits l where l.type = any(p_types)) then
    perform from public.jobkit_limits l where l.type = any(p_types) order by l.type for update;
    v_now := clock_timestamp();  -- read under the lock: starts are logged in the order claims hold it
    for v_lim in select l.* from public.jobkit_limits l where l.type = any(p_types) order by l.type loop
      v_i := v_need;
      if v_lim.max_running is not null then
        v_i := least(v_i, v_lim.max_running - (select count(*)::integer from public.jobkit_jobs j
                                               where j.status = 'running' and j.type = v_lim.type));
      end if;
      if v_lim.max_starts is not null then
        -- started counts the type's rows in jobkit_starts (a count of them cost 0.23 ms at 900 starts)
        delete from public.jobkit_starts s
        where s.type = v_lim.type and s.started_at <= v_now - make_interval(secs => v_lim.per_seconds);
        get diagnostics v_gone = row_count;
        if v_gone > 0 then
          update public.jobkit_limits l set started = l.started - v_gone where l.type = v_lim.type;
        end if;
        v_i := least(v_i, v_lim.max_starts - (v_lim.started - v_gone));
        v_rated := v_rated || v_lim.type;
      end if;
      if v_i < 1 then
        v_types := array_remove(v_types, v_lim.type);
        continue;
      end if;
      v_ltypes := v_ltypes || v_lim.type;
      v_left := v_left || v_i;
      v_kcap := v_kcap || v_lim.max_running_per_key;
      if v_lim.max_running_per_key is not null then
        select v_keys || coalesce(array_agg(v_lim.type || chr(31) || g.k), '{}'),
               v_kcount || coalesce(array_agg(g.n), '{}')
        into v_keys, v_kcount
        from (select j.fair_key as k, count(*)::integer as n from public.jobkit_jobs j
              where j.status = 'running' and j.type = v_lim.type and j.fair_key is not null
              group by j.fair_key) g;
      end if;
    end loop;
    if cardinality(v_types) = 0 then
      return;
    end if;
  end if;

  if cardinality(v_ltypes) > 0 then
    -- Row by row: a type whose allowance is used up leaves the pick (the scan starts again without it); a
    -- key at its cap is passed over.
    loop
      v_more := false;
      for v_row in
        select j.id, j.type, j.fair_key from public.jobkit_jobs j
        where j.status in ('queued', 'retrying') and j.run_after <= now() and j.type = any(v_types)
          and j.id <> all(v_ids)
        order by j.priority desc, j.fair_round, j.run_after, j.created_at
        limit v_need + 1000 - v_passed
        for update skip locked
      loop
        v_i := array_position(v_ltypes, v_row.type);
        if v_i is not null and v_kcap[v_i] is not null and v_row.fair_key is not null then
          v_k := array_position(v_keys, v_row.type || chr(31) || v_row.fair_key);
          if v_k is null then
            v_keys := v_keys || (v_row.type || chr(31) || v_row.fair_key);
            v_kcount := v_kcount || 1;
          elsif v_kcount[v_k] >= v_kcap[v_i] then
            v_passed := v_passed + 1;
            continue;
          else
            v_kcount[v_k] := v_kcount[v_k] + 1;
          end if;
        end if;
        v_ids := v_ids || v_row.id;
        v_need := v_need - 1;
        if v_i is not null then
          v_left[v_i] := v_left[v_i] - 1;
          if v_left[v_i] = 0 then
            v_types := array_remove(v_types, v_row.type);
            v_more := true;
          end if;
        end if;
        exit when v_need = 0 or v_more;
      end loop;
      exit when not v_more or v_need = 0 or cardinality(v_types) = 0;
    end loop;
    if cardinality(v_ids) = 0 then
      return;
    end if;
  end if;

  -- Without limits the pick is part of the update's statement (one statement, as before limits existed).
  return query
  with picked as (
    select j.id from public.jobkit_jobs j
    where cardinality(v_ltypes) = 0
      and j.status in ('queued', 'retrying') and j.run_after <= now() and j.type = any(v_types)
    order by j.priority desc, j.fair_round, j.run_after, j.created_at
    limit v_need
    for update skip locked
  ), claimed as (
    update public.jobkit_jobs j
    set status = 'running',
        attempts = j.attempts + 1,
        lease_until = now() + make_interval(secs => p_lease_seconds),
        lease_token = gen_random_uuid(),
        claimed_by = p_worker,
        updated_at = now(),
        started_at = v_now,
        progress = null,  -- each attempt reports its own
        progress_message = null
    where j.id = any(v_ids || array(select picked.id from picked))
    returning j.*
  ), logged as (
    insert into public.jobkit_starts (type, started_at, n)
    select c.type, v_now, row_number() over () from claimed c where c.type = any(v_rated)
  ), counted as (
    update public.jobkit_limits l set started = l.started + x.n
    from (select c.type, count(*)::integer as n from claimed c where c.type = any(v_rated) group by c.type) x
    where l.type = x.type
  )
  select * from claimed c order by c.priority desc, c.fair_round, c.run_after, c.created_at;
end;
$$;

-- complete: fenced by the lease token each claim hands out. p_results, when given, is a JSON object from
-- job id to what its handler returned (kept as the job's result; at most 64 KiB each, by CHECK); progress
-- becomes 1. With p_delete, jobs without an owner (user_id null) are deleted instead: no row, result or
-- idempotency key is kept (a later enqueue with the key makes a new job). A user's jobs are always kept, as
-- their owner lists them and watches them finish. p_delete is a one-time filter: left false, the delete is
-- never run. Returns one row per id (at most 1000): ok = false when the lease was lost (reclaimed, claimed
-- again, finished, or the job is gone); nothing changes then. Leaving status out of the condition (the
-- token is the fence, see jobkit_claim) keeps the planner on the primary key rather than a scan of every
-- running job's lease entry.
-- The rows nobody else holds are completed first, in one statement that does not wait; a row another
-- transaction holds is waited for alone, at most 250 ms (jobkit_private.complete_held), so that a
-- transaction kept open on one job (a user's own cancel, on a direct SQL session) cannot stall the
-- completions of every other job in the batch. fail and release wait as long for their one row;
-- heartbeat and progress pass a held row over (its lease is extended, its progress written, at the next
-- beat). Taking the locks first costs nothing measurable (claim + complete at batch 50: the same jobs/s and
-- WAL bytes per job).
create or replace function public.jobkit_complete(
  p_ids uuid[],
  p_lease_tokens uuid[],
  p_results jsonb default null,
  p_delete boolean default false
)
returns table (id uuid, ok boolean)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_generic_plan
set enable_bitmapscan = off
set enable_seqscan = off
as $$
#variable_conflict use_column
declare
  v_done uuid[];
  v_rest record;
begin
  if p_ids is null or p_lease_tokens is null or coalesce(array_ndims(p_ids), 1) <> 1
     or coalesce(array_ndims(p_lease_tokens), 1) <> 1
     or cardinality(p_ids) <> cardinality(p_lease_tokens) or cardinality(p_ids) > 1000 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_ids and p_lease_tokens must be arrays of equal length (at most 1000)';
  end if;
  if p_delete is null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_delete must be true or false';
  end if;
  with mine as (  -- rows another transaction holds are done after (jobkit_private.complete_held)
    select j.id, j.user_id from public.jobkit_jobs j
    where j.id = any(p_ids)
      and (j.id, j.lease_token) in (select * from unnest(p_ids, p_lease_tokens))
    for no key update skip locked
  ), kept as (
    update public.jobkit_jobs j
    set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now(), progress = 1,
        result = p_results -> j.id::text
    from mine
    where j.id = mine.id and not (p_delete and mine.user_id is null)
    returning j.id
  ), deleted as (
    delete from public.jobkit_jobs j
    using mine
    where p_delete and mine.user_id is null and j.id = mine.id
    returning j.id
  ), done as (
    select kept.id from kept union all select deleted.id from deleted
  )
  select coalesce(array_agg(done.id), '{}') into v_done from done;
  if cardinality(v_done) < cardinality(p_ids) then
    select array_agg(i.id) as ids, array_agg(i.token) as tokens into v_rest
    from unnest(p_ids, p_lease_tokens) as i(id, token) where i.id <> all(v_done);
    v_done := v_done || jobkit_private.complete_held(v_rest.ids, v_rest.tokens, p_results, p_delete);
  end if;
  return query select i.id, i.id = any(v_done) from unnest(p_ids) as i(id);
end;
$$;

-- fail: fenced like complete. Retrying with run_after = now() + p_retry_delay_seconds, or dead when
-- the attempts are used up or p_permanent. The error text is kept, cut to 4000 characters.
create or replace function public.jobkit_fail(
  p_id uuid,
  p_lease_token uuid,
  p_error text,
  p_retry_delay_seconds double precision default 0,
  p_permanent boolean default false
)
returns table (id uuid, ok boolean, status text, attempts integer, run_after timestamptz)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
set lock_timeout = '250ms'  -- a row another transaction holds (see jobkit_complete)
as $$
#variable_conflict use_column
declare
  v_row record;
  v_ok  boolean;
begin
  if p_id is null or p_lease_token is null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_id and p_lease_token are required';
  end if;
  if p_retry_delay_seconds is null or not (p_retry_delay_seconds >= 0 and p_retry_delay_seconds <= 31557600)
  then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_retry_delay_seconds must be between 0 and 31557600 (got %s)',
                       coalesce(p_retry_delay_seconds::text, 'null'));
  end if;
  begin
    update public.jobkit_jobs j
    set status = case when p_permanent is true or j.attempts >= j.max_attempts then 'dead' else 'retrying' end,
        run_after = case when p_permanent is true or j.attempts >= j.max_attempts then j.run_after
                         else now() + make_interval(secs => p_retry_delay_seconds) end,
        lease_until = null,
        lease_token = null,
        error = left(coalesce(nullif(p_error, ''), 'failed (no error text)'), 4000),
        updated_at = now()
    where j.id = p_id and j.status = 'running' and j.lease_token = p_lease_token
    returning j.id, j.status, j.attempts, j.run_after into v_row;
    v_ok := found;
  exception when lock_not_available then
    v_ok := false;  -- held past the bound: passed over, as a lost lease
  end;
  if v_ok then
    return query select v_row.id, true, v_row.status::text, v_row.attempts, v_row.run_after::timestamptz;
  else
    return query select p_id, false, null::text, null::integer, null::timestamptz;
  end if;
end;
$$;

-- heartbeat: for each (id, lease token) a worker holds, at most 1000: held = false when the lease is lost
-- (the job was cancelled, reclaimed or finished elsewhere; status says which), so the worker stops its
-- handler. A held lease with less than two thirds of p_lease_seconds left is extended to the full lease;
-- the others are only read, so a beat costs one round trip and writes only the rows that need it.
create or replace function public.jobkit_heartbeat(p_ids uuid[], p_lease_tokens uuid[], p_lease_seconds double precision)
returns table (id uuid, held boolean, status text, lease_until timestamptz)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  if p_ids is null or p_lease_tokens is null or coalesce(array_ndims(p_ids), 1) <> 1
     or coalesce(array_ndims(p_lease_tokens), 1) <> 1
     or cardinality(p_ids) <> cardinality(p_lease_tokens) or cardinality(p_ids) > 1000 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_ids and p_lease_tokens must be arrays of equal length (at most 1000)';
  end if;
  if p_lease_seconds is null or not (p_lease_seconds > 0 and p_lease_seconds <= 86400) then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_lease_seconds must be > 0 and <= 86400 (got %s)',
                       coalesce(p_lease_seconds::text, 'null'));
  end if;
  return query
  with due as (  -- a row another transaction holds locked is extended at the next beat
    select j.id from public.jobkit_jobs j
    where j.id = any(p_ids)
      and (j.id, j.lease_token) in (select * from unnest(p_ids, p_lease_tokens))
      and j.lease_until < now() + make_interval(secs => p_lease_seconds * 2 / 3)
    for no key update skip locked
  ), extended as (
    update public.jobkit_jobs j
    set lease_until = now() + make_interval(secs => p_lease_seconds), updated_at = now()
    from due
    where j.id = due.id
    returning j.id, j.lease_until
  )
  select i.id, coalesce(j.lease_token = i.token, false), j.status::text,
         coalesce(e.lease_until, case when j.lease_token = i.token then j.lease_until end)
  from unnest(p_ids, p_lease_tokens) as i(id, token)
  left join public.jobkit_jobs j on j.id = i.id
  left join extended e on e.id = i.id;
end;
$$;

-- progress: what running handlers report, fenced like complete, at most 1000 per call: p_progress from 0 to
-- 1 and p_messages (null elements keep no message) of at most 200 characters. ok = false: the lease was
-- lost. Workers send the latest report of each job at most once a second, so a chatty handler writes a
-- row a second, not a row a call.
create or replace function public.jobkit_progress(
  p_ids uuid[], p_lease_tokens uuid[], p_progress double precision[], p_messages text[]
)
returns table (id uuid, ok boolean)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  if p_ids is null or p_lease_tokens is null or p_progress is null or p_messages is null
     or coalesce(array_ndims(p_ids), 1) <> 1 or coalesce(array_ndims(p_lease_tokens), 1) <> 1
     or coalesce(array_ndims(p_progress), 1) <> 1 or coalesce(array_ndims(p_messages), 1) <> 1
     or cardinality(p_ids) <> cardinality(p_lease_tokens) or cardinality(p_ids) <> cardinality(p_progress)
     or cardinality(p_ids) <> cardinality(p_messages) or cardinality(p_ids) > 1000 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_ids, p_lease_tokens, p_progress and p_messages must be arrays of equal length '
                '(at most 1000)';
  end if;
  if exists (select from unnest(p_progress) v where v is null or not (v between 0 and 1))
     or exists (select from unnest(p_messages) m where char_length(m) > 200) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_progress must be between 0 and 1, p_messages at most 200 characters';
  end if;
  return query
  with mine as (  -- a row another transaction holds locked is not written (ok = false)
    select j.id from public.jobkit_jobs j
    where j.id = any(p_ids) and (j.id, j.lease_token) in (select * from unnest(p_ids, p_lease_tokens))
    for no key update skip locked
  ), reported as (
    update public.jobkit_jobs j
    set progress = r.progress, progress_message = r.message, updated_at = now()
    from mine, unnest(p_ids, p_lease_tokens, p_progress, p_messages) as r(id, token, progress, message)
    where j.id = mine.id and j.id = r.id and j.lease_token = r.token
    returning j.id
  )
  select i.id, exists (select from reported where reported.id = i.id) from unnest(p_ids) as i(id);
end;
$$;

-- release: give a claimed job back unrun (a worker shutting down): the attempt is not counted and the
-- job is runnable at once. Fenced like complete; ok = false when the lease was already lost.
create or replace function public.jobkit_release(p_id uuid, p_lease_token uuid)
returns table (id uuid, ok boolean)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
set lock_timeout = '250ms'  -- a row another transaction holds (see jobkit_complete)
as $$
#variable_conflict use_column
declare
  v_released boolean;
begin
  if p_id is null or p_lease_token is null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_id and p_lease_token are required';
  end if;
  begin
    update public.jobkit_jobs j
    set status = case when j.attempts > 1 then 'retrying' else 'queued' end,
        attempts = j.attempts - 1,
        run_after = now(),
        lease_until = null,
        lease_token = null,
        updated_at = now()
    where j.id = p_id and j.status = 'running' and j.lease_token = p_lease_token;
    v_released := found;
  exception when lock_not_available then
    v_released := false;  -- held past the bound: passed over, as a lost lease
  end;
  return query select p_id, v_released;
end;
$$;

-- The operator's functions: cancel, requeue, prune, stats, get, list; and the schema's version.

-- cancel: queued, retrying and running jobs end cancelled at once, at most 1000 ids per call. A running
-- job's lease ends with it, so its worker's later complete, fail or heartbeat changes nothing; the worker
-- learns at its next heartbeat and stops the handler. Succeeded, dead and cancelled jobs are left as they
-- are. One row per id: cancelled = true when this call cancelled it, status as it is now (null: no such
-- job). p_reason (at most 4000 characters) is kept as the job's error.
create or replace function public.jobkit_cancel(p_ids uuid[], p_reason text default null)
returns table (id uuid, cancelled boolean, status text)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  if p_ids is null or coalesce(array_ndims(p_ids), 1) <> 1 or cardinality(p_ids) > 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_ids must be an array of at most 1000 ids';
  end if;
  return query
  with done as (
    update public.jobkit_jobs j
    set status = 'cancelled', lease_until = null, lease_token = null,
        error = left(coalesce(p_reason, 'cancelled'), 4000), updated_at = now()
    where j.id = any(p_ids) and j.status in ('queued', 'retrying', 'running')
    returning j.id
  )
  -- the statement's snapshot is from before the update: a row cancelled here reads as cancelled
  select i.id, d.id is not null, case when d.id is not null then 'cancelled' else j.status::text end
  from unnest(p_ids) as i(id)
  left join done d on d.id = i.id
  left join public.jobkit_jobs j on j.id = i.id;
end;
$$;

-- requeue: dead jobs back to queued with fresh attempts, at most p_limit (1 to 1000) per call, oldest
-- death first; call again while it returns p_limit rows. p_ids null means every dead job (of p_type, when
-- given). p_dead_before keeps a run of calls to the jobs that were dead when it began: pass the updated_at
-- of the first call's rows (a job requeued and dead again since is left for the next run). An id that does
-- not exist raises JK002; a job that is not dead is left alone; of dead jobs sharing an idempotency key only
-- the newest comes back, and none while a live job holds the key (that job already does the work).
create or replace function public.jobkit_requeue(
  p_ids uuid[] default null,
  p_type text default null,
  p_limit integer default 1000,
  p_dead_before timestamptz default null
)
returns setof public.jobkit_jobs
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_missing uuid;
begin
  if p_limit is null or p_limit not between 1 and 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_limit must be between 1 and 1000';
  end if;
  if p_ids is not null then
    if coalesce(array_ndims(p_ids), 1) <> 1 or cardinality(p_ids) > 10000 then
      raise exception using errcode = 'JK001',
        message = 'jobkit: p_ids must be a one-dimensional array of at most 10000 job ids';
    end if;
    select i into v_missing from unnest(p_ids) i
    where i is null or not exists (select from public.jobkit_jobs j where j.id = i) limit 1;
    if found then
      raise exception using errcode = 'JK002',
        message = format('jobkit: job %s not found', coalesce(v_missing::text, 'null'));
    end if;
  end if;
  return query
  with chosen as (
    select j.id from public.jobkit_jobs j
    where j.status = 'dead'
      and (p_ids is null or j.id = any(p_ids))
      and (p_type is null or j.type = p_type)
      and (p_dead_before is null or j.updated_at <= p_dead_before)
      and (j.idempotency_key is null
           or (not exists (select from public.jobkit_jobs l
                           where l.idempotency_key = j.idempotency_key and l.status not in ('dead', 'cancelled'))
               and not exists (select from public.jobkit_jobs d
                               where d.idempotency_key = j.idempotency_key and d.status = 'dead'
                                 and (p_ids is null or d.id = any(p_ids))
                                 and (p_type is null or d.type = p_type)
                                 and (d.updated_at, d.id) > (j.updated_at, j.id))))
    order by j.updated_at, j.id
    limit p_limit
    for update of j skip locked
  )
  update public.jobkit_jobs j
  set status = 'queued', attempts = 0, run_after = now(), claimed_by = null, updated_at = now()
  from chosen
  where j.id = chosen.id
  returning j.*;
end;
$$;

-- prune: delete finished jobs (succeeded, dead and cancelled by default) last updated longer ago than
-- p_older_than_seconds; at most p_limit rows (1 to 10000) per call: call again until it returns 0.
create or replace function public.jobkit_prune(
  p_older_than_seconds double precision,
  p_statuses text[] default array['succeeded', 'dead', 'cancelled'],
  p_limit integer default 10000
)
returns bigint
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_deleted bigint;
begin
  if p_older_than_seconds is null or p_older_than_seconds < 0 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_older_than_seconds must be >= 0';
  end if;
  if p_statuses is null or array_ndims(p_statuses) is distinct from 1 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_statuses must be a non-empty subset of {succeeded, dead, cancelled}';
  end if;
  if not (p_statuses <@ array['succeeded', 'dead', 'cancelled']) or array_position(p_statuses, null) is not null then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_statuses must be a non-empty subset of {succeeded, dead, cancelled}';
  end if;
  if p_limit is null or p_limit < 1 or p_limit > 10000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_limit must be between 1 and 10000';
  end if;
  with doomed as (
    select j.id from public.jobkit_jobs j
    where j.status = any(p_statuses)
      and j.updated_at < now() - make_interval(secs => p_older_than_seconds)
    limit p_limit
    for update skip locked
  )
  delete from public.jobkit_jobs j using doomed where j.id = doomed.id;
  get diagnostics v_deleted = row_count;
  return v_deleted;
end;
$$;

-- stats: counts by type and status; for runnable rows, the age of the oldest runnable job. Ordered by
-- (type, status), at most p_limit rows (1 to 1000) after the pair (p_after_type, p_after_status): page
-- with the last row's pair while a call returns p_limit rows.
create or replace function public.jobkit_stats(
  p_after_type text default null,
  p_after_status text default null,
  p_limit integer default 1000
)
returns table (type text, status text, count bigint, oldest_runnable_seconds double precision)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select j.type, j.status, count(*),
         extract(epoch from now() - min(j.run_after) filter (
           where j.status in ('queued', 'retrying') and j.run_after <= now()))::double precision
  from public.jobkit_jobs j
  where p_after_type is null or (j.type, j.status) > (p_after_type, coalesce(p_after_status, ''))
  group by j.type, j.status
  order by j.type, j.status
  limit greatest(1, least(coalesce(p_limit, 1000), 1000))
$$;

-- get / list: reads for operators and workers (users read the table itself, through RLS).
create or replace function public.jobkit_get(p_id uuid)
returns setof public.jobkit_jobs
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
  select * from public.jobkit_jobs j where j.id = p_id
$$;

-- list: newest first, at most p_limit (1 to 1000). Keyset cursor: (p_before, p_before_id) = (created_at,
-- id) of the last row seen; the id breaks ties (a batch enqueued in one transaction shares one created_at).
create or replace function public.jobkit_list_jobs(
  p_status text default null,
  p_type text default null,
  p_user_id uuid default null,
  p_before timestamptz default null,
  p_before_id uuid default null,
  p_limit integer default 50
)
returns setof public.jobkit_jobs
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
begin
  if p_limit is null or p_limit < 1 or p_limit > 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_limit must be between 1 and 1000';
  end if;
  if p_status is not null
     and p_status not in ('queued', 'running', 'retrying', 'succeeded', 'dead', 'cancelled') then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_status must be one of queued, running, retrying, succeeded, dead, cancelled';
  end if;
  return query
  select * from public.jobkit_jobs j
  where (p_status is null or j.status = p_status)
    and (p_type is null or j.type = p_type)
    and (p_user_id is null or j.user_id = p_user_id)
    and (p_before is null or j.created_at < p_before
         or (p_before_id is not null and j.created_at = p_before and j.id < p_before_id))
  order by j.created_at desc, j.id desc
  limit p_limit;
end;
$$;

-- schema_version: the jobkit schema this database holds. Each migration from 0.2.0 on replaces it with
-- its own version; a worker reads it at start and refuses a database that is not at its version.
create or replace function public.jobkit_schema_version() returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '0.2.0' $$;

-- Per-type limits (the table is in 10_tables.sql; jobkit_claim obeys them).

-- limit_set: set a type's limits, every kind at once (a null removes that kind).
create or replace function public.jobkit_set_limit(
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
create or replace function public.jobkit_delete_limit(p_type text)
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
create or replace function public.jobkit_list_limits()
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

-- Schedules: recurring jobs, fired by the workers' schedulers through jobkit_fire_schedule.

-- schedule_set: create a schedule, or update the one of that name. The cron expression is parsed by
-- jobkit's schedulers (5 fields, or 6 with seconds first); here only its shape is checked. A new schedule,
-- a changed cron or time zone, and a schedule enabled again all start from now: nothing before is due.
create or replace function public.jobkit_set_schedule(
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
create or replace function public.jobkit_delete_schedule(p_name text)
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
create or replace function public.jobkit_list_schedules()
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
create or replace function public.jobkit_fire_schedule(p_name text, p_last_due_at timestamptz, p_due timestamptz[])
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

-- The users' side: signed-in users start and cancel jobs of the types opened to them, through thin
-- public entry points over SECURITY DEFINER checks in jobkit_private.

-- user_enqueue: one job of an open type for the calling user. The idempotency key is the user's own: it is
-- stored as 'user:<uid>:<key>', so one user can neither collide with nor learn of another's key, and a key
-- held by a job that is not the caller's (the app's own, say) is refused, never answered with that job.
-- The limits (live jobs of the type, and jobs of the type created within per_seconds) are counted after
-- the insert, under a lock per (user, type), by a statement whose snapshot is taken once the lock is held:
-- a job that would exceed either is rolled back with the error, whatever key it came with. Only READ
-- COMMITTED (the Data API's level) gives that snapshot: in a REPEATABLE READ or SERIALIZABLE transaction
-- the count would miss jobs committed while the lock was awaited, so it refuses to run there.
create or replace function jobkit_private.user_enqueue(p_type text, p_payload jsonb, p_idempotency_key text)
returns table (
  inserted boolean, id uuid, user_id uuid, type text, status text, payload jsonb, idempotency_key text,
  attempts integer, max_attempts integer, priority integer, run_after timestamptz, error text,
  created_at timestamptz, updated_at timestamptz
)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
#variable_conflict use_column
declare
  v_user  uuid := auth.uid();
  v_rules public.jobkit_user_types;
  v_key   text;
  v_job   record;
begin
  if v_user is null then
    raise exception using errcode = '42501', message = 'jobkit: sign in to start jobs';
  end if;
  if current_setting('transaction_isolation') <> 'read committed' then
    raise exception using errcode = '0A000',
      message = format('jobkit: jobkit_user_enqueue runs at READ COMMITTED only (this transaction is %s)',
                       current_setting('transaction_isolation')),
      hint = 'call it outside a REPEATABLE READ or SERIALIZABLE transaction, as the Data API does';
  end if;
  select * into v_rules from public.jobkit_user_types t where t.type = p_type;
  if not found then
    raise exception using errcode = 'JK001',
      message = format('jobkit: jobs of type %s cannot be started by users',
                       coalesce(quote_literal(left(p_type, 100)), 'null'));
  end if;
  if p_payload is null or jsonb_typeof(p_payload) <> 'object'
     or octet_length(p_payload::text) > v_rules.max_payload_bytes then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_payload must be a JSON object of at most %s bytes', v_rules.max_payload_bytes);
  end if;
  if p_idempotency_key is not null and char_length(p_idempotency_key) not between 1 and 150 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_idempotency_key must be 1 to 150 characters';
  end if;
  v_key := 'user:' || v_user || ':' || p_idempotency_key;
  perform pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(v_user::text || ':' || p_type, 0));
  select * into v_job from public.jobkit_enqueue(
    p_type => p_type, p_payload => p_payload, p_idempotency_key => v_key, p_priority => v_rules.priority,
    p_max_attempts => v_rules.max_attempts, p_user_id => v_user) e;
  if not v_job.inserted then
    -- the job holding the key: the caller's own (any type: it is theirs to see), or refused
    if v_job.user_id is distinct from v_user then
      raise exception using errcode = 'JK001',
        message = 'jobkit: p_idempotency_key is held by a job that is not yours; choose another key';
    end if;
  elsif (select count(*) from public.jobkit_jobs j
         where j.user_id = v_user and j.type = p_type and j.status in ('queued', 'running', 'retrying'))
        > v_rules.max_live_per_user then
    raise exception using errcode = 'JK003',
      message = format('jobkit: at most %s live jobs of type %s per user', v_rules.max_live_per_user, p_type);
  elsif (select count(*) from public.jobkit_jobs j
         where j.user_id = v_user and j.created_at > now() - make_interval(secs => v_rules.per_seconds)
           and j.type = p_type)
        > v_rules.max_created_per_user then
    raise exception using errcode = 'JK003',
      message = format('jobkit: at most %s jobs of type %s per user in %s seconds',
                       v_rules.max_created_per_user, p_type, v_rules.per_seconds);
  end if;
  return query
  select v_job.inserted, v_job.id, v_job.user_id, v_job.type::text, v_job.status::text, v_job.payload::jsonb,
         v_job.idempotency_key::text, v_job.attempts, v_job.max_attempts::integer, v_job.priority::integer,
         v_job.run_after::timestamptz, v_job.error::text, v_job.created_at, v_job.updated_at;
end;
$$;

-- user_cancel: the calling user's own job, as jobkit_cancel does it. Another user's job, or none, is
-- JK002 alike: nobody learns which ids exist.
create or replace function jobkit_private.user_cancel(p_id uuid)
returns table (id uuid, cancelled boolean, status text)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if auth.uid() is null then
    raise exception using errcode = '42501', message = 'jobkit: sign in to cancel jobs';
  end if;
  if p_id is null or not exists (
       select from public.jobkit_jobs j where j.id = p_id and j.user_id = auth.uid()) then
    raise exception using errcode = 'JK002', message = 'jobkit: no such job';
  end if;
  return query select * from public.jobkit_cancel(array[p_id], 'cancelled by its user');
end;
$$;

-- The entry points users call over the Data API (POST /rest/v1/rpc/jobkit_user_enqueue, ..._cancel).
create or replace function public.jobkit_user_enqueue(
  p_type text, p_payload jsonb default '{}', p_idempotency_key text default null
)
returns table (
  inserted boolean, id uuid, user_id uuid, type text, status text, payload jsonb, idempotency_key text,
  attempts integer, max_attempts integer, priority integer, run_after timestamptz, error text,
  created_at timestamptz, updated_at timestamptz
)
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select * from jobkit_private.user_enqueue(p_type, p_payload, p_idempotency_key);
$$;

create or replace function public.jobkit_user_cancel(p_id uuid)
returns table (id uuid, cancelled boolean, status text)
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select * from jobkit_private.user_cancel(p_id);
$$;

-- Live updates through Supabase Realtime (Broadcast from the database) --------------------------------
-- Only where Realtime is installed (Supabase); on plain PostgreSQL this section creates nothing and
-- workers rely on LISTEN/NOTIFY and polling. Broadcast over Postgres Changes: Supabase recommends it at
-- scale (one message per change, authorised once per channel join, not an RLS check per subscriber per
-- change), and it sends only the columns a user may see.
--   jobkit:user:<user id>  private; each of a user's jobs as it changes (status, progress): event 'job',
--                          payload {id, type, status, progress, progress_message, attempts, error,
--                          updated_at}. Readable only by that user (the policies below).
--   jobkit:workers         private; event 'enqueued' once per statement that inserts runnable jobs.
--                          No policy opens it, so only service_role (which bypasses RLS) may join.
-- A message is written the way realtime.send writes it (supabase/realtime, migration
-- 20260605120000_rename_broadcast_send_warning), by jobkit_private.send rather than by realtime.send
-- itself: realtime.send is PL/pgSQL without a search_path of its own, compiled once per session under the
-- search_path of its first caller, so a session that called it first with a pg_temp.uuid of its own would
-- have jobkit's triggers run that type's checks as the owner. Like realtime.send it never raises (it warns
-- and drops the message), so a Realtime fault cannot fail a job's state change; polling is the workers'
-- fallback, and a user's client can re-read the table.
do $realtime$
begin
  if to_regprocedure('realtime.send(jsonb, text, text, boolean)') is null
     or to_regclass('realtime.messages') is null then
    raise notice 'jobkit: no Supabase Realtime in this database; live updates are off';
    return;
  end if;

  create or replace function jobkit_private.send(p_payload jsonb, p_event text, p_topic text) returns void
  language plpgsql
  security invoker
  set search_path = pg_catalog, pg_temp
  as $fn$
  declare
    v_id uuid := gen_random_uuid();
  begin
    insert into realtime.messages (id, payload, event, topic, private, extension)
    values (v_id, case when p_payload ? 'id' then p_payload else p_payload || jsonb_build_object('id', v_id) end,
            p_event, p_topic, true, 'broadcast');
  exception when others then
    raise warning 'WarnSendingBroadcastMessage: %', sqlerrm;
  end;
  $fn$;

  create or replace function jobkit_private.broadcast_job() returns trigger
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
  as $fn$
  begin
    perform jobkit_private.send(
      jsonb_build_object('id', new.id, 'type', new.type, 'status', new.status, 'progress', new.progress,
                         'progress_message', new.progress_message, 'attempts', new.attempts,
                         'error', new.error, 'updated_at', new.updated_at),
      'job', 'jobkit:user:' || new.user_id::text);
    return null;
  end;
  $fn$;

  create or replace function jobkit_private.wake_workers() returns trigger
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
  as $fn$
  begin
    if exists (select from inserted i where i.status in ('queued', 'retrying') and i.run_after <= now()) then
      perform jobkit_private.send('{}'::jsonb, 'enqueued', 'jobkit:workers');
    end if;
    return null;
  end;
  $fn$;

  revoke all on function jobkit_private.send(jsonb, text, text) from public;
  revoke all on function jobkit_private.broadcast_job() from public;
  revoke all on function jobkit_private.wake_workers() from public;

  drop trigger if exists jobkit_jobs_broadcast_insert on public.jobkit_jobs;

  create trigger jobkit_jobs_broadcast_insert
    after insert on public.jobkit_jobs
    for each row when (new.user_id is not null)
    execute function jobkit_private.broadcast_job();
  drop trigger if exists jobkit_jobs_broadcast_update on public.jobkit_jobs;
  create trigger jobkit_jobs_broadcast_update
    after update of status, progress, progress_message on public.jobkit_jobs
    for each row when (new.user_id is not null and (old.status, old.progress, old.progress_message)
                       is distinct from (new.status, new.progress, new.progress_message))
    execute function jobkit_private.broadcast_job();
  drop trigger if exists jobkit_jobs_wake_workers on public.jobkit_jobs;
  create trigger jobkit_jobs_wake_workers
    after insert on public.jobkit_jobs
    referencing new table as inserted
    for each statement
    execute function jobkit_private.wake_workers();

  -- A signed-in user may join (read) their own job topic, nothing else of jobkit's: each message row is
  -- checked by its own topic, not only by the topic being joined.
  drop policy if exists jobkit_user_topic on realtime.messages;
  create policy jobkit_user_topic on realtime.messages
    for select to authenticated
    using (realtime.messages.extension = 'broadcast'
           and realtime.messages.topic = 'jobkit:user:' || (select auth.uid())::text
           and (select realtime.topic()) = realtime.messages.topic);
  -- And stays so whatever policies an app adds (restrictive policies are ANDed with every permissive one):
  -- neither anon nor a signed-in user reads a jobkit topic but a user their own, or writes one at all (a
  -- forged 'job' message in a user's topic, or a Realtime client's send to it). jobkit_private.send writes
  -- as the owner of jobkit's functions (postgres, which bypasses RLS on Supabase).
  drop policy if exists jobkit_topics_read on realtime.messages;
  create policy jobkit_topics_read on realtime.messages
    as restrictive for select to anon, authenticated
    using (not starts_with(realtime.messages.topic, 'jobkit:')
           or realtime.messages.topic = 'jobkit:user:' || (select auth.uid())::text);
  drop policy if exists jobkit_topics_insert on realtime.messages;
  create policy jobkit_topics_insert on realtime.messages
    as restrictive for insert to anon, authenticated
    with check (not starts_with(realtime.messages.topic, 'jobkit:'));
  drop policy if exists jobkit_topics_update on realtime.messages;
  create policy jobkit_topics_update on realtime.messages
    as restrictive for update to anon, authenticated
    using (not starts_with(realtime.messages.topic, 'jobkit:'))
    with check (not starts_with(realtime.messages.topic, 'jobkit:'));
end;
$realtime$;

-- Grants hold under both Supabase default-privilege modes (legacy: everything granted to the API roles;
-- current: nothing). Start from nothing, then grant exactly what each role needs.
revoke all on table public.jobkit_jobs from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_jobs to service_role;

-- Users see their jobs, not the worker's lease (lease_token is a capability) nor which worker holds it.
grant select (id, user_id, type, status, payload, idempotency_key, attempts, max_attempts, priority,
              run_after, error, created_at, updated_at, progress, progress_message, result, started_at)
  on table public.jobkit_jobs to authenticated;

revoke all on schema jobkit_private from public;

grant usage on schema jobkit_private to authenticated, service_role;

revoke all on function jobkit_private.complete_held(uuid[], uuid[], jsonb, boolean) from public;

grant execute on function jobkit_private.complete_held(uuid[], uuid[], jsonb, boolean) to service_role;

revoke all on table public.jobkit_limits, public.jobkit_starts from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_limits, public.jobkit_starts to service_role;

revoke all on table public.jobkit_schedules from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_schedules to service_role;

-- Only service_role may call any of this (functions are executable by PUBLIC by default).
do $$
declare
  f regprocedure;
begin
  for f in
    select p.oid::regprocedure from pg_catalog.pg_proc p
    where p.pronamespace = 'public'::regnamespace and p.proname like 'jobkit\_%'
  loop
    execute format('revoke execute on function %s from public, anon, authenticated', f);
    execute format('grant execute on function %s to service_role', f);
  end loop;
end;
$$;

revoke all on table public.jobkit_user_types from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_user_types to service_role;

revoke all on function jobkit_private.user_enqueue(text, jsonb, text) from public;

revoke all on function jobkit_private.user_cancel(uuid) from public;

grant execute on function jobkit_private.user_enqueue(text, jsonb, text) to authenticated;

grant execute on function jobkit_private.user_cancel(uuid) to authenticated;

revoke execute on function public.jobkit_user_enqueue(text, jsonb, text) from public, anon, service_role;

revoke execute on function public.jobkit_user_cancel(uuid) from public, anon, service_role;

grant execute on function public.jobkit_user_enqueue(text, jsonb, text) to authenticated;

grant execute on function public.jobkit_user_cancel(uuid) to authenticated;
