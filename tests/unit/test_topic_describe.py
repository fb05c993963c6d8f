"""The decision half of describing topic configs (fx_kafka.workload.topic_configs): which
answers are asked again, which fail at once, and how long it waits between asks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fx_kafka.errors import TopicConfigError
from fx_kafka.workload import describe_backoff_s, sort_described


def _response(*resources: tuple[int, str, int, str, list[tuple[str, str]]]) -> SimpleNamespace:
    """A DescribeConfigs response as aiokafka decodes it: ``resources`` rows of (error code,
    message, resource type, name, config entries)."""
    return SimpleNamespace(resources=list(resources))


def test_known_topics_give_their_configs_and_unknown_ones_are_asked_again() -> None:
    found, unknown = sort_described([_response(
        (0, "", 2, "wl.a.out", [("message.timestamp.type", "LogAppendTime")]),
        (3, "This server does not host this topic-partition.", 2, "wl.a.resp", []),
    )])
    assert found == {"wl.a.out": {"message.timestamp.type": "LogAppendTime"}}
    assert unknown == [("wl.a.resp", "This server does not host this topic-partition.")]


def test_any_other_error_fails_at_once() -> None:
    with pytest.raises(TopicConfigError, match=r"wl\.a\.out.*error 29"):
        sort_described([_response((29, "denied", 2, "wl.a.out", []))])


def test_backoff_doubles_from_50_ms_to_1_s() -> None:
    assert [describe_backoff_s(n) for n in range(1, 8)] == [
        0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert describe_backoff_s(0) == 0.0
