-- The view of a JetStream queue (pgjobkit.stores.jetstream): its projector (`pgjobkit nats project`) writes
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

alter table public.jobkit_projected enable row level security;

create policy jobkit_projected_service on public.jobkit_projected
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_projected from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_projected to service_role;

revoke all on function jobkit_private.refuse_projected() from public;

grant execute on function jobkit_private.refuse_projected() to service_role;
