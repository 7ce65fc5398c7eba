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
  if exists (select from public.jobkit_projected) then
    perform jobkit_private.refuse_projected();
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
    perform jobkit_private.release_waiters(v_dead);  -- the jobs that wait for them (45_pipelines.sql)
  end if;
  return query select * from unnest(v_ids, v_statuses, v_attempts);
end;
$$;

-- complete_after_lock_wait: the completions of complete_done that found their row locked by another
-- transaction, one at a time, each waiting at most lock_timeout for it. A concurrent claim that passed over a
-- job it no longer wanted holds the row until it commits (PostgreSQL keeps the lock it took on the newest
-- version of a row that then failed the claim's conditions), for a moment; a transaction kept open on it
-- (a user's own cancel, on a direct SQL session) is waited for no longer than the bound, and the job counts
-- as lost, as the cancel makes it. The ids completed.
create function jobkit_private.complete_after_lock_wait(
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
  v_done  uuid[] := '{}'::uuid[];
  v_pair  record;
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
      null;  -- locked past the bound: passed over, as lost
    end;
  end loop;
  return v_done;
end;
$$;

-- complete_done: the completion of jobkit_complete and of jobkit_claim's p_done_ids, written once; its
-- callers check the arguments. The ids completed, in no particular order. The rows nobody else holds are
-- completed first, in one statement that does not wait; a row another transaction holds is waited for
-- alone, at most 250 ms (complete_after_lock_wait), so that a transaction kept open on one job (a user's own
-- cancel, on a direct SQL session) cannot stall the completions of every other job in the batch. Taking the
-- locks first costs nothing measurable. A lease token is set exactly when a job is running
-- (jobkit_jobs_lease_iff_running), so matching it is the whole fence. It runs under its callers' planner
-- settings (no bitmap or sequential scans, generic plans), which a SET clause here would set again per call.
create function jobkit_private.complete_done(
  p_ids uuid[], p_lease_tokens uuid[], p_results jsonb, p_delete boolean
)
returns uuid[]
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_done uuid[];
  v_rest record;
begin
  with mine as (  -- rows another transaction holds are done after (complete_after_lock_wait)
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
    v_done := v_done || jobkit_private.complete_after_lock_wait(v_rest.ids, v_rest.tokens, p_results, p_delete);
  end if;
  -- A second statement, whose snapshot sees them succeeded: the jobs that wait for them (45_pipelines.sql)
  if exists (select from public.jobkit_dependencies d where d.depends_on = any(v_done) and d.outcome is null) then
    perform jobkit_private.release_waiters(v_done);
  end if;
  return v_done;
end;
$$;

-- check_claim_args: jobkit_claim's arguments, in the order its errors name them (JK001).
create function jobkit_private.check_claim_args(
  p_types text[], p_worker text, p_lease_seconds double precision, p_limit integer,
  p_done_ids uuid[], p_done_tokens uuid[], p_done_delete boolean
)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
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
  if p_done_delete is null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_done_delete must be true or false';
  end if;
  if (p_done_ids is not null or p_done_tokens is not null)
     and (p_done_ids is null or p_done_tokens is null or coalesce(array_ndims(p_done_ids), 1) <> 1
          or coalesce(array_ndims(p_done_tokens), 1) <> 1
          or cardinality(p_done_ids) <> cardinality(p_done_tokens) or cardinality(p_done_ids) > 1000) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_done_ids and p_done_tokens must be arrays of equal length (at most 1000)';
  end if;
end;
$$;

-- What a claim knows of the limits of its types, read under their locks (open_limits), for the pick that
-- honours them (pick_limited). The arrays limited_types, allowances and key_caps are parallel: a limited
-- type still open, how many more of it may start, its max_running_per_key (null: none); keys (type ||
-- chr(31) || key, for the keys with running jobs of a capped type) parallel to key_running, how many each
-- runs. started_at is when the claim's starts are logged.
create type jobkit_private.claim_limits as (
  open_types    text[],  -- the types the claim may still take: p_types less those at a limit
  limited_types text[],
  allowances    integer[],
  key_caps      integer[],
  rated_types   text[],  -- types whose starts are logged (max_starts)
  keys          text[],
  key_running   integer[],
  started_at    timestamptz
);

-- open_limits: locks the limits of p_types (in type order, so concurrent claims take them in one order),
-- counts each type's running jobs and its starts within the last per_seconds (jobkit_starts, logged at
-- clock_timestamp() taken under the lock; expired starts are deleted here), and says how many more of each
-- may start, at most p_need.
create function jobkit_private.open_limits(p_types text[], p_need integer)
returns jobkit_private.claim_limits
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_limits  jobkit_private.claim_limits;
  v_limit   record;
  v_allowed integer;
  v_expired integer;
begin
  perform from public.jobkit_limits l where l.type = any(p_types) order by l.type for update;
  v_limits := row(p_types, '{}'::text[], '{}'::integer[], '{}'::integer[], '{}'::text[], '{}'::text[],
                  '{}'::integer[], clock_timestamp());  -- started_at: read under the lock
  for v_limit in select l.* from public.jobkit_limits l where l.type = any(p_types) order by l.type loop
    v_allowed := p_need;
    if v_limit.max_running is not null then
      v_allowed := least(v_allowed, v_limit.max_running - (select count(*)::integer from public.jobkit_jobs j
                                                           where j.status = 'running'
                                                             and j.type = v_limit.type));
    end if;
    if v_limit.max_starts is not null then
      -- started counts the type's rows in jobkit_starts, so that no claim counts them
      delete from public.jobkit_starts s
      where s.type = v_limit.type
        and s.started_at <= v_limits.started_at - make_interval(secs => v_limit.per_seconds);
      get diagnostics v_expired = row_count;
      if v_expired > 0 then
        update public.jobkit_limits l set started = l.started - v_expired where l.type = v_limit.type;
      end if;
      v_allowed := least(v_allowed, v_limit.max_starts - (v_limit.started - v_expired));
      v_limits.rated_types := v_limits.rated_types || v_limit.type;
    end if;
    if v_allowed < 1 then
      v_limits.open_types := array_remove(v_limits.open_types, v_limit.type);
      continue;
    end if;
    v_limits.limited_types := v_limits.limited_types || v_limit.type;
    v_limits.allowances := v_limits.allowances || v_allowed;
    v_limits.key_caps := v_limits.key_caps || v_limit.max_running_per_key;
    if v_limit.max_running_per_key is not null then
      select v_limits.keys || coalesce(array_agg(v_limit.type || chr(31) || g.fair_key), '{}'),
             v_limits.key_running || coalesce(array_agg(g.running), '{}')
      into v_limits.keys, v_limits.key_running
      from (select j.fair_key, count(*)::integer as running from public.jobkit_jobs j
            where j.status = 'running' and j.type = v_limit.type and j.fair_key is not null
            group by j.fair_key) g;
    end if;
  end loop;
  return v_limits;
end;
$$;

-- pick_limited: up to p_need runnable jobs of p_limits' open types, locked, in claim order, row by row: a
-- type whose allowance is used up leaves the pick (the scan starts again without it); a key at its cap is
-- passed over (at most 1000 rows passed over per claim).
create function jobkit_private.pick_limited(p_limits jobkit_private.claim_limits, p_need integer)
returns uuid[]
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_types         text[] := p_limits.open_types;
  v_limited_types text[] := p_limits.limited_types;
  v_allowances    integer[] := p_limits.allowances;
  v_key_caps      integer[] := p_limits.key_caps;
  v_keys          text[] := p_limits.keys;
  v_key_running   integer[] := p_limits.key_running;
  v_need          integer := p_need;
  v_ids           uuid[] := '{}'::uuid[];
  v_passed        integer := 0;
  v_row           record;
  v_type_index    integer;  -- the row's type in v_limited_types
  v_key_index     integer;  -- its type and key in v_keys
  v_type_closed   boolean;  -- a type's allowance ran out: the scan starts again without it
begin
  loop
    v_type_closed := false;
    for v_row in
      select j.id, j.type, j.fair_key from public.jobkit_jobs j
      where j.status in ('queued', 'retrying') and j.run_after <= now() and j.type = any(v_types)
        and j.id <> all(v_ids)
      order by j.priority desc, j.fair_round, j.run_after, j.created_at
      limit v_need + 1000 - v_passed
      for update skip locked
    loop
      v_type_index := array_position(v_limited_types, v_row.type);
      if v_type_index is not null and v_key_caps[v_type_index] is not null and v_row.fair_key is not null then
        v_key_index := array_position(v_keys, v_row.type || chr(31) || v_row.fair_key);
        if v_key_index is null then
          v_keys := v_keys || (v_row.type || chr(31) || v_row.fair_key);
          v_key_running := v_key_running || 1;
        elsif v_key_running[v_key_index] >= v_key_caps[v_type_index] then
          v_passed := v_passed + 1;
          continue;
        else
          v_key_running[v_key_index] := v_key_running[v_key_index] + 1;
        end if;
      end if;
      v_ids := v_ids || v_row.id;
      v_need := v_need - 1;
      if v_type_index is not null then
        v_allowances[v_type_index] := v_allowances[v_type_index] - 1;
        if v_allowances[v_type_index] = 0 then
          v_types := array_remove(v_types, v_row.type);
          v_type_closed := true;
        end if;
      end if;
      exit when v_need = 0 or v_type_closed;
    end loop;
    exit when not v_type_closed or v_need = 0 or cardinality(v_types) = 0;
  end loop;
  return v_ids;
end;
$$;

-- pick_after: up to p_need runnable jobs of p_types from p_after's place in the claim order on, within its
-- priority (the claim index's range from that job on), locked; none when p_after is gone.
create function jobkit_private.pick_after(p_after uuid, p_types text[], p_need integer)
returns uuid[]
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_at record;
begin
  select j.priority, j.fair_round, j.run_after, j.created_at into v_at
  from public.jobkit_jobs j where j.id = p_after;
  if not found then
    return '{}'::uuid[];
  end if;
  return array(
    select j.id from public.jobkit_jobs j
    where j.status in ('queued', 'retrying') and j.priority = v_at.priority
      and (j.fair_round, j.run_after, j.created_at) >= (v_at.fair_round, v_at.run_after, v_at.created_at)
      and j.run_after <= now() and j.type = any(p_types)
    order by j.priority desc, j.fair_round, j.run_after, j.created_at
    limit p_need
    for update skip locked);
end;
$$;

-- claim: up to p_limit runnable jobs of the given types: highest priority first, then the earliest turn
-- (jobkit_fair_round: keys take turns), then oldest run_after, then oldest created_at. Expired leases are
-- reclaimed first, in the same round trip.
-- p_after, the last job this caller claimed, is where the claim starts looking: at that job's place in the
-- order (the jobs enqueued with it share that place), among jobs of its priority; from the start only when
-- those run short. Why: every job claimed since the oldest snapshot still open (an idle transaction, a
-- long report) leaves an index entry that no vacuum may remove until that snapshot ends, and a claim from
-- the start walks past all of them (bench/pressure.py measures a drain with the horizon pinned). The cost:
-- a job of higher priority, or a fairness key's earlier turn, enqueued meanwhile waits for a claim from the
-- start, which the worker makes every 10th claim and whenever a claim comes back short. Types under a limit
-- are always claimed from the start (p_after is ignored for them).
-- With p_done_ids / p_done_tokens (at most 1000) it first completes those jobs exactly as jobkit_complete
-- does (jobkit_private.complete_done, p_done_delete as its p_delete) and returns each one completed (id and
-- status succeeded, nothing else: the caller knows the job, and a batch's payloads need not travel back to
-- be ignored) before the claimed rows (status running): one round trip and one commit per batch instead of
-- two. A done id not returned lost its lease. The claim is a later statement, so its snapshot sees these
-- jobs finished.
-- The rows returned never exceed 1000: at most 999 are claimed, and no more than 1000 less the completed
-- rows, so no job is ever leased to a caller whose answer PostgREST cut.
--
-- Flow control: a type with a row in jobkit_limits is claimed holding that row's lock, so concurrent claims
-- of it take turns and none can exceed it. Under the lock it counts the type's running jobs (expired leases
-- were just reclaimed, so a lost worker's slots come back when its leases end) and its starts within the
-- last per_seconds (jobkit_private.open_limits). A type at a limit is left out of the claim; a key at
-- max_running_per_key is passed over (jobkit_private.pick_limited). Types without a row take no lock and
-- pay one primary-key probe.
--
-- How it plans: the pick must be an ordered scan of jobkit_jobs_claim that stops at p_limit rows.
-- Statistics go stale between autovacuums and the planner may pick a bitmap scan plus sort, which reads
-- every dead entry of the index and cannot mark them dead, or join the picked rows back by hashing a
-- sequential scan of the whole table. Every statement here and in its helpers has an index made for it and
-- the queue's pages are in cache, so bitmap and sequential scans are switched off while it runs, and rows
-- are reached by primary key (test_migrations reads the plans it runs).
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
  v_done      uuid[] := '{}'::uuid[];
  v_completed public.jobkit_jobs;  -- a completed job's answer: its id, status succeeded, the rest null
  v_done_id   uuid;
  v_need      integer;
  v_types     text[] := p_types;  -- the types this claim may still take
  v_limits    jobkit_private.claim_limits;
  v_limited   boolean := false;   -- picked row by row under limits (v_ids is the whole claim)
  v_rated     text[] := '{}'::text[];  -- types whose starts are logged
  v_now       timestamptz := now();
  v_ids       uuid[] := '{}'::uuid[];
begin
  perform jobkit_private.check_claim_args(p_types, p_worker, p_lease_seconds, p_limit,
                                          p_done_ids, p_done_tokens, p_done_delete);
  if exists (select from public.jobkit_projected) then  -- the view of a JetStream queue (75_projection.sql)
    perform jobkit_private.refuse_projected();
  end if;
  if p_done_ids is not null then
    v_done := jobkit_private.complete_done(p_done_ids, p_done_tokens, p_done_results, p_done_delete);
    v_completed.status := 'succeeded';
    foreach v_done_id in array v_done loop
      v_completed.id := v_done_id;
      return next v_completed;
    end loop;
  end if;

  -- Cheap when nothing expired: one probe of the lease index.
  if exists (select from public.jobkit_jobs j where j.status = 'running' and j.lease_until <= now()) then
    perform public.jobkit_reclaim_expired(1000);
  end if;

  v_need := least(p_limit, 999, 1000 - cardinality(v_done));
  if v_need < 1 then
    return;
  end if;
  if exists (select from public.jobkit_limits l where l.type = any(p_types)) then
    v_limits := jobkit_private.open_limits(p_types, v_need);
    v_types := v_limits.open_types;
    v_rated := v_limits.rated_types;
    v_now := v_limits.started_at;
    if cardinality(v_types) = 0 then
      return;
    end if;
    if cardinality(v_limits.limited_types) > 0 then
      v_limited := true;
      v_ids := jobkit_private.pick_limited(v_limits, v_need);
      if cardinality(v_ids) = 0 then
        return;
      end if;
    end if;
  end if;
  -- Without limits: first from p_after on, then the rest from the start, in the update's statement (jobs
  -- this claim locked are its own, not skipped: left out).
  if p_after is not null and not v_limited then
    v_ids := jobkit_private.pick_after(p_after, v_types, v_need);
    v_need := v_need - cardinality(v_ids);
  end if;
  return query
  with picked as (
    select j.id from public.jobkit_jobs j
    where not v_limited
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
-- The completion is jobkit_private.complete_done, which jobkit_claim's p_done_ids share: a row another
-- transaction holds is waited for alone, at most 250 ms. fail and release wait as long for their one row;
-- heartbeat and progress pass a held row over (its lease is extended, its progress written, at the next
-- beat).
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
  v_done := jobkit_private.complete_done(p_ids, p_lease_tokens, p_results, p_delete);
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
      perform jobkit_private.release_waiters(array[p_id]);  -- the jobs that wait for it (45_pipelines.sql)
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
