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
create function public.jobkit_check_jobs(p_jobs jsonb)
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
    when o.e - '{type,payload,idempotency_key,priority,max_attempts,user_id,run_after,delay_seconds,fair_key,trace_context}'::text[]
         <> '{}'::jsonb
      then 'has an unknown key; allowed: type, payload, idempotency_key, priority, max_attempts, '
           'user_id, run_after, delay_seconds, fair_key, trace_context'
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
    when coalesce(jsonb_typeof(o.e -> 'trace_context'), 'null') not in ('object', 'null')
      or octet_length((o.e -> 'trace_context')::text) > 1024
      or jsonb_path_exists(o.e -> 'trace_context', '$.* ? (@.type() != "string")')
      then 'trace_context must be a JSON object of strings, at most 1 KiB (a W3C traceparent and tracestate)'
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
create function public.jobkit_fair_round(p_type text, p_priority integer, p_fair_key text)
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

-- insert_jobs: the elements of p_jobs (checked already: jobkit_check_jobs) as new jobs with the ids p_ids, in
-- one statement, but each whose idempotency key a live job holds (earlier in p_jobs, or before); an element
-- with "waiting": true (jobkit's own key, never a caller's) is inserted waiting (45_pipelines.sql). Wakes
-- LISTENing workers, and keeps the trace_context of each job it inserted (jobkit_traces). Returns how many
-- it inserted; the caller reads back what each element got.
create function jobkit_private.insert_jobs(p_jobs jsonb, p_ids uuid[])
returns integer
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_n        integer := jsonb_array_length(p_jobs);
  v_inserted integer;
  v_total    integer := 0;
  v_found    integer;
begin
  -- Insert what no live job holds yet. A conflicting job that turned dead between the insert and the
  -- count frees its key: loop and insert for the elements left.
  for v_attempt in 1..10 loop
    -- Turns (jobkit_fair_round) are looked up once per (type, priority, key) in the batch; a key's jobs
    -- then take consecutive turns in input order.
    with els as (
      select o.ord, o.e, o.e ->> 'type' as t, coalesce((o.e ->> 'priority')::integer, 0) as p,
             coalesce(o.e ->> 'fair_key', (o.e ->> 'user_id')::uuid::text) as k
      from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
      where v_attempt = 1 or not exists (select from public.jobkit_jobs j where j.id = p_ids[o.ord::integer])
    ), turns as materialized (  -- one call per group, not one per row of the join
      select g.t, g.p, g.k, public.jobkit_fair_round(g.t, g.p, g.k) as base
      from (select distinct els.t, els.p, els.k from els) g
    )
    insert into public.jobkit_jobs
      (id, user_id, type, status, payload, idempotency_key, priority, max_attempts, run_after, fair_key,
       fair_round)
    select p_ids[o.ord::integer], (o.e ->> 'user_id')::uuid, o.t,
           case when (o.e ->> 'waiting')::boolean then 'waiting' else 'queued' end,
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
    where exists (select from public.jobkit_jobs j where j.id = p_ids[o.ord::integer])
       or exists (select from public.jobkit_jobs j
                  where j.idempotency_key = o.e ->> 'idempotency_key' and j.status not in ('dead', 'cancelled'));
    exit when v_found = v_n;
    if v_attempt = 10 then
      raise exception using errcode = '40001',
        message = 'jobkit: enqueue could not settle idempotency keys under contention; retry';
    end if;
  end loop;

  -- Wake LISTENing workers when a job is runnable now (a deduplicated element may wake them needlessly: a
  -- claim that finds nothing). Read from the input: looking the new rows up again by id became a 25 ms scan
  -- as the table grew. The payload is empty: any role may LISTEN on any channel, so a notification must
  -- tell a listener nothing but that something was enqueued (0.5.0's named the types, the app's
  -- included); a worker claims on any notification, and PostgreSQL sends one per transaction.
  if v_total > 0 then
    if exists (select from jsonb_array_elements(p_jobs) as o(e)
               where (o.e ->> 'waiting') is null
                 and coalesce((o.e ->> 'run_after')::timestamptz <= now(), true)
                 and coalesce((o.e ->> 'delay_seconds')::double precision <= 0, true)) then
      perform pg_notify('jobkit_jobs', '');
    end if;
    -- the trace contexts of the jobs this call inserted (their ids are new: an id found was inserted here)
    if jsonb_path_exists(p_jobs, '$[*].trace_context ? (@.type() == "object")') then
      insert into public.jobkit_traces (job_id, trace_context)
      select p_ids[o.ord::integer], o.e -> 'trace_context'
      from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
      where jsonb_typeof(o.e -> 'trace_context') = 'object'
        and exists (select from public.jobkit_jobs j where j.id = p_ids[o.ord::integer]);
    end if;
  end if;

  return v_total;
end;
$$;

-- enqueue_many: p_jobs as jobkit_check_jobs takes it, at most 10000 jobs. Returns one row per input
-- element, in input order: the job, and whether this call inserted it (false: a live job already held the
-- idempotency key, earlier in this batch or before). Nothing is written when any element is bad. Over
-- PostgREST call jobkit_enqueue_many_json instead (more than 1000 rows would be cut).
create function public.jobkit_enqueue_many(p_jobs jsonb)
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
  v_n   integer;
  v_ids uuid[];
  v_bad record;
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

  perform jobkit_private.insert_jobs(p_jobs, v_ids);

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
create function public.jobkit_enqueue_many_json(p_jobs jsonb)
returns jsonb
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select coalesce(jsonb_agg(to_jsonb(e) order by e.ord), '[]'::jsonb)
  from public.jobkit_enqueue_many(p_jobs) e
$$;

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

-- enqueue: one job, the same rules (jobkit_check_jobs) and result as enqueue_many, in one insert. Its
-- statements each have an index, and sequential scans are off, so the session's cached plans stay index-bound
-- however the table grows.
create function public.jobkit_enqueue(
  p_type text,
  p_payload jsonb default '{}',
  p_idempotency_key text default null,
  p_priority integer default 0,
  p_max_attempts integer default 3,
  p_user_id uuid default null,
  p_run_after timestamptz default null,
  p_delay_seconds double precision default null,
  p_fair_key text default null,
  p_trace_context jsonb default null
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
     or jsonb_typeof(p_trace_context) <> 'object' or octet_length(p_trace_context::text) > 1024
     or jsonb_path_exists(p_trace_context, '$.* ? (@.type() != "string")')
  then
    select * into v_bad from public.jobkit_check_jobs(jsonb_build_array(jsonb_build_object(
      'type', p_type, 'payload', v_payload, 'idempotency_key', p_idempotency_key, 'priority', p_priority,
      'max_attempts', p_max_attempts, 'user_id', p_user_id, 'run_after', p_run_after,
      'delay_seconds', p_delay_seconds, 'fair_key', p_fair_key, 'trace_context', p_trace_context)));
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
    perform pg_notify('jobkit_jobs', '');  -- wake LISTENing workers (empty: see insert_jobs)
  end if;
  if v_inserted and jsonb_typeof(p_trace_context) = 'object' then
    insert into public.jobkit_traces (job_id, trace_context) values (v_job.id, p_trace_context);
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
