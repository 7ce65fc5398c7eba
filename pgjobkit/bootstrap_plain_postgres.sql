-- jobkit on a plain PostgreSQL (self-hosted, the embedded demo): the few Supabase objects jobkit's
-- migrations reference. Loaded by `jobkit migrate --bootstrap` only when schema auth is absent; a
-- Supabase database already has all of it. Safe to run twice.
do $$
begin
  if not exists (select from pg_roles where rolname = 'anon') then create role anon nologin; end if;
  if not exists (select from pg_roles where rolname = 'authenticated') then create role authenticated nologin; end if;
  if not exists (select from pg_roles where rolname = 'service_role') then
    create role service_role nologin bypassrls;
  end if;
end $$;

create schema if not exists auth;
grant usage on schema auth to anon, authenticated, service_role;

-- Only the column jobkit references; GoTrue's full table has many more.
create table if not exists auth.users (id uuid primary key default gen_random_uuid());

-- As in Supabase: the user id from the request's JWT claims (PostgREST sets request.jwt.claims).
create or replace function auth.uid() returns uuid language sql stable as $$
  select coalesce(
    nullif(current_setting('request.jwt.claim.sub', true), ''),
    (nullif(current_setting('request.jwt.claims', true), '')::jsonb ->> 'sub')
  )::uuid
$$;
