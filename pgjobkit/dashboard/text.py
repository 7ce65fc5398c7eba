"""What the dashboard draws of text it did not write: every character that is invisible, or that reorders
or hides the text around it, is drawn as its escape (``\\u202e``) in a styled span, so the operator reads
what is stored. It is the templates' ``finalize``: every ``{{ ... }}`` passes through it, escaped."""

from __future__ import annotations

import re
from typing import Any

from markupsafe import Markup, escape

# Every control (Cc), format (Cf: the bidi embeddings, overrides, isolates and marks, the zero-width
# characters, the soft hyphen, the tags), surrogate (Cs), line and paragraph separator (Zl, Zp)
# character but tab, newline and carriage return: Python 3.11's Unicode 14 and the Cf characters later
# versions added (U+13439..U+1343F); test_text.py checks that this Python's unicodedata agrees.
HIDDEN = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ud800-\udfff\ufeff\ufff9-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]"
)


class Verbatim(Markup):
    """Escaped text drawn as it is: a form field's value, which the browser sends back and never shows
    as text, or a machine-read ``data-`` attribute."""


def escape_code(char: str) -> str:
    """``char`` as the escape a reader can see and type: ``\\u202e``, ``\\U000e0001``."""
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _marked(match: re.Match[str]) -> str:
    # no quote in it: drawn inside an attribute's quotes it is inert text, never markup
    return f"<span class=cc>{escape_code(match.group())}</span>"


def visible(value: Any) -> Markup:
    """``value`` escaped, with every hidden character drawn as its escape (``Verbatim`` left as it is).
    Already-escaped markup (a macro's, a filter's such as ``join``) is marked the same way: its hidden
    characters can only be text, since the templates' own markup has none."""
    if isinstance(value, Verbatim):
        return value
    html = value if isinstance(value, Markup) else escape(value)
    if HIDDEN.search(html) is None:
        return html
    return Markup(HIDDEN.sub(_marked, html))  # noqa: S704 (escaped above; the spans are ours)


def verbatim(value: Any) -> Verbatim:
    """The ``verbatim`` filter: ``value`` escaped and nothing more, for form values and data attributes."""
    return Verbatim(escape(value))
