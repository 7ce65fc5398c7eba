-- The users' side: signed-in users start and cancel jobs of the types opened to them, through thin
-- public entry points over SECURITY DEFINER checks in jobkit_private.

-- user_enqueue: one job of an open type for the calling user. The idempotency key is the user's own: it is
-- stored as 'user:<uid>:<key>', so one user can neither collide with nor learn of another's key, and a key
-- held by a job that is not the caller's (the app's own, say) is refused, never answered with that job.
-- The limits (live jobs of the type, and jobs of the type created within per_seconds) are counted after
-- the insert, under a lock per (user, type), by a statement whose snapshot is taken once the lock is held:
-- a job that would exceed either is rolled back with the error, whatever key it came with. Only READ
-- COMMITTED (the Data API's level) gives that snapshot: in a REPEATABLE READ or SERIALIZABLE transaction
-- the count would miss jobs committed while the lock was awaited, so it refuses to run there.
create function jobkit_private.user_enqueue(p_type text, p_payload jsonb, p_idempotency_key text)
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
  elsif (select count(*) from public.jobkit_jobs j
         where j.user_id = v_user and j.type = p_type and j.status in ('queued', 'running', 'retrying'))
        > v_rules.max_live_per_user then
    raise exception using errcode = 'JK003',
      message = format('jobkit: at most %s live jobs of type %s per user', v_rules.max_live_per_user, p_type);
  elsif (select count(*) from public.jobkit_jobs j
         where j.user_id = v_user and j.created_at > now() - make_interval(secs => v_rules.per_seconds)
           and j.type = p_type)
        > v_rules.max_created_per_user then
    raise exception using errcode = 'JK003',
      message = format('jobkit: at most %s jobs of type %s per user in %s seconds',
                       v_rules.max_created_per_user, p_type, v_rules.per_seconds);
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

-- The entry points users call over the Data API (POST /rest/v1/rpc/jobkit_user_enqueue, ..._cancel).
create function public.jobkit_user_enqueue(
  p_type text, p_payload jsonb default '{}', p_idempotency_key text default null
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
  select * from jobkit_private.user_enqueue(p_type, p_payload, p_idempotency_key);
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
