"""A transaction left open after reading public.jobkit_jobs, as a long report or an idle session leaves one:
it holds ACCESS SHARE on the table until the block ends, so DDL that needs the table waits behind it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg


@contextmanager
def reading_jobs(url: str) -> Iterator[None]:
    """Hold the open transaction for the body of the ``with`` block."""
    holding, release = threading.Event(), threading.Event()

    def reader() -> None:
        with psycopg.connect(url) as conn:
            conn.execute("select count(*) from public.jobkit_jobs")
            holding.set()
            release.wait(60)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert holding.wait(10), "the reader never opened its transaction"
        yield
    finally:
        release.set()
        thread.join()
