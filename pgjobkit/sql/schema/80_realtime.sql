-- Live updates through Supabase Realtime (Broadcast from the database) --------------------------------
-- Only where Realtime is installed (Supabase); on plain PostgreSQL this section creates nothing and
-- workers rely on LISTEN/NOTIFY and polling. Broadcast over Postgres Changes: Supabase recommends it at
-- scale (one message per change, authorised once per channel join, not an RLS check per subscriber per
-- change), and it sends only the columns a user may see.
--   jobkit:user:<user id>  private; each of a user's jobs as it changes (status, progress): event 'job',
--                          payload {id, type, status, progress, progress_message, attempts, error,
--                          updated_at, pipeline_id (null: in none)}. Readable only by that user (the
--                          policies below).
--   jobkit:workers         private; event 'enqueued' once per statement that inserts runnable jobs, and
--                          once per completion that makes waiting jobs runnable.
--                          No policy opens it, so only service_role (which bypasses RLS) may join.
-- A message is written the way realtime.send writes it (supabase/realtime, migration
-- 20260605120000_rename_broadcast_send_warning), by jobkit_private.send rather than by realtime.send
-- itself: realtime.send is PL/pgSQL without a search_path of its own, compiled once per session under the
-- search_path of its first caller, so a session that called it first with a pg_temp.uuid of its own would
-- have jobkit's triggers run that type's checks as the owner. Like realtime.send it never raises (it warns
-- and drops the message), so a Realtime fault cannot fail a job's state change; polling is the workers'
-- fallback, and a user's client can re-read the table.
do $realtime$
begin
  if to_regprocedure('realtime.send(jsonb, text, text, boolean)') is null
     or to_regclass('realtime.messages') is null then
    raise notice 'jobkit: no Supabase Realtime in this database; live updates are off';
    return;
  end if;

  create function jobkit_private.send(p_payload jsonb, p_event text, p_topic text) returns void
  language plpgsql
  security invoker
  set search_path = pg_catalog, pg_temp
  as $fn$
  declare
    v_id uuid := gen_random_uuid();
  begin
    insert into realtime.messages (id, payload, event, topic, private, extension)
    values (v_id, case when p_payload ? 'id' then p_payload else p_payload || jsonb_build_object('id', v_id) end,
            p_event, p_topic, true, 'broadcast');
  exception when others then
    raise warning 'WarnSendingBroadcastMessage: %', sqlerrm;
  end;
  $fn$;

  create function jobkit_private.broadcast_job() returns trigger
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

  create function jobkit_private.wake_workers() returns trigger
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
  as $fn$
  begin
    if exists (select from inserted i where i.status in ('queued', 'retrying') and i.run_after <= now()) then
      perform jobkit_private.send('{}'::jsonb, 'enqueued', 'jobkit:workers');
    end if;
    return null;
  end;
  $fn$;

  -- The same wake-up, for jobs a completion made runnable (jobkit_private.release_waiters): as the owner,
  -- who may send, whoever's call ended the job they waited for.
  create function jobkit_private.wake_released() returns void
  language plpgsql
  security definer
  set search_path = pg_catalog, pg_temp
  as $fn$
  begin
    perform jobkit_private.send('{}'::jsonb, 'enqueued', 'jobkit:workers');
  end;
  $fn$;

  revoke all on function jobkit_private.send(jsonb, text, text) from public;
  revoke all on function jobkit_private.wake_released() from public;
  grant execute on function jobkit_private.wake_released() to service_role;
  revoke all on function jobkit_private.broadcast_job() from public;
  revoke all on function jobkit_private.wake_workers() from public;

  create trigger jobkit_jobs_broadcast_insert
    after insert on public.jobkit_jobs
    for each row when (new.user_id is not null)
    execute function jobkit_private.broadcast_job();
  create trigger jobkit_jobs_broadcast_update
    after update of status, progress, progress_message on public.jobkit_jobs
    for each row when (new.user_id is not null and (old.status, old.progress, old.progress_message)
                       is distinct from (new.status, new.progress, new.progress_message))
    execute function jobkit_private.broadcast_job();
  create trigger jobkit_jobs_wake_workers
    after insert on public.jobkit_jobs
    referencing new table as inserted
    for each statement
    execute function jobkit_private.wake_workers();

  -- A signed-in user may join (read) their own job topic, nothing else of jobkit's: each message row is
  -- checked by its own topic, not only by the topic being joined.
  create policy jobkit_user_topic on realtime.messages
    for select to authenticated
    using (realtime.messages.extension = 'broadcast'
           and realtime.messages.topic = 'jobkit:user:' || (select auth.uid())::text
           and (select realtime.topic()) = realtime.messages.topic);
  -- And stays so whatever policies an app adds (restrictive policies are ANDed with every permissive one):
  -- neither anon nor a signed-in user reads a jobkit topic but a user their own, or writes one at all (a
  -- forged 'job' message in a user's topic, or a Realtime client's send to it). jobkit_private.send writes
  -- as the owner of jobkit's functions (postgres, which bypasses RLS on Supabase).
  create policy jobkit_topics_read on realtime.messages
    as restrictive for select to anon, authenticated
    using (not starts_with(realtime.messages.topic, 'jobkit:')
           or realtime.messages.topic = 'jobkit:user:' || (select auth.uid())::text);
  create policy jobkit_topics_insert on realtime.messages
    as restrictive for insert to anon, authenticated
    with check (not starts_with(realtime.messages.topic, 'jobkit:'));
  create policy jobkit_topics_update on realtime.messages
    as restrictive for update to anon, authenticated
    using (not starts_with(realtime.messages.topic, 'jobkit:'))
    with check (not starts_with(realtime.messages.topic, 'jobkit:'));
end;
$realtime$;
