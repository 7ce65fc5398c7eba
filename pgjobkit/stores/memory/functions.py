"""Every SQL function the MemoryStore runs in process, by the SQL function's name: ``FUNCTIONS``, the one
table its transport dispatches a ``Call`` through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pgjobkit.stores.memory import admin, flow_control, jobs, pipelines, workers

# (state, now, woken, **the call's arguments without their SQL types) -> the function's answer: its rows, or
# its one value for a scalar function
Function = Callable[..., Any]

FUNCTIONS: dict[str, Function] = {
    "jobkit_enqueue": jobs.enqueue,
    "jobkit_enqueue_many": jobs.enqueue_many,
    "jobkit_claim": jobs.claim,
    "jobkit_complete": jobs.complete,
    "jobkit_progress": jobs.progress,
    "jobkit_fail": jobs.fail,
    "jobkit_heartbeat": jobs.heartbeat,
    "jobkit_release": jobs.release,
    "jobkit_reclaim_expired": jobs.reclaim_expired,
    "jobkit_cancel": admin.cancel,
    "jobkit_requeue": admin.requeue,
    "jobkit_prune": admin.prune,
    "jobkit_stats": admin.stats,
    "jobkit_get": admin.get,
    "jobkit_traceback": admin.traceback,
    "jobkit_list_jobs": admin.list_jobs,
    "jobkit_schema_version": admin.schema_version,
    "jobkit_set_limit": flow_control.set_limit,
    "jobkit_delete_limit": flow_control.delete_limit,
    "jobkit_list_limits": flow_control.list_limits,
    "jobkit_set_schedule": flow_control.set_schedule,
    "jobkit_delete_schedule": flow_control.delete_schedule,
    "jobkit_list_schedules": flow_control.list_schedules,
    "jobkit_fire_schedule": flow_control.fire_schedule,
    "jobkit_enqueue_pipeline": pipelines.enqueue_pipeline,
    "jobkit_complete_adding": pipelines.complete_adding,
    "jobkit_list_dependencies": pipelines.list_dependencies,
    "jobkit_get_pipeline": pipelines.get_pipeline,
    "jobkit_pipeline_progress": pipelines.pipeline_progress,
    "jobkit_pipeline_of": pipelines.pipeline_of,
    "jobkit_cancel_pipeline": pipelines.cancel_pipeline,
    "jobkit_worker_beat": workers.worker_beat,
    "jobkit_worker_stop": workers.worker_stop,
    "jobkit_list_workers": workers.list_workers,
    "jobkit_activity": workers.activity,
    "jobkit_queue_depth": workers.queue_depth,
    "jobkit_trace_contexts": workers.trace_contexts,
}
