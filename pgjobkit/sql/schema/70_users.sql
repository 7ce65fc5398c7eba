-- The users' side: signed-in users start and cancel jobs of the types opened to them, through thin
-- public entry points over SECURITY DEFINER checks in jobkit_private.

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

-- user_enqueue: one job of an open type for the calling user. The idempotency key is the user's own: it is
-- stored as 'user:<uid>:<key>', so one user can neither collide with nor learn of another's key, and a key
-- held by a job that is not the caller's (the app's own, say) is refused, never answered with that job.
-- The limits (live jobs of the type, and jobs of the type created within per_seconds) are counted after
-- the insert, under a lock per (user, type), by a statement whose snapshot is taken once the lock is held:
-- a job that would exceed either is rolled back with the error, whatever key it came with (and one that
-- would exceed them at the lock is refused before its insert: user_limits). Only READ
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

-- user_cancel: the calling user's own job, as jobkit_cancel does it. Another user's job, or none, is
-- JK002 alike: nobody learns which ids exist.
create function jobkit_private.user_cancel(p_id uuid)
returns table (id uuid, cancelled boolean, status text)
language plpgsql
volatile
security definer
set search_path = pg_catalog, pg_temp
as $$
begin
  if auth.uid() is null then
    raise exception using errcode = '42501', message = 'jobkit: sign in to cancel jobs';
  end if;
  if p_id is null or not exists (
       select from public.jobkit_jobs j where j.id = p_id and j.user_id = auth.uid()) then
    raise exception using errcode = 'JK002', message = 'jobkit: no such job';
  end if;
  return query select * from public.jobkit_cancel(array[p_id], 'cancelled by its user');
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

-- refuse_users_enqueue: a signed-in user's enqueue (jobkit_user_enqueue, jobkit_user_enqueue_pipeline) on a
-- database that holds a projection would write a job no worker claims (its workers are on JetStream):
-- refused instead (JK004). Definer: a user reads nothing of jobkit_projected (75_projection.sql) but this.
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
  select jobkit_private.refuse_users_enqueue();  -- the view of a JetStream queue (75_projection.sql)
  select * from jobkit_private.user_enqueue(p_type, p_payload, p_idempotency_key, p_trace_context);
$$;

create function public.jobkit_user_cancel(p_id uuid)
returns table (id uuid, cancelled boolean, status text)
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select * from jobkit_private.user_cancel(p_id);
$$;

create function public.jobkit_user_enqueue_pipeline(p_jobs jsonb)
returns jsonb
language sql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select jobkit_private.refuse_users_enqueue();
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
