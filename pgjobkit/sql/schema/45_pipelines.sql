-- Pipelines: jobs that wait for jobs (the tables are in 10_tables.sql).
--
-- A pipeline is enqueued whole (jobkit_enqueue_pipeline), or grows from a running job: its handler adds
-- jobs, which jobkit_complete_adding inserts in the transaction that completes it, fenced by its lease, so
-- a worker that lost the lease adds nothing. A job that waits for others is 'waiting' until each has ended;
-- every ending (complete, fail, cancel, a lease that expires on the last attempt) settles the jobs that
-- wait for it, in its own transaction (jobkit_private.release_waiters): a success counts down; a dead or
-- cancelled job cancels the jobs that wait for it with on_failure 'cancel' (and, in turn, the jobs that wait
-- for those), and counts down for those with 'run'. The one that brings the count to 0 makes the job queued.
-- Each job lists what it waits for in order: a job of the same call listed before it (by its ref), or a job
-- that exists (by id). So a new graph cannot hold a cycle, and a job that exists cannot wait for a new one.
-- Limits: 10000 jobs per call, 10000 jobs waited for per job, 100000 of both together per call (a users'
-- pipeline: 1000, 100 and 1000, in at most 1 MiB: 70_users.sql); results are handed on 1000 at a time
-- (jobkit_list_dependencies), each at most 64 KiB (jobkit_result).

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
    perform jobkit_private.release_waiters(array[p_id]);
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
-- Each pass locks its jobs first, in the order they were added (seq), which is the order an ending of one
-- of them takes theirs: a job is added after every job it waits for, and an ending locks its own job, then
-- the jobs that wait for it. Locked in the order the update's plan happened to read them (a scan of the
-- table reads a waiting job before the running one it waits for, whose claim moved its row), a cancel
-- could hold the waiting job while it waited for the running one, whose completion waited for the waiting
-- one: a deadlock, and one of the two rolled back (0.5.0).
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

create function public.jobkit_cancel_pipeline(p_pipeline_id uuid, p_reason text default null)
returns bigint
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select jobkit_private.cancel_pipeline(p_pipeline_id, p_reason, null);
$$;
