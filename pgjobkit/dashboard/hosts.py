"""Which host names the dashboard answers to, and where a state-changing request may come from.

A request is served only when its ``Host`` is the address it arrived on (host and port), a loopback name
with that port when that address is a loopback one (``127.0.0.1``, ``localhost``, ``[::1]``), or a host
the operator allowed. That refuses a DNS-rebinding page: its requests reach the dashboard with its own
name in ``Host``. A browser's ``Origin`` (or ``Referer``) is compared with the same allowed hosts, never
with the request's own ``Host``."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pgjobkit.errors import InvalidArgument

LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "[::1]"})
DEFAULT_PORTS = {"http": 80, "https": 443}
# a Host header, or an allowed host: a name, an IPv4 address or a bracketed IPv6 one, and a port
_HOST = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9._-]{0,251}[a-z0-9])?)(?::([0-9]{1,5}))?")

Address = tuple[str, int | None]  # a host name (lower case, IPv6 in brackets) and its port, if one is named


def parse_host(text: str) -> Address | None:
    """``host`` or ``host:port`` as a ``Host`` header carries it; None when it is not one."""
    match = _HOST.fullmatch(text.strip().lower())
    if match is None:
        return None
    port = int(match.group(2)) if match.group(2) else None
    if port is not None and not 0 < port < 65536:
        return None
    return match.group(1), port


def parse_allowed(entries: Iterable[str], source: str) -> list[Address]:
    """The operator's hosts (``host`` or ``host:port`` each, blanks skipped; one string is split at its
    commas); InvalidArgument naming ``source`` (the option or variable they came from) for one that is
    not a host."""
    out = []
    for entry in entries.split(",") if isinstance(entries, str) else entries:
        if not entry.strip():
            continue
        parsed = parse_host(entry)
        if parsed is None:
            raise InvalidArgument(
                f"jobkit: {source}: {entry.strip()[:80]!r} is not a host: give host or host:port "
                "(no scheme, no path), as the browser's address bar shows it"
            )
        out.append(parsed)
    return out


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True)
class Hosts:
    """The hosts the operator allowed, beside the address each request arrived on. An allowed ``host``
    without a port is that name at the scheme's default port (behind a proxy) or at the dashboard's own;
    ``host:port`` is that port alone."""

    extra: tuple[Address, ...] = ()

    def allows(self, host: str | None, scheme: str, server: Any) -> bool:
        """Whether ``host`` (``host[:port]``, as in ``Host`` or an origin) names this dashboard, for a
        request over ``scheme`` that arrived on ``server`` (the ASGI scope's ``(host, port)``; a port of
        None is the scheme's default)."""
        parsed = parse_host(host) if host is not None else None
        if parsed is None:
            return False
        default = DEFAULT_PORTS.get(scheme)
        name, port = parsed
        port = default if port is None else port
        own_port: int | None = None
        if isinstance(server, list | tuple) and len(server) == 2 and server[0]:
            own_port = server[1] if isinstance(server[1], int) else default  # None: no port named
            own = _bracketed(str(server[0]).lower())
            names = LOOPBACK_NAMES | {own} if _is_loopback(own) else {own}
            if name in names and port == own_port:
                return True
        for allowed, allowed_port in self.extra:
            if name == allowed and port in ((default, own_port) if allowed_port is None else (allowed_port,)):
                return True
        return False

    def allows_origin(self, origin: str, scheme: str, server: Any) -> bool:
        """Whether ``origin`` (an ``Origin``, or a ``Referer``'s URL) is this dashboard's: the request's
        scheme, and an allowed host."""
        try:
            parts = urlsplit(origin)
        except ValueError:
            return False
        if parts.scheme.lower() != scheme or parts.username is not None or parts.password is not None:
            return False
        return self.allows(parts.netloc, scheme, server)
