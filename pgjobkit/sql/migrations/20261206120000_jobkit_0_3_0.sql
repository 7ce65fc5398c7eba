-- jobkit 0.3.0, from 0.2.0: pipelines (jobs that wait for jobs; 45_pipelines.sql of the schema sources).
--
-- Locks, on a database with jobs in it (brief: nothing here rewrites jobkit_jobs):
-- * jobkit_jobs: SHARE (blocks writes, not reads) while the last statement checks that every row's status
--   is one jobkit_status still takes (it is: 'waiting' is only added), one pass over the table, at the end
--   of the transaction (measured here: see the README's "Upgrading").
-- * New tables (jobkit_pipeline_jobs, jobkit_dependencies) and new functions: nothing anyone holds.
-- * Functions replaced in place, signatures and row types unchanged for every function a 0.2.0 worker
--   calls, so a 0.2.0 worker keeps claiming, heartbeating and completing through the upgrade, and the
--   statements it prepared stay valid; its jobs take part in pipelines (the database settles them).

-- A lock this migration must wait for, it waits for at most 5 s (unless whoever runs it set a bound of
-- their own, as `pgjobkit migrate --lock-timeout` does): then it fails, changing nothing, rather than queue
-- every worker behind a long transaction. Run it again when the database is quieter.
select set_config('lock_timeout', '5s', true) where current_setting('lock_timeout') = '0';

-- Types ------------------------------------------------------------------------------------------------
alter domain public.jobkit_status drop constraint jobkit_jobs_status_valid;
alter domain public.jobkit_status add constraint jobkit_jobs_status_valid
  check (value in ('queued', 'running', 'retrying', 'succeeded', 'dead', 'cancelled', 'waiting')) not valid;

-- Tables ---------------------------------------------------------------------------------------------
-- Pipelines ---------------------------------------------------------------------------------------------
-- A pipeline is jobs that wait for jobs. Each of its jobs has a row here (the job's row in jobkit_jobs is
-- as any job's, so listings, RLS, Realtime, limits and fairness treat it as one). A job that waits for
-- others has status 'waiting' and counts in waiting_for the jobs it waits for that have not ended; each
-- ending decrements it in the transaction of the ending, and the one that brings it to 0 makes the job
-- queued (jobkit_private.settle). A counter, not a scan for "are all done?": such a scan, run by two
-- completions at once, each seeing the other's job still running, would leave the job waiting for ever.
create table public.jobkit_pipeline_jobs (
  job_id      uuid primary key,
  pipeline_id uuid        not null,
  user_id     uuid        references auth.users (id) on delete cascade,  -- the job's owner, for RLS
  parent_id   uuid,                  -- the job whose completion added this one; null: enqueued
  waiting_for integer     not null default 0,  -- jobs it waits for that have not ended
  seq         bigint      generated always as identity,  -- the order jobs were added in
  created_at  timestamptz not null default now(),
  constraint jobkit_pipeline_jobs_waiting_valid check (waiting_for >= 0)
);

comment on table public.jobkit_pipeline_jobs is
  'jobkit: the jobs of each pipeline, and how many of the jobs each waits for have not ended (kept by jobkit).';

create index jobkit_pipeline_jobs_pipeline on public.jobkit_pipeline_jobs (pipeline_id, seq);

create index jobkit_pipeline_jobs_user on public.jobkit_pipeline_jobs (user_id) where user_id is not null;

-- What each job waits for, in the order it listed them (position, from 0: the order its handler is handed
-- their results in), what it does when one ends dead or cancelled (on_failure: 'cancel' it, the default,
-- which cascades to the jobs that wait for it in turn; or 'run' it anyway), and how each ended (outcome,
-- null until it did). A job waits for at most 10000 jobs.
create table public.jobkit_dependencies (
  job_id     uuid    not null,
  position   integer not null,
  depends_on uuid    not null,
  on_failure text    not null default 'cancel',
  outcome    text,
  user_id    uuid    references auth.users (id) on delete cascade,  -- the waiting job's owner, for RLS
  primary key (job_id, position),
  constraint jobkit_dependencies_position_valid check (position between 0 and 9999),
  constraint jobkit_dependencies_on_failure_valid check (on_failure in ('cancel', 'run')),
  constraint jobkit_dependencies_outcome_valid check (outcome in ('succeeded', 'dead', 'cancelled'))
);

comment on table public.jobkit_dependencies is
  'jobkit: which jobs each pipeline job waits for, and how each ended (kept by jobkit).';

-- The edges an ending settles: only those not settled yet, so a completion's probe of it costs one index
-- descent, and nothing, for a job nobody waits for.
create index jobkit_dependencies_open on public.jobkit_dependencies (depends_on) where outcome is null;

-- prune keeps a job that a job not yet finished waits for (its result is still to be handed on).
create index jobkit_dependencies_on on public.jobkit_dependencies (depends_on);

-- Functions, new -------------------------------------------------------------------------------------
-- insert_jobs: the elements of p_jobs (checked already: jobkit_check_jobs) as new jobs with the ids p_ids, in
-- one statement, but each whose idempotency key a live job holds (earlier in p_jobs, or before); an element
-- with "waiting": true (jobkit's own key, never a caller's) is inserted waiting (45_pipelines.sql). Wakes
-- LISTENing workers. Returns how many it inserted; the caller reads back what each element got.
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
  end if;

  return v_total;
end;
$$;

-- settle: the jobs that wait for p_ids, after these ended (a statement of the caller's transaction made them
-- succeeded, dead or cancelled; one that has not ended is passed over). Cascades: a job it cancels is
-- settled in turn. Counters are locked in id order, so that two endings sharing the jobs that wait for them
-- take their locks in one order and cannot deadlock over them.
create function jobkit_private.settle(p_ids uuid[])
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
  v_types   text;
begin
  while coalesce(cardinality(v_ended), 0) > 0 loop
    with ended as (
      update public.jobkit_dependencies d
      set outcome = j.status
      from public.jobkit_jobs j
      where d.depends_on = any(v_ended) and d.outcome is null
        and j.id = d.depends_on and j.status in ('succeeded', 'dead', 'cancelled')
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
      with freed as (
        update public.jobkit_jobs j
        set status = 'queued', run_after = greatest(j.run_after, now()), updated_at = now(),
            fair_round = public.jobkit_fair_round(j.type, j.priority, j.fair_key)
        where j.id = any(v_free) and j.status = 'waiting'
        returning j.type
      )
      select string_agg(distinct f.type, ',') into v_types from freed f;
      if v_types is not null then
        perform pg_notify('jobkit_jobs', v_types);  -- wake LISTENing workers
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

-- add_graph: p_jobs (jobkit_enqueue_many's objects, each also with an optional ref, a name for it within
-- this call, and an optional depends_on: an array of refs of jobs listed before it, or ids of jobs that
-- exist, each a string or an object {"job": ..., "on_failure": "cancel" | "run"}) as jobs of pipeline
-- p_pipeline_id, added by p_parent_id's completion (or null). on_failure defaults to p_on_failure; user_id
-- to p_user_id; with p_own_only, a job that exists may be waited for only when it is p_user_id's. Nothing is
-- written when anything is wrong. An element whose idempotency key a live job holds gets that job, and
-- adds nothing to it. Returns [{ref, id, inserted, status}] in input order.
create function jobkit_private.add_graph(
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
  v_n       integer;
  v_bad     record;
  v_refs    jsonb;   -- {ref: its element's index}: a lookup by key, where a join could go quadratic
  v_edges   jsonb;   -- [[element, position, as given, target, index of the element it names or null], ...]
  v_jobs    jsonb;
  v_ids     uuid[];
  v_final   uuid[];
  v_new     boolean[];
  v_targets uuid[];
  v_missing uuid;
  v_out     jsonb;
begin
  if p_jobs is null or jsonb_typeof(p_jobs) <> 'array' then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_jobs must be a JSON array of job objects',
      hint = 'pass [{"ref": "a", "type": "embed"}, {"type": "reindex", "depends_on": ["a"]}]';
  end if;
  if p_on_failure is null or p_on_failure not in ('cancel', 'run') then
    raise exception using errcode = 'JK001', message = 'jobkit: p_on_failure must be ''cancel'' or ''run''';
  end if;
  v_n := jsonb_array_length(p_jobs);
  if v_n = 0 then
    return '[]'::jsonb;
  end if;
  if v_n > 10000 then
    raise exception using errcode = 'JK001',
      message = format('jobkit: p_jobs holds %s jobs; at most 10000 per call', v_n), hint = 'split the pipeline';
  end if;

  -- The graph's own keys first, element by element (the first problem, by index), then the job's own rules.
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

  select coalesce(jsonb_object_agg(o.e ->> 'ref', o.ord - 1), '{}') into v_refs
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord) where o.e ? 'ref';
  select coalesce(jsonb_agg(jsonb_build_array(d.idx, d.pos, d.d, x.target, (v_refs ->> x.target)::integer)
                            order by d.idx, d.pos), '[]')
  into v_edges
  from (select (o.ord - 1)::integer as idx, (dd.pos - 1)::integer as pos, dd.d
        from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
        cross join lateral jsonb_array_elements(coalesce(o.e -> 'depends_on', '[]')) with ordinality as dd(d, pos)
       ) d
  cross join lateral (
    select case jsonb_typeof(d.d) when 'string' then d.d #>> '{}' when 'object' then d.d ->> 'job' end
  ) as x(target);
  select x.idx, x.problem into v_bad from (
    select (e ->> 0)::integer as idx, case
      when jsonb_typeof(e -> 2) not in ('string', 'object')
        then 'depends_on must hold refs or job ids (strings), or {"job": ..., "on_failure": ...} objects'
      when jsonb_typeof(e -> 2) = 'object' and ((e -> 2) - '{job,on_failure}'::text[] <> '{}'::jsonb
                                                 or jsonb_typeof(e -> 2 -> 'job') is distinct from 'string')
        then 'a depends_on object is {"job": <ref or id>, "on_failure": "cancel" or "run"}'
      when jsonb_typeof(e -> 2) = 'object' and coalesce(e -> 2 ->> 'on_failure', 'cancel') not in ('cancel', 'run')
        then 'on_failure must be ''cancel'' or ''run'''
      when (e ->> 4)::integer >= (e ->> 0)::integer
        then format('depends_on names %s, listed at or after it: list each job after the jobs it waits for '
                    '(the jobs of a cycle cannot be listed so)', quote_literal(left(e ->> 3, 100)))
      when e -> 4 = 'null' and (e ->> 3) !~* '^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$'
        then format('depends_on names %s, neither a ref listed before it nor a job id',
                    quote_literal(left(e ->> 3, 100)))
    end as problem
    from jsonb_array_elements(v_edges) e
  ) x
  where x.problem is not null
  order by x.idx
  limit 1;
  if found then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;

  -- The elements as jobkit_enqueue_many takes them: graph keys out, the owner in, and waiting when they
  -- wait for anything (settled below, at once, for the jobs waited for that have already ended).
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
  -- and then sees what it added, or it ended first and settle below finds it ended), then checked: they
  -- exist (and, with p_own_only, are the user's).
  v_targets := array(select distinct (e ->> 3)::uuid from jsonb_array_elements(v_edges) e where e -> 4 = 'null');
  perform from public.jobkit_jobs j where j.id = any(v_targets) order by j.id for share;
  select t into v_missing from unnest(v_targets) t
  where not exists (select from public.jobkit_jobs j
                    where j.id = t and (not p_own_only or j.user_id is not distinct from p_user_id))
  limit 1;
  if found then
    raise exception using errcode = 'JK002',
      message = format('jobkit: depends_on names job %s, which does not exist', v_missing);
  end if;

  v_ids := array(select gen_random_uuid() from generate_series(1, v_n));
  -- The pipeline's rows first, so that each job's insert already belongs to it (Realtime reads it there).
  insert into public.jobkit_pipeline_jobs (job_id, pipeline_id, user_id, parent_id, waiting_for)
  select v_ids[o.ord::integer], p_pipeline_id, (o.e ->> 'user_id')::uuid, p_parent_id,
         jsonb_array_length(coalesce(p_jobs -> (o.ord::integer - 1) -> 'depends_on', '[]'))
  from jsonb_array_elements(v_jobs) with ordinality as o(e, ord);

  perform jobkit_private.insert_jobs(v_jobs, v_ids);

  select array_agg(m.id order by o.ord), array_agg(m.inserted order by o.ord) into v_final, v_new
  from jsonb_array_elements(v_jobs) with ordinality as o(e, ord)
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
  select v_final[(e ->> 0)::integer + 1], (e ->> 1)::integer,
         coalesce(v_final[(e ->> 4)::integer + 1], (e ->> 3)::uuid),
         coalesce(e -> 2 ->> 'on_failure', p_on_failure),
         (v_jobs -> (e ->> 0)::integer ->> 'user_id')::uuid
  from jsonb_array_elements(v_edges) e
  where v_new[(e ->> 0)::integer + 1];

  perform jobkit_private.settle(v_targets);

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

-- enqueue_pipeline: the jobs of p_jobs (as jobkit_private.add_graph above takes them) as one pipeline, all
-- or nothing. p_pipeline_id names it (default: a new id); p_on_failure is what its jobs do when a job they
-- wait for ends dead or cancelled, where a dependency does not say. Returns {pipeline_id, jobs: [{ref, id,
-- inserted, status}]}, the jobs in input order.
create function public.jobkit_enqueue_pipeline(
  p_jobs jsonb, p_pipeline_id uuid default null, p_on_failure text default 'cancel'
)
returns jsonb
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  v_pipeline uuid := coalesce(p_pipeline_id, gen_random_uuid());
begin
  return jsonb_build_object(
    'pipeline_id', v_pipeline,
    'jobs', jobkit_private.add_graph(p_jobs, v_pipeline, null, p_on_failure, null, false));
end;
$$;

-- complete_adding: complete one job as jobkit_complete does (fenced by its lease token; p_result kept) and,
-- in the same transaction, add p_jobs (as jobkit_enqueue_pipeline takes them) to its pipeline, as jobs it
-- added: a job not in a pipeline becomes the first of one named by its id. Their user_id defaults to the
-- job's. {ok: false} when the lease was lost: then nothing is completed and nothing added. Else {ok: true,
-- pipeline_id, jobs}.
create function public.jobkit_complete_adding(
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
    perform jobkit_private.settle(array[p_id]);
  end if;
  return jsonb_build_object('ok', true, 'pipeline_id', v_pipeline, 'jobs', v_jobs);
end;
$$;

-- list_dependencies: what job p_id waits for, in its order, with how each ended and its result: at most
-- p_limit (1 to 1000) after position p_after (page with the last row's position while a call returns
-- p_limit rows). A job since pruned reads with its outcome and a null result. Security invoker: a user reads
-- their own jobs' (Row Level Security).
create function public.jobkit_list_dependencies(
  p_id uuid, p_after integer default -1, p_limit integer default 1000
)
returns table (
  "position" integer, id uuid, type text, status text, on_failure text, outcome text, result jsonb
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_limit is null or p_limit not between 1 and 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_limit must be between 1 and 1000';
  end if;
  return query
  select d.position, d.depends_on, j.type::text, coalesce(j.status::text, d.outcome), d.on_failure, d.outcome,
         j.result::jsonb
  from public.jobkit_dependencies d
  left join public.jobkit_jobs j on j.id = d.depends_on
  where d.job_id = p_id and d.position > coalesce(p_after, -1)
  order by d.position
  limit p_limit;
end;
$$;

-- get_pipeline: the jobs of pipeline p_pipeline_id in the order they were added (seq), each with the job
-- that added it (parent_id), the jobs it waits for (depends_on, in its order) and how many of those have
-- not ended: at most p_limit (1 to 1000) after seq p_after (page with the last row's seq).
-- Security invoker: a user reads their own (Row Level Security).
create function public.jobkit_get_pipeline(
  p_pipeline_id uuid, p_after bigint default 0, p_limit integer default 1000
)
returns table (
  seq bigint, id uuid, type text, status text, parent_id uuid, depends_on uuid[], waiting_for integer,
  attempts integer, progress double precision, progress_message text, error text, user_id uuid,
  created_at timestamptz, updated_at timestamptz
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
begin
  if p_limit is null or p_limit not between 1 and 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_limit must be between 1 and 1000';
  end if;
  return query
  select p.seq, p.job_id, j.type::text, j.status::text, p.parent_id,
         array(select d.depends_on from public.jobkit_dependencies d where d.job_id = p.job_id order by d.position),
         p.waiting_for, j.attempts, j.progress::double precision, j.progress_message::text, j.error::text,
         j.user_id, p.created_at, j.updated_at
  from public.jobkit_pipeline_jobs p
  join public.jobkit_jobs j on j.id = p.job_id
  where p.pipeline_id = p_pipeline_id and p.seq > coalesce(p_after, 0)
  order by p.seq
  limit p_limit;
end;
$$;

-- pipeline_progress: pipeline p_pipeline_id in one row: its jobs by status, and the types of those running
-- now (the step it is at). No row: no such pipeline (or, for a user, none of theirs).
create function public.jobkit_pipeline_progress(p_pipeline_id uuid)
returns table (
  pipeline_id uuid, total bigint, succeeded bigint, running bigint, queued bigint, waiting bigint, dead bigint,
  cancelled bigint, running_types text[], updated_at timestamptz
)
language sql
stable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select p_pipeline_id, count(*), count(*) filter (where j.status = 'succeeded'),
         count(*) filter (where j.status = 'running'),
         count(*) filter (where j.status in ('queued', 'retrying')),
         count(*) filter (where j.status = 'waiting'), count(*) filter (where j.status = 'dead'),
         count(*) filter (where j.status = 'cancelled'),
         coalesce(array_agg(distinct j.type::text) filter (where j.status = 'running'), '{}'),
         max(j.updated_at)
  from public.jobkit_pipeline_jobs p
  join public.jobkit_jobs j on j.id = p.job_id
  where p.pipeline_id = p_pipeline_id
  having count(*) > 0
$$;

-- cancel_pipeline (jobkit_private: for the operator's and the users' entry points): every job of the
-- pipeline that has not finished (with p_user_id, every such job of theirs) ends cancelled, as jobkit_cancel
-- ends one; the jobs that wait for them are settled. Until a pass finds none: a job a completion added while
-- the first pass ran is found by the next. Returns how many it cancelled.
create function jobkit_private.cancel_pipeline(p_pipeline_id uuid, p_reason text, p_user_id uuid)
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

create function public.jobkit_cancel_pipeline(p_pipeline_id uuid, p_reason text default null)
returns bigint
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select jobkit_private.cancel_pipeline(p_pipeline_id, p_reason, null);
$$;

-- user_limits: the limits of jobkit_user_types for p_user's jobs of p_types, counted now (JK003 naming the
-- first one exceeded): live jobs (waiting, queued, running or retrying) and jobs created within per_seconds.
-- Its callers hold the lock of each (user, type) and count after their insert.
create function jobkit_private.user_limits(p_user uuid, p_types text[])
returns void
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set enable_seqscan = off
as $$
declare
  v_rules public.jobkit_user_types;
begin
  for v_rules in select t.* from public.jobkit_user_types t where t.type = any(p_types) order by t.type loop
    if (select count(*) from public.jobkit_jobs j
        where j.user_id = p_user and j.type = v_rules.type and j.status in ('queued', 'running', 'retrying'))
       + (select count(*) from public.jobkit_pipeline_jobs p join public.jobkit_jobs j on j.id = p.job_id
          where p.user_id = p_user and j.type = v_rules.type and j.status = 'waiting')
       > v_rules.max_live_per_user then
      raise exception using errcode = 'JK003',
        message = format('jobkit: at most %s live jobs of type %s per user', v_rules.max_live_per_user,
                         v_rules.type);
    end if;
    if (select count(*) from public.jobkit_jobs j
        where j.user_id = p_user and j.created_at > now() - make_interval(secs => v_rules.per_seconds)
          and j.type = v_rules.type)
       > v_rules.max_created_per_user then
      raise exception using errcode = 'JK003',
        message = format('jobkit: at most %s jobs of type %s per user in %s seconds',
                         v_rules.max_created_per_user, v_rules.type, v_rules.per_seconds);
    end if;
  end loop;
end;
$$;

-- user_enqueue_pipeline: a pipeline of the calling user's own, as jobkit_enqueue_pipeline takes one, of at
-- most 1000 jobs, each of an open type with only type, payload, idempotency_key, ref and depends_on: each
-- job is held to its type's rules and limits as jobkit_user_enqueue holds one (the live ones include those
-- waiting), and may wait only for jobs of this call or the user's own. All or nothing.
create function jobkit_private.user_enqueue_pipeline(p_jobs jsonb)
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
  v_jobs     jsonb;
  v_types    text[];
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
  select jsonb_agg(
           (o.e - 'idempotency_key')
           || jsonb_build_object('user_id', v_user, 'priority', t.priority, 'max_attempts', t.max_attempts)
           || case when o.e ? 'idempotency_key'
                   then jsonb_build_object('idempotency_key', 'user:' || v_user || ':' || (o.e ->> 'idempotency_key'))
                   else '{}' end
           order by o.ord),
         array_agg(distinct t.type order by t.type)
  into v_jobs, v_types
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  join public.jobkit_user_types t on t.type = o.e ->> 'type';
  perform pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtextextended(v_user::text || ':' || t, 0))
  from unnest(v_types) t order by t;
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

-- user_cancel_pipeline: the calling user's own pipeline, as jobkit_cancel_pipeline does it (their jobs of
-- it). A pipeline that is not theirs, or none, is JK002 alike.
create function jobkit_private.user_cancel_pipeline(p_pipeline_id uuid)
returns bigint
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if auth.uid() is null then
    raise exception using errcode = '42501', message = 'jobkit: sign in to cancel jobs';
  end if;
  if p_pipeline_id is null or not exists (
       select from public.jobkit_pipeline_jobs p where p.pipeline_id = p_pipeline_id and p.user_id = auth.uid()) then
    raise exception using errcode = 'JK002', message = 'jobkit: no such pipeline';
  end if;
  return jobkit_private.cancel_pipeline(p_pipeline_id, 'cancelled by its user', auth.uid());
end;
$$;

create function public.jobkit_user_enqueue_pipeline(p_jobs jsonb)
returns jsonb
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select jobkit_private.user_enqueue_pipeline(p_jobs);
$$;

create function public.jobkit_user_cancel_pipeline(p_pipeline_id uuid)
returns bigint
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select jobkit_private.user_cancel_pipeline(p_pipeline_id);
$$;

-- Functions, replaced in place (signatures and row types unchanged) ----------------------------------
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
  with done as (
    update public.jobkit_jobs j
    set status = 'cancelled', lease_until = null, lease_token = null,
        error = left(coalesce(p_reason, 'cancelled'), 4000), updated_at = now()
    where j.id = any(p_ids) and j.status in ('waiting', 'queued', 'retrying', 'running')
    returning j.id
  )
  select coalesce(array_agg(d.id), '{}') into v_done from done d;
  if exists (select from public.jobkit_dependencies d where d.depends_on = any(v_done) and d.outcome is null) then
    perform jobkit_private.settle(v_done);
  end if;
  return query
  select i.id, i.id = any(v_done), j.status::text
  from unnest(p_ids) as i(id)
  left join public.jobkit_jobs j on j.id = i.id;
end;
$$;

-- prune: delete finished jobs (succeeded, dead and cancelled by default) last updated longer ago than
-- p_older_than_seconds; at most p_limit rows (1 to 10000) per call: call again until it returns 0. A job
-- that a job not yet finished waits for is kept (its result is still to be handed on); a pruned job's
-- pipeline row and what it waited for go with it.
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
  )
  select count(*) into v_deleted from gone;
  return v_deleted;
end;
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
  else
    perform jobkit_private.user_limits(v_user, array[p_type]);
  end if;
  return query
  select v_job.inserted, v_job.id, v_job.user_id, v_job.type::text, v_job.status::text, v_job.payload::jsonb,
         v_job.idempotency_key::text, v_job.attempts, v_job.max_attempts::integer, v_job.priority::integer,
         v_job.run_after::timestamptz, v_job.error::text, v_job.created_at, v_job.updated_at;
end;
$$;

-- schema_version: the jobkit schema this database holds. Each migration from 0.2.0 on replaces it with
-- its own version; a worker reads it at start and refuses a database that is not at its version.
create or replace function public.jobkit_schema_version() returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '0.3.0' $$;

-- Realtime (where it is installed): a user's job messages name the job's pipeline; jobs a completion makes
-- runnable wake the workers.
do $realtime$
begin
  if to_regprocedure('jobkit_private.broadcast_job()') is null then
    return;
  end if;

  create or replace function jobkit_private.broadcast_job() returns trigger
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
  as $fn$
  begin
    perform jobkit_private.send(
      jsonb_build_object('id', new.id, 'type', new.type, 'status', new.status, 'progress', new.progress,
                         'progress_message', new.progress_message, 'attempts', new.attempts,
                         'error', new.error, 'updated_at', new.updated_at,
                         'pipeline_id', (select p.pipeline_id from public.jobkit_pipeline_jobs p
                                         where p.job_id = new.id)),
      'job', 'jobkit:user:' || new.user_id::text);
    return null;
  end;
  $fn$;

  -- The same wake-up, for jobs a completion made runnable (jobkit_private.settle): as the owner, who may
  -- send, whoever's call ended the job they waited for.
  create function jobkit_private.wake_released() returns void
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
  as $fn$
  begin
    perform jobkit_private.send('{}'::jsonb, 'enqueued', 'jobkit:workers');
  end;
  $fn$;

  revoke all on function jobkit_private.wake_released() from public;
  grant execute on function jobkit_private.wake_released() to service_role;
end;
$realtime$;


-- Only service_role may call any of this (functions are executable by PUBLIC by default): the new ones too;
-- the grants below then open the users' entry points and the pipeline reads to signed-in users.
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

-- Pipelines: a signed-in user reads their own jobs' rows (their pipelines, and what their jobs wait for);
-- nobody but service_role writes (jobkit's functions do).
alter table public.jobkit_pipeline_jobs enable row level security;

alter table public.jobkit_dependencies enable row level security;

create policy jobkit_pipeline_jobs_select_own on public.jobkit_pipeline_jobs
  for select to authenticated
  using (user_id = (select auth.uid()));

create policy jobkit_dependencies_select_own on public.jobkit_dependencies
  for select to authenticated
  using (user_id = (select auth.uid()));

revoke all on table public.jobkit_pipeline_jobs, public.jobkit_dependencies
  from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_pipeline_jobs, public.jobkit_dependencies
  to service_role;

grant select on table public.jobkit_pipeline_jobs, public.jobkit_dependencies to authenticated;

-- seq's sequence: an identity column's inserts need no right on it, so nobody is given one.
revoke all on sequence public.jobkit_pipeline_jobs_seq_seq from public, anon, authenticated, service_role;

revoke all on function jobkit_private.insert_jobs(jsonb, uuid[]) from public;

revoke all on function jobkit_private.settle(uuid[]) from public;

revoke all on function jobkit_private.add_graph(jsonb, uuid, uuid, text, uuid, boolean) from public;

revoke all on function jobkit_private.cancel_pipeline(uuid, text, uuid) from public;

revoke all on function jobkit_private.user_limits(uuid, text[]) from public;

revoke all on function jobkit_private.user_enqueue_pipeline(jsonb) from public;

revoke all on function jobkit_private.user_cancel_pipeline(uuid) from public;

grant execute on function jobkit_private.insert_jobs(jsonb, uuid[]) to service_role;

grant execute on function jobkit_private.settle(uuid[]) to service_role;

grant execute on function jobkit_private.add_graph(jsonb, uuid, uuid, text, uuid, boolean) to service_role;

grant execute on function jobkit_private.cancel_pipeline(uuid, text, uuid) to service_role;

grant execute on function jobkit_private.user_enqueue_pipeline(jsonb) to authenticated;

grant execute on function jobkit_private.user_cancel_pipeline(uuid) to authenticated;

-- Reads through Row Level Security, for the service role and for a signed-in user alike.
grant execute on function public.jobkit_list_dependencies(uuid, integer, integer) to authenticated;

grant execute on function public.jobkit_get_pipeline(uuid, bigint, integer) to authenticated;

grant execute on function public.jobkit_pipeline_progress(uuid) to authenticated;

revoke execute on function public.jobkit_user_enqueue_pipeline(jsonb) from public, anon, service_role;

revoke execute on function public.jobkit_user_cancel_pipeline(uuid) from public, anon, service_role;

grant execute on function public.jobkit_user_enqueue_pipeline(jsonb) to authenticated;

grant execute on function public.jobkit_user_cancel_pipeline(uuid) to authenticated;

revoke execute on function public.jobkit_user_enqueue(text, jsonb, text) from public, anon, service_role;

revoke execute on function public.jobkit_user_cancel(uuid) from public, anon, service_role;

grant execute on function public.jobkit_user_enqueue(text, jsonb, text) to authenticated;

grant execute on function public.jobkit_user_cancel(uuid) to authenticated;

-- The rows written before jobkit_status took 'waiting' hold one of the values it took before.
alter domain public.jobkit_status validate constraint jobkit_jobs_status_valid;
