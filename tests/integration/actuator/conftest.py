"""Fixtures of the actuator gateway tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.actuator.harness import Gateway


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """Make gateway processes (``gateways(config)``); each is stopped at the end of the test,
    whatever happened in it."""
    made: list[Gateway] = []

    def make(config: dict[str, Any], name: str = "gateway") -> Gateway:
        gateway = Gateway(config, tmp_path, name)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        gateway.stop()
