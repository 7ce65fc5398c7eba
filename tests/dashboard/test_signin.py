"""Who reaches the dashboard, in process: the sign-in lockout is per client address (bounded, with a
global ceiling that spares who signed in), a request for a host the dashboard does not serve is refused
before anything else, and a browser's origin is held to the allowed hosts, never to its own Host."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgjobkit.cli import main
from pgjobkit.cli.dashboard import hosts_from
from pgjobkit.dashboard.auth import (
    HEADERS,
    MAX_ADDRESSES,
    MAX_FAILURES,
    MAX_FAILURES_PER_ADDRESS,
    WRONG_HOST,
    Lockout,
)
from pgjobkit.dashboard.hosts import Hosts, parse_allowed, parse_host
from pgjobkit.errors import InvalidArgument
from pgjobkit.settings import Settings
from pgjobkit.stores.memory import MemoryStore
from tests.dashboard.conftest import ORIGIN, TOKEN, Clock, Dash
from tests.dashboard.test_app import dead, status

ATTACKER, OPERATOR = "203.0.113.7", "198.51.100.2"


# --- the lockout ----------------------------------------------------------------------------------------
def test_failed_sign_ins_lock_their_own_address_and_never_the_operators(memory_dash: Dash) -> None:
    attacker, operator = memory_dash.client(ATTACKER), memory_dash.client(OPERATOR)
    for _ in range(MAX_FAILURES_PER_ADDRESS):
        assert memory_dash.post("/login", {"token": "wrong"}, via=attacker).status_code == 403
    locked = memory_dash.post("/login", {"token": TOKEN}, via=attacker)  # even the right token waits
    assert locked.status_code == 429 and "set-cookie" not in locked.headers
    assert 1 <= int(locked.headers["retry-after"]) <= 61
    signed_in = memory_dash.post("/login", {"token": TOKEN}, via=operator)
    assert (signed_in.status_code, signed_in.headers["location"]) == (303, "/")
    assert memory_dash.get("/", via=operator).status_code == 200
    assert memory_dash.post("/login", {"token": "wrong"}, via=operator).status_code == 403  # not locked
    memory_dash.clock.advance(timedelta(seconds=61))
    assert memory_dash.post("/login", {"token": TOKEN}, via=attacker).status_code == 303


def test_an_ipv6_client_counts_as_its_64_and_a_mapped_ipv4_one_as_its_ipv4(memory_dash: Dash) -> None:
    for i in range(MAX_FAILURES_PER_ADDRESS):
        memory_dash.post("/login", {"token": "wrong"}, via=memory_dash.client(f"2001:db8:1:2::{i + 1:x}"))
    same_64 = memory_dash.client("2001:db8:1:2:ffff:ffff:ffff:ffff")
    assert memory_dash.post("/login", {"token": TOKEN}, via=same_64).status_code == 429
    next_64 = memory_dash.client("2001:db8:1:3::1")
    assert memory_dash.post("/login", {"token": TOKEN}, via=next_64).status_code == 303
    for _ in range(MAX_FAILURES_PER_ADDRESS):
        memory_dash.post("/login", {"token": "wrong"}, via=memory_dash.client("::ffff:" + ATTACKER))
    assert memory_dash.post("/login", {"token": TOKEN}, via=memory_dash.client(ATTACKER)).status_code == 429


def test_the_lockout_keeps_a_bounded_table_and_a_ceiling_that_spares_who_signed_in() -> None:
    clock = Clock()
    lockout = Lockout(clock)
    lockout.signed_in(OPERATOR)
    for i in range(MAX_FAILURES - 1):  # an attacker rotating addresses, each failing once
        lockout.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert lockout.locked_until("192.0.2.1") is None
    lockout.failed("192.0.2.1")
    assert lockout.locked_until("192.0.2.2") is not None  # the ceiling: a new address waits
    assert lockout.locked_until(OPERATOR) is None  # but not who signed in lately
    for i in range(MAX_ADDRESSES + 500):
        lockout.failed(f"172.16.{i // 256}.{i % 256}")
    assert len(lockout) == MAX_ADDRESSES  # the least recent forgotten
    clock.advance(timedelta(seconds=61))
    assert lockout.locked_until("192.0.2.2") is None
    assert len(lockout) == 0  # a minute on, nothing is kept
    clock.advance(timedelta(hours=12, seconds=1))  # a session's lifetime on, the operator is one of many
    for i in range(MAX_FAILURES):
        lockout.failed(f"10.1.{i // 256}.{i % 256}")
    assert lockout.locked_until(OPERATOR) is not None


# --- the Host header --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "host", ["evil.test", "evil.test:80", "testserver:8080", "testserver.", "", "user@testserver", "a b"]
)
def test_a_request_for_another_host_is_a_421_with_no_page(memory_dash: Dash, host: str) -> None:
    dead(memory_dash.store, "secret-type")
    memory_dash.login()
    for method, path in [("GET", "/"), ("GET", "/login"), ("GET", "/healthz"), ("GET", "/static/style.css")]:
        response = memory_dash.request(method, path, headers={"Host": host})
        assert response.status_code == 421, (host, path)
        assert response.text == WRONG_HOST and response.headers["content-type"].startswith("text/plain")
        assert all(response.headers[name] == value for name, value in HEADERS.items())
        assert "set-cookie" not in response.headers
    assert memory_dash.get("/", headers={"Host": "TestServer"}).status_code == 200  # names ignore case


def test_a_dns_rebinding_page_cannot_sign_in_or_drive_the_lockout(memory_dash: Dash) -> None:
    """A page at evil.test whose name now resolves to 127.0.0.1: the browser calls it same-origin, and
    sends its own name as Host and Origin."""
    rebound = {"Host": "evil.test:8765", "Origin": "http://evil.test:8765", "Sec-Fetch-Site": "same-origin"}
    for _ in range(3 * MAX_FAILURES_PER_ADDRESS):
        refused = memory_dash.post("/login", {"token": "wrong"}, headers=rebound)
        assert refused.status_code == 421 and "token" not in refused.text
    assert memory_dash.post("/login", {"token": TOKEN}, headers=rebound).status_code == 421
    memory_dash.login()  # the operator, from the same machine, is not locked out
    assert memory_dash.get("/", headers=rebound).status_code == 421


def test_the_origin_is_held_to_the_allowed_hosts_never_to_the_requests_host() -> None:
    memory = MemoryStore()
    dash = Dash(memory, memory.as_async(), allowed_hosts=["dash.example.com", "other.example.com:8443"])
    try:
        assert dash.get("/login", headers={"Host": "dash.example.com"}).status_code == 200
        assert dash.get("/login", headers={"Host": "other.example.com:8443"}).status_code == 200
        assert dash.get("/login", headers={"Host": "other.example.com"}).status_code == 421
        csrf = dash.login()
        job_id = dead(memory)
        for origin, expected in [
            ("http://evil.test", 403),
            ("http://dash.example.com:9000", 403),  # another port is another origin
            ("https://dash.example.com", 403),  # and another scheme
            ("http://user@dash.example.com", 403),
            ("http://dash.example.com", 303),  # an allowed host, whatever the request's own Host
        ]:
            response = dash.post(
                "/actions/requeue", {"csrf": csrf, "id": str(job_id)}, headers={"Origin": origin}
            )
            assert response.status_code == expected, origin
        assert status(memory, job_id).value == "queued"
        requeue = {"csrf": csrf, "id": str(dead(memory, "t2"))}
        assert (
            dash.post("/actions/requeue", requeue, headers={"Referer": "http://evil.test/x"}).status_code
            == 403
        )
        assert (
            dash.post("/actions/requeue", requeue, headers={"Referer": f"{ORIGIN}/failing"}).status_code
            == 303
        )
    finally:
        dash.close()


def test_the_allowed_hosts_and_the_address_a_request_arrived_on() -> None:
    local, lan = ("127.0.0.1", 8765), ("10.0.0.5", 8765)
    plain = Hosts()
    for host in ("127.0.0.1:8765", "localhost:8765", "LOCALHOST:8765", "[::1]:8765"):
        assert plain.allows(host, "http", local), host
    for refused in ("127.0.0.1", "localhost:8766", "evil.test:8765", "127.0.0.1:8765/x", "[::1]", None):
        assert not plain.allows(refused, "http", local), refused
    assert plain.allows("10.0.0.5:8765", "http", lan) and not plain.allows("localhost:8765", "http", lan)
    assert plain.allows("[::1]:8765", "http", ("::1", 8765)) and plain.allows(
        "localhost:8765", "http", ("::1", 8765)
    )
    assert not plain.allows("127.0.0.1:8765", "http", None)  # a unix socket: only the operator's hosts
    named = Hosts(tuple(parse_allowed("dash.example.com, other.example.com:8443", "X")))
    assert named.allows("dash.example.com", "https", lan)  # its scheme's port, behind a proxy
    assert named.allows("dash.example.com:8765", "http", lan)  # or the dashboard's own
    assert named.allows("dash.example.com:80", "http", lan)
    assert not named.allows("dash.example.com:9000", "http", lan)
    assert named.allows("other.example.com:8443", "https", lan) and not named.allows(
        "other.example.com", "https", lan
    )
    assert named.allows_origin("https://dash.example.com", "https", lan)
    assert not named.allows_origin("http://dash.example.com", "https", lan)
    assert not named.allows_origin("http://[bad", "http", lan)
    assert parse_host(" Dash.Example.COM:443 ") == ("dash.example.com", 443)
    for bad in ("http://x", "x/y", "*", "x:0", "x:99999", "[::1", "a b", "x:", "-x", "x.", "@x"):
        assert parse_host(bad) is None, bad
        with pytest.raises(InvalidArgument, match=r"SOURCE: .* is not a host: give host or host:port"):
            parse_allowed(["ok.example", bad], "SOURCE")


# --- pgjobkit dashboard's hosts ------------------------------------------------------------------------------
def test_the_command_takes_its_hosts_from_the_setting_the_option_and_its_host_name() -> None:
    settings = Settings.load(None, dashboard_allowed_hosts=" a.example, b.example:8443 ,")
    assert hosts_from(settings, ("c.example",), "127.0.0.1") == ["a.example", "b.example:8443", "c.example"]
    assert hosts_from(Settings.load(None), (), "dash.lan") == ["dash.lan"]
    assert hosts_from(Settings.load(None), (), "::") == []


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--allowed-host", "https://dash.example.com"], {}, "--allowed-host: 'https://dash.example.com'"),
        (
            [],
            {"JOBKIT_DASHBOARD_ALLOWED_HOSTS": "ok.example,bad/path"},
            "JOBKIT_DASHBOARD_ALLOWED_HOSTS: 'bad/path'",
        ),
    ],
)
def test_the_command_refuses_a_host_that_is_not_one_naming_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], named: str
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("JOBKIT_DASHBOARD_ALLOWED_HOSTS", "JOBKIT_DASHBOARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(main, ["dashboard", *args], env=env)
    assert result.exit_code == 2, result.output
    assert named in result.output and "is not a host: give host or host:port" in result.output
    assert "Traceback" not in result.output
