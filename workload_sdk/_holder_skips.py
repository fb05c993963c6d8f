"""Operators' skip orders, as the lease holder sees them (``fx workload skip``).

An order is a :class:`~broker_schema.SkipOrderRecord` on ``wl.<id>.spec`` (beside the specs:
the operator writes that topic, the holder reads it). The holder reads every order on resume,
takes new ones from its live read of ``.spec``, and, while it waits for a reference an input
names, reads ``.spec`` again so that an order ends the wait. An input with an order is not
stepped: it is marked (:attr:`~workload_sdk._core.Item.skip`, cause ``operator``) and the fold
records a ``quarantined`` merge entry naming the operator. The first order for an input counts;
an order for an input already merged changes nothing (logged, counted).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from broker_schema import DecodeError, SkipNote, SkipOrderRecord, decode, topics
from fx_kafka.workload_log import read_topic
from workload_sdk._core import Item
from workload_sdk._holder_config import HOLDER_LOG as log

__all__ = ["SkipOrders", "order_note"]


def order_note(order: SkipOrderRecord, offset: int) -> SkipNote:
    """The skip note an operator's order at ``.spec@offset`` is recorded with."""
    return SkipNote(cause="operator", detail=order.reason, principal=order.principal,
                    order_offset=offset)


class SkipOrders:
    """The skip orders of one workload by input offset (one object per run of the holder)."""

    def __init__(self, bootstrap: str, workload_id: str) -> None:
        self.bootstrap = bootstrap
        self.workload_id = workload_id
        self.by_input: dict[int, SkipNote] = {}
        #: the next ``.spec`` offset to read
        self._next = 0

    def note(self, offset: int, value: bytes) -> SkipOrderRecord | None:
        """Take the record at ``.spec@offset`` if it is a new skip order of this workload (the
        first for its input); the order, or None."""
        self._next = max(self._next, offset + 1)
        try:
            record = decode(value)
        except DecodeError:
            return None
        if (not isinstance(record, SkipOrderRecord) or record.workload_id != self.workload_id
                or record.input_offset in self.by_input):
            return None
        self.by_input[record.input_offset] = order_note(record, offset)
        return record

    async def read(self) -> list[SkipOrderRecord]:
        """Read the orders appended to ``.spec`` since the last read (all of them at first);
        the new ones."""
        view = await read_topic(self.bootstrap, topics.spec(self.workload_id),
                                start=self._next or None)
        new = [o for o in (self.note(rec.offset, rec.value) for rec in view) if o is not None]
        self._next = max(self._next, view.end)
        return new

    def took(self, order: SkipOrderRecord, merged_before: int) -> None:
        """Say what becomes of ``order``, read while running (inputs below ``merged_before``
        are merged already: such an order changes nothing)."""
        where = f"{topics.spec(self.workload_id)}: input {order.input_offset}"
        if order.input_offset < merged_before:
            del self.by_input[order.input_offset]
            log.warning("skip order on %s was merged already: nothing is skipped (ordered by "
                        "%s)", where, order.principal)
        else:
            log.warning("skip order on %s is skipped when it is reached (ordered by %s: %s)",
                        where, order.principal, order.reason)

    def marked(self, item: Item) -> Item:
        """``item`` marked to be skipped when it is an input an order names."""
        if item.source != "in" or item.skip is not None:
            return item
        note = self.by_input.get(item.offset)
        return item if note is None else replace(item, skip=note, resolved=None)

    def mark_buffered(self, buffered: deque[Item]) -> None:
        """Mark the buffered inputs an order names (an order read after they were)."""
        if not self.by_input or not buffered:
            return
        for i, item in enumerate(buffered):
            marked = self.marked(item)
            if marked is not item:
                buffered[i] = marked

    def forget_merged(self, merged_before: int) -> None:
        """Forget the orders for inputs below ``merged_before`` (merged already)."""
        for o in [o for o in self.by_input if o < merged_before]:
            del self.by_input[o]
