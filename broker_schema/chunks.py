"""The chunk format, in one place: where a chunk lives and how it is read back. Pure, no I/O.

A chunk is a body over the inline limit, named by ``sha256:`` of its bytes and stored **per
workload** (a chunk stored for one workload is not there for another, even with the same bytes).
Two stores hold chunks, and both services (the executor's :mod:`executor.chunks`, the lease
holder's and replay's reader in :mod:`fx_kafka.refs`) read and write them through this module:

- a filesystem store: the file ``<dir>/wl/<workload>/sha256/<hex>`` (:func:`fs_relpath`);
- the compacted topic ``sys.chunks`` (one partition): a chunk is split into parts of at most
  :data:`PART_BYTES` (:func:`split_parts`), part ``i`` of ``n`` keyed ``<workload>/<hash>/<i>/<n>``
  (:func:`part_key`, read back by :func:`parse_part_key`), each part's headers repeating the
  workload, chunk hash, part number and total size (:func:`part_headers`). A part whose value is
  null (a tombstone) deletes that part.

Reading back is always checked: :func:`assemble` joins the parts of a chunk, and
:func:`check_chunk` compares the bytes with the reference's hash and size; either raises a
:class:`ChunkProblem` (``missing`` or ``mismatch``) that says what was looked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from broker_schema.canonical import hex_of_hash, is_hash, sha256_hex
from broker_schema.records import ChunkRef
from broker_schema.topics import check_workload_id

__all__ = [
    "PART_BYTES",
    "ChunkProblem",
    "assemble",
    "check_chunk",
    "chunk_ref_of",
    "fs_relpath",
    "join_parts",
    "parse_part_key",
    "part_headers",
    "part_key",
    "split_parts",
]

#: Largest part written to ``sys.chunks``: under MAX_RECORD_BYTES (1 MiB), leaving room for the
#: key, headers and batch overhead inside the broker frame cap.
PART_BYTES = 1_000_000


class ChunkProblem(ValueError):
    """A chunk that cannot be read back: ``missing`` (not there, or a part of it is not),
    ``mismatch`` (its bytes do not hash to the reference, or have another size, or a sealed
    chunk does not open: :mod:`broker_schema.chunk_crypto`) or ``redacted`` (its data key or its
    tenant key was destroyed: ``fx redact``)."""

    def __init__(self, why: Literal["missing", "mismatch", "redacted"], message: str) -> None:
        super().__init__(message)
        self.why = why
        self.message = message


def chunk_ref_of(data: bytes, *, media_type: str | None = None) -> ChunkRef:
    """The reference of ``data``: its ``sha256:`` hash and size (the owner is left out: the
    workload the reference is read in)."""
    return ChunkRef(hash=sha256_hex(data), size=len(data), media_type=media_type)


def check_chunk(ref: ChunkRef, data: bytes) -> bytes:
    """``data`` if it matches ``ref`` (hash and size), else :class:`ChunkProblem`
    (``mismatch``)."""
    actual = sha256_hex(data)
    if actual != ref.hash or len(data) != ref.size:
        raise ChunkProblem("mismatch", f"chunk {ref.hash} ({ref.size} B) read back as {actual} "
                           f"({len(data)} B)")
    return data


def fs_relpath(workload: str, chunk_hash: str) -> str:
    """The path of ``workload``'s chunk ``chunk_hash`` under a filesystem store's directory:
    ``wl/<workload>/sha256/<hex>`` (``ValueError`` for a bad workload id or hash)."""
    return f"wl/{check_workload_id(workload)}/sha256/{hex_of_hash(chunk_hash)}"


def part_key(workload: str, chunk_hash: str, index: int, total: int) -> bytes:
    """The ``sys.chunks`` key of part ``index`` of ``total`` of ``workload``'s chunk."""
    return f"{workload}/{chunk_hash}/{index}/{total}".encode()


def parse_part_key(key: bytes | None) -> tuple[str, str, int, int] | None:
    """``(workload, hash, part, parts)`` of a part's key; None for anything else (keys of the
    store before it was per workload, ``<hash>/<i>/<n>``, included)."""
    if key is None:
        return None
    try:
        w, h, i, n = key.decode().split("/")
        check_workload_id(w)
        return (w, h, int(i), int(n)) if is_hash(h) else None
    except ValueError:
        return None


def part_headers(workload: str, chunk_hash: str, index: int, total: int,
                 size: int) -> list[tuple[str, bytes]]:
    """The headers of one part on ``sys.chunks``."""
    return [
        ("fx-workload", workload.encode()),
        ("fx-chunk", chunk_hash.encode()),
        ("fx-part", f"{index}/{total}".encode()),
        ("fx-size", str(size).encode()),
    ]


def split_parts(data: bytes) -> list[bytes]:
    """``data`` cut into parts of at most :data:`PART_BYTES` (one empty part for no bytes)."""
    total = max(1, -(-len(data) // PART_BYTES))
    return [data[i * PART_BYTES:(i + 1) * PART_BYTES] for i in range(total)]


def assemble(ref: ChunkRef, workload: str, parts: Mapping[int, bytes], total: int | None, *,
             where: str) -> bytes:
    """The bytes of ``workload``'s chunk ``ref`` from its parts (index -> bytes, ``total`` parts
    in all, None when no part was seen), hash-checked. :class:`ChunkProblem` (``missing``) when
    a part is not there, naming the chunk and ``where`` it was looked for; ``mismatch`` when the
    bytes are not the reference's."""
    return check_chunk(ref, join_parts(ref, workload, parts, total, where=where))


def join_parts(ref: ChunkRef, workload: str, parts: Mapping[int, bytes], total: int | None, *,
               where: str) -> bytes:
    """The stored bytes of ``workload``'s chunk ``ref`` from its parts, not checked (sealed
    chunks are opened, then checked: :func:`fx_kafka.tenant_keys.open_from_store`);
    :class:`ChunkProblem` (``missing``) as :func:`assemble`."""
    if total is None:
        raise ChunkProblem("missing", f"no chunk {ref.hash} ({ref.size} B) of workload "
                           f"{workload} {where}")
    absent = [i for i in range(total) if i not in parts]
    if absent:
        raise ChunkProblem("missing", f"chunk {ref.hash} ({ref.size} B) of workload {workload} "
                           f"lacks part(s) {absent[:8]} of {total} {where}")
    return b"".join(parts[i] for i in range(total))
