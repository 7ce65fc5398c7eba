"""The metrics registry: what it renders, prometheus_client's parser reads back exactly; bad names are refused."""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from pgjobkit.core.models import JobStatus
from pgjobkit.core.workers import QueueDepth
from pgjobkit.exporters.prometheus import CONTENT_TYPE, DEFAULT_BUCKETS, Family, Registry
from pgjobkit.worker.telemetry import Prometheus, bounded

HOSTILE = [
    'say "hi"',
    "back\\slash",
    "trailing\\",
    "\\n is not a newline",
    "new\nline",
    "\n",
    "",
    "} 1\n# TYPE evil gauge\nevil{",
    '{a="b"}',
    "#",
    "# HELP x y",
    "tab\tand\rreturn",
    "ünïcödé ✓ 日本語 🙂",
    "line\u2028separator",
    " leading and trailing ",
    "=,",
    "x" * 200,
    '\\"\\\\"\n\\',
]


def parse(registry: Registry) -> dict[str, Metric]:
    families = {f.name: f for f in text_string_to_metric_families(registry.render().decode("utf-8"))}
    assert len(families) == len(list(text_string_to_metric_families(registry.render().decode("utf-8"))))
    return families


def test_the_content_type_is_the_text_format_0_0_4() -> None:
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_families_render_in_registration_order_with_help_and_type() -> None:
    registry = Registry()
    registry.gauge("b_depth", "Jobs waiting.")
    registry.counter("a_done_total", "Jobs done.")
    registry.histogram("c_seconds", "How long.")
    text = registry.render().decode()
    assert text.splitlines() == [
        "# HELP b_depth Jobs waiting.",
        "# TYPE b_depth gauge",
        "# HELP a_done_total Jobs done.",
        "# TYPE a_done_total counter",
        "# HELP c_seconds How long.",
        "# TYPE c_seconds histogram",
    ]
    assert text.endswith("\n")
    # prometheus_client names a counter's family without its _total
    assert [(f.name, f.type, f.samples) for f in parse(registry).values()] == [
        ("b_depth", "gauge", []),
        ("a_done", "counter", []),
        ("c_seconds", "histogram", []),
    ]


def test_an_empty_registry_renders_nothing() -> None:
    assert Registry().render() == b""


def test_help_with_backslashes_and_newlines_reads_back() -> None:
    registry = Registry()
    help_text = 'one\\two\nthree "quoted"'
    registry.gauge("g", help_text)
    assert parse(registry)["g"].documentation == help_text
    assert len(registry.render().splitlines()) == 2


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_values_read_back_exactly(value: str) -> None:
    registry = Registry()
    counter = registry.counter("jobs_total", "Jobs.", ["queue", "type"])
    counter.labels(value, "plain").inc(3)
    counter.labels("plain", value).inc()
    histogram = registry.histogram("job_seconds", "Time.", ["queue"], buckets=[1])
    histogram.labels(value).observe(0.5)
    registry.gauge("after", "A family after the hostile ones.").set(7)
    families = parse(registry)
    assert [(s.name, s.labels, s.value) for s in families["jobs"].samples] == [
        ("jobs_total", {"queue": value, "type": "plain"}, 3.0),
        ("jobs_total", {"queue": "plain", "type": value}, 1.0),
    ]
    assert {s.labels["queue"] for s in families["job_seconds"].samples} == {value}
    assert [s.value for s in families["after"].samples] == [7.0]
    assert set(families) == {"jobs", "job_seconds", "after"}


def test_a_lone_surrogate_does_not_break_the_scrape() -> None:
    registry = Registry()
    registry.gauge("g", "G.", ["path"]).labels("bad\udcffbyte").set(1)
    [sample] = parse(registry)["g"].samples
    assert sample.labels == {"path": "bad?byte"}


def test_counters_add_up_and_have_no_labels_unless_given() -> None:
    registry = Registry()
    plain = registry.counter("runs_total", "Runs.")
    plain.inc()
    plain.labels().inc(2.5)
    plain.inc(0)
    labelled = registry.counter("jobs_total", "Jobs.", ["queue"])
    labelled.labels("a").inc()
    labelled.labels("b").inc(4)
    labelled.labels("a").inc()
    assert labelled.labels("a") is labelled.labels("a")
    assert "runs_total 3.5\n" in registry.render().decode()
    families = parse(registry)
    assert [(s.labels, s.value) for s in families["runs"].samples] == [({}, 3.5)]
    assert [(s.labels, s.value) for s in families["jobs"].samples] == [
        ({"queue": "a"}, 2.0),
        ({"queue": "b"}, 4.0),
    ]


def test_gauges_set_go_up_and_down_and_are_cleared_wholesale() -> None:
    registry = Registry()
    depth = registry.gauge("queue_depth", "Jobs waiting.", ["queue"])
    depth.labels("a").set(5)
    depth.labels("a").inc()
    depth.labels("a").dec(2.5)
    depth.labels("b").set(-1)
    depth.labels("c").set(float("inf"))
    assert [(s.labels["queue"], s.value) for s in parse(registry)["queue_depth"].samples] == [
        ("a", 3.5),
        ("b", -1.0),
        ("c", math.inf),
    ]
    depth.remove("b")
    depth.remove("nothing there")
    assert [s.labels["queue"] for s in parse(registry)["queue_depth"].samples] == ["a", "c"]
    depth.clear()
    depth.labels("d").set(1)
    assert [(s.labels["queue"], s.value) for s in parse(registry)["queue_depth"].samples] == [("d", 1.0)]
    nan = registry.gauge("nan", "Not a number.")
    nan.set(float("nan"))
    assert "\nnan NaN\n" in registry.render().decode()
    assert math.isnan(parse(registry)["nan"].samples[0].value)


def test_histograms_count_cumulatively_with_sum_count_and_inf() -> None:
    registry = Registry()
    seconds = registry.histogram("job_seconds", "Time.", ["queue"], buckets=[0.1, 1, 10])
    for value in (0.05, 0.1, 0.5, 1, 1, 3, 100, float("inf")):
        seconds.labels("a").observe(value)
    seconds.labels("b").observe(-2)
    samples = parse(registry)["job_seconds"].samples
    a = [(s.name, s.labels.get("le"), s.value) for s in samples if s.labels["queue"] == "a"]
    assert a == [
        ("job_seconds_bucket", "0.1", 2),  # a value equal to a bound is in that bound's bucket
        ("job_seconds_bucket", "1.0", 5),
        ("job_seconds_bucket", "10.0", 6),
        ("job_seconds_bucket", "+Inf", 8),
        ("job_seconds_sum", None, math.inf),
        ("job_seconds_count", None, 8),
    ]
    b = [(s.name, s.labels.get("le"), s.value) for s in samples if s.labels["queue"] == "b"]
    assert b == [
        ("job_seconds_bucket", "0.1", 1),
        ("job_seconds_bucket", "1.0", 1),
        ("job_seconds_bucket", "10.0", 1),
        ("job_seconds_bucket", "+Inf", 1),
        ("job_seconds_sum", None, -2.0),
        ("job_seconds_count", None, 1),
    ]


def test_a_histogram_without_labels_has_the_default_buckets() -> None:
    registry = Registry()
    seconds = registry.histogram("run_seconds", "Time.")
    seconds.observe(0.3)
    seconds.labels().observe(float("nan"))  # counted, in +Inf only
    samples = parse(registry)["run_seconds"].samples
    buckets = [s for s in samples if s.name == "run_seconds_bucket"]
    assert [float(s.labels["le"]) for s in buckets] == [*map(float, DEFAULT_BUCKETS), math.inf]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts)
    assert counts[0] == 0
    assert counts[DEFAULT_BUCKETS.index(0.5)] == 1
    assert counts[-1] == 2
    assert {s.name: s.value for s in samples if s.name != "run_seconds_bucket"}.keys() == {
        "run_seconds_sum",
        "run_seconds_count",
    }
    assert [s.value for s in samples if s.name == "run_seconds_count"] == [2]


@pytest.mark.parametrize("name", ["", "1st", "has-dash", "has space", "ünï", "a\n", "a{b}"])
def test_bad_metric_names_are_refused(name: str) -> None:
    registry = Registry()
    with pytest.raises(ValueError, match="metric name"):
        registry.gauge(name, "Bad.")
    with pytest.raises(ValueError, match="metric name"):
        registry.histogram(name, "Bad.")


@pytest.mark.parametrize("name", ["jobs", "jobs_totals", "_total", "1_total"])
def test_a_counter_name_ends_in_total(name: str) -> None:
    with pytest.raises(ValueError, match="_total"):
        Registry().counter(name, "Bad.")


def test_good_names_pass() -> None:
    registry = Registry()
    registry.gauge("a:b_c9", "Colons are allowed.", ["_x", "y9"])
    registry.counter(":x_total", "Ok.")


@pytest.mark.parametrize("labels", [["__reserved"], ["1a"], ["a-b"], ["a:b"], [""], ["a", "a"], ["ü"]])
def test_bad_label_names_are_refused(labels: list[str]) -> None:
    registry = Registry()
    with pytest.raises(ValueError, match="label"):
        registry.gauge("g", "Bad.", labels)


def test_le_is_the_histograms_own_label() -> None:
    registry = Registry()
    with pytest.raises(ValueError, match="le"):
        registry.histogram("h", "Bad.", ["queue", "le"])
    registry.gauge("g", "Fine for a gauge.", ["le"])


def test_labels_given_as_one_string_are_refused() -> None:
    with pytest.raises(TypeError, match="sequence of label names"):
        Registry().gauge("g", "Bad.", "queue")


@pytest.mark.parametrize("buckets", [[], [1, 1], [2, 1], [1, float("inf")], [float("nan")], [-math.inf, 1]])
def test_bad_buckets_are_refused(buckets: list[float]) -> None:
    with pytest.raises(ValueError, match="buckets"):
        Registry().histogram("h", "Bad.", buckets=buckets)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("gauge", "x"), ("gauge", "x")),
        (("counter", "x_total"), ("counter", "x_total")),
        (("counter", "x_total"), ("gauge", "x_total")),
        (("gauge", "x"), ("histogram", "x")),
        (("histogram", "x"), ("gauge", "x_count")),
        (("histogram", "x"), ("gauge", "x_bucket")),
        (("gauge", "x_sum"), ("histogram", "x")),
        (("counter", "x_total"), ("gauge", "x")),  # the counter's family is x to a parser
    ],
)
def test_a_name_is_registered_once(first: tuple[str, str], second: tuple[str, str]) -> None:
    registry = Registry()
    getattr(registry, first[0])(first[1], "First.")
    with pytest.raises(ValueError, match="already registered"):
        getattr(registry, second[0])(second[1], "Second.")
    assert len(list(text_string_to_metric_families(registry.render().decode()))) == 1


def test_the_number_of_label_values_must_match() -> None:
    registry = Registry()
    jobs = registry.counter("jobs_total", "Jobs.", ["queue", "type"])
    plain = registry.gauge("plain", "No labels.")
    cases: list[tuple[Family[Any], tuple[str, ...]]] = [(jobs, ()), (jobs, ("a",)), (jobs, ("a", "b", "c"))]
    for family, values in [*cases, (plain, ("a",))]:
        with pytest.raises(ValueError, match="given"):
            family.labels(*values)
        with pytest.raises(ValueError, match="given"):
            family.remove(*values)
    with pytest.raises(ValueError, match="given"):
        jobs.inc()
    with pytest.raises(TypeError, match="label values are str"):
        jobs.labels("a", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("amount", [-1, -0.001, float("nan"), -math.inf])
def test_a_counter_never_goes_down(amount: float) -> None:
    registry = Registry()
    jobs = registry.counter("jobs_total", "Jobs.")
    jobs.inc(2)
    with pytest.raises(ValueError, match="only goes up"):
        jobs.inc(amount)
    assert [s.value for s in parse(registry)["jobs"].samples] == [2.0]


def test_concurrent_increments_add_up_exactly() -> None:
    registry = Registry()
    jobs = registry.counter("jobs_total", "Jobs.", ["queue"])
    depth = registry.gauge("depth", "Depth.", ["queue"])
    seconds = registry.histogram("job_seconds", "Time.", ["queue"], buckets=[1])
    threads, rounds = 8, 20_000
    start = threading.Barrier(threads)

    def work(n: int) -> None:
        start.wait()
        for i in range(rounds):
            queue = f"q{i % 3}"
            jobs.labels(queue).inc()
            depth.labels(queue).inc(2)
            depth.labels(queue).dec()
            seconds.labels(queue).observe(n % 2 * 2)  # half in the 1 bucket, half past it
            if i % 1000 == 0:
                registry.render()

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    families = parse(registry)
    assert sum(s.value for s in families["jobs"].samples) == threads * rounds
    assert sum(s.value for s in families["depth"].samples) == threads * rounds
    totals: defaultdict[str, float] = defaultdict(float)
    for s in families["job_seconds"].samples:
        if s.name != "job_seconds_sum":
            totals[s.name + s.labels.get("le", "")] += s.value
    assert totals == {
        "job_seconds_bucket1.0": threads * rounds / 2,
        "job_seconds_bucket+Inf": threads * rounds,
        "job_seconds_count": threads * rounds,
    }


def test_the_depth_a_worker_shows_is_its_deepest_pairs_and_the_rest_summed_by_status() -> None:
    rows = [
        QueueDepth(type="a", status=JobStatus.QUEUED, jobs=9, oldest_seconds=1.0),
        QueueDepth(type="b", status=JobStatus.QUEUED, jobs=2, oldest_seconds=None),  # none runnable yet
        QueueDepth(type="c", status=JobStatus.QUEUED, jobs=3, oldest_seconds=7.5),
        QueueDepth(type="c", status=JobStatus.RUNNING, jobs=8, oldest_seconds=2.0),
        QueueDepth(type="d", status=JobStatus.RUNNING, jobs=1, oldest_seconds=30.0),
        QueueDepth(type="e", status=JobStatus.WAITING, jobs=1, oldest_seconds=None),
    ]
    assert bounded(rows, limit=10) == sorted(rows, key=lambda d: (-d.jobs, d.type))  # under the bound: all
    assert bounded(rows, limit=2) == [
        rows[0],
        rows[3],
        QueueDepth(type="", status=JobStatus.QUEUED, jobs=5, oldest_seconds=7.5),
        QueueDepth(type="", status=JobStatus.RUNNING, jobs=1, oldest_seconds=30.0),
        QueueDepth(type="", status=JobStatus.WAITING, jobs=1, oldest_seconds=None),
    ]
    prometheus = Prometheus()
    prometheus.set_depth(bounded(rows, limit=2))
    shown = {
        (s.labels["type"], s.labels["status"]): s.value
        for s in parse(prometheus.registry)["jobkit_queue_depth"].samples
    }
    assert sum(shown.values()) == sum(d.jobs for d in rows) and shown[("", "queued")] == 5
