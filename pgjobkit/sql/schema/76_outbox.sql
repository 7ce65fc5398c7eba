-- The outbox of a JetStream queue: jobs an app enqueues in its own SQL transaction, committed or rolled back
-- with its other writes, which the relay (`pgjobkit nats project`, pgjobkit.stores.jetstream.relay) then
-- moves into JetStream. Each job needs an idempotency key: the relay enqueues by it, so a move it repeats
-- (it stopped between the enqueue and the delete, or two relays took the same rows) finds the job the
-- first made and adds nothing. Exactly once per key, while the job the key names is live: one that is dead
-- or cancelled before a repeated move frees its key, and the repeat adds a new job.
create table public.jobkit_outbox (
  seq        bigint generated always as identity primary key,
  job        jsonb       not null,  -- one job as jobkit_enqueue_many takes it, checked; run_after absolute
  created_at timestamptz not null default now(),
  error      text                   -- why the relay could not move it: then it stays, for the operator
);

comment on table public.jobkit_outbox is
  'jobkit: jobs enqueued in SQL for a JetStream queue, until the relay moves them (jobkit_outbox_enqueue).';

create index jobkit_outbox_pending on public.jobkit_outbox (seq) where error is null;

-- outbox_enqueue: p_jobs (1 to 1000, as jobkit_enqueue_many takes them) into the outbox, in the caller's
-- transaction; their outbox numbers. Each job is held to jobkit_check_jobs's rules, and to what the
-- JetStream store takes (an idempotency key, priority 0, no fair_key), so that what the relay moves is
-- refused nowhere later. delay_seconds becomes the run_after it means now.
create function public.jobkit_outbox_enqueue(p_jobs jsonb)
returns setof bigint
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_bad record;
begin
  if (case when jsonb_typeof(p_jobs) = 'array' then jsonb_array_length(p_jobs) not between 1 and 1000
      else true end) then
    raise exception using errcode = 'JK001', message = 'jobkit: p_jobs must be an array of 1 to 1000 jobs';
  end if;
  select * into v_bad from public.jobkit_check_jobs(p_jobs) limit 1;
  if not found then
    select (o.ord - 1)::integer as idx, p.problem into v_bad
    from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
    cross join lateral (select case
      when o.e ->> 'idempotency_key' is null
        then 'idempotency_key is required: the outbox moves a job to JetStream exactly once by its key'
      when coalesce((o.e ->> 'priority')::numeric, 0) <> 0
        then 'priority must be 0: JetStream delivers in stream order'
      when o.e ->> 'fair_key' is not null then 'fair_key is not available on the JetStream store'
    end as problem) as p
    where p.problem is not null
    limit 1;
  end if;
  if v_bad.idx is not null then
    raise exception using errcode = 'JK001', message = format('jobkit: job %s: %s', v_bad.idx, v_bad.problem);
  end if;
  return query
  insert into public.jobkit_outbox (job)
  select case when o.e ? 'delay_seconds'
           then o.e - 'delay_seconds'
                || jsonb_build_object('run_after', now() + make_interval(secs => (o.e ->> 'delay_seconds')::float8))
           else o.e end
  from jsonb_array_elements(p_jobs) with ordinality as o(e, ord)
  order by o.ord
  returning jobkit_outbox.seq;
end;
$$;

-- outbox_take: the oldest p_limit (1 to 1000) jobs waiting to be moved, oldest first. Rows are not locked:
-- a move is safe to repeat (by the key), and it never holds a transaction open across a JetStream call.
create function public.jobkit_outbox_take(p_limit integer default 333)
returns table (seq bigint, job jsonb)
language plpgsql
stable
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
#variable_conflict use_column
begin
  if p_limit is null or p_limit not between 1 and 1000 then
    raise exception using errcode = 'JK001', message = 'jobkit: p_limit must be between 1 and 1000';
  end if;
  return query
  select o.seq, o.job from public.jobkit_outbox o where o.error is null order by o.seq limit p_limit;
end;
$$;

-- outbox_done: the moved jobs p_seqs removed; with p_errors (one a seq, null where it moved), the ones that
-- could not move kept with their error (at most 2000 characters), no longer taken. The rows it changed.
create function public.jobkit_outbox_done(p_seqs bigint[], p_errors text[] default null)
returns integer
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
set plan_cache_mode = force_custom_plan
as $$
declare
  v_deleted integer;
  v_kept    integer;
begin
  if p_seqs is null or coalesce(array_ndims(p_seqs), 1) <> 1 or cardinality(p_seqs) > 1000
     or (p_errors is not null and cardinality(p_errors) <> cardinality(p_seqs)) then
    raise exception using errcode = 'JK001',
      message = 'jobkit: p_seqs must be an array of at most 1000 outbox numbers, p_errors null or one for each';
  end if;
  update public.jobkit_outbox o set error = left(d.error, 2000)
  from unnest(p_seqs, p_errors) as d(seq, error)
  where p_errors is not null and d.error is not null and o.seq = d.seq;
  get diagnostics v_kept = row_count;
  delete from public.jobkit_outbox o
  using unnest(p_seqs, coalesce(p_errors, array_fill(null::text, array[cardinality(p_seqs)]))) as d(seq, error)
  where d.error is null and o.seq = d.seq;
  get diagnostics v_deleted = row_count;
  return v_deleted + v_kept;
end;
$$;

alter table public.jobkit_outbox enable row level security;

create policy jobkit_outbox_service on public.jobkit_outbox
  for all to service_role using (true) with check (true);

revoke all on table public.jobkit_outbox from public, anon, authenticated, service_role;

grant select, insert, update, delete on table public.jobkit_outbox to service_role;
