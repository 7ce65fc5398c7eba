"""Secrets out of text (pgjobkit.redact), and how a failed first connection is told: a configuration error
or a network fault (pgjobkit.pgconnect)."""

from __future__ import annotations

import logging

import psycopg
import pytest

from pgjobkit.errors import ConfigurationError, JobkitError, TransientError
from pgjobkit.pgconnect import failure
from pgjobkit.redact import RedactingFilter, conninfo_secrets, redact

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize(
    "text",
    [
        f'in URI: "postgresql://app:{SECRET}@[::1:5432/x"',
        f"postgres://app:{SECRET}@db.example.com:6543/postgres?sslmode=require",
        f"postgresql://app:p@ss{SECRET}@host/db",  # an unencoded @ in the password
        f"postgresql://:{SECRET}@host/db",  # no user name
        f"postgresql://app@host/db?sslmode=require&password={SECRET}",
        f"host=h password={SECRET} dbname=x",
        f"host=h password = '{SECRET} with spaces' dbname=x",
        f"host=h password='{SECRET}",  # quoted, never closed
        f"PASSWORD={SECRET}",
        f"key sb_secret_{SECRET} refused",
        f"wss://x.supabase.co/realtime/v1/websocket?apikey={SECRET}&vsn=1.0.0",
        f"Authorization: Bearer {SECRET}.x.y",
        "token eyJhbGciOiJIUzI1NiJ9.eyJyb2xlIjoic2VydmljZV9yb2xlIn0.s3cr3t-Pa55_sig",
    ],
)
def test_every_shape_of_secret_is_masked(text: str) -> None:
    cleaned = redact(text)
    assert SECRET not in cleaned and "***" in cleaned
    assert SECRET not in str(JobkitError(text))  # every jobkit error passes its message through


def test_text_without_secrets_is_left_as_it_is() -> None:
    for text in (
        "postgresql://app@127.0.0.1:5432/postgres",
        "postgresql://127.0.0.1:5432/postgres",
        'connection to server at "127.0.0.1", port 1 failed: Connection refused',
        "write to ops@example.com",
        "a job of type embed failed: KeyError 'x'",
    ):
        assert redact(text) == text


def test_a_known_secret_is_masked_wherever_it_appears_encoded_or_not() -> None:
    secret = "p@ss w/rd!"
    text = "got 'p@ss w/rd!' then 'p%40ss%20w%2Frd%21'"
    assert redact(text, [secret]) == "got '***' then '***'"
    assert redact("a b a", ["a"]) == "a b a"  # too short to replace word for word


@pytest.mark.parametrize(
    ("conninfo", "secret"),
    [
        (f"postgresql://app:{SECRET}@[::1:5432/x", SECRET),  # malformed: found without libpq
        (f"postgresql://app:p@ss{SECRET}@host/db", f"p@ss{SECRET}"),
        (f"host=h password='{SECRET} x' port=1", f"{SECRET} x"),
        (f"postgresql://h/db?password={SECRET}&x=1", SECRET),
    ],
)
def test_the_password_of_a_conninfo_is_found(conninfo: str, secret: str) -> None:
    assert secret in conninfo_secrets(conninfo)


def test_the_filter_masks_a_record_and_its_traceback() -> None:
    try:
        raise ValueError(f"postgresql://app:{SECRET}@h/x")
    except ValueError as exc:
        record = logging.LogRecord("psycopg.pool", logging.WARNING, __file__, 1, "error: %s", (exc,), None)
        record.exc_info = (type(exc), exc, exc.__traceback__)
    assert RedactingFilter().filter(record)
    formatted = logging.Formatter().format(record)
    assert SECRET not in formatted and "postgresql://app:***@h/x" in formatted


def _failed(message: str) -> ConfigurationError | str:
    return failure(psycopg.OperationalError(message), f"postgresql://app:{SECRET}@h/x", "JOBKIT_DATABASE_URL")


@pytest.mark.parametrize(
    ("server_said", "code"),
    [
        ('FATAL:  database "x" does not exist', "3D000"),
        ('FATAL:  password authentication failed for user "app"', "28P01"),
        ("fe_sendauth: no password supplied", "28P01"),
        ('FATAL:  role "app" does not exist', "28000"),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.1", user "app", database "x", SSL off', "28000"),
        ('FATAL:  unrecognized configuration parameter "nosuch"', "42704"),
        ('FATAL:  invalid value for parameter "statement_timeout": "abc"', "22023"),
        ("server does not support SSL, but SSL was required", "08P01"),
    ],
)
def test_a_refusal_is_a_configuration_error_naming_the_setting(server_said: str, code: str) -> None:
    error = _failed(f'connection failed: connection to server at "h", port 5432 failed: {server_said}')
    assert isinstance(error, ConfigurationError) and error.code == code
    assert "JOBKIT_DATABASE_URL" in str(error) and "\n" not in str(error)


@pytest.mark.parametrize(
    "cause",
    [
        'connection failed: connection to server at "h", port 1 failed: Connection refused\n\tIs the server '
        "running on that host and accepting TCP/IP connections?",
        'connection failed: connection to server at "h", port 5432 failed: timeout expired',
        "failed to resolve host 'h': [Errno -2] Name or service not known",
        'connection failed: connection to server at "h", port 5432 failed: FATAL:  the database system is '
        "starting up",
        'connection failed: connection to server at "h", port 5432 failed: FATAL:  sorry, too many clients '
        "already",
        'connection failed: connection to server at "h", port 5432 failed: FATAL:  la base de données n\'existe pas',
    ],
)
def test_a_network_fault_or_words_not_known_are_waited_out(cause: str) -> None:
    reason = _failed(cause)
    assert isinstance(reason, str) and "\n" not in reason


def test_options_libpq_refuses_before_connecting_are_a_configuration_error() -> None:
    error = _failed('connection is bad: invalid sslmode value: "bogus"')
    assert isinstance(error, ConfigurationError) and "fix it in the URL" in str(error)
    assert not isinstance(error, TransientError)
