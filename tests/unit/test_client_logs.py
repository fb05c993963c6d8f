"""The repeat filter that keeps a broker outage readable in the services' logs."""

from __future__ import annotations

import logging

from fx_kafka.logs import RepeatFilter


def _record(name: str, msg: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, ("127.0.0.1:9092",), None)


def test_repeats_are_held_back_and_counted() -> None:
    now = [0.0]
    flt = RepeatFilter(interval_s=10.0, clock=lambda: now[0])
    template = "Unable connect to node with id %s"
    passed = []
    for i in range(1000):
        now[0] = i * 0.016  # 1,000 retries in 16 s
        rec = _record("aiokafka.conn", template)
        if flt.filter(rec):
            passed.append(rec.getMessage())
    assert len(passed) == 2 and flt.held_back == 998
    assert passed[0] == "Unable connect to node with id 127.0.0.1:9092"
    assert passed[1].endswith("(624 more like this in 10 s)")


def test_other_loggers_and_other_messages_pass() -> None:
    flt = RepeatFilter(clock=lambda: 0.0)
    assert all(flt.filter(_record("executor.service", "same")) for _ in range(5))
    assert flt.filter(_record("aiokafka", "one")) and flt.filter(_record("aiokafka", "two"))
    assert flt.filter(_record("aiokafka", "one", logging.WARNING))
    assert not flt.filter(_record("aiokafka", "one"))
    assert flt.filter(_record("aiokafkaX", "one")) and flt.filter(_record("aiokafkaX", "one"))
