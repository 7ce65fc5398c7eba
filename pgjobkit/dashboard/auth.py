"""Who may use the dashboard: one operator token, server-side sessions, a login rate limit, and the checks
every state-changing request passes (same origin, and the session's CSRF token)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgjobkit.errors import InvalidArgument

log = logging.getLogger("pgjobkit.dashboard")

COOKIE = "jobkit_session"
MIN_TOKEN_LENGTH = 16
SESSION_LIFETIME = timedelta(hours=12)
MAX_SESSIONS = 1000  # past this, a login ends the oldest session
MAX_FAILURES = 10  # failed logins, from anywhere, within FAILURE_WINDOW; then every login waits
FAILURE_WINDOW = timedelta(minutes=1)
# what a browser may say of where a state-changing request comes from (absent: not a browser)
ALLOWED_FETCH_SITES = frozenset({"same-origin"})
PUBLIC_PATHS = frozenset({"/login", "/healthz", "/static/style.css"})
SAFE_METHODS = frozenset({"GET", "HEAD"})
SESSION_KEY = "jobkit.session"  # where the request's session (or None) sits in its ASGI scope
HEADERS = {  # on every response
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
Refuse = Callable[[Request, int, str], Response]  # a page saying why a request was refused


@dataclass
class Session:
    """One signed-in browser: its CSRF token, when it ends, and messages for its next page."""

    csrf: str
    expires: datetime
    flash: list[str] = field(default_factory=list)


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def same_token(given: str, expected: str) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time (any text, ASCII or not)."""
    return hmac.compare_digest(
        given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
    )


class Auth:
    """The dashboard's token, its sessions (in memory: a restart signs everyone out) and its login rate
    limit, on ``clock`` (timezone-aware now)."""

    def __init__(self, token: str, clock: Callable[[], datetime]) -> None:
        if len(token) < MIN_TOKEN_LENGTH:
            raise InvalidArgument(
                f"jobkit: the dashboard's token must be at least {MIN_TOKEN_LENGTH} characters"
            )
        self._token = token
        self._clock = clock
        self._sessions: dict[bytes, Session] = {}  # by the SHA-256 of the cookie's value
        self._failures: deque[datetime] = deque()

    def locked_until(self) -> datetime | None:
        """When logins are let through again, while too many failed within the last minute; else None."""
        now = self._clock()
        while self._failures and self._failures[0] <= now - FAILURE_WINDOW:
            self._failures.popleft()
        if len(self._failures) >= MAX_FAILURES:
            return self._failures[-MAX_FAILURES] + FAILURE_WINDOW
        return None

    def log_in(self, given: str) -> tuple[str, Session] | None:
        """A new session (its cookie value, and it) when ``given`` is the token; None, counted as a
        failure, when it is not. The caller checks ``locked_until`` first."""
        if not same_token(given, self._token):
            self._failures.append(self._clock())
            return None
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if s.expires <= now]:
            del self._sessions[key]
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        cookie = secrets.token_urlsafe(32)
        session = Session(csrf=secrets.token_urlsafe(32), expires=now + SESSION_LIFETIME)
        self._sessions[_digest(cookie)] = session
        return cookie, session

    def session(self, cookie: str | None) -> Session | None:
        """The live session a cookie's value names, or None."""
        if not cookie:
            return None
        key = _digest(cookie)
        session = self._sessions.get(key)
        if session is not None and session.expires <= self._clock():
            del self._sessions[key]
            return None
        return session

    def log_out(self, cookie: str | None) -> None:
        """End the session a cookie's value names (if any)."""
        if cookie:
            self._sessions.pop(_digest(cookie), None)


def set_session_cookie(response: Response, request: Request, cookie: str) -> None:
    """Give the browser its session: HttpOnly, SameSite=Strict, for the whole site, Secure over https."""
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(SESSION_LIFETIME.total_seconds()),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_session_cookie(response: Response, request: Request) -> None:
    """Tell the browser to forget its session."""
    response.delete_cookie(
        COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )


def same_origin(request: Request) -> bool:
    """Whether a state-changing request may come from where it says it does. A browser's
    ``Sec-Fetch-Site``, when sent, must be ``same-origin`` (same-site is refused too: a sibling subdomain
    is another site's code). Its ``Origin``, when sent, must be the dashboard's own scheme://host:port,
    or ``null`` vouched for by ``Sec-Fetch-Site: same-origin``: under this dashboard's own
    ``Referrer-Policy: no-referrer`` a browser sends ``null`` for its own forms. A client that sends
    neither is no browser a page could drive; the CSRF token still guards it."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ALLOWED_FETCH_SITES:
        return False
    origin = request.headers.get("origin")
    if origin is None or origin == f"{request.url.scheme}://{request.url.netloc}":
        return True
    return origin == "null" and site in ALLOWED_FETCH_SITES


def csrf_ok(session: Session, given: str | None) -> bool:
    """Whether a form carried its session's CSRF token."""
    return given is not None and same_token(given, session.csrf)


def request_session(request: Request) -> Session | None:
    """The session ``Guard`` found for this request (None on the public pages when signed out)."""
    session: Session | None = request.scope.get(SESSION_KEY)
    return session


class Guard:
    """The middleware every request passes first: it puts ``HEADERS`` on every response; refuses a
    state-changing request from another origin (403); sends a request without a live session to /login
    (GET, HEAD) or refuses it (403), except on ``PUBLIC_PATHS``; and answers an unexpected error with a
    plain 500 page, never a traceback. ``refuse`` draws the refusals."""

    def __init__(self, app: ASGIApp, auth: Auth, refuse: Refuse) -> None:
        self.app, self.auth, self.refuse = app, auth, refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_guarded(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS.items():
                    headers[name] = value
            await send(message)

        request = Request(scope)
        session = self.auth.session(request.cookies.get(COOKIE))
        scope[SESSION_KEY] = session
        try:
            if request.method not in SAFE_METHODS and not same_origin(request):
                response = self.refuse(
                    request, 403, "This request came from another site, so it was refused."
                )
            elif session is None and request.url.path not in PUBLIC_PATHS:
                if request.method in SAFE_METHODS:
                    response = RedirectResponse("/login", status_code=303)
                else:
                    response = self.refuse(request, 403, "You are not signed in (or your session has ended).")
            else:
                await self.app(scope, receive, send_guarded)
                return
            await response(scope, receive, send_guarded)
        except Exception:
            log.exception("jobkit: the dashboard failed on %s %s", request.method, request.url.path)
            if started:
                raise
            await Response("Internal error: see the dashboard's log.", 500, media_type="text/plain")(
                scope, receive, send_guarded
            )
