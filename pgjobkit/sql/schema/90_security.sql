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

revoke all on function jobkit_private.complete_held(uuid[], uuid[], jsonb, boolean) from public;

grant execute on function jobkit_private.complete_held(uuid[], uuid[], jsonb, boolean) to service_role;

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

revoke all on function jobkit_private.user_enqueue(text, jsonb, text) from public;

revoke all on function jobkit_private.user_cancel(uuid) from public;

grant execute on function jobkit_private.user_enqueue(text, jsonb, text) to authenticated;

grant execute on function jobkit_private.user_cancel(uuid) to authenticated;

revoke execute on function public.jobkit_user_enqueue(text, jsonb, text) from public, anon, service_role;

revoke execute on function public.jobkit_user_cancel(uuid) from public, anon, service_role;

grant execute on function public.jobkit_user_enqueue(text, jsonb, text) to authenticated;

grant execute on function public.jobkit_user_cancel(uuid) to authenticated;
