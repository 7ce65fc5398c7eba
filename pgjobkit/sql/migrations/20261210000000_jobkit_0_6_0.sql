-- jobkit 0.6.0, from 0.5.1: SQL a reader can follow (issue 43), and the view of a JetStream queue (issue
-- 44). The first is a refactor: every public function keeps its name, arguments, defaults, result columns
-- and errors; what changes is the private helpers behind them. The second adds two tables (the projection's
-- versions, the outbox) and their functions, and one refusal (JK004) to three functions on a database that
-- holds a projection. Each section below says what and why.
--
-- Locks, on a database with jobs in it (measured: 15 ms for the whole file on 100,000 jobs, median of 3):
-- * No table is altered, and none is locked: jobkit_jobs, its row type and its indexes are unchanged.
-- * Each function replaced or dropped: ACCESS EXCLUSIVE on the function itself (an object lock, until the
--   file commits), which only DDL on that function waits for: calls take no lock on a function.
-- * The public functions are replaced in place (create or replace, the same signatures): a 0.5.x worker's
--   calls go on working; a call already running finishes on the body it started with, and its next call
--   runs the new one (prepared statements are planned again, with the same result types).
-- * jobkit_private.settle and jobkit_private.complete_held are renamed release_waiters and
--   complete_after_lock_wait; the old names stay for one release as wrappers of the new (88_compat.sql), so
--   a 0.5.1 body still running at the commit finds what it calls (a name it could not find would be 42883,
--   which a worker takes for a missing migration). The next schema release drops them.
-- * The new types jobkit_private.claim_limits and jobkit_private.edge, and the new private functions:
--   nothing anyone holds.
-- * The view of a JetStream queue (issue 44, at the end of the file): the new table jobkit_projected and
--   the new functions jobkit_project, jobkit_private.refuse_projected and refuse_users_enqueue, nothing
--   anyone holds; jobkit_claim, jobkit_reclaim_expired and jobkit_cancel, replaced as above, and
--   jobkit_user_enqueue and jobkit_user_enqueue_pipeline, replaced in place, refuse once that table holds
--   a row. The
--   outbox: the new table jobkit_outbox, its index and jobkit_outbox_enqueue, _take and _done, likewise.

-- A lock this migration must wait for, it waits for at most 5 s (unless whoever runs it set a bound of
-- their own, as `pgjobkit migrate --lock-timeout` does): then it fails, changing nothing, rather than queue
-- every worker behind a long transaction. Run it again when the database is quieter.
select set_config('lock_timeout', '5s', true) where current_setting('lock_timeout') = '0';

-- The schema version ------------------------------------------------------------------------------------
create or replace function public.jobkit_schema_version() returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '0.6.0' $$;

-- Names that say what they mean (issue 43, house review section 7) --------------------------------------
-- settle is release_waiters (it releases, or cancels, the jobs that wait for the ones that ended);
-- complete_held is complete_after_lock_wait ("held" meant locked by another transaction, not leased).
-- Their bodies are 0.5.1's. Every function that called them is replaced below to call the new names.
-- release_waiters: the jobs that wait for p_ids, after these ended (a statement of the caller's transaction
-- made them succeeded, dead or cancelled; one that has not ended is passed over; one that no longer exists,
-- deleted before it ended, counts as cancelled: jobkit_jobs_settle_deleted, 85_triggers.sql). Cascades: a job it
-- cancels is settled in turn. Counters are locked in id order, so that two endings sharing the jobs that
-- wait for them take their locks in one order and cannot deadlock over them.
create function jobkit_private.release_waiters(p_ids uuid[])
returns void
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
set enable_seqscan = off
as $$
declare
  v_ended   uuid[] := p_ids;
  v_jobs    uuid[];
  v_counts  integer[];
  v_whys    text[];
  v_free    uuid[];
  v_cancel  uuid[];
  v_reasons text[];
begin
  while coalesce(cardinality(v_ended), 0) > 0 loop
    with ended as (
      update public.jobkit_dependencies d
      set outcome = coalesce(j.status, 'cancelled')
      from unnest(v_ended) as e(id)
      left join public.jobkit_jobs j on j.id = e.id
      where d.depends_on = e.id and d.outcome is null
        and (j.id is null or j.status in ('succeeded', 'dead', 'cancelled'))
      returning d.job_id, d.position, d.depends_on, d.on_failure, d.outcome
    )
    select array_agg(g.job_id order by g.job_id), array_agg(g.n order by g.job_id),
           array_agg(g.why order by g.job_id)
    into v_jobs, v_counts, v_whys
    from (select e.job_id, count(*)::integer as n,  -- why: the first it listed of those that failed it
                 (array_agg(format('job %s, which it waits for, ended %s', e.depends_on, e.outcome)
                            order by e.position)
                    filter (where e.on_failure = 'cancel' and e.outcome <> 'succeeded'))[1] as why
          from ended e group by e.job_id) g;
    exit when v_jobs is null;

    perform from public.jobkit_pipeline_jobs p where p.job_id = any(v_jobs) order by p.job_id
    for no key update;
    with counted as (
      update public.jobkit_pipeline_jobs p
      set waiting_for = greatest(p.waiting_for - c.n, 0)
      from unnest(v_jobs, v_counts, v_whys) as c(job_id, n, why)
      where p.job_id = c.job_id
      returning p.job_id, p.waiting_for, c.why
    )
    select array_agg(c.job_id) filter (where c.why is null and c.waiting_for = 0),
           array_agg(c.job_id) filter (where c.why is not null),
           array_agg(c.why) filter (where c.why is not null)
    into v_free, v_cancel, v_reasons
    from counted c;

    if v_free is not null then
      -- queued now, taking the turn a job enqueued now would (jobkit_fair_round)
      update public.jobkit_jobs j
      set status = 'queued', run_after = greatest(j.run_after, now()), updated_at = now(),
          fair_round = public.jobkit_fair_round(j.type, j.priority, j.fair_key)
      where j.id = any(v_free) and j.status = 'waiting';
      if found then
        perform pg_notify('jobkit_jobs', '');  -- wake LISTENing workers (insert_jobs says why empty)
        if to_regprocedure('jobkit_private.wake_released()') is not null then  -- and Realtime's
          execute 'select jobkit_private.wake_released()';
        end if;
      end if;
    end if;

    v_ended := null;
    if v_cancel is not null then
      with gone as (
        update public.jobkit_jobs j
        set status = 'cancelled', error = left('jobkit: cancelled: ' || c.why, 4000), updated_at = now()
        from unnest(v_cancel, v_reasons) as c(id, why)
        where j.id = c.id and j.status = 'waiting'
        returning j.id
      )
      select array_agg(g.id) into v_ended from gone g;
    end if;
  end loop;
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

-- The claim in pieces of about two screens each (issue 43) -------------------------------------------------
-- jobkit_claim was 272 lines with a copy of jobkit_complete's statement written out in it; now it checks
-- its arguments (check_claim_args), completes with the statement jobkit_complete uses (complete_done, the
-- completion written once), reclaims, reads the limits of its types (open_limits, into the named type
-- claim_limits) and picks under them (pick_limited) or after p_after (pick_after), then claims in one
-- statement as before. A completed job's answer row is one row variable (its id and status), not 22 typed
-- nulls. Behaviour, plans (test_migrations) and the answer's rows are 0.5.1's.
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
create or replace function public.jobkit_claim(
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

-- The other callers of the renamed helpers, replaced in place: their bodies differ from 0.5.1's only in
-- the names they call.
-- reclaim_expired: running jobs whose lease ran out go back to retrying (runnable at once), or to
-- dead when their attempts are used up (a job that kills its worker every time ends dead): against the
-- job's max_attempts, which a failure may have set to its handler's (jobkit_fail's p_max_attempts). At most
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
create or replace function public.jobkit_fail(
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

-- cancel: waiting, queued, retrying and running jobs end cancelled at once, at most 1000 ids per call (and
-- the jobs that wait for them are settled: 45_pipelines.sql). A running
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

-- complete_adding: complete one job as jobkit_complete does (fenced by its lease token; p_result kept) and,
-- in the same transaction, add p_jobs (as jobkit_enqueue_pipeline takes them) to its pipeline, as jobs it
-- added: a job not in a pipeline becomes the first of one named by its id. Their user_id defaults to the
-- job's. {ok: false} when the lease was lost: then nothing is completed and nothing added. Else {ok: true,
-- pipeline_id, jobs}.
create or replace function public.jobkit_complete_adding(
  p_id uuid,
  p_lease_token uuid,
  p_result jsonb default null,
  p_jobs jsonb default '[]',
  p_on_failure text default 'cancel'
)
returns jsonb
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set lock_timeout = '250ms'  -- a row another transaction holds (see jobkit_complete)
as $$
declare
  v_owner    uuid;
  v_done     boolean;
  v_pipeline uuid;
  v_jobs     jsonb;
begin
  if p_id is null or p_lease_token is null then
    raise exception using errcode = 'JK001', message = 'jobkit: p_id and p_lease_token are required';
  end if;
  begin
    update public.jobkit_jobs j
    set status = 'succeeded', lease_until = null, lease_token = null, updated_at = now(), progress = 1,
        result = p_result
    where j.id = p_id and j.lease_token = p_lease_token
    returning j.user_id into v_owner;
    v_done := found;
  exception when lock_not_available then
    v_done := false;  -- held past the bound: passed over, as a lost lease
  end;
  if not v_done then
    return jsonb_build_object('ok', false);
  end if;
  select p.pipeline_id into v_pipeline from public.jobkit_pipeline_jobs p where p.job_id = p_id;
  if not found and jsonb_typeof(p_jobs) = 'array' and jsonb_array_length(p_jobs) > 0 then
    v_pipeline := p_id;
    insert into public.jobkit_pipeline_jobs (job_id, pipeline_id, user_id) values (p_id, p_id, v_owner);
  end if;
  v_jobs := jobkit_private.add_graph(p_jobs, v_pipeline, p_id, p_on_failure, v_owner, false);
  if exists (select from public.jobkit_dependencies d where d.depends_on = p_id and d.outcome is null) then
    perform jobkit_private.release_waiters(array[p_id]);
  end if;
  return jsonb_build_object('ok', true, 'pipeline_id', v_pipeline, 'jobs', v_jobs);
end;
$$;

-- cancel_pipeline (jobkit_private: for the operator's and the users' entry points): every job of the
-- pipeline that has not finished (with p_user_id, every such job of theirs) ends cancelled, as jobkit_cancel
-- ends one; the jobs that wait for them are settled. Until a pass finds none: a job a completion added while
-- the first pass ran is found by the next. Returns how many it cancelled.
-- Each pass locks its jobs first, in the order they were added (seq), which is the order an ending of one
-- of them takes theirs: a job is added after every job it waits for, and an ending locks its own job, then
-- the jobs that wait for it. Locked in the order the update's plan happened to read them (a scan of the
-- table reads a waiting job before the running one it waits for, whose claim moved its row), a cancel
-- could hold the waiting job while it waited for the running one, whose completion waited for the waiting
-- one: a deadlock, and one of the two rolled back (0.5.0).
create or replace function jobkit_private.cancel_pipeline(p_pipeline_id uuid, p_reason text, p_user_id uuid)
returns bigint
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_ids   uuid[];
  v_total bigint := 0;
begin
  loop
    perform from public.jobkit_pipeline_jobs p
    join public.jobkit_jobs j on j.id = p.job_id
    where p.pipeline_id = p_pipeline_id
      and (p_user_id is null or j.user_id = p_user_id)
      and j.status in ('waiting', 'queued', 'retrying', 'running')
    order by p.seq
    for no key update of j;
    with gone as (
      update public.jobkit_jobs j
      set status = 'cancelled', lease_until = null, lease_token = null,
          error = left(coalesce(p_reason, 'cancelled with its pipeline'), 4000), updated_at = now()
      from public.jobkit_pipeline_jobs p
      where p.pipeline_id = p_pipeline_id and j.id = p.job_id
        and (p_user_id is null or j.user_id = p_user_id)
        and j.status in ('waiting', 'queued', 'retrying', 'running')
      returning j.id
    )
    select array_agg(g.id) into v_ids from gone g;
    exit when v_ids is null;
    v_total := v_total + cardinality(v_ids);
    perform jobkit_private.release_waiters(v_ids);
  end loop;
  return v_total;
end;
$$;

-- A job deleted before it ended settles the jobs that wait for it as its cancellation would (0.5.1): those
-- with on_failure 'cancel' end cancelled, in cascade, and those with 'run' count it as ended. A user deleted
-- from auth.users takes their jobs with them (the foreign key's on delete cascade), and a job of another
-- owner, or of the app, that waited for one of them waited for ever (0.5.0). Row by row, and only for a job
-- that may be waited for without having ended: not for a finished one (prune's, whose waits were settled
-- when it ended), nor for the app's running ones, which jobkit deletes only as a completion with p_delete,
-- never while one waits for it (a delete of one by hand: cancel it first). So a worker's completions
-- pay a comparison per row and nothing more. As the owner: the cascade, or whoever deletes, may hold no
-- right on the pipeline tables.
create or replace function jobkit_private.settle_deleted() returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if exists (select from public.jobkit_dependencies d where d.depends_on = old.id and d.outcome is null) then
    perform jobkit_private.release_waiters(array[old.id]);
  end if;
  return null;
end;
$$;

-- add_graph in pieces, its waits a named type (issue 43) ---------------------------------------------------
-- add_graph was 193 lines that read each wait back from a JSON array by position (e ->> 3); now a wait is a
-- jobkit_private.edge (element, position, given, target, ref_index), read as e.target. The graph's keys
-- are checked by check_graph_keys, its waits made and checked by graph_edges, and its writes are
-- insert_graph's. The checks run in 0.5.1's order and raise its errors; the writes are 0.5.1's.
-- One wait of a graph's element, as add_graph reads it from depends_on: the element's index, the wait's
-- position in its depends_on, the entry as given (a string, or {"job": ..., "on_failure": ...}), the ref or
-- id it names, and the index of the element that ref names (null: not a ref of this call).
create type jobkit_private.edge as (
  element   integer,
  position  integer,
  given     jsonb,
  target    text,
  ref_index integer
);

-- check_graph_keys: the graph's own keys of p_jobs' elements (ref, depends_on), element by element: the
-- first problem, by index, raised (JK001); then refs named twice, then the waits in all.
create function jobkit_private.check_graph_keys(p_jobs jsonb)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_bad record;
begin
  select x.idx, x.problem into v_bad from (
    select (o.ord - 1)::integer as idx, case
      when jsonb_typeof(o.e) <> 'object' then 'must be a JSON object'
      when coalesce(jsonb_typeof(o.e -> 'ref'), 'string') <> 'string' then 'ref must be a string'
      when char_length(o.e ->> 'ref') not between 1 and 200 then 'ref must be 1 to 200 characters'
      when coalesce(jsonb_typeof(o.e -> 'depends_on'), 'array') <> 'array'
        then 'depends_on must be an array of refs or job ids'
      when jsonb_array_length(coalesce(o.e -> 'depends_on', '[]')) > 10000
        then 'depends_on must name at most 10000 jobs'
    end as problem
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  ) x
  where x.problem is not null
  order by x.idx
  limit 1;
  if found then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;
  select x.idx, format('ref %s names two jobs of this call; give each its own', quote_literal(left(x.ref, 100)))
    as problem
  into v_bad
  from (select (o.ord - 1)::integer as idx, o.e ->> 'ref' as ref,
               row_number() over (partition by o.e ->> 'ref' order by o.ord) as nth
        from jsonb_array_elements(p_jobs) with ordinality as o(e, ord) where o.e ? 'ref') x
  where x.nth = 2
  order by x.idx
  limit 1;
  if found then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;
  if (select sum(jsonb_array_length(coalesce(e -> 'depends_on', '[]'))) from jsonb_array_elements(p_jobs) e)
     > 100000 then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_jobs waits for more than 100000 jobs in all; split the pipeline';
  end if;
end;
$$;

-- graph_edges: every wait of p_jobs (whose graph keys check_graph_keys passed), in element and position
-- order, each checked: the first problem, by element, raised (JK001). A ref is looked up in an object from
-- ref to index, where a join could go quadratic.
create function jobkit_private.graph_edges(p_jobs jsonb)
returns jobkit_private.edge[]
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_refs  jsonb;  -- {ref: its element's index}
  v_edges jobkit_private.edge[];
  v_bad   record;
begin
  select coalesce(jsonb_object_agg(o.e ->> 'ref', o.ord - 1), '{}') into v_refs
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord) where o.e ? 'ref';
  v_edges := array(
    select row(d.idx, d.pos, d.d, x.target, (v_refs ->> x.target)::integer)::jobkit_private.edge
    from (select (o.ord - 1)::integer as idx, (dd.pos - 1)::integer as pos, dd.d
          from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
          cross join lateral jsonb_array_elements(coalesce(o.e -> 'depends_on', '[]')) with ordinality as dd(d, pos)
         ) d
    cross join lateral (
      select case jsonb_typeof(d.d) when 'string' then d.d #>> '{}' when 'object' then d.d ->> 'job' end
    ) as x(target)
    order by d.idx, d.pos);
  select x.element, x.problem into v_bad from (
    select e.element, e.position, case
      when jsonb_typeof(e.given) not in ('string', 'object')
        then 'depends_on must hold refs or job ids (strings), or {"job": ..., "on_failure": ...} objects'
      when jsonb_typeof(e.given) = 'object' and (e.given - '{job,on_failure}'::text[] <> '{}'::jsonb
                                                 or jsonb_typeof(e.given -> 'job') is distinct from 'string')
        then 'a depends_on object is {"job": <ref or id>, "on_failure": "cancel" or "run"}'
      when jsonb_typeof(e.given) = 'object' and coalesce(e.given ->> 'on_failure', 'cancel') not in ('cancel', 'run')
        then 'on_failure must be ''cancel'' or ''run'''
      when e.ref_index >= e.element
        then format('depends_on names %s, listed at or after it: list each job after the jobs it waits for '
                    '(the jobs of a cycle cannot be listed so)', quote_literal(left(e.target, 100)))
      when e.ref_index is null
           and e.target !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
        then format('depends_on names %s, neither a ref listed before it nor a job id',
                    quote_literal(left(e.target, 100)))
    end as problem
    from unnest(v_edges) e
  ) x
  where x.problem is not null
  order by x.element, x.position
  limit 1;
  if found then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.element, v_bad.problem);
  end if;
  return v_edges;
end;
$$;

-- add_graph: p_jobs (jobkit_enqueue_many's objects, each also with an optional ref, a name for it within
-- this call, and an optional depends_on: an array of refs of jobs listed before it, or ids of jobs that
-- exist, each a string or an object {"job": ..., "on_failure": "cancel" | "run"}) as jobs of pipeline
-- p_pipeline_id, added by p_parent_id's completion (or null). on_failure defaults to p_on_failure; user_id
-- to p_user_id; with p_own_only, a job that exists may be waited for only when it is p_user_id's. Nothing is
-- written when anything is wrong. An element whose idempotency key a live job holds gets that job, and
-- adds nothing to it. Returns [{ref, id, inserted, status}] in input order.
create or replace function jobkit_private.add_graph(
  p_jobs jsonb, p_pipeline_id uuid, p_parent_id uuid, p_on_failure text, p_user_id uuid, p_own_only boolean
)
returns jsonb
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_count   integer;
  v_bad     record;
  v_edges   jobkit_private.edge[];
  v_jobs    jsonb;
  v_targets uuid[];
  v_missing uuid;
begin
  if p_jobs is null or jsonb_typeof(p_jobs) <> 'array' then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_jobs must be a JSON array of job objects',
      hint = 'pass [{"ref": "a", "type": "embed"}, {"type": "reindex", "depends_on": ["a"]}]';
  end if;
  if p_on_failure is null or p_on_failure not in ('cancel', 'run') then
    raise exception using errcode = 'JK001', message = 'jobkit: p_on_failure must be ''cancel'' or ''run''';
  end if;
  v_count := jsonb_array_length(p_jobs);
  if v_count = 0 then
    return '[]'::jsonb;
  end if;
  if v_count > 10000 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_jobs holds %s jobs; at most 10000 per call', v_count),
      hint = 'split the pipeline';
  end if;
  -- The graph's own keys first, then its waits, then each job's own rules.
  perform jobkit_private.check_graph_keys(p_jobs);
  v_edges := jobkit_private.graph_edges(p_jobs);

  -- The elements as jobkit_enqueue_many takes them: graph keys out, the owner in, and waiting when they
  -- wait for anything (released below, at once, for the jobs waited for that have already ended).
  select jsonb_agg(
           (o.e - '{ref,depends_on}'::text[])
           || case when p_user_id is not null and not o.e ? 'user_id'
                   then jsonb_build_object('user_id', p_user_id) else '{}' end
           order by o.ord)
  into v_jobs
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord);
  select * into v_bad from public.jobkit_check_jobs(v_jobs);
  if found then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;
  select jsonb_agg(case when jsonb_array_length(coalesce(p_jobs -> (o.ord::integer - 1) -> 'depends_on', '[]')) > 0
                        then o.e || '{"waiting": true}' else o.e end
                   order by o.ord)
  into v_jobs
  from jsonb_array_elements(v_jobs) with ordinality as o(e, ord);

  -- Jobs that exist and are waited for are locked (FOR SHARE: an ending of one waits for this transaction
  -- and then sees what it added, or it ended first and release_waiters finds it ended), then checked: they
  -- exist (and, with p_own_only, are the user's).
  v_targets := array(select distinct e.target::uuid from unnest(v_edges) e where e.ref_index is null);
  perform from public.jobkit_jobs j where j.id = any(v_targets) order by j.id for share;
  select t into v_missing from unnest(v_targets) t
  where not exists (select from public.jobkit_jobs j
                    where j.id = t and (not p_own_only or j.user_id is not distinct from p_user_id))
  limit 1;
  if found then
    raise exception using errcode = 'JK002',
      message = format('jobkit: depends_on names job %s, which does not exist', v_missing);
  end if;
  return jobkit_private.insert_graph(p_jobs, v_jobs, v_edges, v_targets, p_pipeline_id, p_parent_id,
                                     p_on_failure);
end;
$$;

-- insert_graph: add_graph's writes, once it checked everything: p_jobs' elements as p_checked holds them
-- (as jobkit_enqueue_many takes them), their pipeline rows and their waits (p_edges); p_targets are the jobs
-- that exist and are waited for, locked. Returns add_graph's answer.
create function jobkit_private.insert_graph(
  p_jobs jsonb, p_checked jsonb, p_edges jobkit_private.edge[], p_targets uuid[], p_pipeline_id uuid,
  p_parent_id uuid, p_on_failure text
)
returns jsonb
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_ids     uuid[];
  v_final   uuid[];
  v_new     boolean[];
  v_targets uuid[] := p_targets;
  v_out     jsonb;
begin
  v_ids := array(select gen_random_uuid() from generate_series(1, jsonb_array_length(p_checked)));
  -- The pipeline's rows first, so that each job's insert already belongs to it (Realtime reads it there).
  insert into public.jobkit_pipeline_jobs (job_id, pipeline_id, user_id, parent_id, waiting_for)
  select v_ids[o.ord::integer], p_pipeline_id, (o.e ->> 'user_id')::uuid, p_parent_id,
         jsonb_array_length(coalesce(p_jobs -> (o.ord::integer - 1) -> 'depends_on', '[]'))
  from jsonb_array_elements(p_checked) with ordinality as o(e, ord);

  perform jobkit_private.insert_jobs(p_checked, v_ids);

  select array_agg(m.id order by o.ord), array_agg(m.inserted order by o.ord) into v_final, v_new
  from jsonb_array_elements(p_checked) with ordinality as o(e, ord)
  cross join lateral (
    (select true as inserted, j.id from public.jobkit_jobs j where j.id = v_ids[o.ord::integer])
    union all
    (select false, j.id from public.jobkit_jobs j
     where j.idempotency_key = o.e ->> 'idempotency_key' and j.status not in ('dead', 'cancelled'))
    limit 1
  ) m;
  if false = any(v_new) then
    delete from public.jobkit_pipeline_jobs p
    where p.job_id = any(array(select v_ids[i] from generate_subscripts(v_new, 1) i where not v_new[i]));
    -- the jobs that held their keys are waited for as jobs that exist
    v_targets := v_targets || array(select v_final[i] from generate_subscripts(v_new, 1) i where not v_new[i]);
    perform from public.jobkit_jobs j where j.id = any(v_targets) order by j.id for share;
  end if;

  insert into public.jobkit_dependencies (job_id, position, depends_on, on_failure, user_id)
  select v_final[e.element + 1], e.position, coalesce(v_final[e.ref_index + 1], e.target::uuid),
         coalesce(e.given ->> 'on_failure', p_on_failure), (p_checked -> e.element ->> 'user_id')::uuid
  from unnest(p_edges) e
  where v_new[e.element + 1];

  perform jobkit_private.release_waiters(v_targets);

  select jsonb_agg(jsonb_build_object('ref', o.e -> 'ref', 'id', v_final[o.ord::integer],
                                      'inserted', v_new[o.ord::integer],
                                      'status', (select j.status from public.jobkit_jobs j
                                                 where j.id = v_final[o.ord::integer]))
                   order by o.ord)
  into v_out
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord);
  return v_out;
end;
$$;

-- The old names, kept for one release (88_compat.sql): they now forward to the new ones. Their grants
-- stay as 0.5.1 made them (create or replace keeps a function's privileges).
-- 0.5.1's settle: release_waiters (45_pipelines.sql) since 0.6.0.
create or replace function jobkit_private.settle(p_ids uuid[])
returns void
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$ select jobkit_private.release_waiters(p_ids) $$;

-- 0.5.1's complete_held: complete_after_lock_wait (30_worker.sql) since 0.6.0.
create or replace function jobkit_private.complete_held(
  p_ids uuid[], p_lease_tokens uuid[], p_results jsonb, p_delete boolean
)
returns uuid[]
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$ select jobkit_private.complete_after_lock_wait(p_ids, p_lease_tokens, p_results, p_delete) $$;

-- Grants, as 90_security.sql makes them: the private helpers are service_role's (jobkit_claim and
-- jobkit_complete, which service_role calls, call them as the caller); anon and authenticated run none.
revoke all on function jobkit_private.release_waiters(uuid[]) from public;

grant execute on function jobkit_private.release_waiters(uuid[]) to service_role;

revoke all on function jobkit_private.complete_after_lock_wait(uuid[], uuid[], jsonb, boolean),
  jobkit_private.complete_done(uuid[], uuid[], jsonb, boolean),
  jobkit_private.check_claim_args(text[], text, double precision, integer, uuid[], uuid[], boolean),
  jobkit_private.open_limits(text[], integer),
  jobkit_private.pick_limited(jobkit_private.claim_limits, integer),
  jobkit_private.pick_after(uuid, text[], integer)
  from public;

grant execute on function jobkit_private.complete_after_lock_wait(uuid[], uuid[], jsonb, boolean),
  jobkit_private.complete_done(uuid[], uuid[], jsonb, boolean),
  jobkit_private.check_claim_args(text[], text, double precision, integer, uuid[], uuid[], boolean),
  jobkit_private.open_limits(text[], integer),
  jobkit_private.pick_limited(jobkit_private.claim_limits, integer),
  jobkit_private.pick_after(uuid, text[], integer)
  to service_role;

revoke all on function jobkit_private.check_graph_keys(jsonb), jobkit_private.graph_edges(jsonb),
  jobkit_private.insert_graph(jsonb, jsonb, jobkit_private.edge[], uuid[], uuid, uuid, text)
  from public;

grant execute on function jobkit_private.check_graph_keys(jsonb), jobkit_private.graph_edges(jsonb),
  jobkit_private.insert_graph(jsonb, jsonb, jobkit_private.edge[], uuid[], uuid, uuid, text)
  to service_role;

-- The view of a JetStream queue (issue 44): a new table and two new functions, as 75_projection.sql makes
-- them; jobkit_claim, jobkit_reclaim_expired and jobkit_cancel above refuse on a database that holds one.
-- Locks: none on jobkit_jobs (the table is new; the functions are created).
-- A JetStream queue's projector (`pgjobkit nats project`) writes
-- each job's newest record into jobkit_jobs, so that a signed-in user's listing (RLS), UserJobs, stats and
-- Realtime work for its jobs as they do for Postgres's own.
--
-- jobkit_projected holds each projected job's version: its record's stream sequence, which grows with
-- every write of that job (a job's record lives on one stream). A record no newer than the version held is
-- passed over, so one delivered again, or late, never moves a row back. A version outlives its job's row
-- (prune): a late record of a pruned job is passed over too.
--
-- A database that holds a projection is that queue's view, not a queue: its jobs are claimed, reclaimed and
-- cancelled on JetStream. jobkit_claim and jobkit_reclaim_expired refuse here, and jobkit_cancel refuses a
-- projected job (JK004), so that a worker or command left on JOBKIT_DATABASE_URL alone never runs or
-- changes a JetStream job behind its record.
create table public.jobkit_projected (
  job_id  uuid   primary key,
  version bigint not null check (version > 0)
);

comment on table public.jobkit_projected is
  'jobkit: the version of each job projected from a JetStream queue (jobkit_project writes it).';

create function jobkit_private.refuse_projected() returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  raise exception using errcode = 'JK004',
    message = 'jobkit: this database is the view of a JetStream queue (jobkit_projected holds its jobs): '
              'claim, reclaim and cancel them on JetStream (set JOBKIT_NATS_URL beside JOBKIT_DATABASE_URL)';
end;
$$;

-- refuse_users_enqueue: a signed-in user's enqueue (jobkit_user_enqueue, jobkit_user_enqueue_pipeline) on a
-- database that holds a projection would write a job no worker claims (its workers are on JetStream):
-- refused instead (JK004). Definer: a user reads nothing of jobkit_projected but this.
create function jobkit_private.refuse_users_enqueue() returns void
language plpgsql
stable
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if exists (select from public.jobkit_projected) then
    raise exception using errcode = 'JK004',
      message = 'jobkit: this project''s jobs run on a JetStream queue, which users cannot start jobs on '
                'directly: start them through the app';
  end if;
end;
$$;

-- project: write p_jobs, an array of at most 1000 {version, job} (job: a jobkit_jobs row as JSON) or
-- {version, removed} (removed: the id of a job JetStream removed, deleted here), each job once, each only
-- where its version is newer than the one held; the ids written or deleted. A value the table refuses (a
-- user that is not in auth.users, a key a live job of this database holds) fails the call: the projector
-- then writes the batch one job at a time and passes over the one refused.
create function public.jobkit_project(p_jobs jsonb)
returns table (id uuid)
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
#variable_conflict use_column
begin
  if (case when jsonb_typeof(p_jobs) = 'array' then jsonb_array_length(p_jobs) > 1000 else true end) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_jobs must be an array of at most 1000 {version, job}';
  end if;
  return query
  with incoming as (
    select (e ->> 'version')::bigint as version,
           coalesce((e -> 'job' ->> 'id')::uuid, (e ->> 'removed')::uuid) as id,
           e ? 'job' as kept,  -- (a row with a null column is neither null nor not null: this says which)
           jsonb_populate_record(null::public.jobkit_jobs, e -> 'job') as job
    from jsonb_array_elements(p_jobs) as e
  ), newer as (
    insert into public.jobkit_projected as p (job_id, version)
    select i.id, i.version from incoming i
    on conflict (job_id) do update set version = excluded.version where p.version < excluded.version
    returning p.job_id
  ), removed as (
    delete from public.jobkit_jobs j
    using incoming i join newer n on n.job_id = i.id
    where not i.kept and j.id = i.id
    returning j.id
  ), written as (
  insert into public.jobkit_jobs as j
  select (i.job).* from incoming i join newer n on n.job_id = i.id where i.kept
  on conflict (id) do update set
    (user_id, type, status, payload, idempotency_key, attempts, max_attempts, priority, run_after,
     lease_until, lease_token, claimed_by, error, created_at, updated_at, progress, progress_message,
     result, fair_key, fair_round, started_at)
    = (excluded.user_id, excluded.type, excluded.status, excluded.payload, excluded.idempotency_key,
       excluded.attempts, excluded.max_attempts, excluded.priority, excluded.run_after,
       excluded.lease_until, excluded.lease_token, excluded.claimed_by, excluded.error,
       excluded.created_at, excluded.updated_at, excluded.progress, excluded.progress_message,
       excluded.result, excluded.fair_key, excluded.fair_round, excluded.started_at)
  returning j.id
  )
  select w.id from written w union all select r.id from removed r;
end;
$$;

-- A signed-in user's enqueue on a database that holds a projection: refused (JK004), as 70_users.sql's
-- entry points now say first. Replaced in place (create or replace, the same signatures and results).
create or replace function public.jobkit_user_enqueue(
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
  select jobkit_private.refuse_users_enqueue();  -- the view of a JetStream queue (75_projection.sql)
  select * from jobkit_private.user_enqueue(p_type, p_payload, p_idempotency_key, p_trace_context);
$$;

create or replace function public.jobkit_user_enqueue_pipeline(p_jobs jsonb)
returns jsonb
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select jobkit_private.refuse_users_enqueue();
  select jobkit_private.user_enqueue_pipeline(p_jobs);
$$;

alter table public.jobkit_projected enable row level security;

create policy jobkit_projected_service on public.jobkit_projected
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_projected from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_projected to service_role;

revoke all on function jobkit_private.refuse_projected() from public;

grant execute on function jobkit_private.refuse_projected() to service_role;

revoke all on function jobkit_private.refuse_users_enqueue() from public;

grant execute on function jobkit_private.refuse_users_enqueue() to authenticated;

grant execute on function public.jobkit_project(jsonb) to service_role;

revoke execute on function public.jobkit_project(jsonb) from public, anon, authenticated;

-- The outbox of a JetStream queue (issue 44), as 76_outbox.sql makes it: jobs an app enqueues in its own SQL transaction, committed or rolled back
-- with its other writes, which the relay (`pgjobkit nats project`, pgjobkit.stores.jetstream.relay) then
-- moves into JetStream. Each job needs an idempotency key: the relay enqueues by it, so a move it repeats
-- (it stopped between the enqueue and the delete, or two relays took the same rows) finds the job the
-- first made and adds nothing. Exactly once per key, while the job the key names is live: one that is dead
-- or cancelled before a repeated move frees its key, and the repeat adds a new job.
create table public.jobkit_outbox (
  seq        bigint generated always as identity primary key,
  job        jsonb       not null,  -- one job as jobkit_enqueue_many takes it, checked; run_after absolute
  created_at timestamptz not null default now(),
  error      text                   -- why the relay could not move it: then it stays, for the operator
);

comment on table public.jobkit_outbox is
  'jobkit: jobs enqueued in SQL for a JetStream queue, until the relay moves them (jobkit_outbox_enqueue).';

create index jobkit_outbox_pending on public.jobkit_outbox (seq) where error is null;

-- outbox_enqueue: p_jobs (1 to 1000, as jobkit_enqueue_many takes them) into the outbox, in the caller's
-- transaction; their outbox numbers. Each job is held to jobkit_check_jobs's rules, and to what the
-- JetStream store takes (an idempotency key, priority 0, no fair_key), so that what the relay moves is
-- refused nowhere later. delay_seconds becomes the run_after it means now.
create function public.jobkit_outbox_enqueue(p_jobs jsonb)
returns setof bigint
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_bad record;
begin
  if (case when jsonb_typeof(p_jobs) = 'array' then jsonb_array_length(p_jobs) not between 1 and 1000
      else true end) then
    raise exception using errcode = 'JK001', message = 'jobkit: p_jobs must be an array of 1 to 1000 jobs';
  end if;
  select * into v_bad from public.jobkit_check_jobs(p_jobs) limit 1;
  if not found then
    select (o.ord - 1)::integer as idx, p.problem into v_bad
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
    cross join lateral (select case
      when o.e ->> 'idempotency_key' is null
        then 'idempotency_key is required: the outbox moves a job to JetStream exactly once by its key'
      when coalesce((o.e ->> 'priority')::numeric, 0) <> 0
        then 'priority must be 0: JetStream delivers in stream order'
      when o.e ->> 'fair_key' is not null then 'fair_key is not available on the JetStream store'
    end as problem) as p
    where p.problem is not null
    limit 1;
  end if;
  if v_bad.idx is not null then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;
  return query
  insert into public.jobkit_outbox (job)
  select case when o.e ? 'delay_seconds'
           then o.e - 'delay_seconds'
                || jsonb_build_object('run_after', now() + make_interval(secs => (o.e ->> 'delay_seconds')::float8))
           else o.e end
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  order by o.ord
  returning jobkit_outbox.seq;
end;
$$;

-- outbox_take: the oldest p_limit (1 to 1000) jobs waiting to be moved, oldest first. Rows are not locked:
-- a move is safe to repeat (by the key), and it never holds a transaction open across a JetStream call.
create function public.jobkit_outbox_take(p_limit integer default 333)
returns table (seq bigint, job jsonb)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
#variable_conflict use_column
begin
  if p_limit is null or p_limit not between 1 and 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_limit must be between 1 and 1000';
  end if;
  return query
  select o.seq, o.job from public.jobkit_outbox o where o.error is null order by o.seq limit p_limit;
end;
$$;

-- outbox_done: the moved jobs p_seqs removed; with p_errors (one a seq, null where it moved), the ones that
-- could not move kept with their error (at most 2000 characters), no longer taken. The rows it changed.
create function public.jobkit_outbox_done(p_seqs bigint[], p_errors text[] default null)
returns integer
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_deleted integer;
  v_kept    integer;
begin
  if p_seqs is null or coalesce(array_ndims(p_seqs), 1) <> 1 or cardinality(p_seqs) > 1000
     or (p_errors is not null and cardinality(p_errors) <> cardinality(p_seqs)) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_seqs must be an array of at most 1000 outbox numbers, p_errors null or one for each';
  end if;
  update public.jobkit_outbox o set error = left(d.error, 2000)
  from unnest(p_seqs, p_errors) as d(seq, error)
  where p_errors is not null and d.error is not null and o.seq = d.seq;
  get diagnostics v_kept = row_count;
  delete from public.jobkit_outbox o
  using unnest(p_seqs, coalesce(p_errors, array_fill(null::text, array[cardinality(p_seqs)]))) as d(seq, error)
  where d.error is null and o.seq = d.seq;
  get diagnostics v_deleted = row_count;
  return v_deleted + v_kept;
end;
$$;

alter table public.jobkit_outbox enable row level security;

create policy jobkit_outbox_service on public.jobkit_outbox
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_outbox from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_outbox to service_role;

revoke execute on function public.jobkit_outbox_enqueue(jsonb), public.jobkit_outbox_take(integer),
  public.jobkit_outbox_done(bigint[], text[])
  from public, anon, authenticated;

grant execute on function public.jobkit_outbox_enqueue(jsonb), public.jobkit_outbox_take(integer),
  public.jobkit_outbox_done(bigint[], text[])
  to service_role;
