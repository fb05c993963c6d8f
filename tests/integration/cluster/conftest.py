"""A 3-node local Apache Kafka cluster (KRaft, three controller+broker processes on loopback),
started for each test module of this folder and stopped after it (three JVMs are not kept idle
through the rest of the session)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fx_kafka.local import LocalKafka


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A running 3-node cluster (its ``bootstrap`` names all three listeners)."""
    data_dir: Path = tmp_path_factory.mktemp("cluster")
    in_main = threading.current_thread() is threading.main_thread()
    kafka = LocalKafka(data_dir=data_dir, nodes=3, heap="384m", die_with_parent=in_main)
    kafka.start(timeout=180)
    try:
        yield kafka
    finally:
        kafka.stop()
