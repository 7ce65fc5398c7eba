-- jobkit 0.5.1, from 0.5.0: hardening. A handler's max_attempts and a failure's traceback reach the
-- database (jobkit_fail, jobkit_tracebacks); jobkit_queue_depth pages; users' pipelines are refused from
-- their shape before any work and bounded; wake-ups name nothing; deleting a user settles what waits for
-- their jobs; a pipeline's cancel locks in a completion's order. Each section below says what and why.
--
-- Locks, on a database with jobs in it (measured: 29 ms for the whole file on 100,000 jobs):
-- * jobkit_jobs: SHARE ROW EXCLUSIVE, to create the trigger jobkit_jobs_settle_deleted, until the file
--   commits (writes wait, reads go on); its row type and indexes do not change.
-- * auth.users: SHARE ROW EXCLUSIVE for a moment, for jobkit_tracebacks' foreign key.
-- * jobkit_fail and jobkit_queue_depth are dropped and created again with trailing defaulted arguments,
--   jobkit_private.user_limits with a third: 0.5.0 clients' calls go on working. The rest is replaced in
--   place or new: nothing anyone holds.

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
as $$ select '0.5.1' $$;

-- Handlers' max_attempts, and tracebacks for operators (issue 42, items 6 and 7) ---------------------------
-- A handler's max_attempts is the attempts its type's jobs get, raising or lowering each job's own:
-- jobkit_fail takes it (p_max_attempts), decides with it and keeps it as the job's max_attempts, so that a
-- later reclaim of an expired lease honours it too. A failure's traceback (p_traceback) is kept for
-- operators in jobkit_tracebacks (service_role only; users read the job's one-line error, as before), read
-- with jobkit_traceback, deleted with its job by jobkit_prune (which also deletes, past its horizon, those
-- of jobs deleted on completion) and with its user.
-- Locks: jobkit_jobs none (its table, row type and indexes are unchanged). jobkit_fail is dropped and
-- created again with two more trailing arguments, both default null: a 0.5.0 worker's calls (named
-- arguments, or the first five positionally) go on working, and its prepared statements are planned again
-- against the new function. jobkit_prune is replaced in place; the new table and function: nothing anyone
-- holds (the new table's foreign key takes SHARE ROW EXCLUSIVE on auth.users, for the moment it is made).
create table public.jobkit_tracebacks (
  job_id    uuid        primary key,
  user_id   uuid        references auth.users (id) on delete cascade,  -- the job's owner: gone with them
  attempt   integer     not null,
  traceback text        not null,
  failed_at timestamptz not null default now(),
  constraint jobkit_tracebacks_attempt_valid check (attempt >= 1),
  constraint jobkit_tracebacks_bounded check (char_length(traceback) <= 8000)
);

comment on table public.jobkit_tracebacks is
  'jobkit: the traceback of each job''s latest failed attempt (kept by jobkit_fail; service_role only).';

create index jobkit_tracebacks_failed on public.jobkit_tracebacks (failed_at);

create index jobkit_tracebacks_user on public.jobkit_tracebacks (user_id) where user_id is not null;

drop function public.jobkit_fail(uuid, uuid, text, double precision, boolean);

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

-- prune: delete finished jobs (succeeded, dead and cancelled by default) last updated longer ago than
-- p_older_than_seconds; at most p_limit rows (1 to 10000) per call: call again until it returns 0. A job
-- that a job not yet finished waits for is kept (its result is still to be handed on); a pruned job's
-- pipeline row, what it waited for and its traceback go with it (and, as old, the tracebacks of jobs
-- deleted on completion).
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


alter table public.jobkit_tracebacks enable row level security;

create policy jobkit_tracebacks_service on public.jobkit_tracebacks
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_tracebacks from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_tracebacks to service_role;

revoke execute on function public.jobkit_fail(uuid, uuid, text, double precision, boolean, integer, text)
  from public, anon, authenticated;

grant execute on function public.jobkit_fail(uuid, uuid, text, double precision, boolean, integer, text)
  to service_role;

revoke execute on function public.jobkit_traceback(uuid) from public, anon, authenticated;

grant execute on function public.jobkit_traceback(uuid) to service_role;

-- The queue's depth, every row (issue 42, item 13b) ------------------------------------------------------
-- jobkit_queue_depth() answered at most 1000 (type, status) rows and said nothing of the rest (through
-- PostgREST, a lowered Max Rows cut it sooner): a metric read from it stopped at 1000 series, silently. It
-- now pages as jobkit_activity does, after the last row's (type, status), p_limit rows at a time; called
-- with no arguments it answers what it did.
-- Locks: jobkit_jobs none. The function is dropped and created again with three arguments, each with a
-- default (a call without arguments is unchanged); its grants are given again.
drop function public.jobkit_queue_depth();

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

revoke execute on function public.jobkit_queue_depth(text, text, integer) from public, anon, authenticated;
grant execute on function public.jobkit_queue_depth(text, text, integer) to service_role;

-- The users' SQL, hardened (issue 42, items 9, 10 and 11, and (a) and (b) left from 0.5.0) ---------------
-- * Cheap refusals first (9): jobkit_user_enqueue_pipeline refuses what the request's shape and the user's
--   limits refuse (its size, the waits it lists, the jobs of each type it would add against max_live_per_user
--   and max_created_per_user less what the user has) before add_graph validates or writes anything, with the
--   error the late check raises (JK001, JK003); jobkit_user_enqueue refuses a job over a limit before its
--   insert. jobkit_private.user_limits takes what a call would add (p_adding).
-- * Bounds (10): a users' pipeline is at most 1 MiB of JSON, and each of its jobs waits for at most 100 jobs,
--   1000 in all (the app's own pipelines keep 10000 and 100000).
-- * Wake-ups name nothing (11): any role may LISTEN on any channel, and a notification on jobkit_jobs named
--   the types enqueued, the app's included. Its payload is now empty; workers claim on any notification, as
--   they did, so a 0.5.0 worker keeps waking.
-- * Deleting a user (a) deleted their jobs by the foreign key and left a job of another owner that waited for
--   one of them waiting for ever. A trigger now settles what waits for a job deleted before it ended, as its
--   cancellation would (settle counts a job that no longer exists as cancelled).
-- * cancel_pipeline (b) locks its jobs in the order they were added, the order a completion takes them, so
--   the two no longer deadlock.
-- Locks: jobkit_jobs SHARE ROW EXCLUSIVE, to create the trigger jobkit_jobs_settle_deleted: taken once the
-- transactions writing jobs have ended (waiting at most the 5 s above), and held until the migration
-- commits, milliseconds later (the rest is function definitions), while writes to jobs wait and reads go on;
-- the table's row type and indexes are unchanged. jobkit_private.user_limits is dropped and created again
-- with a third argument (private: called only by the functions replaced here); the other functions are
-- replaced in place (same arguments and result): nothing anyone holds.

-- Wake-ups that name nothing (item 11)

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

-- A job deleted before it ended counts as cancelled (item a), and the lock order of a pipeline's cancel (b)

-- settle: the jobs that wait for p_ids, after these ended (a statement of the caller's transaction made them
-- succeeded, dead or cancelled; one that has not ended is passed over; one that no longer exists, deleted
-- before it ended, counts as cancelled: jobkit_jobs_settle_deleted, 85_triggers.sql). Cascades: a job it
-- cancels is settled in turn. Counters are locked in id order, so that two endings sharing the jobs that
-- wait for them take their locks in one order and cannot deadlock over them.
create or replace function jobkit_private.settle(p_ids uuid[])
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
    perform jobkit_private.settle(v_ids);
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
create function jobkit_private.settle_deleted() returns trigger
language plpgsql
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if exists (select from public.jobkit_dependencies d where d.depends_on = old.id and d.outcome is null) then
    perform jobkit_private.settle(array[old.id]);
  end if;
  return null;
end;
$$;

create trigger jobkit_jobs_settle_deleted
  after delete on public.jobkit_jobs
  for each row
  when (old.status in ('waiting', 'queued', 'retrying') or (old.status = 'running' and old.user_id is not null))
  execute function jobkit_private.settle_deleted();


revoke all on function jobkit_private.settle_deleted() from public;

-- Cheap refusals first, and the bounds of a users' pipeline (items 9 and 10)

drop function jobkit_private.user_limits(uuid, text[]);

-- user_limits: the limits of jobkit_user_types for p_user's jobs of p_types, counted now (JK003 naming the
-- first one exceeded): live jobs (waiting, queued, running or retrying) and jobs created within per_seconds,
-- with p_adding[i] more of p_types[i] (null: none) that the caller is about to add. Its callers hold the lock
-- of each (user, type) and call it twice: before their insert with what they would add, so that a call
-- that cannot pass is refused before it writes anything (one that would add more than a limit at all,
-- without a count); and after it, with nothing more, since a key freed meanwhile (its job cancelled) may
-- have added a job the first count took for one the key already held.
create function jobkit_private.user_limits(p_user uuid, p_types text[], p_adding integer[] default null)
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
  v_rules public.jobkit_user_types;
  v_add   integer;
  v_have  bigint;
begin
  for v_rules in select t.* from public.jobkit_user_types t where t.type = any(p_types) order by t.type loop
    v_add := coalesce(p_adding[array_position(p_types, v_rules.type)], 0);
    if v_add > v_rules.max_live_per_user then
      raise exception using errcode = 'JK003',
        message = format('jobkit: at most %s live jobs of type %s per user (max_live_per_user); this call adds %s',
                         v_rules.max_live_per_user, v_rules.type, v_add);
    end if;
    if v_add > v_rules.max_created_per_user then
      raise exception using errcode = 'JK003',
        message = format('jobkit: at most %s jobs of type %s per user in %s seconds (max_created_per_user); '
                         'this call adds %s', v_rules.max_created_per_user, v_rules.type, v_rules.per_seconds, v_add);
    end if;
    v_have := (select count(*) from public.jobkit_jobs j
               where j.user_id = p_user and j.type = v_rules.type and j.status in ('queued', 'running', 'retrying'))
              + (select count(*) from public.jobkit_pipeline_jobs p join public.jobkit_jobs j on j.id = p.job_id
                 where p.user_id = p_user and j.type = v_rules.type and j.status = 'waiting');
    if v_have + v_add > v_rules.max_live_per_user then
      raise exception using errcode = 'JK003',
        message = format('jobkit: at most %s live jobs of type %s per user', v_rules.max_live_per_user,
                         v_rules.type)
                  || case when v_add > 0 then format(' (max_live_per_user); you have %s and this call adds %s',
                                                     v_have, v_add) else '' end;
    end if;
    v_have := (select count(*) from public.jobkit_jobs j
               where j.user_id = p_user and j.created_at > now() - make_interval(secs => v_rules.per_seconds)
                 and j.type = v_rules.type);
    if v_have + v_add > v_rules.max_created_per_user then
      raise exception using errcode = 'JK003',
        message = format('jobkit: at most %s jobs of type %s per user in %s seconds',
                         v_rules.max_created_per_user, v_rules.type, v_rules.per_seconds)
                  || case when v_add > 0 then format(' (max_created_per_user); you created %s and this call adds %s',
                                                     v_have, v_add) else '' end;
    end if;
  end loop;
end;
$$;


revoke all on function jobkit_private.user_limits(uuid, text[], integer[]) from public;

-- user_enqueue: one job of an open type for the calling user. The idempotency key is the user's own: it is
-- stored as 'user:<uid>:<key>', so one user can neither collide with nor learn of another's key, and a key
-- held by a job that is not the caller's (the app's own, say) is refused, never answered with that job.
-- The limits (live jobs of the type, and jobs of the type created within per_seconds) are counted after
-- the insert, under a lock per (user, type), by a statement whose snapshot is taken once the lock is held:
-- a job that would exceed either is rolled back with the error, whatever key it came with (and one that
-- would exceed them at the lock is refused before its insert: user_limits). Only READ
-- COMMITTED (the Data API's level) gives that snapshot: in a REPEATABLE READ or SERIALIZABLE transaction
-- the count would miss jobs committed while the lock was awaited, so it refuses to run there.
create or replace function jobkit_private.user_enqueue(
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
  -- a job that cannot pass is refused before its insert; one whose key a live job holds is answered with it
  if v_key is null or not exists (select from public.jobkit_jobs j
                                  where j.idempotency_key = v_key and j.status not in ('dead', 'cancelled')) then
    perform jobkit_private.user_limits(v_user, array[p_type], array[1]);
  end if;
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

-- user_enqueue_pipeline: a pipeline of the calling user's own, as jobkit_enqueue_pipeline takes one, of at
-- most 1000 jobs, each of an open type with only type, payload, idempotency_key, ref and depends_on: each
-- job is held to its type's rules and limits as jobkit_user_enqueue holds one (the live ones include those
-- waiting), and may wait only for jobs of this call or the user's own. All or nothing.
-- Cheap refusals first: what the request's shape and the user's limits refuse is refused before add_graph
-- validates or writes anything, with the error the late check raises (0.5.0 inserted a pipeline over a live
-- limit before it refused it: 3.7 to 5.8 s of database time for a 640 KB request, rolled back, so that
-- nothing counted it). The bounds of a users' pipeline: 1000 jobs, each waiting for at most 100 jobs, 1000
-- waits in all, and 1 MiB of JSON as PostgreSQL writes it (jsonb's text: a space after each comma and
-- colon). A chain of 1000 jobs fits, or a fan-in of 100; the 90,000 stored waits of 0.5.0's review do not:
-- a job of a user's is waited for at most 100 times by each of their live jobs (900 at a live limit of 10,
-- settled by its completion in about 25 ms). Measured in psql on the 2-core test machine (EXPLAIN ANALYZE,
-- rolled back): the largest call a user may make, 1000 jobs with 1000 waits in 1 MiB, takes 0.35 to 0.6 s
-- of database time, up to 1.2 s when its payloads are dense JSON (330,000 numbers); one refused at a bound
-- or a limit, 15 to 30 ms, besides the parse of its JSON.
create or replace function jobkit_private.user_enqueue_pipeline(p_jobs jsonb)
returns jsonb
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
  v_user     uuid := auth.uid();
  v_bad      record;
  v_bytes    integer;
  v_waits    bigint;
  v_jobs     jsonb;
  v_types    text[];
  v_adding   integer[];
  v_pipeline uuid := gen_random_uuid();
  v_out      jsonb;
begin
  if v_user is null then
    raise exception using errcode = '42501', message = 'jobkit: sign in to start jobs';
  end if;
  if current_setting('transaction_isolation') <> 'read committed' then
    raise exception using errcode = '0A000',
      message = format('jobkit: jobkit_user_enqueue_pipeline runs at READ COMMITTED only (this transaction is %s)',
                       current_setting('transaction_isolation')),
      hint = 'call it outside a REPEATABLE READ or SERIALIZABLE transaction, as the Data API does';
  end if;
  if p_jobs is null or jsonb_typeof(p_jobs) <> 'array' or jsonb_array_length(p_jobs) not between 1 and 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_jobs must be a JSON array of 1 to 1000 jobs';
  end if;
  v_bytes := octet_length(p_jobs::text);
  if v_bytes > 1048576 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_jobs is %s bytes of JSON as PostgreSQL writes it; a users'' pipeline is at '
                       'most 1048576 (1 MiB)', v_bytes),
      hint = 'split the pipeline, or keep large inputs elsewhere (Storage) and pass their names';
  end if;
  select x.idx, x.problem into v_bad from (
    select (o.ord - 1)::integer as idx, case
      when jsonb_typeof(o.e) <> 'object' then 'must be a JSON object'
      when o.e - '{type,payload,idempotency_key,ref,depends_on}'::text[] <> '{}'::jsonb
        then 'has an unknown key; allowed: type, payload, idempotency_key, ref, depends_on'
      when t.type is null
        then format('jobs of type %s cannot be started by users',
                    coalesce(quote_literal(left(o.e ->> 'type', 100)), 'null'))
      when coalesce(jsonb_typeof(o.e -> 'payload'), 'object') <> 'object'
           or octet_length(coalesce(o.e -> 'payload', '{}')::text) > t.max_payload_bytes
        then format('payload must be a JSON object of at most %s bytes', t.max_payload_bytes)
      when coalesce(jsonb_typeof(o.e -> 'idempotency_key'), 'null') not in ('string', 'null')
           or char_length(o.e ->> 'idempotency_key') not between 1 and 150
        then 'idempotency_key must be 1 to 150 characters'
      when coalesce(jsonb_typeof(o.e -> 'depends_on'), 'array') <> 'array'
        then 'depends_on must be an array of refs or job ids'
      when jsonb_array_length(coalesce(o.e -> 'depends_on', '[]')) > 100
        then 'depends_on must name at most 100 jobs in a users'' pipeline'
    end as problem
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
    left join public.jobkit_user_types t on jsonb_typeof(o.e) = 'object' and t.type = o.e ->> 'type'
  ) x
  where x.problem is not null
  order by x.idx
  limit 1;
  if found then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;
  select sum(jsonb_array_length(coalesce(e -> 'depends_on', '[]'))) into v_waits from jsonb_array_elements(p_jobs) e;
  if v_waits > 1000 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_jobs waits for %s jobs in all; a users'' pipeline waits for at most 1000', v_waits),
      hint = 'split the pipeline';
  end if;
  v_types := array(select distinct e ->> 'type' from jsonb_array_elements(p_jobs) e order by 1);
  perform pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(v_user::text || ':' || t, 0))
  from unnest(v_types) t order by t;
  -- The jobs of each type it would add: one per element without a key, one per key no live job holds
  -- (elements sharing a key are one job, of the first one's type).
  with els as (
    select o.ord, o.e ->> 'type' as type, o.e ->> 'idempotency_key' as key
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  ), added as (
    select f.type, count(*)::integer as n
    from (select distinct on (e.key, case when e.key is null then e.ord end) e.type, e.key
          from els e
          order by e.key, case when e.key is null then e.ord end, e.ord) f
    where f.key is null
       or not exists (select from public.jobkit_jobs j
                      where j.idempotency_key = 'user:' || v_user || ':' || f.key
                        and j.status not in ('dead', 'cancelled'))
    group by f.type
  )
  select array_agg(coalesce(a.n, 0) order by t.type) into v_adding
  from unnest(v_types) as t(type)
  left join added a on a.type = t.type;
  perform jobkit_private.user_limits(v_user, v_types, v_adding);
  -- one concatenation per element: each rebuilds the element, its payload's every value included
  select jsonb_agg(o.e || jsonb_build_object('user_id', v_user, 'priority', t.priority, 'max_attempts', t.max_attempts,
                                             'idempotency_key', 'user:' || v_user || ':' || (o.e ->> 'idempotency_key'))
                   order by o.ord)
  into v_jobs
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  join public.jobkit_user_types t on t.type = o.e ->> 'type';
  v_out := jobkit_private.add_graph(v_jobs, v_pipeline, null, 'cancel', v_user, true);
  if exists (select from jsonb_array_elements(v_out) o
             join public.jobkit_jobs j on j.id = (o ->> 'id')::uuid
             where j.user_id is distinct from v_user) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: an idempotency_key is held by a job that is not yours; choose another key';
  end if;
  perform jobkit_private.user_limits(v_user, v_types);
  return jsonb_build_object('pipeline_id', v_pipeline, 'jobs', v_out);
end;
$$;
