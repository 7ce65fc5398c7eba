"""jobkit's web dashboard for operators: the queue's counts and last hour, failing jobs grouped by error,
running jobs, one job, a pipeline's tree, limits, schedules and workers, with the actions an operator takes
(requeue, cancel, set and delete). Server-rendered (Starlette and Jinja2), no JavaScript, behind one token;
``pgjobkit dashboard`` serves it (``serving.config``), ``create_app`` builds it on any AsyncJobStore."""

from pgjobkit.dashboard.app import create_app

__all__ = ["create_app"]
