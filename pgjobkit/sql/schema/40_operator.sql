-- The operator's functions: cancel, requeue, prune, stats, get, list; and the schema's version.

-- cancel: waiting, queued, retrying and running jobs end cancelled at once, at most 1000 ids per call (and
-- the jobs that wait for them are settled: 45_pipelines.sql). A running
-- job's lease ends with it, so its worker's later complete, fail or heartbeat changes nothing; the worker
-- learns at its next heartbeat and stops the handler. Succeeded, dead and cancelled jobs are left as they
-- are. One row per id: cancelled = true when this call cancelled it, status as it is now (null: no such
-- job). p_reason (at most 4000 characters) is kept as the job's error.
create function public.jobkit_cancel(p_ids uuid[], p_reason text default null)
returns table (id uuid, cancelled boolean, status text)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
set enable_seqscan = off
as $$
#variable_conflict use_column
declare
  v_done uuid[];
begin
  if p_ids is null or coalesce(array_ndims(p_ids), 1) <> 1 or cardinality(p_ids) > 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_ids must be an array of at most 1000 ids';
  end if;
  if exists (select from public.jobkit_projected p where p.job_id = any(p_ids)) then
    perform jobkit_private.refuse_projected();
  end if;
  with done as (
    update public.jobkit_jobs j
    set status = 'cancelled', lease_until = null, lease_token = null,
        error = left(coalesce(p_reason, 'cancelled'), 4000), updated_at = now()
    where j.id = any(p_ids) and j.status in ('waiting', 'queued', 'retrying', 'running')
    returning j.id
  )
  select coalesce(array_agg(d.id), '{}') into v_done from done d;
  if exists (select from public.jobkit_dependencies d where d.depends_on = any(v_done) and d.outcome is null) then
    perform jobkit_private.release_waiters(v_done);
  end if;
  return query
  select i.id, i.id = any(v_done), j.status::text
  from unnest(p_ids) as i(id)
  left join public.jobkit_jobs j on j.id = i.id;
end;
$$;

-- requeue: dead jobs back to queued with fresh attempts, at most p_limit (1 to 1000) per call, oldest
-- death first; call again while it returns p_limit rows. p_ids null means every dead job (of p_type, when
-- given). p_dead_before keeps a run of calls to the jobs that were dead when it began: pass the updated_at
-- of the first call's rows (a job requeued and dead again since is left for the next run). An id that does
-- not exist raises JK002; a job that is not dead is left alone; of dead jobs sharing an idempotency key only
-- the newest comes back, and none while a live job holds the key (that job already does the work).
create function public.jobkit_requeue(
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
-- p_older_than_seconds; at most p_limit rows (1 to 10000) per call: call again until it returns 0. A job
-- that a job not yet finished waits for is kept (its result is still to be handed on); a pruned job's
-- pipeline row, what it waited for and its traceback go with it (and, as old, the tracebacks of jobs
-- deleted on completion).
create function public.jobkit_prune(
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
      and not exists (select from public.jobkit_dependencies d
                      join public.jobkit_jobs w on w.id = d.job_id
                      where d.depends_on = j.id and w.status in ('waiting', 'queued', 'retrying', 'running'))
    limit p_limit
    for update skip locked
  ), gone as (
    delete from public.jobkit_jobs j using doomed where j.id = doomed.id returning j.id
  ), nodes as (
    delete from public.jobkit_pipeline_jobs p using gone where p.job_id = gone.id
  ), edges as (
    delete from public.jobkit_dependencies d using gone where d.job_id = gone.id
  ), tracebacks as (
    delete from public.jobkit_tracebacks t using gone where t.job_id = gone.id
  )
  select count(*) into v_deleted from gone;
  -- and the tracebacks, past the same horizon, of jobs deleted another way (on completion, after a
  -- failure): a read of tracebacks that old, whose jobs prune itself would mostly have deleted by now
  delete from public.jobkit_tracebacks t
  where t.job_id in (select o.job_id from public.jobkit_tracebacks o
                     where o.failed_at < now() - make_interval(secs => p_older_than_seconds)
                       and not exists (select from public.jobkit_jobs j where j.id = o.job_id)
                     limit p_limit);
  return v_deleted;
end;
$$;

-- stats: counts by type and status; for runnable rows, the age of the oldest runnable job. Ordered by
-- (type, status), at most p_limit rows (1 to 1000) after the pair (p_after_type, p_after_status): page
-- with the last row's pair while a call returns p_limit rows.
create function public.jobkit_stats(
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
create function public.jobkit_get(p_id uuid)
returns setof public.jobkit_jobs
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
  select * from public.jobkit_jobs j where j.id = p_id
$$;

-- traceback: the traceback the job's latest failed attempt left (jobkit_fail's p_traceback), which attempt
-- that was and when; no row when none did. The operator's (service_role): a job's owner reads its error.
create function public.jobkit_traceback(p_id uuid)
returns table (attempt integer, traceback text, failed_at timestamptz)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select t.attempt, t.traceback, t.failed_at from public.jobkit_tracebacks t where t.job_id = p_id
$$;

-- list: newest first, at most p_limit (1 to 1000). Keyset cursor: (p_before, p_before_id) = (created_at,
-- id) of the last row seen; the id breaks ties (a batch enqueued in one transaction shares one created_at).
create function public.jobkit_list_jobs(
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
     and p_status not in ('queued', 'running', 'retrying', 'succeeded', 'dead', 'cancelled', 'waiting') then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_status must be one of queued, running, retrying, succeeded, dead, cancelled, waiting';
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
create function public.jobkit_schema_version() returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '0.6.0' $$;
