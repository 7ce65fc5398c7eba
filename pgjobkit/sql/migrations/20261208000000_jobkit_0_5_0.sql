-- jobkit 0.5.0, from 0.4.0: seen and operated. A job enqueued inside a trace keeps its trace context
-- (jobkit_traces), and the worker that runs it continues that trace; workers keep a row of their own fresh
-- (jobkit_workers) and add what they did by the minute (jobkit_activity); jobkit_queue_depth counts the
-- unfinished jobs cheaply.
--
-- Locks, on a database with jobs in it:
-- * jobkit_jobs: none. Nothing here changes the table, its row type or its indexes.
-- * jobkit_enqueue, jobkit_user_enqueue and jobkit_private.user_enqueue are dropped and created again with
--   one more argument, p_trace_context (default null): a 0.4.0 client's calls, which name their arguments,
--   go on working, and its prepared statements are planned again against the new functions.
-- * jobkit_check_jobs and jobkit_private.insert_jobs are replaced in place; new tables and functions: nothing
--   anyone holds.

-- A lock this migration must wait for, it waits for at most 5 s (unless whoever runs it set a bound of
-- their own, as `pgjobkit migrate --lock-timeout` does): then it fails, changing nothing, rather than queue
-- every worker behind a long transaction. Run it again when the database is quieter.
select set_config('lock_timeout', '5s', true) where current_setting('lock_timeout') = '0';

-- The trace context of the code that enqueued a job (W3C: {"traceparent": ..., "tracestate": ...}), as
-- OpenTelemetry's propagators write it: an object of strings, at most 1 KiB.
create domain public.jobkit_trace_context as jsonb
  constraint jobkit_jobs_trace_context_valid
    check (jsonb_typeof(value) = 'object' and octet_length(value::text) <= 1024
           and not jsonb_path_exists(value, '$.* ? (@.type() != "string")'));

-- Traces (0.5.0) ---------------------------------------------------------------------------------------
-- The trace context of each job enqueued inside a trace (OpenTelemetry's W3C fields), read by the worker
-- that runs it to continue that trace. A table beside jobkit_jobs, not a column of it: a new column
-- changes the row type every running worker's prepared claim returns (their next claim would fail), and
-- jobs enqueued outside a trace, or by an app that does not trace, cost nothing here. No foreign key, so
-- that deleting a job costs what it did; the workers' beats delete what a finished or deleted job left
-- once it is a day old.
create table public.jobkit_traces (
  job_id        uuid        primary key,
  trace_context public.jobkit_trace_context not null,
  created_at    timestamptz not null default now()
);

comment on table public.jobkit_traces is
  'jobkit: the trace context each job was enqueued with (kept by jobkit_enqueue; read by workers).';

create index jobkit_traces_created on public.jobkit_traces (created_at);

-- Workers -------------------------------------------------------------------------------------------------
-- One row per worker, kept by the worker itself: jobkit_worker_beat when it starts and every few seconds
-- while it runs, jobkit_worker_stop when it stops. A worker that vanished (killed, its machine gone) stops
-- beating; the next beat of any worker deletes it once its last beat is older than its own stale_after.
-- What a worker holds is read live from jobkit_jobs (claimed_by), not kept here.
create table public.jobkit_workers (
  name         public.jobkit_worker primary key,  -- as in jobkit_jobs.claimed_by
  host         text,
  pid          integer,
  version      text,
  types        text[]           not null default '{}',
  concurrency  integer,
  started_at   timestamptz      not null default now(),
  heartbeat_at timestamptz      not null default now(),
  stale_after  double precision not null default 60,  -- seconds without a beat before it counts as gone
  constraint jobkit_workers_host_bounded check (char_length(host) <= 200),
  constraint jobkit_workers_version_bounded check (char_length(version) <= 50),
  constraint jobkit_workers_types_bounded check (cardinality(types) <= 1000),
  constraint jobkit_workers_stale_after_valid check (stale_after between 1 and 86400)
);

comment on table public.jobkit_workers is
  'jobkit: the workers that are running, kept fresh by their own beats (jobkit_worker_beat).';

-- What the workers did, by the minute: attempts ended per type and outcome, with their run times and queue
-- waits (sums and maxima). Each worker adds its own minutes at its beats; minutes older than a day are
-- deleted by the beats. The dashboard's rates and timings over the last hour read it.
create table public.jobkit_activity (
  minute       timestamptz      not null,  -- the minute the attempts ended in
  type         public.jobkit_type not null,
  outcome      text             not null,
  jobs         bigint           not null default 0,
  run_seconds  double precision not null default 0,  -- the sum of the attempts' run times
  run_max      double precision not null default 0,
  wait_seconds double precision not null default 0,  -- the sum of their waits from runnable to claimed
  wait_max     double precision not null default 0,
  primary key (minute, type, outcome),
  constraint jobkit_activity_outcome_valid check (outcome in ('succeeded', 'retrying', 'dead', 'lost')),
  constraint jobkit_activity_counts_valid
    check (jobs >= 0 and run_seconds >= 0 and run_max >= 0 and wait_seconds >= 0 and wait_max >= 0)
);

comment on table public.jobkit_activity is
  'jobkit: attempts ended per minute, type and outcome, with run times and queue waits (kept by the workers).';

-- Enqueue, keeping the trace context ------------------------------------------------------------------
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

-- insert_jobs: the elements of p_jobs (checked already: jobkit_check_jobs) as new jobs with the ids p_ids, in
-- one statement, but each whose idempotency key a live job holds (earlier in p_jobs, or before); an element
-- with "waiting": true (jobkit's own key, never a caller's) is inserted waiting (45_pipelines.sql). Wakes
-- LISTENing workers, and keeps the trace_context of each job it inserted (jobkit_traces). Returns how many
-- it inserted; the caller reads back what each element got.
create or replace function jobkit_private.insert_jobs(p_jobs jsonb, p_ids uuid[])
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
  v_types    text;
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

  -- Wake LISTENing workers once per type runnable now (a deduplicated element may wake them needlessly:
  -- a claim that finds nothing). The types are read from the input: looking the new rows up again by id
  -- became a 25 ms scan as the table grew.
  if v_total > 0 then
    select string_agg(distinct o.e ->> 'type', ',') into v_types
    from jsonb_array_elements(p_jobs) as o(e)
    where (o.e ->> 'waiting') is null
      and coalesce((o.e ->> 'run_after')::timestamptz <= now(), true)
      and coalesce((o.e ->> 'delay_seconds')::double precision <= 0, true);
    if v_types is not null then
      perform pg_notify('jobkit_jobs', v_types);
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

drop function public.jobkit_enqueue(
  text, jsonb, text, integer, integer, uuid, timestamptz, double precision, text);

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
    perform pg_notify('jobkit_jobs', v_job.type);  -- wake LISTENing workers
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

revoke execute on function public.jobkit_enqueue(
  text, jsonb, text, integer, integer, uuid, timestamptz, double precision, text, jsonb)
  from public, anon, authenticated;

grant execute on function public.jobkit_enqueue(
  text, jsonb, text, integer, integer, uuid, timestamptz, double precision, text, jsonb)
  to service_role;

-- Users' enqueue, with the trace context of the request that started the job.
drop function public.jobkit_user_enqueue(text, jsonb, text);

drop function jobkit_private.user_enqueue(text, jsonb, text);

-- user_enqueue: one job of an open type for the calling user. The idempotency key is the user's own: it is
-- stored as 'user:<uid>:<key>', so one user can neither collide with nor learn of another's key, and a key
-- held by a job that is not the caller's (the app's own, say) is refused, never answered with that job.
-- The limits (live jobs of the type, and jobs of the type created within per_seconds) are counted after
-- the insert, under a lock per (user, type), by a statement whose snapshot is taken once the lock is held:
-- a job that would exceed either is rolled back with the error, whatever key it came with. Only READ
-- COMMITTED (the Data API's level) gives that snapshot: in a REPEATABLE READ or SERIALIZABLE transaction
-- the count would miss jobs committed while the lock was awaited, so it refuses to run there.
create function jobkit_private.user_enqueue(
  p_type text, p_payload jsonb, p_idempotency_key text, p_trace_context jsonb default null
)
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
    p_max_attempts => v_rules.max_attempts, p_user_id => v_user, p_trace_context => p_trace_context) e;
  if not v_job.inserted then
    -- the job holding the key: the caller's own (any type: it is theirs to see), or refused
    if v_job.user_id is distinct from v_user then
      raise exception using errcode = 'JK001',
        message = 'jobkit: p_idempotency_key is held by a job that is not yours; choose another key';
    end if;
  else
    perform jobkit_private.user_limits(v_user, array[p_type]);
  end if;
  return query
  select v_job.inserted, v_job.id, v_job.user_id, v_job.type::text, v_job.status::text, v_job.payload::jsonb,
         v_job.idempotency_key::text, v_job.attempts, v_job.max_attempts::integer, v_job.priority::integer,
         v_job.run_after::timestamptz, v_job.error::text, v_job.created_at, v_job.updated_at;
end;
$$;

-- The entry points users call over the Data API (POST /rest/v1/rpc/jobkit_user_enqueue, ..._cancel).
create function public.jobkit_user_enqueue(
  p_type text, p_payload jsonb default '{}', p_idempotency_key text default null,
  p_trace_context jsonb default null
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
  select * from jobkit_private.user_enqueue(p_type, p_payload, p_idempotency_key, p_trace_context);
$$;

revoke all on function jobkit_private.user_enqueue(text, jsonb, text, jsonb) from public;

grant execute on function jobkit_private.user_enqueue(text, jsonb, text, jsonb) to authenticated;

revoke execute on function public.jobkit_user_enqueue(text, jsonb, text, jsonb) from public, anon, service_role;

grant execute on function public.jobkit_user_enqueue(text, jsonb, text, jsonb) to authenticated;

-- Workers, activity, depth and traces ---------------------------------------------------------------------
-- worker_beat: p_worker is alive (inserted, or its row refreshed), and its activity since its last beat is
-- added (p_activity: [{"minute", "type", "outcome", "jobs", "run_seconds", "run_max", "wait_seconds",
-- "wait_max"}, ...], at most 1000). Workers whose last beat is older than their stale_after are deleted,
-- activity older than a day, and the trace contexts, a day old, of jobs that finished or are gone. Returns
-- how many vanished workers it deleted.
create function public.jobkit_worker_beat(
  p_worker text,
  p_host text default null,
  p_pid integer default null,
  p_version text default null,
  p_types text[] default '{}',
  p_concurrency integer default null,
  p_stale_seconds double precision default 60,
  p_activity jsonb default null
)
returns integer
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_bad    text;
  v_pruned integer;
begin
  if p_worker is null or char_length(p_worker) not between 1 and 200 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_worker must be 1 to 200 characters';
  end if;
  if p_stale_seconds is null or not p_stale_seconds between 1 and 86400 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_stale_seconds must be between 1 and 86400';
  end if;
  if p_activity is not null and (jsonb_typeof(p_activity) <> 'array' or jsonb_array_length(p_activity) > 1000) then
    raise exception using errcode = 'JK001', message = 'jobkit: p_activity must be a JSON array of at most 1000 minutes';
  end if;
  select format('p_activity[%s] %s', o.ord - 1, p.problem)
  into v_bad
  from jsonb_array_elements(coalesce(p_activity, '[]')) with ordinality o(e, ord)
  cross join lateral (select case  -- in order: each value's shape is checked before it is cast
    when jsonb_typeof(o.e) <> 'object' then 'must be a JSON object'
    when jsonb_typeof(o.e -> 'minute') is distinct from 'string'
      or (o.e ->> 'minute') !~ '^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}(:?\d{2})?)$'
      then 'minute must be an ISO 8601 timestamp with its offset'
    when jsonb_typeof(o.e -> 'type') is distinct from 'string' or char_length(o.e ->> 'type') not between 1 and 200
      then 'type must be 1 to 200 characters'
    when (o.e ->> 'outcome') is null or (o.e ->> 'outcome') not in ('succeeded', 'retrying', 'dead', 'lost')
      then 'outcome must be succeeded, retrying, dead or lost'
    when exists (select from unnest(array['jobs', 'run_seconds', 'run_max', 'wait_seconds', 'wait_max']) k(k)
                 where jsonb_typeof(o.e -> k.k) is distinct from 'number')
      or exists (select from unnest(array['jobs', 'run_seconds', 'run_max', 'wait_seconds', 'wait_max']) k(k)
                 where (o.e ->> k.k)::numeric not between 0 and 1e15)
      then 'jobs, run_seconds, run_max, wait_seconds and wait_max must be numbers from 0 to 1e15'
    when not (o.e ->> 'minute')::timestamptz between now() - interval '1 day' and now() + interval '1 hour'
      then 'minute must be within the last day'
  end as problem) p
  where p.problem is not null
  order by o.ord
  limit 1;
  if v_bad is not null then
    raise exception using errcode = 'JK001', message = 'jobkit: ' || v_bad;
  end if;

  insert into public.jobkit_workers as w (name, host, pid, version, types, concurrency, stale_after)
  values (p_worker, left(p_host, 200), p_pid, left(p_version, 50), coalesce(p_types[1:1000], '{}'),
          p_concurrency, p_stale_seconds)
  on conflict (name) do update
  set host = excluded.host, pid = excluded.pid, version = excluded.version, types = excluded.types,
      concurrency = excluded.concurrency, stale_after = excluded.stale_after, heartbeat_at = now();

  -- in key order, so that two workers adding to the same minutes never wait for each other in a circle
  insert into public.jobkit_activity as a
    (minute, type, outcome, jobs, run_seconds, run_max, wait_seconds, wait_max)
  select date_trunc('minute', (e ->> 'minute')::timestamptz), e ->> 'type', e ->> 'outcome',
         sum((e ->> 'jobs')::bigint), sum((e ->> 'run_seconds')::double precision),
         max((e ->> 'run_max')::double precision), sum((e ->> 'wait_seconds')::double precision),
         max((e ->> 'wait_max')::double precision)
  from jsonb_array_elements(coalesce(p_activity, '[]')) e
  group by 1, 2, 3
  order by 1, 2, 3
  on conflict (minute, type, outcome) do update
  set jobs = a.jobs + excluded.jobs, run_seconds = a.run_seconds + excluded.run_seconds,
      run_max = greatest(a.run_max, excluded.run_max), wait_seconds = a.wait_seconds + excluded.wait_seconds,
      wait_max = greatest(a.wait_max, excluded.wait_max);

  delete from public.jobkit_workers w
  where w.heartbeat_at < now() - make_interval(secs => w.stale_after) and w.name <> p_worker;
  get diagnostics v_pruned = row_count;
  delete from public.jobkit_activity a where a.minute < now() - interval '1 day';
  delete from public.jobkit_traces t
  where t.created_at < now() - interval '1 day'
    and not exists (select from public.jobkit_jobs j
                    where j.id = t.job_id and j.status not in ('succeeded', 'dead', 'cancelled'));
  return v_pruned;
end;
$$;

-- worker_stop: p_worker has stopped; its row goes. Whether there was one.
create function public.jobkit_worker_stop(p_worker text)
returns boolean
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  with gone as (delete from public.jobkit_workers w where w.name = p_worker returning 1)
  select exists (select from gone)
$$;

-- list_workers: the workers (at most 1000, oldest first), whether each is alive (beat within its
-- stale_after), and how many running jobs each holds now.
create function public.jobkit_list_workers()
returns table (
  name text, host text, pid integer, version text, types text[], concurrency integer,
  started_at timestamptz, heartbeat_at timestamptz, alive boolean, holding bigint
)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select w.name, w.host, w.pid, w.version, w.types, w.concurrency, w.started_at, w.heartbeat_at,
         w.heartbeat_at >= now() - make_interval(secs => w.stale_after),
         coalesce(h.n, 0)
  from public.jobkit_workers w
  left join (select j.claimed_by, count(*) as n from public.jobkit_jobs j
             where j.status = 'running' group by j.claimed_by) h on h.claimed_by = w.name
  order by w.started_at, w.name
  limit 1000
$$;

-- activity: the minutes since p_since (at most the last day), ordered by (minute, type, outcome), at most
-- p_limit rows (1 to 1000) after (p_after_minute, p_after_type, p_after_outcome): page with the last row's.
create function public.jobkit_activity(
  p_since timestamptz,
  p_after_minute timestamptz default null,
  p_after_type text default null,
  p_after_outcome text default null,
  p_limit integer default 1000
)
returns table (
  minute timestamptz, type text, outcome text, jobs bigint, run_seconds double precision,
  run_max double precision, wait_seconds double precision, wait_max double precision
)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select a.minute, a.type, a.outcome, a.jobs, a.run_seconds, a.run_max, a.wait_seconds, a.wait_max
  from public.jobkit_activity a
  where a.minute >= p_since
    and (p_after_minute is null
         or (a.minute, a.type::text, a.outcome) > (p_after_minute, coalesce(p_after_type, ''),
                                                   coalesce(p_after_outcome, '')))
  order by a.minute, a.type, a.outcome
  limit greatest(1, least(coalesce(p_limit, 1000), 1000))
$$;

-- queue_depth: the jobs not yet finished, by type and status (queued, retrying, running, waiting), and the
-- age in seconds of the oldest of each: runnable ones by run_after (null when none is runnable yet), running
-- ones by started_at, waiting ones by created_at. Each status is read through its own partial index, so the
-- cost follows the unfinished jobs, never the finished rows that fill the table (those: jobkit_stats). At
-- most 1000 rows, ordered by (type, status). Any SQL client can read it (Grafana, a cron job, psql).
create function public.jobkit_queue_depth()
returns table (type text, status text, jobs bigint, oldest_seconds double precision)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select d.type, d.status, d.jobs, d.oldest_seconds
  from (
    select j.type::text, j.status::text, count(*) as jobs,
           extract(epoch from now() - min(j.run_after) filter (where j.run_after <= now()))::double precision
             as oldest_seconds
    from public.jobkit_jobs j
    where j.status in ('queued', 'retrying')
    group by j.type, j.status
    union all
    select j.type::text, 'running', count(*), extract(epoch from now() - min(j.started_at))::double precision
    from public.jobkit_jobs j
    where j.status = 'running'
    group by j.type
    union all
    select j.type::text, 'waiting', count(*), extract(epoch from now() - min(j.created_at))::double precision
    from public.jobkit_jobs j
    where j.status = 'waiting'
      and j.id in (select d.job_id from public.jobkit_dependencies d where d.outcome is null)
    group by j.type
  ) d
  order by d.type, d.status
  limit 1000
$$;

-- trace_contexts: the trace context each of p_ids (at most 1000) was enqueued with, for those that have
-- one: what a tracing worker reads after a claim, to run each job in the trace that enqueued it.
create function public.jobkit_trace_contexts(p_ids uuid[])
returns table (id uuid, trace_context jsonb)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  if cardinality(p_ids) > 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_ids must be an array of at most 1000 ids';
  end if;
  return query
  select t.job_id, t.trace_context::jsonb from public.jobkit_traces t where t.job_id = any(p_ids);
end;
$$;

-- The pipeline a job belongs to (the dashboard links a job to its tree).
-- pipeline_of: the pipeline job p_id belongs to, or null (not in one, or no such job). 0.5.0.
create function public.jobkit_pipeline_of(p_id uuid)
returns uuid
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select p.pipeline_id from public.jobkit_pipeline_jobs p where p.job_id = p_id
$$;


-- Security ------------------------------------------------------------------------------------------------
alter table public.jobkit_workers enable row level security;

alter table public.jobkit_activity enable row level security;

alter table public.jobkit_traces enable row level security;

create policy jobkit_workers_service on public.jobkit_workers
  for all to service_role using (true) with check (true);

create policy jobkit_activity_service on public.jobkit_activity
  for all to service_role using (true) with check (true);

create policy jobkit_traces_service on public.jobkit_traces
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_workers, public.jobkit_activity, public.jobkit_traces
  from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_workers, public.jobkit_activity, public.jobkit_traces
  to service_role;

do $$
declare
  f regprocedure;
begin
  for f in
    select p.oid::regprocedure from pg_catalog.pg_proc p
    where p.pronamespace = 'public'::regnamespace
      and p.proname in ('jobkit_worker_beat', 'jobkit_worker_stop', 'jobkit_list_workers', 'jobkit_activity',
                        'jobkit_queue_depth', 'jobkit_trace_contexts',
                        'jobkit_pipeline_of')
  loop
    execute format('revoke execute on function %s from public, anon, authenticated', f);
    execute format('grant execute on function %s to service_role', f);
  end loop;
end;
$$;

-- schema_version: the jobkit schema this database holds. Each migration from 0.2.0 on replaces it with
-- its own version; a worker reads it at start and refuses a database that is not at its version.
create or replace function public.jobkit_schema_version() returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '0.5.0' $$;
