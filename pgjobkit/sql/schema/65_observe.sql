-- Seen and operated (0.5.0): the workers' beats, what they did, the queue's depth, and the trace contexts
-- a worker continues (the tables: 10_tables.sql).

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
-- cost follows the unfinished jobs, never the finished rows that fill the table (those: jobkit_stats).
-- Ordered by (type, status), p_limit rows (1 to 1000) after the row (p_after_type, p_after_status): call
-- again after the last row until fewer come back. Any SQL client can read it (Grafana, a cron job, psql).
create function public.jobkit_queue_depth(
  p_after_type text default null,
  p_after_status text default null,
  p_limit integer default 1000
)
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
  where p_after_type is null or (d.type, d.status) > (p_after_type, coalesce(p_after_status, ''))
  order by d.type, d.status
  limit greatest(1, least(coalesce(p_limit, 1000), 1000))
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
