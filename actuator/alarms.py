"""Alarms on ``sys.alarms``: list them, acknowledge them (``fx alarms``).

An alarm is written by the lease holder, in the same transaction as the ``unknown`` outcome of an
``at-most-once`` actuation or the ``timeout`` of any actuation, and by a gateway whose device did
not confirm a write in time, with the register read back (docs/actuation.md, "Alarms"): the command
may have acted, or did not, and nothing will retry it, so a person must look; or (a
``skip_alarm``) in the transaction of the merge entry that skipped an input on the record
(docs/workloads.md, "Bad inputs"). An operator acknowledges it with an ``alarm_ack`` record (who,
and a note); both stay on the topic as its history. :func:`alarm_states` is the pure fold.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from broker_schema import DecodeError, decode, encode, topics
from broker_schema.records import AlarmAckRecord, AlarmRecord, SkipAlarmRecord
from fx_kafka.client import make_consumer, make_producer, read_partition

__all__ = ["AlarmState", "acknowledge", "alarm_states", "read_alarms"]


@dataclass(frozen=True)
class AlarmState:
    """An alarm, where it is on ``sys.alarms``, and its acknowledgement if there is one."""

    offset: int
    time_ms: int
    alarm: AlarmRecord | SkipAlarmRecord
    ack: AlarmAckRecord | None = None

    @property
    def open(self) -> bool:
        """Not acknowledged yet."""
        return self.ack is None


Alarm = AlarmRecord | SkipAlarmRecord


def alarm_states(records: Iterable[tuple[int, int, Alarm | AlarmAckRecord]]
                 ) -> list[AlarmState]:
    """Every alarm of ``records`` (``(offset, broker time, record)`` in log order) with its
    first acknowledgement, in the order they were raised. The first alarm of an id counts (a
    holder writes one per effect; a second is the same alarm); an ack before its alarm, or for
    no alarm, acknowledges nothing. Pure."""
    alarms: dict[str, AlarmState] = {}
    for offset, time_ms, record in records:
        if isinstance(record, AlarmRecord | SkipAlarmRecord):
            alarms.setdefault(record.alarm_id, AlarmState(offset, time_ms, record))
        else:
            state = alarms.get(record.alarm_id)
            if state is not None and state.ack is None:
                alarms[record.alarm_id] = AlarmState(state.offset, state.time_ms, state.alarm,
                                                     record)
    return list(alarms.values())


async def read_alarms(bootstrap: str, *, timeout: float = 30.0) -> list[AlarmState]:
    """The alarms on ``sys.alarms`` (committed ones: alarms are written transactionally)."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        if topics.ALARMS not in await consumer.topics():
            return []
        read = await read_partition(consumer, topics.ALARMS, timeout=timeout)
    finally:
        await consumer.stop()
    records: list[tuple[int, int, Alarm | AlarmAckRecord]] = []
    for offset, time_ms, value in read.records:
        try:
            record = decode(value, topic=topics.ALARMS)
        except DecodeError:
            continue
        if isinstance(record, AlarmRecord | SkipAlarmRecord | AlarmAckRecord):
            records.append((offset, time_ms, record))
    return alarm_states(records)


async def acknowledge(bootstrap: str, alarm_id: str, *, by: str, note: str = "") -> int:
    """Append an ``alarm_ack`` for ``alarm_id``; returns its offset on ``sys.alarms``."""
    ack = AlarmAckRecord(alarm_id=alarm_id, acked_by=by, note=note,
                         acked_us=time.time_ns() // 1000)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.ALARMS, value=encode(ack),
                                            key=alarm_id.encode(), partition=0)
    finally:
        await producer.stop()
    return int(meta.offset)
