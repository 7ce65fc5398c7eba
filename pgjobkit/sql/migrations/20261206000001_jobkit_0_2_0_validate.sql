-- jobkit 0.2.0, second step: the rows written before 0.2.0 checked against its new rules (the first step
-- enforces them on every value written since). Its own transaction, after the first has committed.
--
-- Locks: the table's check takes SHARE UPDATE EXCLUSIVE on jobkit_jobs (workers and apps go on reading
-- and writing while it reads the table); each domain check takes SHARE on jobkit_jobs and jobkit_schedules
-- while it reads their payloads or results, so writes wait for it (the README's "Upgrading" gives the
-- time it took per 100,000 jobs). A row that breaks a rule stops this step, naming the rule: the README
-- says how to find and fix such rows; until then 0.2.0 runs, and a worker fails such a job alone.

-- A lock this migration must wait for, it waits for at most 5 s (unless whoever runs it set a bound of
-- their own, as `pgjobkit migrate --lock-timeout` does): then it fails, changing nothing, rather than queue
-- every worker behind a long transaction. Run it again when the database is quieter.
select set_config('lock_timeout', '5s', true) where current_setting('lock_timeout') = '0';

alter table public.jobkit_jobs validate constraint jobkit_run_after_between_1970_and_9999;
alter domain public.jobkit_payload validate constraint jobkit_payload_nests_at_most_100_deep;
alter domain public.jobkit_payload validate constraint jobkit_payload_numbers_within_double_range;
alter domain public.jobkit_result validate constraint jobkit_result_nests_at_most_100_deep;
alter domain public.jobkit_result validate constraint jobkit_result_numbers_within_double_range;
