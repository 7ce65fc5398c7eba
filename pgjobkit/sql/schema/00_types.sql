-- jobkit's schema as it is now, split by concern and read in file order: types (this file), tables, the
-- functions of each area (enqueue, the worker's, the operator's, limits, schedules, users, Realtime), then
-- triggers and security (Row Level Security, policies, grants). This is the source a reader reads; a
-- database gets here through ../migrations/ (append-only: 0.1's file as it shipped, then one per release),
-- and tests/sql/test_schema_sources.py proves the two build the same database.
--
-- Status machine:  queued -> running -> succeeded
--                  running -> retrying -> running ...      (failure with attempts left; lease expiry)
--                  running -> dead                          (attempts used up, or a permanent failure)
--                  dead -> queued                           (requeue, by an operator)
--                  queued, retrying, running -> cancelled   (cancel; a running job's lease ends with it)
--                  waiting -> queued                        (every job it waits for ended: 45_pipelines.sql)
--                  waiting -> cancelled                     (one ended dead or cancelled; or cancel)
-- dead and cancelled free the job's idempotency key; succeeded and cancelled are never requeued.
-- "Runnable" is status in ('queued', 'retrying') and run_after <= now(), written out in every statement that
-- needs it: the planner uses a partial index only for a query that repeats the index's predicate literally.
-- Claim order: priority, then fairness turn (jobkit_fair_round), then run_after, then created_at; per-type
-- limits (jobkit_limits) are held by every claim; schedules (jobkit_schedules) enqueue recurring jobs.
--
-- Conventions of the functions: one function per name (PostgREST cannot choose between overloads);
-- security invoker; every name schema-qualified, and search_path = pg_catalog, pg_temp: the session's
-- temporary schema last, where it can shadow nothing (left out of a search_path, pg_temp is searched first
-- for types, so a caller's pg_temp.uuid would stand in for uuid); durations are seconds (double precision); time is the database clock (now()). No function returns more than 1000 rows in one call,
-- the max-rows PostgREST applies on Supabase (it cuts a longer result while the function still runs to
-- completion, so changed rows would go unseen): callers page or chunk, and jobkit's stores do.
--
-- jobkit's own SQLSTATEs (mapped to Python exceptions in jobkit/errors.py, whatever the transport):
--   JK001  invalid argument: the message names the argument and the fix
--   JK002  job not found
--   JK003  a limit for users was reached (live jobs of a type per user, or jobs created per window)
--   JK004  this database is the view of a JetStream queue: claim, reclaim and cancel there (75_projection.sql)
-- An error quotes at most the first 100 characters of an argument it names.
-- Lease loss is not an error: complete / fail / heartbeat report it in their result (ok = false, held = false).

-- Types --------------------------------------------------------------------------------------------------
-- A rule on one column is a domain, named like the table constraint it replaced. PostgreSQL prepares a
-- table's CHECK constraints afresh for every statement that writes a row (parsing each stored expression
-- and planning it: about 70 us per single-row statement for seventeen of them, a third of the backend's
-- time in a one-row insert under perf), where a domain's check is prepared once per session, is part of
-- the statement's cached plan, and runs only when a value of its column is written. The rules across
-- columns stay CHECK constraints. A violation is SQLSTATE 23514 naming the constraint either way; clients
-- read each column as its base type.
create domain public.jobkit_status as text
  constraint jobkit_jobs_status_valid
  check (value in ('queued', 'running', 'retrying', 'succeeded', 'dead', 'cancelled', 'waiting'));

create domain public.jobkit_type as text
  constraint jobkit_jobs_type_valid check (char_length(value) between 1 and 200);

-- What every client can read back: JSON nested at most 100 deep (Python's json gives up near 1000, serde_json
-- at 128) and numbers within a double's range (PostgreSQL keeps 1e4300 as a 4,301-digit integer, which
-- Python refuses to read: more than 4,300 digits). Checked wherever a value is written, whichever path
-- wrote it (about 0.6 us for a small payload).
create domain public.jobkit_payload as jsonb
  constraint jobkit_jobs_payload_object check (jsonb_typeof(value) = 'object')
  constraint jobkit_payload_nests_at_most_100_deep
    check (not jsonb_path_exists(value, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")'))
  constraint jobkit_payload_numbers_within_double_range
    check (not jsonb_path_exists(value,
      'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))'));

create domain public.jobkit_key as text
  constraint jobkit_jobs_key_valid check (char_length(value) between 1 and 200);

create domain public.jobkit_max_attempts as integer
  constraint jobkit_jobs_max_attempts_valid check (value between 1 and 1000);

create domain public.jobkit_priority as integer
  constraint jobkit_jobs_priority_valid check (value between -1000000 and 1000000);

create domain public.jobkit_worker as text
  constraint jobkit_jobs_claimed_by_valid check (char_length(value) between 1 and 200);

create domain public.jobkit_error as text
  constraint jobkit_jobs_error_bounded check (char_length(value) <= 4000);

create domain public.jobkit_progress as double precision
  constraint jobkit_jobs_progress_valid check (value between 0 and 1);

create domain public.jobkit_progress_message as text
  constraint jobkit_jobs_progress_message_bounded check (char_length(value) <= 200);

create domain public.jobkit_result as jsonb
  constraint jobkit_jobs_result_bounded check (octet_length(value::text) <= 65536)
  constraint jobkit_result_nests_at_most_100_deep
    check (not jsonb_path_exists(value, 'strict $.**{100} ? (@.type() == "object" || @.type() == "array")'))
  constraint jobkit_result_numbers_within_double_range
    check (not jsonb_path_exists(value,
      'strict $.** ? (@.type() == "number" && (@ > 1.7976931348623157e308 || @ < -1.7976931348623157e308))'));

create domain public.jobkit_fair_key as text
  constraint jobkit_jobs_fair_key_valid check (char_length(value) between 1 and 200);

create domain public.jobkit_fair_round as integer
  constraint jobkit_jobs_fair_round_valid check (value >= 0);

-- The trace context of the code that enqueued a job (W3C: {"traceparent": ..., "tracestate": ...}), as
-- OpenTelemetry's propagators write it: an object of strings, at most 1 KiB.
create domain public.jobkit_trace_context as jsonb
  constraint jobkit_jobs_trace_context_valid
    check (jsonb_typeof(value) = 'object' and octet_length(value::text) <= 1024
           and not jsonb_path_exists(value, '$.* ? (@.type() != "string")'));


-- jobkit_private holds helpers of the public functions and the checks behind the users' entry points, in a
-- schema the Data API does not expose.
create schema jobkit_private;

comment on schema jobkit_private is 'jobkit: helpers and the checks behind the users'' functions; not exposed by the Data API.';
