"""``pgjobkit pipeline show`` and ``pipeline cancel``: a pipeline as a tree with each job's state, and
cancelling one."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from uuid import UUID

import click
from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from pgjobkit.cli.params import UUIDType, open_store_for
from pgjobkit.core.pipelines import PipelineJob, PipelineProgress

FOLD = 10  # more jobs than this under one job, of one type: one line with their counts by status
COLOURS = {
    "succeeded": "green",
    "running": "cyan",
    "queued": "white",
    "retrying": "yellow",
    "waiting": "magenta",
    "dead": "red",
    "cancelled": "bright_black",
}


@click.group("pipeline")
def pipeline() -> None:
    """Pipelines: jobs that wait for jobs."""


@pipeline.command("show")
@click.argument("pipeline_id", type=UUIDType())
@click.option("--json", "as_json", is_flag=True, help="Print every job of it as JSON.")
@click.pass_context
def show(ctx: click.Context, pipeline_id: UUID, as_json: bool) -> None:
    """PIPELINE_ID as a tree: under each job, the jobs it added (or, for jobs enqueued together, the jobs
    that wait for it), with their states; many jobs of one type under one job are counted on one line."""
    with open_store_for(ctx) as store:
        jobs = store.get_pipeline(pipeline_id)
        progress = store.pipeline_progress(pipeline_id)
    if not jobs or progress is None:
        click.echo(f"no pipeline {pipeline_id}", err=True)
        raise SystemExit(1)
    if as_json:
        click.echo(json.dumps([j.model_dump(mode="json") for j in jobs]))
        return
    Console(highlight=False, soft_wrap=True).print(tree(jobs, progress))


def tree(jobs: list[PipelineJob], progress: PipelineProgress) -> Tree:
    """The pipeline as a rich Tree: a job sits under the job that added it, else under the first job of
    the pipeline it waits for, else at the top."""
    ids = {j.id for j in jobs}
    under: dict[UUID | None, list[PipelineJob]] = defaultdict(list)
    for j in jobs:
        above = j.parent_id if j.parent_id in ids else next((d for d in j.depends_on if d in ids), None)
        under[above].append(j)
    running = f", running {', '.join(progress.running_types)}" if progress.running_types else ""
    root = Tree(
        f"pipeline {progress.pipeline_id}: {progress.succeeded} of {progress.total} succeeded{escape(running)}"
    )

    def grow(node: Tree, parent: UUID | None) -> None:
        by_type: dict[str, list[PipelineJob]] = defaultdict(list)
        for j in under[parent]:
            by_type[j.type].append(j)
        for type_, group in by_type.items():
            if len(group) > FOLD:
                counts = Counter(j.status.value for j in group)
                states = ", ".join(f"[{COLOURS[s]}]{n} {s}[/]" for s, n in sorted(counts.items()))
                branch = node.add(f"{escape(type_)} x {len(group)}: {states}")
                for j in group:
                    grow(branch, j.id)
                continue
            for j in group:
                grow(node.add(line(j)), j.id)

    grow(root, None)
    return root


def line(job: PipelineJob) -> str:
    """One job: its type, state (what it waits for, its progress or error) and id."""
    state = f"[{COLOURS[job.status.value]}]{job.status.value}[/]"
    if job.waiting_for:
        state += f" for {job.waiting_for} of {len(job.depends_on)}"
    if job.progress is not None and job.status.value == "running":
        state += f" {job.progress:.0%}"
    if job.error and job.status.value in ("dead", "cancelled", "retrying"):
        state += f": {escape(job.error[:80])}"
    return f"{escape(job.type)} {state} [bright_black]{job.id}[/]"


@pipeline.command("cancel")
@click.argument("pipeline_id", type=UUIDType())
@click.option("--reason", help="Kept as each cancelled job's error.")
@click.pass_context
def cancel(ctx: click.Context, pipeline_id: UUID, reason: str | None) -> None:
    """Cancel every job of PIPELINE_ID that has not finished (running ones at their worker's next
    heartbeat)."""
    with open_store_for(ctx) as store:
        n = store.cancel_pipeline(pipeline_id, reason)
    click.echo(f"{n} jobs of pipeline {pipeline_id} cancelled")
