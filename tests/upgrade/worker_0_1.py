"""A jobkit 0.1 worker, as the database sees one: the SQL calls 513526e's worker made, in the form its
PostgresStore rendered them (``select * from public.fn("p_a" => %s::type, ...)``, ops.py's
``_claim_call`` and ``heartbeat``, stores/postgres.py's ``_statement``), claiming with the previous batch's
completions folded in and heartbeating what it holds. Stricter than 0.1 by default: every statement is
prepared on the server (0.1's ``prepare=True``, and what PostgREST does), so a change to a row type or a
signature the upgrade makes shows up as the error a real worker would get, for as long as its connection
lives. It keeps what it ran and every error it met."""

from __future__ import annotations

import threading
import time
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row


class Worker01:
    CLAIM = (
        b'select * from public."jobkit_claim"("p_types" => %s::text[], "p_worker" => %s::text, '
        b'"p_lease_seconds" => %s::double precision, "p_limit" => %s::integer, "p_done_ids" => %s::uuid[], '
        b'"p_done_tokens" => %s::uuid[])'
    )
    HEARTBEAT = (
        b'select * from public."jobkit_heartbeat"("p_ids" => %s::uuid[], "p_lease_tokens" => %s::uuid[], '
        b'"p_lease_seconds" => %s::double precision)'
    )
    COMPLETE = (
        b'select * from public."jobkit_complete"("p_ids" => %s::uuid[], "p_lease_tokens" => %s::uuid[])'
    )

    def __init__(
        self, url: str, types: list[str], *, batch: int, handler_seconds: float, lease_seconds: float = 30
    ) -> None:
        self.url, self.types, self.batch = url, types, batch
        self.handler_seconds, self.lease_seconds = handler_seconds, lease_seconds
        self.stop = threading.Event()
        self.ran: list[UUID] = []  # each job a handler ran, in order
        self.holding: list[UUID] = []  # jobs claimed and not yet completed
        self.errors: list[str] = []

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True, row_factory=dict_row, prepare_threshold=0) as conn:
            done: list[dict[str, Any]] = []
            while not self.stop.is_set():
                ids, tokens = [r["id"] for r in done] or None, [r["lease_token"] for r in done] or None
                claimed = self._call(
                    conn, self.CLAIM, self.types, "worker-0.1", self.lease_seconds, self.batch, ids, tokens
                )
                if claimed is None:  # in self.errors; the completions are sent again with the next claim
                    time.sleep(0.05)
                    continue
                jobs = [r for r in claimed if r["status"] == "running"]
                self.holding, done, beat = [r["id"] for r in jobs], [], time.monotonic()
                for job in jobs:
                    time.sleep(self.handler_seconds)  # the handler
                    self.ran.append(job["id"])
                    done.append(job)
                    if time.monotonic() - beat > 1:
                        held = [r["id"] for r in jobs], [r["lease_token"] for r in jobs]
                        self._call(conn, self.HEARTBEAT, *held, self.lease_seconds)
                        beat = time.monotonic()
                if not jobs:
                    time.sleep(0.05)
            if done:
                self._call(conn, self.COMPLETE, [r["id"] for r in done], [r["lease_token"] for r in done])
            self.holding = []

    def _call(
        self, conn: psycopg.Connection[dict[str, Any]], statement: bytes, *params: Any
    ) -> list[dict[str, Any]] | None:
        try:
            return conn.execute(statement, params).fetchall()
        except psycopg.Error as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            return None
