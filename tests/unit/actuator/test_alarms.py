"""The fold of ``sys.alarms`` (``fx alarms``): alarms with their first acknowledgement."""

from __future__ import annotations

from actuator.alarms import alarm_states
from broker_schema import AlarmAckRecord, AlarmRecord, EffectHeader


def _alarm(index: int) -> AlarmRecord:
    header = EffectHeader(workload_id="gate-1", input_offset=3, index=index, epoch=2)
    return AlarmRecord(alarm_id=header.effect_id, workload_id="gate-1", header=header,
                       effect_kind="acme:gate/set@1.0.0", guarantee="at-most-once",
                       request_offset=7, reason="lost", raised_by="h", raised_us=1)


def _ack(alarm_id: str, by: str) -> AlarmAckRecord:
    return AlarmAckRecord(alarm_id=alarm_id, acked_by=by, acked_us=2)


def test_alarms_and_their_first_ack() -> None:
    a, b = _alarm(0), _alarm(1)
    early = _ack(b.alarm_id, "too-early")  # before its alarm: acknowledges nothing
    states = alarm_states([(0, 10, early), (1, 11, a), (2, 12, b), (3, 13, a),
                           (4, 14, _ack(a.alarm_id, "ops")), (5, 15, _ack(a.alarm_id, "late")),
                           (6, 16, _ack("gate-1/9/9@9", "stray"))])
    assert [s.alarm.alarm_id for s in states] == [a.alarm_id, b.alarm_id]
    first, second = states
    assert first.offset == 1 and first.ack is not None and first.ack.acked_by == "ops"
    assert not first.open and second.open
