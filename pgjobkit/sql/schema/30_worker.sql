-- The worker's functions: claim (with completions folded in), complete, fail, heartbeat, progress,
-- release, and taking back expired leases. Every change after a claim is fenced by the lease token.

-- reclaim_expired: running jobs whose lease ran out go back to retrying (runnable at once), or to
-- dead when their attempts are used up (a job that kills its worker every time ends dead): against the
-- job's max_attempts, which a failure may have set to its handler's (jobkit_fail's p_max_attempts). At most
-- least(p_limit, 1000) per call, oldest lease first: call again while it returns that many.
create function public.jobkit_reclaim_expired(p_limit integer default 1000)
returns table (id uuid, status text, attempts integer)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
#variable_conflict use_column
declare
  v_ids      uuid[];
  v_statuses text[];
  v_attempts integer[];
  v_dead     uuid[];
begin
  if p_limit is null or p_limit < 1 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_limit must be >= 1 (got %s)', coalesce(p_limit::text, 'null'));
  end if;
  with expired as (
    select j.id from public.jobkit_jobs j
    where j.status = 'running' and j.lease_until <= now()
    order by j.lease_until
    limit least(p_limit, 1000)
    for update skip locked
  ), reclaimed as (
  update public.jobkit_jobs j
  set status = case when j.attempts >= j.max_attempts then 'dead' else 'retrying' end,
      run_after = now(),
      lease_until = null,
      lease_token = null,
      error = format('lease expired on attempt %s (its worker stopped or was too slow)', j.attempts),
      updated_at = now()
  from expired
  where j.id = expired.id
  returning j.id, j.status::text, j.attempts
  )
  select array_agg(r.id), array_agg(r.status), array_agg(r.attempts) into v_ids, v_statuses, v_attempts
  from reclaimed r;
  v_dead := array(select i.id from unnest(v_ids, v_statuses) as i(id, status) where i.status = 'dead');
  if exists (select from public.jobkit_dependencies d where d.depends_on = any(v_dead) and d.outcome is null) then
    perform jobkit_private.settle(v_dead);  -- the jobs that wait for them (45_pipelines.sql)
  end if;
  return query select * from unnest(v_ids, v_statuses, v_attempts);
end;
$$;

-- complete_held: the completions of jobkit_complete and jobkit_claim that found their row held by another
-- transaction, one at a time, each waiting at most lock_timeout for it. A concurrent claim that passed over a
-- job it no longer wanted holds the row until it commits (PostgreSQL keeps the lock it took on the newest
-- version of a row that then failed the claim's conditions), for a moment; a transaction kept open on it
-- (a user's own cancel, on a direct SQL session) is waited for no longer than the bound, and the job counts
-- as lost, as the cancel makes it. The ids completed.
create function jobkit_private.complete_held(
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
        if p_delete and v_owner is null
           and not exists (select from public.jobkit_pipeline_jobs p where p.job_id = v_pair.id)
           and not exists (select from public.jobkit_dependencies d
                           where d.depends_on = v_pair.id and d.outcome is null) then
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
-- p_after, the last job this caller claimed, is where the claim starts looking: at that job's place in the
-- order (the jobs enqueued with it share that place), among jobs of its priority; from the start only when
-- those run short. Why: every job claimed since the oldest snapshot still open (an idle transaction, a
-- long report) leaves an index entry that no vacuum may remove until that snapshot ends, and a claim from
-- the start walks past all of them (a drain of 30,000 jobs with the horizon pinned ran at 0.62x of its
-- clean rate; starting at p_after, 0.97x). The cost: a job of higher priority, or a fairness key's earlier
-- turn, enqueued meanwhile waits for a claim from the start, which the worker makes every 10th claim and
-- whenever a claim comes back short. Types under a limit are always claimed from the start (p_after is
-- ignored for them).
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
create function public.jobkit_claim(
  p_types text[],
  p_worker text,
  p_lease_seconds double precision,
  p_limit integer default 1,
  p_done_ids uuid[] default null,
  p_done_tokens uuid[] default null,
  p_done_results jsonb default null,
  p_done_delete boolean default false,
  p_after uuid default null
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
  v_at        record;
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
      select j.id, p_done_delete and j.user_id is null
                   and not exists (select from public.jobkit_pipeline_jobs p where p.job_id = j.id)
                   and not exists (select from public.jobkit_dependencies d
                                   where d.depends_on = j.id and d.outcome is null) as gone
      from public.jobkit_jobs j
      where j.id = any(p_done_ids)
        and (j.id, j.lease_token) in (select * from unnest(p_done_ids, p_done_tokens))
      for no key update of j skip locked
    ), kept as (
      update public.jobkit_jobs j
      set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now(), progress = 1,
          result = p_done_results -> j.id::text
      from mine
      where j.id = mine.id and not mine.gone
      returning j.id
    ), deleted as (
      delete from public.jobkit_jobs j
      using mine
      where mine.gone and j.id = mine.id
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
    -- A second statement, whose snapshot sees them succeeded: the jobs that wait for them (45_pipelines.sql)
    if exists (select from public.jobkit_dependencies d where d.depends_on = any(v_done) and d.outcome is null)
    then
      perform jobkit_private.settle(v_done);
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

  -- Without limits: first from p_after on, within its priority (the index's range from that job on), then the
  -- rest from the start, in the update's statement (jobs this claim locked are its own, not skipped: left out).
  if p_after is not null and cardinality(v_ltypes) = 0 then
    select j.priority, j.fair_round, j.run_after, j.created_at into v_at
    from public.jobkit_jobs j where j.id = p_after;
    if found then
      v_ids := array(
        select j.id from public.jobkit_jobs j
        where j.status in ('queued', 'retrying') and j.priority = v_at.priority
          and (j.fair_round, j.run_after, j.created_at) >= (v_at.fair_round, v_at.run_after, v_at.created_at)
          and j.run_after <= now() and j.type = any(v_types)
        order by j.priority desc, j.fair_round, j.run_after, j.created_at
        limit v_need
        for update skip locked);
      v_need := v_need - cardinality(v_ids);
    end if;
  end if;
  return query
  with picked as (
    select j.id from public.jobkit_jobs j
    where cardinality(v_ltypes) = 0
      and j.status in ('queued', 'retrying') and j.run_after <= now() and j.type = any(v_types)
      and j.id <> all(v_ids)
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
-- their owner lists them and watches them finish, and so are a pipeline's and those a job waits for (their
-- ending and result are handed on). p_delete is a one-time filter: left false, the delete is
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
create function public.jobkit_complete(
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
    select j.id, p_delete and j.user_id is null
                 and not exists (select from public.jobkit_pipeline_jobs p where p.job_id = j.id)
                 and not exists (select from public.jobkit_dependencies d
                                 where d.depends_on = j.id and d.outcome is null) as gone
    from public.jobkit_jobs j
    where j.id = any(p_ids)
      and (j.id, j.lease_token) in (select * from unnest(p_ids, p_lease_tokens))
    for no key update of j skip locked
  ), kept as (
    update public.jobkit_jobs j
    set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now(), progress = 1,
        result = p_results -> j.id::text
    from mine
    where j.id = mine.id and not mine.gone
    returning j.id
  ), deleted as (
    delete from public.jobkit_jobs j
    using mine
    where mine.gone and j.id = mine.id
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
  -- A second statement, whose snapshot sees them succeeded: the jobs that wait for them (45_pipelines.sql)
  if exists (select from public.jobkit_dependencies d where d.depends_on = any(v_done) and d.outcome is null) then
    perform jobkit_private.settle(v_done);
  end if;
  return query select i.id, i.id = any(v_done) from unnest(p_ids) as i(id);
end;
$$;

-- fail: fenced like complete. Retrying with run_after = now() + p_retry_delay_seconds, or dead when
-- the attempts are used up or p_permanent. The error text is kept, cut to 4000 characters.
-- p_max_attempts (1 to 1000), when given, is the attempts the job's type gets (its handler's
-- max_attempts): it decides dead or retrying in place of the job's own, and is kept as the job's
-- max_attempts, so that a later reclaim of an expired lease (which runs without the worker) honours it
-- too. It raises the job's value or lowers it, never below the attempts made (attempts <= max_attempts
-- holds): a job past it ends dead. Until its first failure, a job's crashes count against its own value.
-- p_traceback, when given, is kept for operators as the job's latest traceback (jobkit_tracebacks, its last
-- 8000 characters, with the attempt): users, who read their job's error, never read it. A traceback row
-- another transaction holds is passed over: it never costs the failure.
create function public.jobkit_fail(
  p_id uuid,
  p_lease_token uuid,
  p_error text,
  p_retry_delay_seconds double precision default 0,
  p_permanent boolean default false,
  p_max_attempts integer default null,
  p_traceback text default null
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
  if p_max_attempts is not null and p_max_attempts not between 1 and 1000 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_max_attempts must be between 1 and 1000 (got %s)', p_max_attempts);
  end if;
  begin
    update public.jobkit_jobs j
    set status = case when p_permanent is true or j.attempts >= coalesce(p_max_attempts, j.max_attempts)
                      then 'dead' else 'retrying' end,
        run_after = case when p_permanent is true or j.attempts >= coalesce(p_max_attempts, j.max_attempts)
                         then j.run_after else now() + make_interval(secs => p_retry_delay_seconds) end,
        max_attempts = greatest(coalesce(p_max_attempts, j.max_attempts), j.attempts),
        lease_until = null,
        lease_token = null,
        error = left(coalesce(nullif(p_error, ''), 'failed (no error text)'), 4000),
        updated_at = now()
    where j.id = p_id and j.status = 'running' and j.lease_token = p_lease_token
    returning j.id, j.status, j.attempts, j.run_after, j.user_id into v_row;
    v_ok := found;
  exception when lock_not_available then
    v_ok := false;  -- held past the bound: passed over, as a lost lease
  end;
  if v_ok and p_traceback is not null then
    begin
      insert into public.jobkit_tracebacks as t (job_id, user_id, attempt, traceback, failed_at)
      values (p_id, v_row.user_id, v_row.attempts, right(p_traceback, 8000), now())
      on conflict (job_id) do update
      set attempt = excluded.attempt, traceback = excluded.traceback, failed_at = excluded.failed_at;
    exception when lock_not_available then
      null;  -- held past the bound (a prune deleting it, say): the failure is recorded without it
    end;
  end if;
  if v_ok then
    if v_row.status = 'dead'
       and exists (select from public.jobkit_dependencies d where d.depends_on = p_id and d.outcome is null) then
      perform jobkit_private.settle(array[p_id]);  -- the jobs that wait for it (45_pipelines.sql)
    end if;
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
create function public.jobkit_heartbeat(p_ids uuid[], p_lease_tokens uuid[], p_lease_seconds double precision)
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
create function public.jobkit_progress(
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
create function public.jobkit_release(p_id uuid, p_lease_token uuid)
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
