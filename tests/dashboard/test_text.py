"""Hidden characters in what the dashboard shows from the database (bidi overrides and isolates, marks,
zero-width characters, controls): every page draws them as their escapes, inert, and the forms still send
back what is stored."""

from __future__ import annotations

import sys
import unicodedata
from html.parser import HTMLParser
from typing import Any

from markupsafe import Markup

from pgjobkit.core.models import NewJob
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.core.schedules import Schedule
from pgjobkit.core.workers import Activity
from pgjobkit.dashboard.text import HIDDEN, escape_code, verbatim, visible
from pgjobkit.worker.calls import WorkerCalls
from tests.dashboard.conftest import ORIGIN, Dash
from tests.dashboard.test_app import LEASE, cells, dead

# what a type may hold (no controls: the store refuses them there), and what other text may
SNEAKY = "inv\u202eoice\u2066x\u2069\u200b\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u2067\u2068"
SNEAKY_TEXT = SNEAKY + "\x1b[31m\x7f\u0085\u2028\u2029\ufeff\U000e0041"  # (no store keeps a NUL)
HIDDEN_CATEGORIES = {"Cc", "Cf", "Cs", "Zl", "Zp"}
# the only attributes a stored value may sit in as it is: a form's values, and the machine-read data-type
VERBATIM_ATTRIBUTES = {"value", "data-type", "href"}


class Page(HTMLParser):
    """A page's text (but a textarea's, a form value) and its attributes, as a browser reads them."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self._in_textarea = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_textarea = self._in_textarea or tag == "textarea"
        self.attributes += [(name, value or "") for name, value in attrs]

    def handle_endtag(self, tag: str) -> None:
        self._in_textarea = self._in_textarea and tag != "textarea"

    def handle_data(self, data: str) -> None:
        if not self._in_textarea:
            self.text.append(data)


def shown(dash: Dash, path: str) -> str:
    """The text ``path`` shows, checked: no hidden character in it, nor in any attribute but a form's
    value (sent back, never shown) or data-type."""
    response = dash.get(path)
    assert response.status_code == 200, path
    page = Page(response.text)
    text = "".join(page.text)
    assert HIDDEN.search(text) is None, (path, HIDDEN.search(text))
    for name, value in page.attributes:
        assert name in VERBATIM_ATTRIBUTES or HIDDEN.search(value) is None, (path, name, value)
    return text


# --- the escaping layer -----------------------------------------------------------------------------------
def test_the_hidden_characters_are_every_control_format_and_separator_character() -> None:
    """HIDDEN is written out (building it from unicodedata takes a quarter of a second): this Python's
    Unicode must agree with it, but for the Cf characters later versions add."""
    later = set(range(0x13439, 0x13440))  # Egyptian hieroglyph format controls (Unicode 15)
    for code in range(sys.maxunicode + 1):
        char = chr(code)
        hidden = unicodedata.category(char) in HIDDEN_CATEGORIES and char not in "\t\n\r"
        assert (HIDDEN.fullmatch(char) is not None) == (hidden or code in later), hex(code)


def test_visible_escapes_then_marks_each_hidden_character_and_leaves_the_rest() -> None:
    assert visible("plain <b> & é ✓ עברית\ttab\nline") == "plain &lt;b&gt; &amp; é ✓ עברית\ttab\nline"
    assert visible("a\u202eb") == "a<span class=cc>\\u202e</span>b"
    assert visible("<\U000e0041>") == "&lt;<span class=cc>\\U000e0041</span>&gt;"
    assert visible(Markup("<i>x\u200by</i>")) == "<i>x<span class=cc>\\u200b</span>y</i>"
    assert visible(verbatim("a\u202e<b>")) == "a\u202e&lt;b&gt;"
    assert visible(None) == "None" and visible(3) == "3"
    assert all(escape_code(c).isascii() and '"' not in escape_code(c) for c in SNEAKY_TEXT)
    marked = visible(SNEAKY_TEXT + "\x00")
    assert HIDDEN.search(marked) is None and '"' not in marked and "'" not in marked
    assert marked.count("<span class=cc>") == len(HIDDEN.findall(SNEAKY_TEXT)) + 1


# --- every page -------------------------------------------------------------------------------------------
def _arrange(dash: Dash) -> dict[str, Any]:
    """One of everything, its text sneaky: a running job (type, progress message, keys, payload), a dead
    one (error), a limit, a schedule, a pipeline and a worker."""
    store = dash.store
    enqueued = store.enqueue(
        NewJob(
            type=SNEAKY,
            payload={SNEAKY: SNEAKY_TEXT},
            idempotency_key=SNEAKY_TEXT,
            fair_key=SNEAKY,
        )
    )
    [running] = WorkerCalls(store).claim([SNEAKY], SNEAKY, LEASE)
    assert running.id == enqueued.id and running.lease_token is not None
    WorkerCalls(store).progress([(running.id, running.lease_token, 0.5, SNEAKY_TEXT)])
    dead_id = dead(store, SNEAKY + "-dead", SNEAKY_TEXT + "\ntraceback")
    store.set_limit(SNEAKY, max_running=3)
    store.set_schedule(Schedule(name=SNEAKY, cron="0 3 * * *", type=SNEAKY, payload={"x": SNEAKY}))
    pipeline = Pipeline()
    pipeline.add(SNEAKY, ref="first")
    pipeline.add(SNEAKY + "2", after="first")
    added = store.enqueue_pipeline(pipeline)
    activity = Activity()
    activity.add(running.created_at.timestamp(), SNEAKY, "dead", run=1, wait=1)
    store.worker_beat(SNEAKY, host=SNEAKY, version=SNEAKY, types=[SNEAKY, "b"], activity=activity.take())
    return {"running": running.id, "dead": dead_id, "pipeline": added.pipeline_id}


def test_every_page_draws_hidden_characters_as_their_escapes(dash: Dash) -> None:
    csrf = dash.login()
    ids = _arrange(dash)
    escaped = str(visible(SNEAKY)).replace("<span class=cc>", "").replace("</span>", "")
    assert escaped.startswith("inv\\u202eoice\\u2066x\\u2069")
    pages = {
        "/": 2,  # the type's row, the worker
        "/failing": 2,  # the error's first line, and the dead job's type
        "/running": 3,  # the type, the progress message, the worker holding it
        "/limits": 1,
        "/schedules": 3,  # name, type, payload
        "/workers": 4,  # name, host, version, types
        f"/jobs/{ids['running']}": 5,  # type, claimed by, the keys, the payload
        f"/jobs/{ids['dead']}": 2,  # type, error
        f"/pipelines/{ids['pipeline']}": 2,
    }
    for path, least in pages.items():
        text = shown(dash, path)
        assert text.count(escaped) >= least, (path, text.count(escaped))
    assert "\\u001b[31m" in shown(dash, f"/jobs/{ids['dead']}")
    assert "\\u2028\\u2029\\ufeff\\U000e0041" in shown(dash, f"/jobs/{ids['running']}")
    # the overview's cells still carry the type as stored, for whoever reads them
    assert cells(dash.get("/").text)[(SNEAKY, "running")] == 1
    # a message naming it, an error page, a form sent back with it: drawn the same way
    dash.act("/schedules", {"csrf": csrf, "name": SNEAKY + "2", "cron": "0 4 * * *", "type": "t"})
    assert escaped + "2 saved." in shown(dash, "/schedules")
    refused = dash.post(
        "/limits", {"csrf": csrf, "type": SNEAKY, "max_running": "x"}, headers={"Origin": ORIGIN}
    )
    assert refused.status_code == 400
    assert HIDDEN.search("".join(Page(refused.text).text)) is None
    assert f'value="{SNEAKY}"' in refused.text  # what was sent, kept as it was in the form
    # the forms send back what is stored, so the actions still find it
    dash.act("/limits/delete", {"csrf": csrf, "type": _value(dash.get("/limits").text, "type")})
    assert dash.store.list_limits() == []
    dash.act("/schedules/delete", {"csrf": csrf, "name": SNEAKY})
    assert [s.name for s in dash.store.list_schedules()] == [SNEAKY + "2"]


def _value(html: str, name: str) -> str:
    """The value of the first hidden field ``name`` on a page, as a browser sends it."""
    page = Page(html)
    for attr, value in zip(page.attributes, page.attributes[1:], strict=False):
        if attr == ("name", name) and value[0] == "value":
            return value[1]
    raise AssertionError(f"no field {name}")
