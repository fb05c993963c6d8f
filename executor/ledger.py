"""The node's receipt ledger on Kafka (``sys.ledger.<node id>``) and its reading.

The formats, the Merkle tree and every check live in :mod:`fx_integer.ledger` (pure, for
verifiers); this module holds the broker side: :class:`LedgerWriter`, which the service calls for
every receipt it signs (the leaf, then a checkpoint signed with the node's key, both acks=all,
before the response that carries the receipt is written), and :func:`read_ledger`, which reads a
node's ledger from the beginning (the writer on its first append, ``fx ledger`` always).

One writer per node id: two processes sharing a node id would each append to the same topic
and fork it (the monitor says so).

The writer never signs a checkpoint over a leaf it did not append (issue 31): when it loads the
ledger it checks every leaf's receipt against the node's own keys (:func:`fx_integer.ledger.
leaf_problem`: the node's name, one of its keys, a signature that verifies) and, if any leaf is
foreign, refuses to extend the ledger (:class:`LedgerRefused`: an error log line, the metric
``fx_executor_ledger_foreign_leaves`` and the alert ``FxLedgerForeignLeaf``). The node's own keys
are its current key, every key it has signed its ledger with before (remembered in
``ledger_keys_file``, beside the node key) and the keys an operator names in
``ledger_previous_keys``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from broker_schema import signatures, topics
from fx_integer import ledger as L
from fx_node.identity import NodeIdentity

__all__ = ["LedgerRefused", "LedgerWriter", "read_ledger", "remember_key"]

log = logging.getLogger(__name__)

Produce = Callable[[str, bytes, bytes], Awaitable[Any]]


async def read_ledger(bootstrap: str, node_id: str, *, timeout: float = 60.0,
                      topic: str | None = None) -> list[tuple[int, bytes, int | None]]:
    """Every record of ``sys.ledger.<node_id>`` (or of ``topic``, a copy of it) as
    ``(offset, value, append_us)``; [] when the topic does not exist. ``append_us`` is the
    broker's append time in µs, which the writer does not choose; None for every record when the
    topic does not stamp append times (``CreateTime``, or a mirrored copy): those times are the
    producer's, and :func:`fx_integer.ledger.audit` then judges keys as undated."""
    from fx_kafka.client import make_consumer, read_partition

    topic = topic or topics.ledger(node_id)
    consumer = make_consumer(bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return []
        read = await read_partition(consumer, topic, timeout=timeout)
        return [(offset, value, time_ms * 1000 if read.broker_times else None)
                for offset, time_ms, value in read.records]
    finally:
        await consumer.stop()


class LedgerRefused(RuntimeError):
    """The node's ledger holds a leaf the node did not append (or another problem that makes
    it unsafe to extend): it signs no checkpoint over it, and serves no receipt until an
    operator moves the node to a fresh ledger (docs/ledger.md, "Foreign leaves")."""


def _known_keys(path: Path | None) -> list[bytes]:
    if path is None or not path.exists():
        return []
    try:
        return [bytes.fromhex(k) for k in json.loads(path.read_text())["keys"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerRefused(f"cannot read the node's ledger keys {path}: {exc}") from None


def remember_key(path: Path, public_key: bytes) -> None:
    """Add ``public_key`` to the node's ledger keys file (created 0600, replaced atomically)."""
    keys = _known_keys(path)
    if public_key in keys:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"keys": [k.hex() for k in [*keys, public_key]]}, fh)
        fh.write("\n")
    os.replace(tmp, path)


class LedgerWriter:
    """Appends receipts to one node's ledger and checkpoints after every append.

    The tree is rebuilt from the topic on first use (:meth:`load`; the topic is created then,
    never compacted, no retention). A ledger holding a foreign leaf is refused
    (:class:`LedgerRefused`, every append after); other problems (a gap, a truncation, a fork
    among the node's own leaves) are logged and the ledger continued as it is: the monitor
    (``fx ledger watch``) reports them to whoever watches."""

    def __init__(self, bootstrap: str, node_id: str, identity: NodeIdentity, *,
                 keys_file: Path | None = None, previous_keys: Iterable[bytes] = (),
                 on_refused: Callable[[L.Audit], None] | None = None) -> None:
        self.bootstrap = bootstrap
        self.node_id = node_id
        self.topic = topics.ledger(node_id)
        self.origin = L.origin(node_id)
        self.identity = identity
        self._raw_key = signatures.public_key_from_text(identity.public_key_b64)
        self.keys_file = keys_file
        self.previous_keys = list(previous_keys)
        self.on_refused = on_refused
        self._tree: L.MerkleTree | None = None
        self._refused: str | None = None
        self._lock = asyncio.Lock()

    def own_keys(self) -> list[bytes]:
        """The keys whose receipts are this node's: the current key, the keys it signed its
        ledger with before (``keys_file``) and ``previous_keys``."""
        return list(dict.fromkeys([self._raw_key, *_known_keys(self.keys_file),
                                   *self.previous_keys]))

    async def load(self) -> L.MerkleTree:
        """Read and check the ledger (once); :class:`LedgerRefused` when it holds a foreign
        leaf."""
        async with self._lock:
            return await self._loaded()

    async def _loaded(self) -> L.MerkleTree:
        if self._refused is not None:
            raise LedgerRefused(self._refused)
        if self._tree is not None:
            return self._tree
        from fx_kafka.client import create_topics
        from fx_kafka.workload import WORKLOAD_TOPIC_CONFIGS

        await create_topics(self.bootstrap, [self.topic], configs=WORKLOAD_TOPIC_CONFIGS)
        try:
            keys = self.own_keys()
        except LedgerRefused as exc:
            self._refused = str(exc)
            raise
        found = L.audit(await read_ledger(self.bootstrap, self.node_id), self.node_id, keys)
        if found.foreign:
            self._refused = (
                f"ledger {self.topic} holds {len(found.foreign)} leaf/leaves this node did not "
                f"append (leaf {found.foreign[:5]}): refusing to sign a checkpoint over them; "
                f"the node serves no receipt until it moves to a fresh ledger (a new node id), "
                f"or, if they are its own from an earlier key, that key is named in "
                f"ledger_previous_keys (docs/ledger.md, 'Foreign leaves')")
            for kind, message in found.problems:
                if kind == "foreign":
                    log.error("ledger %s: %s", self.topic, message)
            log.error("%s", self._refused)
            if self.on_refused is not None:
                self.on_refused(found)
            raise LedgerRefused(self._refused)
        for kind, message in found.problems:
            log.warning("ledger %s: %s: %s", self.topic, kind, message)
        if self.keys_file is not None:
            remember_key(self.keys_file, self._raw_key)
        log.info("ledger %s: %d receipts, continuing", self.topic, len(found.tree))
        self._tree = found.tree
        return found.tree

    def checkpoint_note(self, tree: L.MerkleTree) -> str:
        body = L.checkpoint_body(self.origin, len(tree), tree.root())
        return L.sign_note(body, self.origin, self.identity.signing_key.sign, self._raw_key)

    async def append(self, receipt: Mapping[str, Any], produce: Produce) -> int:
        """Log ``receipt`` and a checkpoint of the tree with it; returns its leaf index.
        :class:`LedgerRefused` when the ledger holds a foreign leaf."""
        async with self._lock:
            tree = await self._loaded()
            index = len(tree)
            key = self.node_id.encode()
            await produce(self.topic, L.leaf_record(index, receipt), key)
            tree.append(L.leaf_data(receipt))
            await produce(self.topic, L.checkpoint_record(self.checkpoint_note(tree)), key)
            return index
