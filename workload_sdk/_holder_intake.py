"""What the lease holder takes in, outside its loop: a record read from a source topic
(:func:`decode_item`) and a spec appended while it runs (:func:`spec_adoption`).

Split out of :mod:`workload_sdk._holder` (which keeps the loop and its state): both are
decisions over what was read, handed the few pieces of state they touch.
"""

from __future__ import annotations

from typing import Any, cast

from broker_schema import (
    AcceptedRecord,
    ClaimRecord,
    DecodeError,
    SpecRecord,
    TickRecord,
    decode,
    record_hash,
)
from broker_schema.fast_codec import decode as decode_fast
from broker_schema.streams import STREAM_RECORDS, SourceRecord
from workload_sdk._broker_clock import BrokerClock
from workload_sdk._code import Code
from workload_sdk._core import Item
from workload_sdk._holder_config import HOLDER_LOG as log
from workload_sdk._holder_rejects import TickRejects
from workload_sdk._holder_start import adoptable_spec
from workload_sdk._module_store import code_for

__all__ = ["decode_item", "spec_adoption"]


def decode_item(source: str, msg: Any, *, workload_id: str, metrics: Any, clock: BrokerClock,
                ticks: TickRejects, accepted_by: dict[str, str]) -> Item | None:
    """The merge item of ``msg`` read from ``source`` (``in`` or ``resp``), or None when it is
    passed over: undecodable, a record that does not belong on the topic (counted on ``.resp``),
    or a tick its epoch's holder did not write. An ``accepted`` notes its node in
    ``accepted_by``; every ``.resp`` record moves the broker ``clock``."""
    try:
        # answers (.resp) through the msgspec fast path (the codec's record or error); inputs
        # (.in) are no kind of its: the codec at once
        record = decode_fast(msg.value) if source == "resp" else decode(msg.value)
    except DecodeError as exc:
        log.warning("skipping undecodable record at %s@%d: %s", msg.topic, msg.offset, exc)
        if source == "resp" and metrics is not None:
            metrics.skipped(workload_id, "undecodable")
        return None
    if not isinstance(record, STREAM_RECORDS[source]):
        log.warning("skipping a %s record on %s@%d", record.kind, msg.topic, msg.offset)
        if source == "resp" and metrics is not None:
            metrics.skipped(workload_id, "wrong_record")
        return None
    if source == "resp":
        clock.observe(msg.timestamp)
        if isinstance(record, TickRecord) and ticks.rejected(msg, record):
            return None
        if isinstance(record, AcceptedRecord):
            accepted_by[record.effect_id] = record.node_id
    return Item("in" if source == "in" else "resp", msg.offset, msg.timestamp,
                cast(SourceRecord, record))  # narrowed by STREAM_RECORDS above


async def spec_adoption(offset: int, value: bytes, *, code: Code, bootstrap: str,
                        spec: SpecRecord, seq: int, epoch: int, holder_id: str,
                        holder_key: str | None, workload_id: str
                        ) -> tuple[SpecRecord, ClaimRecord] | str | None:
    """A spec appended to ``.spec`` at ``offset`` while the holder runs at step ``seq``: the
    spec and the claim of this ``epoch`` that adopts it from ``seq`` (``from_seq``; the rule is
    :mod:`broker_schema.binding`), why it is refused (it would rebind a step already taken, or
    its code cannot be loaded: :func:`~workload_sdk._module_store.code_for`), or None when there
    is nothing to adopt."""
    record, problem = adoptable_spec(offset, value, workload_id=workload_id, spec=spec, seq=seq)
    if problem is not None:
        return problem
    if record is None:
        return None
    problem = await code_for(code, bootstrap, record, seq)
    if problem is not None:
        return problem
    return record, ClaimRecord(workload_id=workload_id, epoch=epoch, holder_id=holder_id,
                               spec_hash=record_hash(record), spec_offset=offset,
                               from_seq=seq, holder_key=holder_key)
