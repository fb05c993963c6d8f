"""``fx chunk put|get``: store a body for a workload in the chunk store, and read one back.

A request whose input is over the 64 KiB inline limit names a chunk by hash and size; the chunk
must have been stored **for the request's workload** (chunks are per workload: see
:mod:`executor.chunks` and :func:`fx_node.admission.chunk_problem`). ``put`` prints the reference as
JSON, ready to be a request's or an input record's ``body``.

The store is the executor's: ``--config`` (its ``chunk_backend``, ``chunk_dir``, ``bootstrap`` and
security), overridden by ``--backend``, ``--dir`` and ``--bootstrap``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from broker_schema.canonical import is_hash
from broker_schema.records import ChunkRef
from broker_schema.topics import check_workload_id
from executor.chunks import ChunkStore, FsChunkStore, KafkaChunkStore
from executor.config import ExecutorConfig, load_config
from fx_kafka.security import use_security
from fx_node.errors import OutcomeError
from fx_node.settings import ConfigError

__all__ = ["add_chunk"]


def _config(args: argparse.Namespace) -> ExecutorConfig:
    overrides: dict[str, Any] = {}
    if args.backend:
        overrides["chunk_backend"] = args.backend
    if args.dir:
        overrides["chunk_dir"] = args.dir
    if args.bootstrap:
        overrides["bootstrap"] = args.bootstrap
    return load_config(args.config, **overrides)


@contextlib.asynccontextmanager
async def _store(cfg: ExecutorConfig, *, read: bool) -> AsyncIterator[ChunkStore]:
    """The store of ``cfg``; a Kafka store that only writes starts no consumer, so a principal
    with WRITE on ``sys.chunks`` and no READ can put chunks."""
    cache = FsChunkStore(cfg.chunk_dir)
    if cfg.chunk_backend == "fs":
        yield cache
        return
    from aiokafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError

    from broker_schema import topics
    from fx_kafka.client import create_topics, make_producer, wait_ready

    await wait_ready(cfg.bootstrap, 30.0)
    if not read:
        # as the executor does at start; a writer that may not create topics finds it there
        with contextlib.suppress(ClusterAuthorizationFailedError, TopicAuthorizationFailedError):
            await create_topics(cfg.bootstrap, [topics.CHUNKS], compacted=True)
    producer = make_producer(cfg.bootstrap)
    await producer.start()
    try:
        store = KafkaChunkStore(cfg.bootstrap, producer, cache)
        if read:
            await store.start()
        try:
            yield store
        finally:
            await store.stop()
    finally:
        await producer.stop()


def _run(args: argparse.Namespace, work: Callable[[ChunkStore], Awaitable[int]]) -> int:
    name = f"fx chunk {args.chunk_cmd}"
    try:
        check_workload_id(args.workload)
        cfg = _config(args)
        security = cfg.client_security()
    except (ConfigError, ValueError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2

    async def main() -> int:
        async with _store(cfg, read=args.chunk_cmd == "get") as store:
            return await work(store)

    try:
        if security is None or cfg.chunk_backend == "fs":
            return asyncio.run(main())
        with use_security(security):
            return asyncio.run(main())
    except OutcomeError as exc:
        print(f"{name}: {exc.code}: {exc.message}", file=sys.stderr)
        return 1


def _put(args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        data = sys.stdin.buffer.read() if args.file == "-" else path.read_bytes()
    except OSError as exc:
        print(f"fx chunk put: cannot read {args.file}: {exc}", file=sys.stderr)
        return 2

    async def work(store: ChunkStore) -> int:
        ref = await store.put(data, workload=args.workload, media_type=args.media_type)
        print(json.dumps(ref.model_dump(mode="json", exclude_none=True), sort_keys=True))
        return 0

    return _run(args, work)


def _get(args: argparse.Namespace) -> int:
    if not is_hash(args.hash):
        print(f"fx chunk get: not a sha256:<64 hex> hash: {args.hash!r}", file=sys.stderr)
        return 2
    ref = ChunkRef(hash=args.hash, size=args.size)

    async def work(store: ChunkStore) -> int:
        data = await store.get(ref, workload=args.workload)
        if args.output in (None, "-"):
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            Path(args.output).write_bytes(data)
        return 0

    return _run(args, work)


def add_chunk(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx chunk put|get``."""
    chunk = subparsers.add_parser(
        "chunk", help="the chunk store (bodies over the 64 KiB inline limit), per workload")
    sub = chunk.add_subparsers(dest="chunk_cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--workload", required=True,
                       help="the workload the chunk belongs to (only its requests may read it)")
        p.add_argument("--config", help="executor config file (chunk_backend, chunk_dir, "
                       "bootstrap, kafka_security)")
        p.add_argument("--backend", choices=("fs", "kafka"),
                       help="override the config's chunk_backend")
        p.add_argument("--dir", help="override the config's chunk_dir")
        p.add_argument("--bootstrap", help="override the config's bootstrap (kafka backend)")

    put = sub.add_parser("put", help="store FILE (or - for stdin) for a workload; print its "
                         "reference as JSON")
    put.add_argument("file", metavar="FILE")
    put.add_argument("--media-type", help="recorded in the reference (e.g. audio/wav)")
    common(put)
    put.set_defaults(func=_put)
    get = sub.add_parser("get", help="write a workload's chunk (hash-checked) to stdout or -o")
    get.add_argument("hash", metavar="HASH")
    get.add_argument("--size", type=int, required=True, help="the reference's size in bytes")
    get.add_argument("-o", "--output", help="file to write (default: stdout)")
    common(get)
    get.set_defaults(func=_get)
