"""Who may use the dashboard: one operator token, server-side sessions, a login rate limit per client
address, and the checks every request passes (an allowed Host; for a state-changing one, same origin and
the session's CSRF token)."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from starlette.datastructures import MutableHeaders
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgjobkit.dashboard.hosts import Hosts
from pgjobkit.errors import InvalidArgument

log = logging.getLogger("pgjobkit.dashboard")

COOKIE = "jobkit_session"
MIN_TOKEN_LENGTH = 16
SESSION_LIFETIME = timedelta(hours=12)
MAX_SESSIONS = 1000  # past this, a login ends the oldest session
FAILURE_WINDOW = timedelta(minutes=1)
# Failed sign-ins within FAILURE_WINDOW, from one client address (an IPv6 /64 counts as one), that lock
# that address until the window has passed. Locking one address, not every sign-in, is what keeps an
# anonymous client from locking the operator out.
MAX_FAILURES_PER_ADDRESS = 10
# Failed sign-ins from all addresses within FAILURE_WINDOW that lock every address but the ones that
# signed in lately: the ceiling on guessing from many addresses (5 a second), 30 addresses' worth.
MAX_FAILURES = 300
MAX_ADDRESSES = 4096  # addresses whose failures are kept (the least recent one is forgotten past it)
MAX_TRUSTED = 256  # addresses that signed in within SESSION_LIFETIME, exempt from the global ceiling
MAX_ADDRESS_TEXT = 100  # characters of an address kept as a key (a name given by a proxy, say)
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
WRONG_HOST = (  # the answer to a request for a host the dashboard does not serve: no page, no data
    "421 Misdirected Request: this dashboard does not answer to that host name. Its operator can allow "
    "it with --allowed-host or JOBKIT_DASHBOARD_ALLOWED_HOSTS.\n"
)


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


def client_address(request: Request) -> str:
    """Who a sign-in is counted against: the client's IP address (IPv4, an IPv4-mapped IPv6 address as
    its IPv4 one), or its IPv6 /64 (one host's, or one site's, any number of addresses); what the server
    gave otherwise, cut short ('' when it gave none). Behind a proxy this is the proxy's address unless
    the server takes the client's from X-Forwarded-For (uvicorn does from 127.0.0.1)."""
    host = request.client.host if request.client is not None else ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host[:MAX_ADDRESS_TEXT]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


def _oldest(times: deque[datetime], limit: int) -> datetime | None:
    """When the sign-ins ``times`` holds (at most ``limit``, newest last) lock until, or None."""
    if len(times) < limit:
        return None
    return times[0] + FAILURE_WINDOW


class Lockout:
    """Failed sign-ins within FAILURE_WINDOW, per client address and in all, in bounded memory: the
    failures of at most MAX_ADDRESSES addresses (the least recent forgotten first), each at most
    MAX_FAILURES_PER_ADDRESS, and MAX_FAILURES in all; and the addresses that signed in lately."""

    def __init__(self, clock: Callable[[], datetime]) -> None:
        self._clock = clock
        self._all: deque[datetime] = deque(maxlen=MAX_FAILURES)
        self._by_address: OrderedDict[str, deque[datetime]] = OrderedDict()  # least recent failure first
        self._trusted: OrderedDict[str, datetime] = OrderedDict()  # when each signed in, oldest first

    def __len__(self) -> int:
        """How many addresses have failures kept."""
        return len(self._by_address)

    def _forget_old(self, now: datetime) -> None:
        since = now - FAILURE_WINDOW
        while self._by_address:
            address, times = next(iter(self._by_address.items()))
            if times[-1] > since:
                break
            del self._by_address[address]
        while self._trusted and next(iter(self._trusted.values())) <= now - SESSION_LIFETIME:
            self._trusted.popitem(last=False)

    def locked_until(self, address: str) -> datetime | None:
        """When ``address`` may try again: after its own failures, or (unless it signed in lately) after
        everyone's; None when it may now."""
        now = self._clock()
        self._forget_old(now)
        times = self._by_address.get(address)
        ends = [_oldest(times, MAX_FAILURES_PER_ADDRESS) if times else None]
        if address not in self._trusted:
            ends.append(_oldest(self._all, MAX_FAILURES))
        return max((end for end in ends if end is not None and end > now), default=None)

    def failed(self, address: str) -> None:
        """Count a failed sign-in from ``address``."""
        now = self._clock()
        times = self._by_address.pop(address, None) or deque(maxlen=MAX_FAILURES_PER_ADDRESS)
        times.append(now)
        self._by_address[address] = times
        while len(self._by_address) > MAX_ADDRESSES:
            self._by_address.popitem(last=False)
        self._all.append(now)
        if len(times) == MAX_FAILURES_PER_ADDRESS and times[0] > now - FAILURE_WINDOW:
            log.warning(
                "jobkit: %d failed dashboard sign-ins from %s within a minute: it waits",
                MAX_FAILURES_PER_ADDRESS,
                address or "an unknown address",
            )
        if len(self._all) == MAX_FAILURES and self._all[0] > now - FAILURE_WINDOW:
            log.warning(
                "jobkit: %d failed dashboard sign-ins within a minute: only addresses that signed in "
                "lately may try for now",
                MAX_FAILURES,
            )

    def signed_in(self, address: str) -> None:
        """Remember that ``address`` signed in (the global ceiling then spares it)."""
        self._trusted.pop(address, None)
        self._trusted[address] = self._clock()
        while len(self._trusted) > MAX_TRUSTED:
            self._trusted.popitem(last=False)


class Auth:
    """The dashboard's token, its sessions (in memory: a restart signs everyone out) and its sign-in
    rate limit, on ``clock`` (timezone-aware now)."""

    def __init__(self, token: str, clock: Callable[[], datetime]) -> None:
        if len(token) < MIN_TOKEN_LENGTH:
            raise InvalidArgument(
                f"jobkit: the dashboard's token must be at least {MIN_TOKEN_LENGTH} characters"
            )
        self._token = token
        self._clock = clock
        self._sessions: dict[bytes, Session] = {}  # by the SHA-256 of the cookie's value
        self.lockout = Lockout(clock)

    def locked_until(self, address: str) -> datetime | None:
        """When sign-ins from ``address`` are let through again, while too many failed within the last
        minute (see Lockout); else None."""
        return self.lockout.locked_until(address)

    def log_in(self, given: str, address: str) -> tuple[str, Session] | None:
        """A new session (its cookie value, and it) when ``given`` is the token; None, counted as a
        failure of ``address``, when it is not. The caller checks ``locked_until`` first."""
        if not same_token(given, self._token):
            self.lockout.failed(address)
            return None
        self.lockout.signed_in(address)
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


def same_origin(request: Request, hosts: Hosts) -> bool:
    """Whether a state-changing request may come from where it says it does. A browser's
    ``Sec-Fetch-Site``, when sent, must be ``same-origin`` (same-site is refused too: a sibling subdomain
    is another site's code). Its ``Origin``, when sent, must be the dashboard's scheme and one of
    ``hosts`` (never compared with the request's own ``Host``, which a DNS-rebinding page sets), or
    ``null`` vouched for by ``Sec-Fetch-Site: same-origin``: under this dashboard's own
    ``Referrer-Policy: no-referrer`` a browser sends ``null`` for its own forms. Without an ``Origin``,
    a ``Referer`` is held to the same. A client that sends none is no browser a page could drive; the
    CSRF token still guards it."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ALLOWED_FETCH_SITES:
        return False
    scheme, server = request.url.scheme, request.scope.get("server")
    origin = request.headers.get("origin")
    if origin is None:
        referer = request.headers.get("referer")
        return referer is None or hosts.allows_origin(referer, scheme, server)
    if origin == "null":
        return site in ALLOWED_FETCH_SITES
    return hosts.allows_origin(origin, scheme, server)


def csrf_ok(session: Session, given: str | None) -> bool:
    """Whether a form carried its session's CSRF token."""
    return given is not None and same_token(given, session.csrf)


def request_session(request: Request) -> Session | None:
    """The session ``Guard`` found for this request (None on the public pages when signed out)."""
    session: Session | None = request.scope.get(SESSION_KEY)
    return session


class Guard:
    """The middleware every request passes first: it puts ``HEADERS`` on every response; refuses a
    request for a host not in ``hosts`` (421, plain text, before anything else); refuses a
    state-changing request from another origin (403); sends a request without a live session to /login
    (GET, HEAD) or refuses it (403), except on ``PUBLIC_PATHS``; and answers an unexpected error with a
    plain 500 page, never a traceback. ``refuse`` draws the refusals."""

    def __init__(self, app: ASGIApp, auth: Auth, refuse: Refuse, hosts: Hosts) -> None:
        self.app, self.auth, self.refuse, self.hosts = app, auth, refuse, hosts

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
        named = request.headers.getlist("host")  # one Host, or none served
        if len(named) != 1 or not self.hosts.allows(named[0], request.url.scheme, scope.get("server")):
            await PlainTextResponse(WRONG_HOST, 421)(scope, receive, send_guarded)
            return
        session = self.auth.session(request.cookies.get(COOKIE))
        scope[SESSION_KEY] = session
        try:
            if request.method not in SAFE_METHODS and not same_origin(request, self.hosts):
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
        except ClientDisconnect:
            return  # the client went away (or the server closed it) while sending its form: no one to answer
        except Exception:
            log.exception("jobkit: the dashboard failed on %s %s", request.method, request.url.path)
            if started:
                raise
            await Response("Internal error: see the dashboard's log.", 500, media_type="text/plain")(
                scope, receive, send_guarded
            )
