"""``fx redact`` and ``fx tenant-keys``: an operator removes one input's bytes early, or a
tenant's, and rotates a tenant's key (docs/security.md, "Chunk encryption and redaction").

- ``fx redact ID --input N --reason TEXT``: the input at offset ``N`` of ``wl.<ID>.in`` must name
  a chunk (an inline body cannot be redacted: the spec's ``redactable_inputs`` sends inputs
  through chunks). Writes a :class:`~broker_schema.RedactionRecord` on ``sys.chunks`` (key
  ``<owner>/<hash>/redaction``) and a tombstone for the chunk's key entry
  (``<owner>/<hash>/key``); with ``--chunk-dir`` the same in that filesystem store. The sealed
  chunk stays and no longer opens; every reader meets it as ``redacted``.
- ``fx tenant-keys rotate ID``: a new tenant key; every key entry of the workload (on
  ``sys.chunks``, and under ``--chunk-dir``) wrapped again under it. The chunks are not touched.
  ``--destroy-old`` then destroys the older keys.
- ``fx tenant-keys destroy ID --reason TEXT``: destroys every key of the tenant in the local key
  directory (every chunk of the workload is redacted on this machine: copies elsewhere must be
  destroyed the same way) and records it (``whole_tenant``) on ``sys.chunks``.

Who: the SASL user on a secured broker, else ``--by``, else ``user@host`` (as ``fx workload
skip``). The operator role: on a secured broker only the operator (and the services) may write
``sys.chunks`` (docs/security.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from broker_schema import (
    ChunkRef,
    DecodeError,
    InputRecord,
    RedactionRecord,
    decode,
    encode,
    topics,
)
from broker_schema.canonical import hash_from_hex
from broker_schema.chunk_crypto import (
    ChunkKeyError,
    KeyEntry,
    fs_keys_dir,
    key_entry_key,
    parse_key_entry_key,
    redaction_key,
    rewrap,
    wrapped_under,
)
from broker_schema.refs import chunk_owner
from fx_kafka.chunk_files import redact_chunk_file
from fx_kafka.client import create_topics, make_consumer, make_producer
from fx_kafka.tenant_keys import TenantKeys
from fx_kafka.workloads import needs_workload
from workload_sdk._skip_cli import principal_of

__all__ = ["redact_input", "register", "rotate_tenant"]

EXIT_REFUSED = 2


async def _input_chunk(bootstrap: str, workload_id: str, offset: int) -> ChunkRef | str:
    """The chunk reference of input ``offset``, or why it has none."""
    from fx_kafka.refs import StreamAbsent, read_record_at

    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        value = await read_record_at(consumer, topics.inputs(workload_id), 0, offset)
    except StreamAbsent as exc:
        return f"no input {offset}: {exc}"
    finally:
        await consumer.stop()
    try:
        record = decode(value)
    except DecodeError as exc:
        return f"input {offset} is undecodable: {exc}"
    if not isinstance(record, InputRecord):
        return f"offset {offset} of {topics.inputs(workload_id)} holds a {record.kind}"
    if not isinstance(record.body, ChunkRef):
        return (f"input {offset} is inline ({record.body.type}): its bytes are in the record "
                "itself and cannot be redacted; a spec with redactable_inputs sends inputs "
                "through chunks (docs/security.md)")
    return record.body


async def _produce(bootstrap: str, items: list[tuple[bytes, bytes | None]]) -> None:
    with contextlib.suppress(Exception):  # a client that may not create topics finds it there
        await create_topics(bootstrap, [topics.CHUNKS], compacted=True)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        for key, value in items:
            await producer.send_and_wait(topics.CHUNKS, value=value, key=key, partition=0)
    finally:
        await producer.stop()


async def redact_input(bootstrap: str, workload_id: str, offset: int, reason: str,
                       principal: str, chunk_dir: Path | None = None
                       ) -> tuple[RedactionRecord | None, str]:
    """Redact input ``offset``'s chunk; ``(record, message)``, the record None when refused."""
    ref = await _input_chunk(bootstrap, workload_id, offset)
    if isinstance(ref, str):
        return None, ref
    owner = chunk_owner(ref, workload_id)
    record = RedactionRecord(workload_id=owner, input_offset=offset, chunk_hash=ref.hash,
                             reason=reason, principal=principal,
                             redacted_us=time.time_ns() // 1000)
    # the record first: a reader that sees the tombstone also finds why
    await _produce(bootstrap, [(redaction_key(owner, ref.hash), encode(record)),
                               (key_entry_key(owner, ref.hash), None)])
    where = topics.CHUNKS
    if chunk_dir is not None:
        await asyncio.to_thread(redact_chunk_file, chunk_dir, owner, ref.hash, encode(record))
        where += f" and {chunk_dir}"
    return record, (f"input {offset} of {workload_id} redacted: chunk {ref.hash} of {owner}, "
                    f"its data key destroyed on {where} (by {principal}: {reason}); replay "
                    "stops there (Redacted, exit 5), fx why marks it REDACTED")


async def _key_entries(bootstrap: str, workload_id: str) -> dict[str, bytes]:
    """The live key entries of ``workload_id`` on ``sys.chunks``: chunk hash -> entry."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    out: dict[str, bytes] = {}
    try:
        if topics.CHUNKS not in await consumer.topics():
            return out
        tp = TopicPartition(topics.CHUNKS, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            for msg in batch.get(tp, []):
                parsed = parse_key_entry_key(msg.key)
                if parsed is None or parsed[0] != workload_id or parsed[2] != "key":
                    continue
                if msg.value is None:
                    out.pop(parsed[1], None)
                else:
                    out[parsed[1]] = msg.value
    finally:
        await consumer.stop()
    return out


async def rotate_tenant(bootstrap: str, workload_id: str, keys: TenantKeys,
                        chunk_dir: Path | None = None) -> tuple[str, int, list[str]]:
    """A new key for the tenant ``workload_id``, every key entry wrapped again under it;
    ``(new key id, entries re-wrapped, problems)``. Chunks are not touched."""
    new_id = keys.create(workload_id)
    new_key = keys.get(workload_id, new_id)
    assert new_key is not None
    problems: list[str] = []

    def again(chunk_hash: str, raw: bytes) -> bytes | None:
        try:
            entry = KeyEntry.from_bytes(raw)
            if wrapped_under(entry, new_id):
                return None
            old = keys.get(entry.tenant, entry.key_id)
            if old is None:
                problems.append(f"{chunk_hash}: tenant key {entry.key_id} is not here "
                                "(redacted, or never copied to this machine)")
                return None
            return rewrap(entry, old, new_key, new_key_id=new_id, workload=workload_id,
                          chunk_hash=chunk_hash).to_bytes()
        except ChunkKeyError as exc:
            problems.append(f"{chunk_hash}: {exc.message}")
            return None

    writes: list[tuple[bytes, bytes | None]] = []
    for chunk_hash, raw in (await _key_entries(bootstrap, workload_id)).items():
        new = again(chunk_hash, raw)
        if new is not None:
            writes.append((key_entry_key(workload_id, chunk_hash), new))
    if writes:
        await _produce(bootstrap, writes)
    count = len(writes)
    if chunk_dir is not None:
        keys_dir = chunk_dir / fs_keys_dir(workload_id)
        for path in sorted(keys_dir.glob("*")) if keys_dir.is_dir() else []:
            if path.name.startswith("."):
                continue
            chunk_hash = hash_from_hex(path.name)
            new = again(chunk_hash, path.read_bytes())
            if new is not None:
                tmp = path.with_name(f".rot-{path.name}")
                tmp.write_bytes(new)
                tmp.replace(path)
                count += 1
    return new_id, count, problems


def _by(args: argparse.Namespace) -> str:
    return principal_of(args.by)


def _redact(args: argparse.Namespace, *, bootstrap: Callable[[argparse.Namespace], str]) -> int:
    reason = args.reason.strip()
    if args.input < 0 or not reason:
        print("fx redact: --input is an offset on wl.<id>.in and --reason must say why (both "
              "are recorded)", file=sys.stderr)
        return EXIT_REFUSED
    chunk_dir = Path(args.chunk_dir) if args.chunk_dir else None
    record, message = asyncio.run(redact_input(bootstrap(args), args.id, args.input,
                                               reason[:4096], _by(args), chunk_dir))
    if record is None:
        print(f"fx redact: {message}", file=sys.stderr)
        return EXIT_REFUSED
    print(message)
    return 0


def _rotate(args: argparse.Namespace, *, bootstrap: Callable[[argparse.Namespace], str]) -> int:
    keys = TenantKeys(args.key_dir) if args.key_dir else TenantKeys()
    old = keys.key_ids(args.id)
    new_id, count, problems = asyncio.run(rotate_tenant(
        bootstrap(args), args.id, keys, Path(args.chunk_dir) if args.chunk_dir else None))
    for problem in problems:
        print(f"fx tenant-keys rotate: not re-wrapped: {problem}", file=sys.stderr)
    print(f"tenant {args.id}: new key {new_id}; {count} data key(s) wrapped again under it "
          "(chunks untouched)")
    if args.destroy_old and not problems:
        for key_id in old:
            keys.destroy(args.id, key_id)
        print(f"destroyed the older key(s) {old}")
    return 0 if not problems else EXIT_REFUSED


def _destroy(args: argparse.Namespace, *, bootstrap: Callable[[argparse.Namespace], str]) -> int:
    reason = args.reason.strip()
    if not reason:
        print("fx tenant-keys destroy: --reason must say why (it is recorded)", file=sys.stderr)
        return EXIT_REFUSED
    keys = TenantKeys(args.key_dir) if args.key_dir else TenantKeys()
    record = RedactionRecord(workload_id=args.id, reason=reason[:4096], principal=_by(args),
                             whole_tenant=True, redacted_us=time.time_ns() // 1000)
    asyncio.run(_produce(bootstrap(args), [(f"{args.id}/tenant/redaction".encode(),
                                            encode(record))]))
    gone = keys.destroy(args.id)
    print(f"tenant {args.id}: destroyed key(s) {gone} in {keys.root}: every chunk of the "
          "workload is redacted here (destroy every other copy of the key directory too); "
          f"recorded on {topics.CHUNKS}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
             bootstrap_arg: Callable[[argparse.ArgumentParser], None],
             bootstrap: Callable[[argparse.Namespace], str]) -> None:
    """Add ``fx redact`` and ``fx tenant-keys``."""

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("id", help="workload id (the tenant)")
        p.add_argument("--by", metavar="NAME", help="who (default user@host; on a secured "
                       "broker always the SASL user)")
        bootstrap_arg(p)

    def wrapped(func: Callable[..., int]) -> Any:
        return needs_workload(partial(func, bootstrap=bootstrap), exit_code=EXIT_REFUSED,
                              bootstrap=bootstrap)

    red = subparsers.add_parser("redact", help="destroy one input's chunk key (operator): "
                                "replay, why, audit and shadow then meet it as Redacted")
    common(red)
    red.add_argument("--input", type=int, required=True, metavar="N",
                     help="the input's offset on wl.<id>.in")
    red.add_argument("--reason", required=True, help="why (recorded)")
    red.add_argument("--chunk-dir", metavar="DIR",
                     help="also redact it in this filesystem chunk store")
    red.set_defaults(func=wrapped(_redact))

    tk = subparsers.add_parser("tenant-keys", help="rotate or destroy a tenant's chunk keys")
    tks = tk.add_subparsers(dest="tenant_keys_command", required=True)
    rot = tks.add_parser("rotate", help="a new tenant key; data keys wrapped again under it")
    common(rot)
    rot.add_argument("--chunk-dir", metavar="DIR", help="also the entries in this fs store")
    rot.add_argument("--key-dir", metavar="DIR", help="tenant key directory "
                     "(default $FX_TENANT_KEY_DIR or ~/.local/share/ninelives-fx/tenant-keys)")
    rot.add_argument("--destroy-old", action="store_true",
                     help="destroy the older keys once every entry is re-wrapped")
    rot.set_defaults(func=wrapped(_rotate))
    des = tks.add_parser("destroy", help="destroy every key of the tenant: redacts all its "
                         "chunks")
    common(des)
    des.add_argument("--reason", required=True, help="why (recorded)")
    des.add_argument("--key-dir", metavar="DIR", help="tenant key directory")
    des.set_defaults(func=wrapped(_destroy))
