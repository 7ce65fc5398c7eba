"""``pgjobkit dashboard``: serve the web dashboard on the configured store, behind a token."""

from __future__ import annotations

import asyncio
import ipaddress
import secrets

import click
import uvicorn

from pgjobkit.cli.params import BadConfig, Failure, exit_codes, open_store_for
from pgjobkit.dashboard import create_app, serving
from pgjobkit.dashboard.auth import MIN_TOKEN_LENGTH
from pgjobkit.dashboard.hosts import parse_allowed
from pgjobkit.errors import InvalidArgument
from pgjobkit.settings import Settings

TOKEN_ENV = "JOBKIT_DASHBOARD_TOKEN"  # noqa: S105 (the variable's name, not a token)
HOSTS_ENV = "JOBKIT_DASHBOARD_ALLOWED_HOSTS"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine (localhost, 127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_from(settings: Settings) -> tuple[str, bool]:
    """The token: JOBKIT_DASHBOARD_TOKEN (at least 16 characters; from the environment or the env file),
    else a new random one; and whether it was made here."""
    if settings.dashboard_token is None:
        return secrets.token_urlsafe(24), True
    given = settings.dashboard_token.get_secret_value()
    if len(given) < MIN_TOKEN_LENGTH:
        raise BadConfig(
            f"{TOKEN_ENV} must be at least {MIN_TOKEN_LENGTH} characters (it has {len(given)}); "
            "unset it to have the dashboard make one"
        )
    return given, False


def hosts_from(settings: Settings, given: tuple[str, ...], host: str) -> list[str]:
    """The hosts the dashboard answers to beside its own address: JOBKIT_DASHBOARD_ALLOWED_HOSTS
    (comma-separated), each --allowed-host, and ``host`` when it is a name rather than an address;
    BadConfig naming the one that is not a host."""
    try:
        parse_allowed(settings.dashboard_allowed_hosts, HOSTS_ENV)
        parse_allowed(given, "--allowed-host")
    except InvalidArgument as exc:
        raise BadConfig(str(exc)) from None
    named = [h.strip() for h in settings.dashboard_allowed_hosts.split(",") if h.strip()]
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        if host.strip():
            named.append(host.strip())  # the name it was told to listen on (its port is the server's)
    return named + list(given)


def url_of(host: str, port: int) -> str:
    """The dashboard's address as a browser takes it (an IPv6 host in brackets)."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


async def serve(server: uvicorn.Server, host: str, token: str, made: bool) -> None:
    """Run ``server``; once it listens, say where (the port it got, for --port 0), and the token when it
    was made here."""
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1]
        click.echo(f"jobkit dashboard: {url_of(host, port)}")
        click.echo(f"token: {token}" if made else f"token: the one in {TOKEN_ENV}")
        click.echo("Ctrl-C stops it.")
    await task


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8765, show_default=True, help="Port (0: any free one)."
)
@click.option(
    "--allowed-host",
    "allowed",
    multiple=True,
    metavar="HOST[:PORT]",
    help="Another host name it answers to, as the browser's address bar shows it (its name behind a "
    "proxy); repeatable. Also JOBKIT_DASHBOARD_ALLOWED_HOSTS, comma-separated. Any other Host gets 421.",
)
@click.pass_context
def dashboard(ctx: click.Context, host: str, port: int, allowed: tuple[str, ...]) -> None:
    """Serve the web dashboard: counts, failing and running jobs, pipelines, limits, schedules, workers.
    Sign in with JOBKIT_DASHBOARD_TOKEN, or the token it prints at start."""
    with exit_codes():
        settings = Settings.load(ctx.obj["env_file"])
        token, made = token_from(settings)
        hosts = hosts_from(settings, allowed, host)
    if not is_loopback(host):
        click.secho(
            f"WARNING: listening on {host}, not on this machine alone: anyone who can reach it can try "
            "the token, and without TLS in front the token and session travel in clear text. "
            "The dashboard acts with the store's full (service role) rights.",
            fg="red",
            bold=True,
            err=True,
        )
    with open_store_for(ctx) as blocking, exit_codes():
        app = create_app(blocking.as_async(), token, allowed_hosts=hosts)
        server = uvicorn.Server(serving.config(app, host, port))
        try:
            asyncio.run(serve(server, host, token, made))
        except KeyboardInterrupt:
            pass
        except SystemExit as exc:  # uvicorn's answer to an address it cannot listen on (it logged why)
            raise Failure(f"the dashboard could not listen on {url_of(host, port)}") from exc
    click.echo("jobkit dashboard stopped.", err=True)
