-- jobkit: one table, its indexes, RLS, grants. The functions that change state are in the next migration.
--
-- Status machine:  queued -> running -> succeeded
--                  running -> retrying -> running ...      (failure with attempts left; lease expiry)
--                  running -> dead                          (attempts used up, or a permanent failure)
--                  dead -> queued                           (requeue, by an operator)
-- "Runnable" is defined once: status in ('queued', 'retrying') and run_after <= now().

create table public.jobkit_jobs (
  id              uuid        primary key default gen_random_uuid(),
  user_id         uuid        references auth.users (id) on delete cascade,
  type            text        not null,
  status          text        not null default 'queued',
  payload         jsonb       not null default '{}',
  idempotency_key text,
  attempts        integer     not null default 0,
  max_attempts    integer     not null default 3,
  priority        integer     not null default 0,
  run_after       timestamptz not null default now(),
  lease_until     timestamptz,
  lease_token     uuid,
  claimed_by      text,
  error           text,
  created_at      timestamptz not null default now(),
  updated_at      timestamptz not null default now(),

  constraint jobkit_jobs_status_valid
    check (status in ('queued', 'running', 'retrying', 'succeeded', 'dead')),
  constraint jobkit_jobs_type_valid check (char_length(type) between 1 and 200),
  constraint jobkit_jobs_payload_object check (jsonb_typeof(payload) = 'object'),
  constraint jobkit_jobs_key_valid
    check (idempotency_key is null or char_length(idempotency_key) between 1 and 200),
  constraint jobkit_jobs_attempts_valid check (attempts >= 0 and attempts <= max_attempts),
  constraint jobkit_jobs_max_attempts_valid check (max_attempts between 1 and 1000),
  constraint jobkit_jobs_priority_valid check (priority between -1000000 and 1000000),
  -- a running job always holds a lease (deadline and token); nothing else does
  constraint jobkit_jobs_lease_iff_running
    check ((status = 'running') = (lease_until is not null and lease_token is not null)),
  constraint jobkit_jobs_running_claimed
    check (status <> 'running' or (claimed_by is not null and attempts >= 1)),
  -- a finished job has run at least once
  constraint jobkit_jobs_finished_ran check (status not in ('succeeded', 'dead') or attempts >= 1),
  constraint jobkit_jobs_claimed_by_valid
    check (claimed_by is null or char_length(claimed_by) between 1 and 200),
  constraint jobkit_jobs_error_bounded check (error is null or char_length(error) <= 4000)
)
-- Every job is inserted once and updated two or three times: leave room on each page for the new
-- versions, and vacuum this table far sooner than the 20% default so dead tuples do not pile up.
with (
  fillfactor = 80,
  autovacuum_vacuum_scale_factor = 0.01,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 1
);

comment on table public.jobkit_jobs is
  'jobkit job queue. State changes only through the jobkit_* functions (service_role).';

-- Idempotency: one live job per key. A dead job frees its key.
create unique index jobkit_jobs_idempotency_key
  on public.jobkit_jobs (idempotency_key) where status <> 'dead';

-- The claim path: leads with the claim's own order, holds only runnable rows, so finished rows
-- (the bulk of the table) never slow a claim down.
create index jobkit_jobs_claim
  on public.jobkit_jobs (priority desc, run_after, created_at)
  where status in ('queued', 'retrying');

-- Expired leases: only running rows.
create index jobkit_jobs_lease
  on public.jobkit_jobs (lease_until) where status = 'running';

-- A user's own listing, newest first (keyset pagination on created_at).
create index jobkit_jobs_user_created
  on public.jobkit_jobs (user_id, created_at desc, id desc) where user_id is not null;

-- updated_at is kept current. jobkit's functions set it themselves (so the hot path runs no trigger
-- function); the WHEN clause makes the trigger fire only for an update that left it unchanged.
create function public.jobkit_touch() returns trigger
language plpgsql
security invoker
set search_path = ''
as $$
begin
  new.updated_at := now();
  return new;
end;
$$;

create trigger jobkit_jobs_touch
  before update on public.jobkit_jobs
  for each row
  when (old.updated_at is not distinct from new.updated_at)
  execute function public.jobkit_touch();

-- Row Level Security: a signed-in user reads only their own jobs; nobody but service_role writes.
alter table public.jobkit_jobs enable row level security;

create policy jobkit_jobs_select_own on public.jobkit_jobs
  for select to authenticated
  using (user_id = (select auth.uid()));

-- Grants hold under both Supabase default-privilege modes (legacy: everything granted to the API roles;
-- current: nothing). Start from nothing, then grant exactly what each role needs.
revoke all on table public.jobkit_jobs from public, anon, authenticated, service_role;
grant select, insert, update, delete on table public.jobkit_jobs to service_role;
-- Users see their jobs, not the worker's lease (lease_token is a capability) nor which worker holds it.
grant select (id, user_id, type, status, payload, idempotency_key, attempts, max_attempts, priority,
              run_after, error, created_at, updated_at)
  on table public.jobkit_jobs to authenticated;

revoke execute on function public.jobkit_touch() from public, anon, authenticated;
grant execute on function public.jobkit_touch() to service_role;
