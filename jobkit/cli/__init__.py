"""The ``jobkit`` command, one module per group of subcommands. Exit codes: 0 success, 2 bad usage or
configuration, 1 runtime failure (``jobkit.cli.params``)."""

from __future__ import annotations

import click

from jobkit.cli import demo, jobs, limits, project, schedules, worker
from jobkit.version import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--env-file", default=".env", show_default=True, help="Read settings from this file too.")
@click.version_option(__version__, prog_name="pgjobkit")
@click.pass_context
def main(ctx: click.Context, env_file: str) -> None:
    """jobkit: a job queue on one Postgres table (Supabase or plain PostgreSQL).

    Configure with SUPABASE_URL + SUPABASE_SECRET_KEY, or JOBKIT_DATABASE_URL (see .env.example).
    """
    ctx.obj = {"env_file": env_file}


for command in (
    worker.worker,
    jobs.enqueue,
    jobs.jobs,
    jobs.stats,
    jobs.cancel,
    jobs.requeue,
    jobs.prune,
    project.init,
    project.migrate,
    demo.demo_command,
    limits.limit,
    schedules.schedule_group,
):
    main.add_command(command)
