"""``pgjobkit init supabase`` and ``pgjobkit migrate``: jobkit's schema into a project or a database."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import click

from pgjobkit import migrate as migrate_module
from pgjobkit.cli.nats import migrate as nats_migrate
from pgjobkit.cli.params import BadConfig, Duration, errors_only, exit_codes
from pgjobkit.settings import Settings


@click.command()
@click.argument("target", type=click.Choice(["supabase"]))
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=".",
    show_default=True,
    help="The directory holding the project's supabase/ folder.",
)
def init(target: str, workdir: Path) -> None:
    """Write the jobkit migrations a Supabase project lacks into supabase/migrations/, newer than its own."""
    project = workdir / "supabase"
    if not (project / "config.toml").is_file():
        raise BadConfig(
            f"no Supabase project in {workdir.resolve()} (no supabase/config.toml): run `supabase init` "
            "there first, or pass --workdir"
        )
    with exit_codes():
        files = migrate_module.init_project(project / "migrations")
    for path, written in files:
        click.echo(f"wrote {path}" if written else f"already in the project: {path}")
    if any(written for _, written in files):
        click.echo("next: `supabase db push` applies them (`--db-url URL` for a database of your own)")
    else:
        click.echo("the project already has every jobkit migration")


@click.command()
@click.option("--bootstrap", is_flag=True, help="On plain PostgreSQL: create the roles and auth schema too.")
@click.option(
    "--lock-timeout",
    type=Duration(),
    default="5s",
    show_default=True,
    help="The longest each migration waits for a lock on jobkit's tables before it tries again.",
)
@click.pass_context
def migrate(ctx: click.Context, bootstrap: bool, lock_timeout: timedelta) -> None:
    """Apply jobkit's migrations to JOBKIT_DATABASE_URL (Supabase projects: `supabase db push`), and create
    or update the JetStream stream on JOBKIT_NATS_URL's cluster when it is set."""
    with exit_codes(), errors_only():
        settings = Settings.load(ctx.obj["env_file"])
        if settings.nats_url is None or settings.database_url is not None:
            settings.require(
                "database_url", why="`pgjobkit migrate` needs a database URL (or JOBKIT_NATS_URL)"
            )
    if settings.database_url is not None:
        with exit_codes(), errors_only():
            applied = migrate_module.apply(
                settings.database_url.get_secret_value(),
                bootstrap=bootstrap,
                lock_timeout=lock_timeout,
                timeout=settings.connect_timeout,
                origin=settings.origin("database_url"),
            )
        click.echo(f"applied {', '.join(applied)}" if applied else "database is up to date")
    if settings.nats_url is not None:
        ctx.invoke(nats_migrate)
