"""Secrets out of text, in one place: the password of a PostgreSQL URL or conninfo, Supabase secret keys and
JWTs. Every jobkit error passes its message here (``JobkitError``), and the loggers that repeat a driver's
words go through ``RedactingFilter``: libpq quotes a malformed URL whole, password and all."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote

MASK = "***"
# The password of a URL's userinfo: after ``scheme://user:``, up to the token's last ``@`` (a hostile
# password may hold an unencoded ``@``; hiding too much is the safe side).
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.\-]*://[^\s:/?#@\"'<>]*:)[^\s\"'<>]*(?=@)", re.IGNORECASE)
# ``password=...`` in a conninfo string or a URL's query; quoted ('s3 cr3t', terminated or not) or bare.
_KEYWORD = re.compile(
    r"(\b(?:password|passwd|apikey|api_key|access_token|refresh_token|secret)\s*=\s*)"
    r"(?:'(?:[^'\\]|\\.)*(?:'|$)|[^\s&'\",;)]+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(\bbearer\s+)[A-Za-z0-9._~+/=\-]+", re.IGNORECASE)
_SB_SECRET = re.compile(r"\bsb_secret_[A-Za-z0-9_\-]+")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]*")
_TRIGGERS = ("://", "password", "passwd", "apikey", "api_key", "_token", "secret", "bearer", "eyj")
_MIN_LITERAL = 4  # a shorter known secret is not replaced word for word (it would garble the text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every password, secret key and JWT it holds masked; ``secrets`` are known values
    (a store's own password) masked wherever they appear, percent-encoded or not."""
    known = [s for s in secrets if s and len(s) >= _MIN_LITERAL]
    lowered = text.lower()
    if not known and not any(t in lowered for t in _TRIGGERS):
        return text  # the common case: nothing that could be a secret
    for secret in known:
        for form in {secret, quote(secret, safe=""), unquote(secret)}:
            if len(form) >= _MIN_LITERAL:
                text = text.replace(form, MASK)
    text = _URL_PASSWORD.sub(rf"\1{MASK}", text)
    text = _KEYWORD.sub(rf"\1{MASK}", text)
    text = _BEARER.sub(rf"\1{MASK}", text)
    text = _SB_SECRET.sub(f"sb_secret_{MASK}", text)
    return _JWT.sub(MASK, text)


def conninfo_secrets(conninfo: str) -> list[str]:
    """The password(s) a conninfo string or URL carries, found without parsing it as libpq would (it may
    be malformed): the userinfo's, and any ``password=`` value."""
    found: list[str] = []
    url = re.match(r"\s*[a-z][a-z0-9+.\-]*://[^:/?#@]*:(.*)@", conninfo, re.IGNORECASE | re.DOTALL)
    if url:
        found.append(url.group(1))
    for match in re.finditer(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s&]+)", conninfo, re.IGNORECASE):
        value = match.group(1)
        found.append(value.strip("'").replace("\\'", "'").replace("\\\\", "\\"))
        found.append(value)
    return [s for s in found if s]


class RedactingFilter(logging.Filter):
    """Masks secrets in a record's message (and its traceback) before any handler writes it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted is left to logging's own error path
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_FILTER = RedactingFilter()


def guard(*loggers: str) -> None:
    """Put ``RedactingFilter`` on these loggers (once each): what they log is masked wherever it goes."""
    for name in loggers:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
