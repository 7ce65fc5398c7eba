"""The dashboard's pages and actions, on any AsyncJobStore: ``create_app`` builds the Starlette app."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from pgjobkit.core.models import FINISHED, Job, JobStatus
from pgjobkit.core.workers import OUTCOMES
from pgjobkit.dashboard import charts, views
from pgjobkit.dashboard.auth import (
    COOKIE,
    Auth,
    Guard,
    Session,
    clear_session_cookie,
    client_address,
    csrf_ok,
    request_session,
    set_session_cookie,
)
from pgjobkit.dashboard.hosts import Hosts, parse_allowed
from pgjobkit.dashboard.text import verbatim, visible
from pgjobkit.errors import InvalidArgument, JobkitError, JobNotFound
from pgjobkit.stores.base_async import AsyncJobStore

log = logging.getLogger("pgjobkit.dashboard")

HERE = Path(__file__).parent
LOGIN_BODY = 4096  # bytes a login form may send
ACTION_BODY = 2 * 1024 * 1024  # bytes any other form may send (a schedule's payload, a group's ids)
MAX_LISTED = 1000  # jobs of one status a page reads, newest first
SHOWN_PER_GROUP = 10  # jobs of an error group listed one by one
REASON = "cancelled from the dashboard"
OUTCOME_COLOURS = {"succeeded": "#2f9e44", "retrying": "#f2a007", "dead": "#d6336c", "lost": "#7048e8"}

Action = Callable[[Request, Session, views.Form], Awaitable[Response]]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}".replace(f".0{unit}", unit)
    return f"{seconds:.0f}s"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _compact(value: Any, length: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= length else text[: length - 1] + "…"


async def read_form(request: Request, limit: int) -> views.Form:
    """The request's form, read up to ``limit`` bytes (413 past it; 415 for anything but a plain form)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/x-www-form-urlencoded", ""):  # none: an empty form, as a bare POST sends
        raise HTTPException(415, "Send the page's own form.")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, "That form is too large.")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise HTTPException(413, "That form is too large.")
    if not kind and body:
        raise HTTPException(415, "Send the page's own form.")
    try:
        return views.Form.parse(bytes(body))
    except InvalidArgument as exc:
        raise HTTPException(413, str(exc)) from None


class Dashboard:
    """What the routes share: the store, the sign-in state, the templates and the clock."""

    def __init__(self, store: AsyncJobStore, auth: Auth, clock: Callable[[], datetime]) -> None:
        self.store, self.auth, self.clock = store, auth, clock
        self.css = (HERE / "static" / "style.css").read_text(encoding="utf-8")
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            finalize=visible,  # every hidden character of every value drawn as its escape
        )
        self.env.filters.update(when=_when, age=_age, pretty=_pretty, compact=_compact, verbatim=verbatim)
        self.env.tests["datetime"] = lambda value: isinstance(value, datetime)
        self.env.globals.update(STATUS_ORDER=views.STATUS_ORDER, FINISHED=FINISHED)

    # --- drawing ----------------------------------------------------------------------------------------
    def render(
        self,
        request: Request,
        name: str,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        **context: Any,
    ) -> HTMLResponse:
        """A page, with the signed-in session's CSRF token and its messages (shown once)."""
        session = request_session(request)
        flash = []
        if session is not None:
            flash, session.flash = session.flash, []
        html = self.env.get_template(name).render(
            session=session,
            csrf=session.csrf if session else "",
            flash=flash,
            path=request.url.path,
            now=self.clock(),
            **context,
        )
        return HTMLResponse(html, status_code=status, headers=headers)

    def refuse(self, request: Request, status: int, message: str) -> Response:
        """The error page: ``status`` and ``message``."""
        return self.render(request, "error.html", status, message=message, code=status)

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        messages = {
            404: "There is no such page, job or pipeline.",
            405: "That page does not take this method.",
        }
        message = messages.get(exc.status_code, exc.detail)
        return self.render(
            request, "error.html", exc.status_code, exc.headers, message=message, code=exc.status_code
        )

    async def store_error(self, request: Request, exc: Exception) -> Response:
        """A store's refusal or failure: bad input 400 with its message, an unknown job 404, anything else
        (the database down, a key refused) 503, naming only the kind of error."""
        if isinstance(exc, InvalidArgument):
            return self.refuse(request, 400, str(exc))
        if isinstance(exc, JobNotFound):
            return self.refuse(request, 404, "There is no such job.")
        log.warning("jobkit: the dashboard's store failed: %s", type(exc).__name__)
        message = (
            f"The job store is not answering ({type(exc).__name__}): what this page shows or does could "
            "not be done. Try again in a moment."
        )
        return self.refuse(request, 503, message)

    def done(self, session: Session, message: str, back: str) -> Response:
        """After an action: its message for the next page, and back to ``back`` (303)."""
        session.flash.append(message)
        return RedirectResponse(back, status_code=303)

    def action(self, handler: Action) -> Callable[[Request], Awaitable[Response]]:
        """``handler`` behind the CSRF check: the form must carry its session's token (403 if not)."""

        async def endpoint(request: Request) -> Response:
            session = request_session(request)
            form = await read_form(request, ACTION_BODY)
            if session is None or not csrf_ok(session, form.get("csrf")):
                raise HTTPException(
                    403, "This form has expired or did not come from this dashboard: reload the page."
                )
            return await handler(request, session, form)

        return endpoint

    # --- reading ----------------------------------------------------------------------------------------
    async def listed(self, status: JobStatus) -> tuple[list[Job], bool]:
        """The newest ``MAX_LISTED`` jobs in ``status``, and whether there are more."""
        out: list[Job] = []
        while len(out) < MAX_LISTED:
            want = min(MAX_LISTED - len(out), self.store.dialect.max_rows, 1000)
            page = await self.store.list_jobs(
                status=status, limit=want, before=(out[-1].created_at, out[-1].id) if out else None
            )
            out += page
            if len(page) < want:
                return out, False
        more = await self.store.list_jobs(status=status, limit=1, before=(out[-1].created_at, out[-1].id))
        return out, bool(more)

    # --- the public pages -------------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        return PlainTextResponse("ok")

    async def style(self, request: Request) -> Response:
        return Response(self.css, media_type="text/css")

    async def login_page(self, request: Request) -> Response:
        if request_session(request) is not None:
            return RedirectResponse("/", status_code=303)
        return self.render(request, "login.html", error=None)

    async def login(self, request: Request) -> Response:
        address = client_address(request)
        locked = self.auth.locked_until(address)
        if locked is not None:
            wait = max(1, int((locked - self.clock()).total_seconds()) + 1)
            return self.render(
                request,
                "login.html",
                429,
                {"Retry-After": str(wait)},
                error=f"Too many failed sign-ins: try again in {wait} seconds.",
            )
        form = await read_form(request, LOGIN_BODY)
        started = self.auth.log_in(form.get("token", ""), address)
        if started is None:
            return self.render(request, "login.html", 403, error="That token is not right.")
        self.auth.log_out(request.cookies.get(COOKIE))  # a new session, never the one the browser had
        response = RedirectResponse("/", status_code=303)
        set_session_cookie(response, request, started[0])
        return response

    async def logout(self, request: Request, session: Session, form: views.Form) -> Response:
        self.auth.log_out(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        clear_session_cookie(response, request)
        return response

    # --- the pages ----------------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        now = self.clock()
        stats = await self.store.stats()
        table = views.count_table(stats, await self.store.queue_depth())
        minutes = views.minutes(await self.store.activity(now - timedelta(hours=1)), now)
        workers = await self.store.list_workers()
        labels = [m.start.strftime("%H:%M") for m in minutes]
        drawn = None
        if any(m.jobs for m in minutes):
            drawn = {
                "ended": charts.stacked_bars(
                    labels,
                    {o: [m.ended.get(o, 0) for m in minutes] for o in OUTCOMES},
                    OUTCOME_COLOURS,
                    title="Attempts ended per minute, by outcome",
                    width=1200,
                ),
                "wait": charts.mean_max_bars(
                    labels,
                    [m.wait_mean for m in minutes],
                    [m.wait_max for m in minutes],
                    title="Queue wait per minute (seconds)",
                ),
                "run": charts.mean_max_bars(
                    labels,
                    [m.run_mean for m in minutes],
                    [m.run_max for m in minutes],
                    title="Run time per minute (seconds)",
                    colour="#0c8599",
                    max_colour="#a5d8e0",
                ),
            }
        return self.render(
            request,
            "overview.html",
            table=table,
            totals={s: stats.count(s) for s in views.STATUS_ORDER},
            total=stats.count(),
            dead=stats.count(JobStatus.DEAD),
            oldest_runnable=stats.oldest_runnable_seconds,
            charts={k: Markup(v) for k, v in drawn.items()} if drawn else None,  # noqa: S704 (escaped by charts)
            ended=sum(m.jobs for m in minutes),
            workers=workers,
            alive=sum(w.alive for w in workers),
        )

    async def failing(self, request: Request) -> Response:
        dead, more_dead = await self.listed(JobStatus.DEAD)
        retrying, more_retrying = await self.listed(JobStatus.RETRYING)
        groups = views.group_by_error(dead + [j for j in retrying if j.error])
        return self.render(
            request,
            "failing.html",
            groups=groups,
            shown=SHOWN_PER_GROUP,
            dead=len(dead),
            retrying=sum(1 for j in retrying if j.error),
            more=more_dead or more_retrying,
            limit=MAX_LISTED,
        )

    async def running(self, request: Request) -> Response:
        jobs, more = await self.listed(JobStatus.RUNNING)
        return self.render(request, "running.html", jobs=jobs, more=more, limit=MAX_LISTED)

    async def job(self, request: Request) -> Response:
        job_id = _uuid(request.path_params["id"])
        job = await self.store.get(job_id)
        if job is None:
            raise HTTPException(404)
        dependencies = await self.store.list_dependencies(job.id)
        member_of = await self.store.pipeline_of(job.id)
        # a pipeline this job's handler started is named by the job's id
        started = await self.store.pipeline_progress(job.id)
        traceback = await self.store.traceback(job.id)  # the operator's: the dashboard is theirs
        return self.render(
            request,
            "job.html",
            job=job,
            fields=views.job_fields(job),
            dependencies=dependencies,
            member_of=member_of,
            started=started,
            traceback=traceback,
        )

    async def pipeline_lookup(self, request: Request) -> Response:
        given = request.query_params.get("id", "").strip()
        if given:
            try:
                return RedirectResponse(f"/pipelines/{UUID(given)}", status_code=303)
            except ValueError:
                return self.render(
                    request, "pipelines.html", 400, error="That is not a pipeline id (a UUID)."
                )
        return self.render(request, "pipelines.html", error=None)

    async def pipeline(self, request: Request) -> Response:
        pipeline_id = _uuid(request.path_params["id"])
        jobs = await self.store.get_pipeline(pipeline_id)
        progress = await self.store.pipeline_progress(pipeline_id)
        if not jobs or progress is None:
            raise HTTPException(404)
        rows, still_open = views.pipeline_tree(jobs)
        return self.render(request, "pipeline.html", progress=progress, rows=rows, still_open=still_open)

    async def limits_page(
        self,
        request: Request,
        status: int = 200,
        error: str | None = None,
        given: dict[str, str] | None = None,
    ) -> Response:
        """The limits, and the form to set one: filled with what was sent (after an error), or with the
        limits of the type ``?edit=`` names."""
        limits = await self.store.list_limits()
        edit = request.query_params.get("edit")
        if given is None and edit is not None:
            chosen = next((lim for lim in limits if lim.type == edit), None)
            if chosen is not None:
                given = {
                    "type": chosen.type,
                    "max_running": _text(chosen.max_running),
                    "max_starts": _text(chosen.max_starts),
                    "per_seconds": _text(chosen.per.total_seconds() if chosen.per else None),
                    "max_running_per_key": _text(chosen.max_running_per_key),
                }
        return self.render(request, "limits.html", status, limits=limits, error=error, given=given or {})

    async def set_limit(self, request: Request, session: Session, form: views.Form) -> Response:
        async def save() -> str:
            type_, kwargs = views.limit_arguments(form)
            await self.store.set_limit(type_, **kwargs)
            return f"Limits of {type_} set."

        return await self._saved(request, session, form, save, self.limits_page, "/limits")

    async def _saved(
        self,
        request: Request,
        session: Session,
        form: views.Form,
        save: Callable[[], Awaitable[str]],
        page: Callable[[Request, int, str, dict[str, str]], Awaitable[Response]],
        back: str,
    ) -> Response:
        """A form's ``save()`` done, back to ``back`` with what it says; a refused form shown again on its
        ``page`` (400), with the error and what was sent."""
        try:
            message = await save()
        except InvalidArgument as exc:
            return await page(request, 400, str(exc), dict(form))
        return self.done(session, message, back)

    async def delete_limit(self, request: Request, session: Session, form: views.Form) -> Response:
        type_ = form.get("type", "")
        removed = await self.store.delete_limit(type_)
        return self.done(
            session, f"Limits of {type_} removed." if removed else f"{type_} had no limits.", "/limits"
        )

    async def schedules_page(
        self,
        request: Request,
        status: int = 200,
        error: str | None = None,
        given: dict[str, str] | None = None,
    ) -> Response:
        """The schedules, each with its next due time, and the form to set one (filled with what was sent,
        after an error)."""
        now = self.clock()
        listed = []
        for s in await self.store.list_schedules():
            try:
                upcoming: datetime | None = s.next_due(now) if s.enabled else None
            except (InvalidArgument, ValueError):
                upcoming = None
            listed.append((s, upcoming))
        if given is None:
            given = {"payload": "{}", "timezone": "UTC", "misfire": "skip", "enabled": "on"}
        return self.render(request, "schedules.html", status, schedules=listed, error=error, given=given)

    async def set_schedule(self, request: Request, session: Session, form: views.Form) -> Response:
        async def save() -> str:
            stored = await self.store.set_schedule(views.schedule_from(form))
            return f"Schedule {stored.name} saved."

        return await self._saved(request, session, form, save, self.schedules_page, "/schedules")

    async def delete_schedule(self, request: Request, session: Session, form: views.Form) -> Response:
        name = form.get("name", "")
        removed = await self.store.delete_schedule(name)
        return self.done(
            session, f"Schedule {name} removed." if removed else f"No schedule {name}.", "/schedules"
        )

    async def workers(self, request: Request) -> Response:
        return self.render(request, "workers.html", workers=await self.store.list_workers())

    # --- actions --------------------------------------------------------------------------------------------
    async def requeue(self, request: Request, session: Session, form: views.Form) -> Response:
        ids = views.job_ids(form.getlist("only") or form.getlist("id"))
        back = views.back_to(form.get("back"))
        if not ids:
            return self.done(session, "No job was selected.", back)
        try:
            requeued = await self.store.requeue(ids=ids)
        except JobNotFound:
            return self.done(session, "Nothing was requeued: one of those jobs no longer exists.", back)
        left = len(ids) - len(requeued)
        return self.done(
            session,
            f"Requeued {len(requeued)} job(s)."
            + (f" {left} were not dead, and were left as they were." if left else ""),
            back,
        )

    async def cancel(self, request: Request, session: Session, form: views.Form) -> Response:
        ids = views.job_ids(form.getlist("only") or form.getlist("id"))
        back = views.back_to(form.get("back"))
        if not ids:
            return self.done(session, "No job was selected.", back)
        results = await self.store.cancel(ids, reason=REASON)
        cancelled = sum(r.cancelled for r in results)
        left = len(ids) - cancelled
        return self.done(
            session,
            f"Cancelled {cancelled} job(s)."
            + (f" {left} had already finished or were gone." if left else ""),
            back,
        )

    async def cancel_pipeline(self, request: Request, session: Session, form: views.Form) -> Response:
        pipeline_id = _uuid(request.path_params["id"])
        n = await self.store.cancel_pipeline(pipeline_id, reason=REASON)
        return self.done(session, f"Cancelled {n} job(s) of the pipeline.", f"/pipelines/{pipeline_id}")

    def routes(self) -> list[BaseRoute]:
        """Every route: the public ones, the pages (GET) and the actions (POST, behind ``action``)."""
        post = ["POST"]
        return [
            Route("/healthz", self.healthz),
            Route("/static/style.css", self.style),
            Route("/login", self.login_page),
            Route("/login", self.login, methods=post),
            Route("/logout", self.action(self.logout), methods=post),
            Route("/", self.overview),
            Route("/failing", self.failing),
            Route("/running", self.running),
            Route("/jobs/{id}", self.job),
            Route("/pipelines", self.pipeline_lookup),
            Route("/pipelines/{id}", self.pipeline),
            Route("/pipelines/{id}/cancel", self.action(self.cancel_pipeline), methods=post),
            Route("/limits", self.limits_page),
            Route("/limits", self.action(self.set_limit), methods=post),
            Route("/limits/delete", self.action(self.delete_limit), methods=post),
            Route("/schedules", self.schedules_page),
            Route("/schedules", self.action(self.set_schedule), methods=post),
            Route("/schedules/delete", self.action(self.delete_schedule), methods=post),
            Route("/workers", self.workers),
            Route("/actions/requeue", self.action(self.requeue), methods=post),
            Route("/actions/cancel", self.action(self.cancel), methods=post),
        ]


def _uuid(text: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise HTTPException(404) from None


def _text(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def create_app(
    store: AsyncJobStore,
    token: str,
    *,
    allowed_hosts: Iterable[str] = (),
    clock: Callable[[], datetime] | None = None,
) -> Starlette:
    """The dashboard on ``store``, for whoever signs in with ``token`` (at least 16 characters). The app
    closes ``store`` when it stops. It answers requests for the address they arrived on (and loopback
    names, on a loopback address), and for ``allowed_hosts`` (``host`` or ``host:port`` each: its names
    behind a proxy); 421 for any other Host. ``clock``: the current time (timezone-aware; default: UTC
    now)."""
    now = clock or _utcnow
    hosts = Hosts(tuple(parse_allowed(allowed_hosts, "allowed_hosts")))
    auth = Auth(token, now)
    dashboard = Dashboard(store, auth, now)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await store.close()

    return Starlette(
        routes=dashboard.routes(),
        middleware=[Middleware(Guard, auth=auth, refuse=dashboard.refuse, hosts=hosts)],
        exception_handlers={HTTPException: dashboard.http_error, JobkitError: dashboard.store_error},
        lifespan=lifespan,
    )
