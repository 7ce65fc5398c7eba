-- Tables: the jobs, and the flow-control and users' tables beside them, with their indexes.

-- The jobs ---------------------------------------------------------------------------------------------
create table public.jobkit_jobs (
  id              uuid        primary key default gen_random_uuid(),
  user_id         uuid        references auth.users (id) on delete cascade,  -- what waits for them is settled: 85_triggers.sql
  type            public.jobkit_type not null,
  status          public.jobkit_status not null default 'queued',
  payload         public.jobkit_payload not null default '{}',
  idempotency_key public.jobkit_key,
  attempts        integer     not null default 0,
  max_attempts    public.jobkit_max_attempts not null default 3,
  priority        public.jobkit_priority not null default 0,
  run_after       timestamptz not null default now(),
  lease_until     timestamptz,
  lease_token     uuid,
  claimed_by      public.jobkit_worker,
  error           public.jobkit_error,
  created_at      timestamptz not null default now(),
  updated_at      timestamptz not null default now(),
  progress        public.jobkit_progress,  -- 0 to 1, reported by the running handler; 1 on success
  progress_message public.jobkit_progress_message,
  result          public.jobkit_result,    -- what the handler returned, on success
  fair_key        public.jobkit_fair_key,  -- fairness and per-key limits group jobs by it; defaults to user_id
  fair_round      public.jobkit_fair_round not null default 0,  -- the job's turn among its key's waiting jobs
  started_at      timestamptz, -- when the latest attempt was claimed

  constraint jobkit_jobs_attempts_valid check (attempts >= 0 and attempts <= max_attempts),
  -- a running job always holds a lease (deadline and token); nothing else does
  constraint jobkit_jobs_lease_iff_running
    check ((status = 'running') = (lease_until is not null and lease_token is not null)),
  constraint jobkit_jobs_running_claimed
    check (status <> 'running' or (claimed_by is not null and attempts >= 1)),
  -- a finished job has run at least once
  constraint jobkit_jobs_finished_ran check (status not in ('succeeded', 'dead') or attempts >= 1),
  -- a time every client's date type holds, in any time zone (not infinity, not BC, not past 9999). A check
  -- on the table, not a domain: a column's type change would change the row type every function returns,
  -- and break the statements a running worker prepared against it (0.2.0 upgrades 0.1 under load)
  constraint jobkit_run_after_between_1970_and_9999
    check (run_after >= '1970-01-01 00:00:00+00' and run_after < '9999-01-01 00:00:00+00')
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

-- Idempotency: one live job per key. A dead or cancelled job frees its key. Jobs without a key are not in
-- it, so their every transition writes one index entry fewer (measured: claim plus complete 9% faster).
create unique index jobkit_jobs_idempotency_key
  on public.jobkit_jobs (idempotency_key)
  where idempotency_key is not null and status not in ('dead', 'cancelled');

-- The claim path: leads with the claim's own order, holds only runnable rows, so finished rows
-- (the bulk of the table) never slow a claim down. Not type: a claim's types = any(array) on a column of
-- the index would be an index condition, and PostgreSQL (before 17) then cannot return rows in index
-- order, so it would sort every runnable row (measured: claims 2x slower at 1,000 runnable). Not id: the
-- jobs of one enqueue share every column here, so their entries deduplicate into one posting list, which a
-- scan steps over whole once they are claimed, vacuumed or not (with id last, or each row's own clock in
-- created_at, a claim cycle after 100,000 jobs with no vacuum touched 35x the pages of an empty table's).
create index jobkit_jobs_claim
  on public.jobkit_jobs (priority desc, fair_round, run_after, created_at)
  where status in ('queued', 'retrying');

-- Fairness: the last turn a key's waiting jobs of a type hold (jobs without a key are not in it).
create index jobkit_jobs_fair
  on public.jobkit_jobs (type, fair_key, fair_round)
  where fair_key is not null and status in ('queued', 'retrying');

-- Expired leases: only running rows.
create index jobkit_jobs_lease
  on public.jobkit_jobs (lease_until) where status = 'running';

-- A user's own listing, newest first (keyset pagination on created_at).
create index jobkit_jobs_user_created
  on public.jobkit_jobs (user_id, created_at desc, id desc) where user_id is not null;

-- Flow control ----------------------------------------------------------------------------------------
-- Limits per job type, enforced by jobkit_claim for every worker on every machine: at most max_running
-- running at once (0 pauses the type), at most max_starts claims in any window of per_seconds (an API's
-- quota: 3000 per 60), at most max_running_per_key running per fairness key (fair_key, else user_id).
-- Null means no limit of that kind. Set with jobkit_set_limit, removed with jobkit_delete_limit, read with
-- jobkit_list_limits (service_role); the next claim applies a change.
create table public.jobkit_limits (
  type                text primary key,
  max_running         integer,
  max_starts          integer,
  per_seconds         double precision,
  max_running_per_key integer,
  updated_at          timestamptz not null default now(),
  started             integer     not null default 0,  -- its rows in jobkit_starts, kept by jobkit_claim
  constraint jobkit_limits_type_valid check (char_length(type) between 1 and 200),
  constraint jobkit_limits_running_valid check (max_running between 0 and 1000000),
  constraint jobkit_limits_starts_valid check (max_starts between 1 and 100000),
  constraint jobkit_limits_per_valid check (per_seconds > 0 and per_seconds <= 86400),
  constraint jobkit_limits_rate_whole check ((max_starts is null) = (per_seconds is null)),
  constraint jobkit_limits_per_key_valid check (max_running_per_key between 1 and 1000000),
  constraint jobkit_limits_some check (num_nonnulls(max_running, max_starts, max_running_per_key) > 0)
);

comment on table public.jobkit_limits is
  'jobkit: per-type limits every claim obeys (service_role; set them with jobkit_set_limit).';

-- The starts of rate-limited types within their window, written and trimmed by jobkit_claim under the
-- type's lock (n numbers the jobs of one claim, which share a start time).
create table public.jobkit_starts (
  type       text        not null,
  started_at timestamptz not null,
  n          integer     not null,
  primary key (type, started_at, n)
);

comment on table public.jobkit_starts is 'jobkit: recent starts of rate-limited types (kept by jobkit_claim).';

-- Schedules: named recurring jobs. A scheduler (jobkit's Worker runs one; any number may run) reads them
-- with jobkit_list_schedules, computes the cron's due times in the schedule's time zone after last_due_at,
-- and hands them to jobkit_fire_schedule, which enqueues them and moves last_due_at under the schedule's
-- row lock, only if no other scheduler moved it first: one job per due time, however many schedulers run.
-- misfire says what a scheduler does with due times missed while none ran: 'skip' enqueues only the latest,
-- 'catch_up' every one (at most 1000 per fire, oldest first).
create table public.jobkit_schedules (
  name         text primary key,
  cron         text        not null,
  timezone     text        not null default 'UTC',
  type         text        not null,
  payload      public.jobkit_payload not null default '{}',
  priority     integer     not null default 0,
  max_attempts integer     not null default 3,
  misfire      text        not null default 'skip',
  enabled      boolean     not null default true,
  last_due_at  timestamptz not null default now(),  -- due times up to this one are enqueued (or skipped)
  created_at   timestamptz not null default now(),
  updated_at   timestamptz not null default now(),
  constraint jobkit_schedules_name_valid
    check (char_length(name) between 1 and 150 and name !~ '[\u0001-\u001f\u007f-\u009f]'),
  constraint jobkit_schedules_cron_valid check (char_length(cron) between 1 and 200),
  constraint jobkit_schedules_timezone_valid check (char_length(timezone) between 1 and 100),
  constraint jobkit_schedules_type_valid check (char_length(type) between 1 and 200),
  constraint jobkit_schedules_payload_object
    check (jsonb_typeof(payload) = 'object' and octet_length(payload::text) <= 65536),
  constraint jobkit_schedules_priority_valid check (priority between -1000000 and 1000000),
  constraint jobkit_schedules_attempts_valid check (max_attempts between 1 and 1000),
  constraint jobkit_schedules_misfire_valid check (misfire in ('skip', 'catch_up'))
);

comment on table public.jobkit_schedules is
  'jobkit: recurring jobs (service_role; manage them with jobkit_set_schedule / _delete).';

-- The users' side -------------------------------------------------------------------------------------
-- A signed-in user (authenticated) may start jobs of the types an operator opened to users, and cancel
-- their own jobs; nothing else. The user is always auth.uid(), never an argument. The checks run in
-- jobkit_private, a schema the Data API does not expose, as SECURITY DEFINER functions (owned by the
-- migration's role); public holds only thin SECURITY INVOKER entry points, so the Security Advisor's lints
-- on definer functions in exposed schemas stay quiet.

-- Which job types users may start, and their limits. Managed by the service role (Data API or SQL).
create table public.jobkit_user_types (
  type              text primary key,
  max_live_per_user integer not null default 10,   -- queued, running or retrying jobs of this type
  max_attempts      integer not null default 3,
  priority          integer not null default 0,
  max_payload_bytes integer not null default 65536,
  created_at        timestamptz not null default now(),
  max_created_per_user integer not null default 60, -- jobs of this type a user creates per per_seconds
  per_seconds       integer not null default 60,   -- (cancelled ones count: no loop of enqueue and cancel)
  constraint jobkit_user_types_type_valid check (char_length(type) between 1 and 200),
  constraint jobkit_user_types_live_valid check (max_live_per_user between 1 and 100000),
  constraint jobkit_user_types_created_valid check (max_created_per_user between 1 and 1000000),
  constraint jobkit_user_types_per_seconds_valid check (per_seconds between 1 and 86400),
  constraint jobkit_user_types_attempts_valid check (max_attempts between 1 and 1000),
  constraint jobkit_user_types_priority_valid check (priority between -1000000 and 1000000),
  constraint jobkit_user_types_payload_valid check (max_payload_bytes between 2 and 1048576)
);

comment on table public.jobkit_user_types is
  'jobkit: job types signed-in users may start with jobkit_user_enqueue, and their limits (service_role).';

-- A user's live jobs of a type, for the limit: holds only users' live jobs, so the worker's own jobs and
-- every finished job pay nothing for it.
create index jobkit_jobs_user_live
  on public.jobkit_jobs (user_id, type)
  where user_id is not null and status in ('queued', 'running', 'retrying');

-- Pipelines ---------------------------------------------------------------------------------------------
-- A pipeline is jobs that wait for jobs. Each of its jobs has a row here (the job's row in jobkit_jobs is
-- as any job's, so listings, RLS, Realtime, limits and fairness treat it as one). A job that waits for
-- others has status 'waiting' and counts in waiting_for the jobs it waits for that have not ended; each
-- ending decrements it in the transaction of the ending, and the one that brings it to 0 makes the job
-- queued (jobkit_private.release_waiters). A counter, not a scan for "are all done?": such a scan, run by two
-- completions at once, each seeing the other's job still running, would leave the job waiting for ever.
create table public.jobkit_pipeline_jobs (
  job_id      uuid primary key,
  pipeline_id uuid        not null,
  user_id     uuid        references auth.users (id) on delete cascade,  -- the job's owner, for RLS
  parent_id   uuid,                  -- the job whose completion added this one; null: enqueued
  waiting_for integer     not null default 0,  -- jobs it waits for that have not ended
  seq         bigint      generated always as identity,  -- the order jobs were added in
  created_at  timestamptz not null default now(),
  constraint jobkit_pipeline_jobs_waiting_valid check (waiting_for >= 0)
);

comment on table public.jobkit_pipeline_jobs is
  'jobkit: the jobs of each pipeline, and how many of the jobs each waits for have not ended (kept by jobkit).';

create index jobkit_pipeline_jobs_pipeline on public.jobkit_pipeline_jobs (pipeline_id, seq);

create index jobkit_pipeline_jobs_user on public.jobkit_pipeline_jobs (user_id) where user_id is not null;

-- What each job waits for, in the order it listed them (position, from 0: the order its handler is handed
-- their results in), what it does when one ends dead or cancelled (on_failure: 'cancel' it, the default,
-- which cascades to the jobs that wait for it in turn; or 'run' it anyway), and how each ended (outcome,
-- null until it did). A job waits for at most 10000 jobs (100 in a users' pipeline: 70_users.sql).
create table public.jobkit_dependencies (
  job_id     uuid    not null,
  position   integer not null,
  depends_on uuid    not null,
  on_failure text    not null default 'cancel',
  outcome    text,
  user_id    uuid    references auth.users (id) on delete cascade,  -- the waiting job's owner, for RLS
  primary key (job_id, position),
  constraint jobkit_dependencies_position_valid check (position between 0 and 9999),
  constraint jobkit_dependencies_on_failure_valid check (on_failure in ('cancel', 'run')),
  constraint jobkit_dependencies_outcome_valid check (outcome in ('succeeded', 'dead', 'cancelled'))
);

comment on table public.jobkit_dependencies is
  'jobkit: which jobs each pipeline job waits for, and how each ended (kept by jobkit).';

-- The edges an ending settles: only those not settled yet, so a completion's probe of it costs one index
-- descent, and nothing, for a job nobody waits for.
create index jobkit_dependencies_open on public.jobkit_dependencies (depends_on) where outcome is null;

-- prune keeps a job that a job not yet finished waits for (its result is still to be handed on).
create index jobkit_dependencies_on on public.jobkit_dependencies (depends_on);

-- Traces (0.5.0) ---------------------------------------------------------------------------------------
-- The trace context of each job enqueued inside a trace (OpenTelemetry's W3C fields), read by the worker
-- that runs it to continue that trace. A table beside jobkit_jobs, not a column of it: a new column
-- changes the row type every running worker's prepared claim returns (their next claim would fail), and
-- jobs enqueued outside a trace, or by an app that does not trace, cost nothing here. No foreign key, so
-- that deleting a job costs what it did; the workers' beats delete what a finished or deleted job left
-- once it is a day old.
create table public.jobkit_traces (
  job_id        uuid        primary key,
  trace_context public.jobkit_trace_context not null,
  created_at    timestamptz not null default now()
);

comment on table public.jobkit_traces is
  'jobkit: the trace context each job was enqueued with (kept by jobkit_enqueue; read by workers).';

create index jobkit_traces_created on public.jobkit_traces (created_at);

-- Tracebacks (0.5.1) -----------------------------------------------------------------------------------
-- The traceback of each job's latest failed attempt that sent one (jobkit_fail's p_traceback), for
-- operators: its end, at most 8,000 characters (the frames nearest the error). Beside jobkit_jobs, not a
-- column of it: a job's owner reads its row there (RLS), error included, and a traceback names the app's
-- files, functions and source lines, which are the operator's to see; and a new column would change the row
-- type running workers' prepared claims return (see jobkit_traces). No foreign key to the job, as for
-- jobkit_traces (deleting a job costs what it did): prune deletes a job's traceback with it, and one whose
-- job went another way (deleted on completion after a failure) once it is older than prune's horizon. A
-- user's go with the user (the foreign key to auth.users), as their jobs do.
create table public.jobkit_tracebacks (
  job_id    uuid        primary key,
  user_id   uuid        references auth.users (id) on delete cascade,  -- the job's owner: gone with them
  attempt   integer     not null,
  traceback text        not null,
  failed_at timestamptz not null default now(),
  constraint jobkit_tracebacks_attempt_valid check (attempt >= 1),
  constraint jobkit_tracebacks_bounded check (char_length(traceback) <= 8000)
);

comment on table public.jobkit_tracebacks is
  'jobkit: the traceback of each job''s latest failed attempt (kept by jobkit_fail; service_role only).';

create index jobkit_tracebacks_failed on public.jobkit_tracebacks (failed_at);

create index jobkit_tracebacks_user on public.jobkit_tracebacks (user_id) where user_id is not null;

-- Workers -------------------------------------------------------------------------------------------------
-- One row per worker, kept by the worker itself: jobkit_worker_beat when it starts and every few seconds
-- while it runs, jobkit_worker_stop when it stops. A worker that vanished (killed, its machine gone) stops
-- beating; the next beat of any worker deletes it once its last beat is older than its own stale_after.
-- What a worker holds is read live from jobkit_jobs (claimed_by), not kept here.
create table public.jobkit_workers (
  name         public.jobkit_worker primary key,  -- as in jobkit_jobs.claimed_by
  host         text,
  pid          integer,
  version      text,
  types        text[]           not null default '{}',
  concurrency  integer,
  started_at   timestamptz      not null default now(),
  heartbeat_at timestamptz      not null default now(),
  stale_after  double precision not null default 60,  -- seconds without a beat before it counts as gone
  constraint jobkit_workers_host_bounded check (char_length(host) <= 200),
  constraint jobkit_workers_version_bounded check (char_length(version) <= 50),
  constraint jobkit_workers_types_bounded check (cardinality(types) <= 1000),
  constraint jobkit_workers_stale_after_valid check (stale_after between 1 and 86400)
);

comment on table public.jobkit_workers is
  'jobkit: the workers that are running, kept fresh by their own beats (jobkit_worker_beat).';

-- What the workers did, by the minute: attempts ended per type and outcome, with their run times and queue
-- waits (sums and maxima). Each worker adds its own minutes at its beats; minutes older than a day are
-- deleted by the beats. The dashboard's rates and timings over the last hour read it.
create table public.jobkit_activity (
  minute       timestamptz      not null,  -- the minute the attempts ended in
  type         public.jobkit_type not null,
  outcome      text             not null,
  jobs         bigint           not null default 0,
  run_seconds  double precision not null default 0,  -- the sum of the attempts' run times
  run_max      double precision not null default 0,
  wait_seconds double precision not null default 0,  -- the sum of their waits from runnable to claimed
  wait_max     double precision not null default 0,
  primary key (minute, type, outcome),
  constraint jobkit_activity_outcome_valid check (outcome in ('succeeded', 'retrying', 'dead', 'lost')),
  constraint jobkit_activity_counts_valid
    check (jobs >= 0 and run_seconds >= 0 and run_max >= 0 and wait_seconds >= 0 and wait_max >= 0)
);

comment on table public.jobkit_activity is
  'jobkit: attempts ended per minute, type and outcome, with run times and queue waits (kept by the workers).';
