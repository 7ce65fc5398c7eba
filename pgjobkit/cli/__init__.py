"""The ``pgjobkit`` command, one module per group of subcommands. Exit codes: 0 success, 2 bad usage or
configuration, 1 runtime failure (``pgjobkit.cli.params``)."""

from __future__ import annotations

import importlib
from typing import Any

import click

from pgjobkit.cli.params import BadConfig
from pgjobkit.extras import missing
from pgjobkit.version import __version__

# Each subcommand, imported when it is used: an install without an extra (psycopg for a database URL,
# supabase-py for a project) runs every command that does not need it.
COMMANDS = {
    "worker": "pgjobkit.cli.worker:worker",
    "enqueue": "pgjobkit.cli.jobs:enqueue",
    "jobs": "pgjobkit.cli.jobs:jobs",
    "stats": "pgjobkit.cli.jobs:stats",
    "workers": "pgjobkit.cli.jobs:workers",
    "cancel": "pgjobkit.cli.jobs:cancel",
    "requeue": "pgjobkit.cli.jobs:requeue",
    "prune": "pgjobkit.cli.jobs:prune",
    "init": "pgjobkit.cli.project:init",
    "migrate": "pgjobkit.cli.project:migrate",
    "demo": "pgjobkit.cli.demo:demo_command",
    "limit": "pgjobkit.cli.limits:limit",
    "schedule": "pgjobkit.cli.schedules:schedule_group",
    "pipeline": "pgjobkit.cli.pipelines:pipeline",
    "dashboard": "pgjobkit.cli.dashboard:dashboard",
    "nats": "pgjobkit.cli.nats:nats_group",
}


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, name = COMMANDS[cmd_name].partition(":")
        try:
            command: click.Command = getattr(importlib.import_module(module), name)
        except ModuleNotFoundError as exc:
            hint = missing(exc, f"`pgjobkit {cmd_name}`")
            if hint is None:
                raise
            return _unavailable(cmd_name, hint)
        return command


def _unavailable(name: str, hint: str) -> click.Command:
    def explain(**_: Any) -> None:
        raise BadConfig(hint)

    return click.Command(
        name,
        callback=explain,
        help=hint,
        short_help=hint.split(": ")[-1],
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--env-file", default=".env", show_default=True, help="Read settings from this file too.")
@click.version_option(__version__, prog_name="pgjobkit")
@click.pass_context
def main(ctx: click.Context, env_file: str) -> None:
    """jobkit: a job queue on one jobs table in your database (Supabase or plain PostgreSQL).

    Configure with SUPABASE_URL + SUPABASE_SECRET_KEY, or JOBKIT_DATABASE_URL (see .env.example); with
    both set, JOBKIT_STORE=postgres or JOBKIT_STORE=supabase chooses.
    """
    ctx.obj = {"env_file": env_file}
