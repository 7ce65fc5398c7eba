"""`python -m bench.hot_path`: the claim + complete round trip of reference/hot-path-profile.md ("The loop
measured"), on two schemas side by side: one database migrated to an earlier release (``--before``, the
number of migrations it shipped: 7 is 0.5.1) and one to this checkout's newest migration. Rounds alternate
which database goes first; each round refills both with the same jobs. Prints each round and the medians:
jobs/s (wall time of the loop) and the loop's backend CPU per job (/proc/<pid>/schedstat, when the server
is local), and the ratio after / before.

Not part of `make bench`: run it when a change touches jobkit_claim or jobkit_complete, and quote the
medians with the command. The loop is the Worker's call, server-side in one DO block, a transaction per
claim: it completes the last batch and claims the next, starting after the last job of a full claim
except every 10th claim."""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

from bench.setup import drop_database, server_url
from pgjobkit.migrate import apply

LOOP = """
do $$ declare v_ids uuid[]; v_tokens uuid[]; v_n int; v_k int := 0; v_last uuid; v_after uuid;
begin loop
  v_k := v_k + 1; v_after := case when v_k % 10 = 0 then null else v_last end;
  select array_agg(c.id) filter (where c.status = 'running'), array_agg(c.lease_token) filter (where c.status = 'running'),
         count(*) filter (where c.status = 'running') into v_ids, v_tokens, v_n
  from public.jobkit_claim(p_types => '{noop}', p_worker => 'bench-host:4242:abcdef', p_lease_seconds => 30,
                           p_limit => {batch}, p_done_ids => v_ids, p_done_tokens => v_tokens, p_after => v_after) c;
  v_last := case when v_n >= {batch} then v_ids[v_n] end; commit; exit when v_n = 0;
end loop; end $$
"""

SEPARATE = """
do $$ declare v_ids uuid[]; v_tokens uuid[]; v_n int;
begin loop
  select array_agg(c.id), array_agg(c.lease_token), count(*) into v_ids, v_tokens, v_n
  from public.jobkit_claim(p_types => '{noop}', p_worker => 'bench-host:4242:abcdef', p_lease_seconds => 30,
                           p_limit => {batch}) c;
  commit; exit when v_n = 0;
  perform from public.jobkit_complete(v_ids, v_tokens); commit;
end loop; end $$
"""


def _url(base: str, name: str) -> str:
    return psycopg.conninfo.make_conninfo(base, dbname=name)


def _build(base: str, name: str, shipped: int | None) -> str:
    """A fresh database with the first ``shipped`` migrations (None: all of this checkout's)."""
    drop_database(name)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    url = _url(base, name)
    every = sorted((Path(__file__).parent.parent / "pgjobkit" / "sql" / "migrations").glob("*.sql"))
    with tempfile.TemporaryDirectory() as folder:
        for path in every[: shipped if shipped is not None else len(every)]:
            shutil.copy(path, folder)
        apply(url, directory=Path(folder), bootstrap=True)
    return url


def _fill(url: str, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("truncate public.jobkit_jobs cascade")
        for low in range(0, jobs, 1000):
            conn.execute(
                "insert into public.jobkit_jobs (type, payload) "
                "select 'noop', jsonb_build_object('n', g) from generate_series(%s::int, %s::int) g",
                (low, min(low + 999, jobs - 1)),
            )
        conn.execute("vacuum analyze public.jobkit_jobs")
        conn.execute("checkpoint")


def _cpu_ns(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except OSError:
        return None


def _loop(url: str, jobs: int, loop: str) -> tuple[float, float | None]:
    """jobs/s and backend CPU microseconds per job of one drain."""
    with psycopg.connect(url, autocommit=True) as conn:
        pid = conn.info.backend_pid
        conn.execute("select 1")
        cpu_before, started = _cpu_ns(pid), time.perf_counter()
        conn.execute(loop.encode())
        wall, cpu_after = time.perf_counter() - started, _cpu_ns(pid)
        left = conn.execute("select count(*) from public.jobkit_jobs where status <> 'succeeded'").fetchone()
        assert left == (0,), left
    cpu = (cpu_after - cpu_before) / 1000 / jobs if cpu_before is not None and cpu_after is not None else None
    return jobs / wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=int, default=7, help="migrations of the old release (7: 0.5.1)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--separate", action="store_true", help="jobkit_complete as its own call")
    args = parser.parse_args()
    base = server_url()
    names = {"before": "jobkit_bench_hot_before", "after": "jobkit_bench_hot_after"}
    urls = {"before": _build(base, names["before"], args.before), "after": _build(base, names["after"], None)}
    loop = (SEPARATE if args.separate else LOOP).replace("{batch}", str(args.batch))
    rate: dict[str, list[float]] = {"before": [], "after": []}
    cpu: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for _ in range(1):  # a warm-up drain of each, not counted
            for which in ("before", "after"):
                _fill(urls[which], args.jobs // 4)
                _loop(urls[which], args.jobs // 4, loop)
        for number in range(args.rounds):
            order = ("before", "after") if number % 2 == 0 else ("after", "before")
            line = [f"round {number + 1}:"]
            for which in order:
                _fill(urls[which], args.jobs)
                per_second, micros = _loop(urls[which], args.jobs, loop)
                rate[which].append(per_second)
                if micros is not None:
                    cpu[which].append(micros)
                line.append(f"{which} {per_second:,.0f} jobs/s" + (f" {micros:.1f} us/job" if micros else ""))
            print("  ".join(line), flush=True)
    finally:
        for name in names.values():
            drop_database(name)
    # The machine's load moves every round; each round's ratio compares two drains run back to back.
    paired = statistics.median(a / b for a, b in zip(rate["after"], rate["before"], strict=True))
    print(f"jobs/s after/before, median of the rounds' own ratios: {paired:.3f}")
    if len(cpu["before"]) == len(cpu["after"]) == args.rounds:
        paired = statistics.median(a / b for a, b in zip(cpu["after"], cpu["before"], strict=True))
        print(f"backend CPU after/before, median of the rounds' own ratios: {paired:.3f}")
    before, after = statistics.median(rate["before"]), statistics.median(rate["after"])
    print(
        f"jobs/s, median of {args.rounds}: before {before:,.0f}, after {after:,.0f}, after/before {after / before:.3f}"
    )
    if cpu["before"] and cpu["after"]:
        b, a = statistics.median(cpu["before"]), statistics.median(cpu["after"])
        print(f"backend CPU us/job, median: before {b:.1f}, after {a:.1f}, after/before {a / b:.3f}")


if __name__ == "__main__":
    main()
