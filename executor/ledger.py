"""The node's receipt ledger on Kafka (``sys.ledger.<node id>``) and its reading.

The formats, the Merkle tree and every check live in :mod:`fx_integer.ledger` (pure, for
verifiers); this module holds the broker side: :class:`LedgerWriter`, which the service calls for
every receipt it signs (the leaf, then a checkpoint signed with the node's key, both acks=all,
before the response that carries the receipt is written), and :func:`read_ledger`, which reads a
node's ledger from the beginning (the writer on its first append, ``fx ledger`` always).

One writer per node id: two processes sharing a node id would each append to the same topic
and fork it (the monitor says so).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from broker_schema import signatures, topics
from fx_integer import ledger as L
from fx_node.identity import NodeIdentity

__all__ = ["LedgerWriter", "read_ledger"]

log = logging.getLogger(__name__)

Produce = Callable[[str, bytes, bytes], Awaitable[Any]]


async def read_ledger(bootstrap: str, node_id: str, *, timeout: float = 60.0,
                      topic: str | None = None) -> list[tuple[int, bytes]]:
    """Every record of ``sys.ledger.<node_id>`` (or of ``topic``, a copy of it) as
    ``(offset, value)``; [] when the topic does not exist."""
    from fx_kafka.client import make_consumer, read_partition

    topic = topic or topics.ledger(node_id)
    consumer = make_consumer(bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return []
        read = await read_partition(consumer, topic, timeout=timeout)
        return [(offset, value) for offset, _, value in read.records]
    finally:
        await consumer.stop()


class LedgerWriter:
    """Appends receipts to one node's ledger and checkpoints after every append.

    The tree is rebuilt from the topic on first use (the topic is created then, never
    compacted, no retention). A ledger that does not audit clean is still continued (the
    checkpoint then covers what is on the log, as it is) and the problems are logged: the
    monitor (``fx ledger watch``) reports them to whoever watches."""

    def __init__(self, bootstrap: str, node_id: str, identity: NodeIdentity) -> None:
        self.bootstrap = bootstrap
        self.node_id = node_id
        self.topic = topics.ledger(node_id)
        self.origin = L.origin(node_id)
        self.identity = identity
        self._raw_key = signatures.public_key_from_text(identity.public_key_b64)
        self._tree: L.MerkleTree | None = None
        self._lock = asyncio.Lock()

    async def _load(self) -> L.MerkleTree:
        from fx_kafka.client import create_topics
        from fx_kafka.workload import WORKLOAD_TOPIC_CONFIGS

        await create_topics(self.bootstrap, [self.topic], configs=WORKLOAD_TOPIC_CONFIGS)
        found = L.audit(await read_ledger(self.bootstrap, self.node_id), self.node_id,
                        self._raw_key)
        for kind, message in found.problems:
            log.warning("ledger %s: %s: %s", self.topic, kind, message)
        log.info("ledger %s: %d receipts, continuing", self.topic, len(found.tree))
        return found.tree

    def checkpoint_note(self, tree: L.MerkleTree) -> str:
        body = L.checkpoint_body(self.origin, len(tree), tree.root())
        return L.sign_note(body, self.origin, self.identity.signing_key.sign, self._raw_key)

    async def append(self, receipt: Mapping[str, Any], produce: Produce) -> int:
        """Log ``receipt`` and a checkpoint of the tree with it; returns its leaf index."""
        async with self._lock:
            if self._tree is None:
                self._tree = await self._load()
            tree = self._tree
            index = len(tree)
            key = self.node_id.encode()
            await produce(self.topic, L.leaf_record(index, receipt), key)
            tree.append(L.leaf_data(receipt))
            await produce(self.topic, L.checkpoint_record(self.checkpoint_note(tree)), key)
            return index
