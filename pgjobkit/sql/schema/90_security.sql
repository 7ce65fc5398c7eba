-- Security: Row Level Security, policies and grants, for every table and function above.

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
              run_after, error, created_at, updated_at, progress, progress_message, result, started_at)
  on table public.jobkit_jobs to authenticated;

revoke all on schema jobkit_private from public;

grant usage on schema jobkit_private to authenticated, service_role;

-- The worker's helpers (30_worker.sql): service_role's, whose jobkit_claim and jobkit_complete call them.
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

-- The names kept for one release (88_compat.sql), as 0.5.1 granted them.
revoke all on function jobkit_private.settle(uuid[]),
  jobkit_private.complete_held(uuid[], uuid[], jsonb, boolean)
  from public;

grant execute on function jobkit_private.settle(uuid[]),
  jobkit_private.complete_held(uuid[], uuid[], jsonb, boolean)
  to service_role;

alter table public.jobkit_limits enable row level security;

alter table public.jobkit_starts enable row level security;

create policy jobkit_limits_service on public.jobkit_limits
  for all to service_role using (true) with check (true);

create policy jobkit_starts_service on public.jobkit_starts
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_limits, public.jobkit_starts from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_limits, public.jobkit_starts to service_role;

alter table public.jobkit_schedules enable row level security;

create policy jobkit_schedules_service on public.jobkit_schedules
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_schedules from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_schedules to service_role;

-- Only service_role may call any of this (functions are executable by PUBLIC by default).
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

alter table public.jobkit_user_types enable row level security;

create policy jobkit_user_types_service on public.jobkit_user_types
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_user_types from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_user_types to service_role;

revoke all on function jobkit_private.user_enqueue(text, jsonb, text, jsonb) from public;

revoke all on function jobkit_private.user_cancel(uuid) from public;

grant execute on function jobkit_private.user_enqueue(text, jsonb, text, jsonb) to authenticated;

grant execute on function jobkit_private.user_cancel(uuid) to authenticated;

revoke all on function jobkit_private.refuse_users_enqueue() from public;

grant execute on function jobkit_private.refuse_users_enqueue() to authenticated;

revoke execute on function public.jobkit_user_enqueue(text, jsonb, text, jsonb) from public, anon, service_role;

revoke execute on function public.jobkit_user_cancel(uuid) from public, anon, service_role;

grant execute on function public.jobkit_user_enqueue(text, jsonb, text, jsonb) to authenticated;

grant execute on function public.jobkit_user_cancel(uuid) to authenticated;

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

revoke all on function jobkit_private.release_waiters(uuid[]) from public;

revoke all on function jobkit_private.add_graph(jsonb, uuid, uuid, text, uuid, boolean) from public;

revoke all on function jobkit_private.check_graph_keys(jsonb), jobkit_private.graph_edges(jsonb),
  jobkit_private.insert_graph(jsonb, jsonb, jobkit_private.edge[], uuid[], uuid, uuid, text)
  from public;

revoke all on function jobkit_private.cancel_pipeline(uuid, text, uuid) from public;

revoke all on function jobkit_private.settle_deleted() from public;

revoke all on function jobkit_private.user_limits(uuid, text[], integer[]) from public;

revoke all on function jobkit_private.user_enqueue_pipeline(jsonb) from public;

revoke all on function jobkit_private.user_cancel_pipeline(uuid) from public;

grant execute on function jobkit_private.insert_jobs(jsonb, uuid[]) to service_role;

grant execute on function jobkit_private.release_waiters(uuid[]) to service_role;

grant execute on function jobkit_private.add_graph(jsonb, uuid, uuid, text, uuid, boolean) to service_role;

grant execute on function jobkit_private.check_graph_keys(jsonb), jobkit_private.graph_edges(jsonb),
  jobkit_private.insert_graph(jsonb, jsonb, jobkit_private.edge[], uuid[], uuid, uuid, text)
  to service_role;

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

-- Workers, their activity and the trace contexts: service_role's alone (jobkit's functions write them).
alter table public.jobkit_workers enable row level security;

alter table public.jobkit_activity enable row level security;

alter table public.jobkit_traces enable row level security;

create policy jobkit_workers_service on public.jobkit_workers
  for all to service_role using (true) with check (true);

create policy jobkit_activity_service on public.jobkit_activity
  for all to service_role using (true) with check (true);

create policy jobkit_traces_service on public.jobkit_traces
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_workers, public.jobkit_activity, public.jobkit_traces
  from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_workers, public.jobkit_activity, public.jobkit_traces
  to service_role;

-- Tracebacks (0.5.1): the operator's alone. A job's owner reads its one-line error in jobkit_jobs, never
-- its traceback (the app's files, functions and source lines); jobkit_traceback, which reads it, is
-- service_role's like every jobkit_* function (the loop above).
alter table public.jobkit_tracebacks enable row level security;

create policy jobkit_tracebacks_service on public.jobkit_tracebacks
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_tracebacks from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_tracebacks to service_role;
