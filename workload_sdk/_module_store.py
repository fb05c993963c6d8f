"""The module store on the broker: workload code by content hash on ``sys.modules``.

Why a topic of its own (compacted, keyed by the module hash) rather than the chunk store: every
process that folds a workload (holders on any node, ``fx replay``, ``fx audit``, ``fx why``,
shadow evaluations, the console) already reads the broker, while chunks may live in a node's
directory (``--chunk-dir``); module sources are small (one file, at most
:data:`broker_schema.records.MODULE_SOURCE_MAX_CHARS`) and few, so the whole store is read at
once; and a record says which workload class the code was deployed with, which a chunk (bytes
only) cannot. Compaction keeps one record per hash, and a hash names one source, so nothing is
ever lost to it. The ACLs let operators write it and holders read it.
"""

from __future__ import annotations

import getpass
import inspect
import os
import socket
import sys
import time

from broker_schema import DecodeError, ModuleRecord, SpecRecord, decode, encode, topics
from fx_kafka.client import create_topics, make_consumer, make_producer
from fx_kafka.workload_log import read_topic
from workload_sdk._api import Workload, module_hash
from workload_sdk._code import Code, ModuleUnavailable

__all__ = ["code_for", "ensure_modules_topic", "module_record", "read_modules", "store_module"]


def _who() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"[:200]
    except (KeyError, OSError):
        return "unknown"


def module_record(workload: Workload) -> ModuleRecord:
    """The module store's record of ``workload``'s code: the source file of its class (the
    bytes :func:`~workload_sdk.module_hash` hashes). ``ValueError`` when the code has no source
    file or the file is not UTF-8 text."""
    cls = type(workload)
    module = sys.modules[cls.__module__]
    try:
        path = inspect.getsourcefile(module)
    except TypeError:
        path = None
    if path is None:
        raise ValueError(f"the module of {cls.__name__} has no source file to store")
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc}): the module store keeps text") from None
    record = ModuleRecord(module_hash=module_hash(workload), workload_class=cls.__name__,
                          filename=os.path.basename(path)[:200], source=source,
                          written_by=_who(), written_us=time.time_ns() // 1000)
    return record


async def ensure_modules_topic(bootstrap: str) -> None:
    """Create ``sys.modules`` (compacted) if missing."""
    await create_topics(bootstrap, [topics.MODULES], compacted=True)


async def store_module(bootstrap: str, record: ModuleRecord) -> int:
    """Append ``record`` to the module store (keyed by its hash); its offset. ``EncodeError``
    (a ``ValueError``) when the source is over the record size limit."""
    value = encode(record)
    await ensure_modules_topic(bootstrap)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.MODULES, value=value,
                                            key=record.module_hash.encode(), partition=0)
        return int(meta.offset)
    finally:
        await producer.stop()


async def read_modules(bootstrap: str, *, timeout: float = 30.0) -> dict[str, ModuleRecord]:
    """The module store as it is now: records by module hash (the latest per hash); empty when
    ``sys.modules`` does not exist. Records that do not decode are passed over."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        present = topics.MODULES in await consumer.topics()
    finally:
        await consumer.stop()
    if not present:
        return {}
    found: dict[str, ModuleRecord] = {}
    for rec in await read_topic(bootstrap, topics.MODULES, timeout=timeout):
        try:
            record = decode(rec.value, topic=topics.MODULES)
        except DecodeError:
            continue
        if isinstance(record, ModuleRecord):
            found[record.module_hash] = record
    return found


async def code_for(code: Code, bootstrap: str, spec: SpecRecord, seq: int) -> str | None:
    """Have the code ``spec`` runs from step ``seq`` on loaded in ``code`` (reading the module
    store again for a module deployed since it was read), or say why not: the holder adopts a
    spec only with its code."""
    if code.missing(spec, seq):
        code.add((await read_modules(bootstrap)).values())
    wanted = [spec.module_at(seq)] + [(s.module_hash, s.workload_class)
                                      for s in spec.module_switches if s.at_step > seq]
    try:
        for module, workload_class in wanted:
            code.workload(module, workload_class)
    except ModuleUnavailable as exc:
        return str(exc)
    return None
