-- jobkit: the hot path, made lean. Signatures and results are unchanged; what each change bought was
-- measured with `make bench` and under auto_explain on the benchmark machine (2 cores, PostgreSQL 15).
--   * A single jobkit_enqueue ran enqueue_many's six set-based statements, each planned per call, for one
--     row (3.5-4.6 ms against 1.1 ms for the bare insert): now one insert, with the checks in one function
--     both entry points share.
--   * jobkit_claim joined its picked rows back to the table, and the planner chose a hash join over a
--     sequential scan of the whole table while it was small or its statistics stale (4.6 ms of a 50-job
--     claim at 10k rows, growing with the table). Rows are now fetched by primary key, and completions
--     are done in place rather than through jobkit_complete plus a second read. Every statement of
--     jobkit_claim and jobkit_complete has an index made for it; with the queue's pages in cache a
--     sequential scan is never the cheaper plan the default costs make it look, so it is switched off
--     for the two (a setting that holds only while they run; test_migrations checks the plans).

-- The rules a job's typed values must meet, in one place: the first problem as text, or null.
-- A standard SQL body (RETURN: the CLI's statement splitter cannot read BEGIN ATOMIC) is bound at
-- creation, so it needs no search_path, and the planner inlines it into its callers' statements.
create function public.jobkit_job_problem(
  p_type text,
  p_payload jsonb,
  p_idempotency_key text,
  p_priority integer,
  p_max_attempts integer,
  p_run_after timestamptz,
  p_delay_seconds double precision
)
returns text
language sql
immutable
security invoker
return case
  when p_type is null then 'type is required and must be a string'
    when pg_catalog.char_length(p_type) not between 1 and 200 then 'type must be 1 to 200 characters'
    -- explicit ranges (C0, DEL, C1), not [[:cntrl:]], whose meaning follows the database's locale
    when p_type operator(pg_catalog.~) '[\u0001-\u001f\u007f-\u009f]'
      then 'type must not contain control characters'
    when pg_catalog.jsonb_typeof(p_payload) operator(pg_catalog.<>) 'object'
      then 'payload must be a JSON object'
    when pg_catalog.char_length(p_idempotency_key) not between 1 and 200
      then 'idempotency_key must be 1 to 200 characters'
    when p_priority not between -1000000 and 1000000
      then 'priority must be an integer between -1000000 and 1000000'
    when p_max_attempts not between 1 and 1000
      then 'max_attempts must be an integer between 1 and 1000'
    when p_delay_seconds not between 0 and 315576000
      then 'delay_seconds must be between 0 and 315576000 (ten years)'
    when p_run_after is not null and p_delay_seconds is not null
      then 'give run_after or delay_seconds, not both'
    when pg_catalog.octet_length(p_payload::text) > 1048576
      then 'payload must be at most 1 MiB as JSON text'
  end;

revoke execute on function public.jobkit_job_problem(text, jsonb, text, integer, integer, timestamptz,
  double precision) from public, anon, authenticated;
grant execute on function public.jobkit_job_problem(text, jsonb, text, integer, integer, timestamptz,
  double precision) to service_role;

-- enqueue: one job, the same rules and result as enqueue_many, in one insert. Its statements are simple
-- and index-bound whatever the table's size, so the session's cached plans are kept.
create or replace function public.jobkit_enqueue(
  p_type text,
  p_payload jsonb default '{}',
  p_idempotency_key text default null,
  p_priority integer default 0,
  p_max_attempts integer default 3,
  p_user_id uuid default null,
  p_run_after timestamptz default null,
  p_delay_seconds double precision default null
)
returns table (
  inserted boolean,
  id uuid, user_id uuid, type text, status text, payload jsonb, idempotency_key text,
  attempts integer, max_attempts integer, priority integer, run_after timestamptz,
  lease_until timestamptz, lease_token uuid, claimed_by text, error text,
  created_at timestamptz, updated_at timestamptz
)
language plpgsql
volatile
security invoker
set search_path = ''
as $$
#variable_conflict use_column
declare
  v_payload  jsonb := coalesce(nullif(p_payload, 'null'::jsonb), '{}'::jsonb);
  v_problem  text;
  v_job      public.jobkit_jobs;
  v_inserted boolean;
begin
  v_problem := public.jobkit_job_problem(p_type, v_payload, p_idempotency_key, p_priority, p_max_attempts,
                                         p_run_after, p_delay_seconds);
  if v_problem is not null then
    raise exception using errcode = 'JK001', message = format('jobkit: %s', v_problem);
  end if;

  -- A conflicting job that turned dead between the insert and the read frees its key: try again.
  for v_attempt in 1..10 loop
    insert into public.jobkit_jobs
      (user_id, type, payload, idempotency_key, priority, max_attempts, run_after)
    values (p_user_id, p_type, v_payload, p_idempotency_key, coalesce(p_priority, 0),
            coalesce(p_max_attempts, 3),
            coalesce(p_run_after, now() + make_interval(secs => coalesce(p_delay_seconds, 0))))
    on conflict (idempotency_key) where status <> 'dead' do nothing
    returning * into v_job;
    v_inserted := found;
    if not v_inserted then
      select * into v_job from public.jobkit_jobs j
      where j.idempotency_key = p_idempotency_key and j.status <> 'dead';
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
  return query select v_inserted, v_job.id, v_job.user_id, v_job.type, v_job.status, v_job.payload,
    v_job.idempotency_key, v_job.attempts, v_job.max_attempts, v_job.priority, v_job.run_after,
    v_job.lease_until, v_job.lease_token, v_job.claimed_by, v_job.error, v_job.created_at, v_job.updated_at;
end;
$$;

-- enqueue_many: the same contract. What changed, each measured at 100k rows (1,000 keyed jobs per call): the
-- typed rules are jobkit_job_problem's; unknown keys are found by one jsonb subtraction, not a key scan; a
-- batch that inserted every element skips the settle check; the types to wake are read from the input, not
-- found again by id (that lookup had turned into a 25 ms scan as the table grew).
create or replace function public.jobkit_enqueue_many(p_jobs jsonb)
returns table (
  ord bigint, inserted boolean,
  id uuid, user_id uuid, type text, status text, payload jsonb, idempotency_key text,
  attempts integer, max_attempts integer, priority integer, run_after timestamptz,
  lease_until timestamptz, lease_token uuid, claimed_by text, error text,
  created_at timestamptz, updated_at timestamptz
)
language plpgsql
volatile
security invoker
set search_path = ''
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

  -- Validate every element before writing anything; report the first problem with its index. JSON
  -- shapes here (and the integer ranges, so the casts below cannot overflow), then the shared rules.
  select o.ord - 1 as idx, p.problem into v_bad
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  cross join lateral (select case
    when jsonb_typeof(o.e) <> 'object' then 'must be a JSON object'
    when o.e - '{type,payload,idempotency_key,priority,max_attempts,user_id,run_after,delay_seconds}'::text[]
         <> '{}'::jsonb
      then 'has an unknown key; allowed: type, payload, idempotency_key, priority, max_attempts, '
           'user_id, run_after, delay_seconds'
    when jsonb_typeof(o.e -> 'type') is distinct from 'string'
      then 'type is required and must be a string'
    when coalesce(jsonb_typeof(o.e -> 'payload'), 'object') not in ('object', 'null')
      then 'payload must be a JSON object'
    when coalesce(jsonb_typeof(o.e -> 'idempotency_key'), 'null') not in ('string', 'null')
      then 'idempotency_key must be a string or null'
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
    when coalesce(jsonb_typeof(o.e -> 'delay_seconds'), 'null') not in ('number', 'null')
      then 'delay_seconds must be a number'
    when (o.e ->> 'delay_seconds')::numeric not between 0 and 315576000
      then 'delay_seconds must be between 0 and 315576000 (ten years)'
    else public.jobkit_job_problem(
      o.e ->> 'type', coalesce(nullif(o.e -> 'payload', 'null'::jsonb), '{}'::jsonb),
      o.e ->> 'idempotency_key', (o.e ->> 'priority')::integer, (o.e ->> 'max_attempts')::integer,
      (o.e ->> 'run_after')::timestamptz, (o.e ->> 'delay_seconds')::double precision)
  end as problem) p
  where p.problem is not null
  order by o.ord
  limit 1;
  if found then
    raise exception using errcode = 'JK001',
      message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;

  -- Ids are chosen here so each inserted row maps back to its input element.
  v_ids := array(select gen_random_uuid() from generate_series(1, v_n));

  -- Insert what no live job holds yet; read back the job each element got. A conflicting job that
  -- turned dead between the two statements frees its key: loop and insert for the elements left.
  for v_attempt in 1..10 loop
    insert into public.jobkit_jobs
      (id, user_id, type, payload, idempotency_key, priority, max_attempts, run_after)
    select v_ids[o.ord::integer], (o.e ->> 'user_id')::uuid, o.e ->> 'type',
           coalesce(nullif(o.e -> 'payload', 'null'::jsonb), '{}'::jsonb),
           o.e ->> 'idempotency_key',
           coalesce((o.e ->> 'priority')::integer, 0),
           coalesce((o.e ->> 'max_attempts')::integer, 3),
           coalesce((o.e ->> 'run_after')::timestamptz,
                    now() + make_interval(secs => coalesce((o.e ->> 'delay_seconds')::double precision, 0)))
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
    where v_attempt = 1 or not exists (select from public.jobkit_jobs j where j.id = v_ids[o.ord::integer])
    order by o.ord
    on conflict (idempotency_key) where status <> 'dead' do nothing;
    get diagnostics v_inserted = row_count;
    v_total := v_total + v_inserted;
    exit when v_total = v_n;  -- every element is a new job: nothing to settle

    select count(*) into v_found
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
    where exists (select from public.jobkit_jobs j where j.id = v_ids[o.ord::integer])
       or exists (select from public.jobkit_jobs j
                  where j.idempotency_key = o.e ->> 'idempotency_key' and j.status <> 'dead');
    exit when v_found = v_n;
    if v_attempt = 10 then
      raise exception using errcode = '40001',
        message = 'jobkit: enqueue could not settle idempotency keys under contention; retry';
    end if;
  end loop;

  -- Wake LISTENing workers once per type runnable now (a deduplicated element may wake them needlessly:
  -- a claim that finds nothing).
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
         m.created_at, m.updated_at
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  cross join lateral (
    (select true as inserted, j.* from public.jobkit_jobs j where j.id = v_ids[o.ord::integer])
    union all
    (select false, j.* from public.jobkit_jobs j
     where j.idempotency_key = o.e ->> 'idempotency_key' and j.status <> 'dead')
    limit 1
  ) m
  order by o.ord;
end;
$$;

-- claim: as before; see the header for what changed.
create or replace function public.jobkit_claim(
  p_types text[],
  p_worker text,
  p_lease_seconds double precision,
  p_limit integer default 1,
  p_done_ids uuid[] default null,
  p_done_tokens uuid[] default null
)
returns setof public.jobkit_jobs
language plpgsql
volatile
security invoker
set search_path = ''
set plan_cache_mode = force_custom_plan
set enable_bitmapscan = off
set enable_seqscan = off
as $$
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

  if p_done_ids is not null or p_done_tokens is not null then
    if p_done_ids is null or p_done_tokens is null or coalesce(array_ndims(p_done_ids), 1) <> 1
       or coalesce(array_ndims(p_done_tokens), 1) <> 1
       or cardinality(p_done_ids) <> cardinality(p_done_tokens) or cardinality(p_done_ids) > 10000 then
      raise exception using errcode = 'JK001',
        message = 'jobkit: p_done_ids and p_done_tokens must be arrays of equal length (at most 10000)';
    end if;
    -- jobkit_complete's update, returning the rows (see there for the shape). The claim below is a
    -- second statement, so its snapshot sees these jobs finished.
    return query
    update public.jobkit_jobs j
    set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now()
    where j.id = any(p_done_ids)
      and (j.id, j.lease_token) in (select * from unnest(p_done_ids, p_done_tokens))
    returning j.*;
  end if;

  -- Cheap when nothing expired: one probe of the lease index.
  if exists (select from public.jobkit_jobs j where j.status = 'running' and j.lease_until <= now()) then
    perform public.jobkit_reclaim_expired(1000);
  end if;

  return query
  with picked as (
    select j.id from public.jobkit_jobs j
    where j.status in ('queued', 'retrying') and j.run_after <= now() and j.type = any(p_types)
    order by j.priority desc, j.run_after, j.created_at
    limit least(p_limit, 999)
    for update skip locked
  ), claimed as (
    update public.jobkit_jobs j
    set status = 'running',
        attempts = j.attempts + 1,
        lease_until = now() + make_interval(secs => p_lease_seconds),
        lease_token = gen_random_uuid(),
        claimed_by = p_worker,
        updated_at = now()
    where j.id = any(array(select picked.id from picked))
    returning j.*
  )
  select * from claimed c order by c.priority desc, c.run_after, c.created_at;
end;
$$;

-- complete: as before. A lease token is set exactly when a job is running (jobkit_jobs_lease_iff_running),
-- so matching it is the whole fence; leaving status out of the condition keeps the planner on the primary
-- key rather than a scan of every running job's lease entry.
create or replace function public.jobkit_complete(p_ids uuid[], p_lease_tokens uuid[])
returns table (id uuid, ok boolean)
language plpgsql
volatile
security invoker
set search_path = ''
set plan_cache_mode = force_custom_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
begin
  if p_ids is null or p_lease_tokens is null or coalesce(array_ndims(p_ids), 1) <> 1
     or coalesce(array_ndims(p_lease_tokens), 1) <> 1
     or cardinality(p_ids) <> cardinality(p_lease_tokens) or cardinality(p_ids) > 10000 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_ids and p_lease_tokens must be arrays of equal length (at most 10000)';
  end if;
  return query
  with done as (
    update public.jobkit_jobs j
    set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now()
    where j.id = any(p_ids)
      and (j.id, j.lease_token) in (select * from unnest(p_ids, p_lease_tokens))
    returning j.id
  )
  select i.id, exists (select from done where done.id = i.id) from unnest(p_ids) as i(id);
end;
$$;
