"""The contract tests the JetStream store does not pass, each with the documented difference it stands
for (docs/operations/jetstream.md, the table "What differs from PostgreSQL"; each is refused at once, with
``NotAvailable`` or, for a batch past 333 jobs, ``InvalidArgument``). The harness marks them
xfail(strict): one that starts passing fails, so this list stays exact. A test that uses a refused feature
only on the way (a priority in ``test_cancel``) is listed too: what it would check on this store,
tests/jetstream/ checks."""

from __future__ import annotations

import pytest

ATOMIC = "enqueue_many is atomic up to 333 jobs per call on JetStream; a larger batch is refused"
FAIRNESS = "fair_key is refused on JetStream (it delivers in stream order)"
LIMITS = "limits cannot be set on JetStream"
LISTING = "list_jobs is refused on JetStream"
PIPELINES = "pipelines are refused on JetStream"
PRIORITY = "priorities other than 0 are refused on JetStream (it delivers in stream order)"
REGISTRY = "the worker registry, queue depth and activity are refused on JetStream"
SCHEDULES = "cron schedules are refused on JetStream"
TRACEBACKS = "a failure's traceback is not kept on JetStream (traceback() is refused)"
TRACES = "a job's trace context is not kept on JetStream"

DIFFERENCES: dict[str, str] = {
    "test_claim_limit_clamped": ATOMIC,
    "test_complete_and_claim_beyond_max_rows_leases_nothing_unseen": ATOMIC,
    "test_complete_many_beyond_max_rows": ATOMIC,
    "test_enqueue_many_beyond_max_rows_returns_every_result": ATOMIC,
    "test_reclaim_and_requeue_beyond_max_rows": ATOMIC,
    "test_stats_beyond_max_rows": ATOMIC,
    "test_a_key_with_one_job_waits_behind_one_job_of_a_burst": FAIRNESS,
    "test_turns_continue_after_single_enqueues": FAIRNESS,
    "test_a_claim_of_a_limited_type_always_looks_from_the_front": LIMITS,
    "test_a_limited_type_capped_mid_claim_leaves_room_for_others": LIMITS,
    "test_a_paused_type_is_left_out_and_others_still_claim": LIMITS,
    "test_expired_leases_give_their_slots_back": LIMITS,
    "test_max_running_holds_across_claims_and_frees_on_finish": LIMITS,
    "test_per_key_cap_passes_over_a_busy_key": LIMITS,
    "test_rate_limit_counts_every_start_in_the_window": LIMITS,
    "test_dedup_by_live_key": LISTING,
    "test_enqueue_many_too_big": LISTING,
    "test_list_filters_and_keyset_pages": LISTING,
    "test_a_batch_runs_its_completion_job_once_whatever_each_job_did": PIPELINES,
    "test_a_chain_runs_in_order_through_the_worker_completion_in_the_claim": PIPELINES,
    "test_a_completion_adds_jobs_only_when_it_holds_its_lease": PIPELINES,
    "test_a_dead_job_cancels_what_waits_for_it_down_the_graph": PIPELINES,
    "test_a_fan_out_from_a_user_s_job_belongs_to_the_user": PIPELINES,
    "test_a_graph_that_is_not_listed_in_order_is_refused_by_the_store": PIPELINES,
    "test_a_job_may_wait_for_a_job_that_exists": PIPELINES,
    "test_a_job_that_another_waits_for_is_kept_when_completions_delete": PIPELINES,
    "test_a_job_waits_until_every_job_it_waits_for_succeeded": PIPELINES,
    "test_a_pipeline_s_jobs_are_listed_and_counted_as_waiting": PIPELINES,
    "test_a_traced_pipeline_keeps_each_jobs_context": PIPELINES,
    "test_an_idempotent_pipeline_is_enqueued_once": PIPELINES,
    "test_cancelling_a_job_cancels_what_waits_for_it": PIPELINES,
    "test_cancelling_a_pipeline_ends_every_job_of_it_not_finished": PIPELINES,
    "test_jobs_a_handler_adds_under_tracing_keep_the_attempts_context": PIPELINES,
    "test_prune_keeps_what_a_waiting_job_still_needs": PIPELINES,
    "test_run_anyway_runs_after_a_dead_job_and_sees_how_each_ended": PIPELINES,
    "test_the_first_dependency_listed_that_failed_is_the_reason": PIPELINES,
    "test_waiting_for_a_job_that_does_not_exist_is_refused_writing_nothing": PIPELINES,
    "test_a_claim_after_a_job_looks_after_it_first": PRIORITY,
    "test_a_job_that_uses_every_key_is_taken": PRIORITY,
    "test_cancel": PRIORITY,
    "test_claim_order_priority_then_age": PRIORITY,
    "test_prune_deletes_a_jobs_traceback_and_past_its_horizon_one_whose_job_is_gone": TRACEBACKS,
    "test_a_beat_refuses_bad_activity_and_changes_nothing": REGISTRY,
    "test_a_vanished_worker_is_pruned_by_another_workers_beat": REGISTRY,
    "test_a_worker_beats_is_listed_holding_its_jobs_and_goes_when_it_stops": REGISTRY,
    "test_activity_adds_up_across_beats_and_workers": REGISTRY,
    "test_queue_depth_counts_unfinished_jobs_by_type_and_status": REGISTRY,
    "test_a_scheduler_fires_through_every_store": SCHEDULES,
    "test_fire_enqueues_each_due_time_once": SCHEDULES,
    "test_fire_refuses_bad_due_times": SCHEDULES,
    "test_schedules_are_stored_listed_and_deleted": SCHEDULES,
    "test_a_failures_traceback_is_the_operators_latest_attempt": TRACEBACKS,
    "test_a_lost_lease_keeps_neither_max_attempts_nor_traceback": TRACEBACKS,
    "test_a_max_attempts_out_of_range_is_refused_changing_nothing": TRACEBACKS,
    "test_a_traceback_is_kept_to_its_end": TRACEBACKS,
    "test_hostile_text_in_a_traceback_fails_nothing": TRACEBACKS,
    "test_an_enqueued_jobs_trace_context_is_kept": TRACES,
    "test_the_trace_context_is_kept_beside_the_jobs_it_was_enqueued_with": TRACES,
}


def why(item: pytest.Item) -> str | None:
    """The difference ``item`` (a test of the contract suite) stands for on this store, or None."""
    return DIFFERENCES.get(item.name.split("[")[0])
