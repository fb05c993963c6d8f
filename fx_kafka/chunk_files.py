"""A chunk store's files: the one atomic, idempotent write of a chunk under a directory, its
checked read, and its redaction.

The executor's :class:`executor.chunks.FsChunkStore` and the lease holder's
:class:`workload_sdk._refs_io.FsChunks` share a directory layout
(:func:`broker_schema.chunks.fs_relpath`, ``<workload>/<hash>``), so they share these. A chunk is
stored sealed (:mod:`broker_schema.chunk_crypto`): the file holds the sealed bytes, and its key
entry (the data key wrapped by the tenant key, :mod:`fx_kafka.tenant_keys`) is the file
:func:`broker_schema.chunk_crypto.fs_key_relpath`. A chunk already there that opens to exactly
these bytes is left alone; anything else (missing, damaged, or redacted) is written again, key
entry first, each through a temporary file and ``os.replace``, so a reader never sees half a
chunk. (The local cache of :class:`executor.chunks.KafkaChunkStore` is such a directory; that
store asks ``sys.chunks`` whether a chunk's key entry is still there before it opens the cached
one, so a redaction on the topic reaches every cache.) Blocking: callers run these in a thread.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from broker_schema.canonical import hex_of_hash
from broker_schema.chunk_crypto import fs_key_relpath, is_sealed
from broker_schema.chunks import ChunkProblem, chunk_ref_of, fs_relpath
from broker_schema.records import ChunkRef
from broker_schema.topics import check_workload_id
from fx_kafka.tenant_keys import TenantKeys, open_from_store, seal_for_store

__all__ = ["fs_redaction_relpath", "read_chunk_file", "redact_chunk_file", "store_files",
           "stored_files", "write_chunk_file"]


def fs_redaction_relpath(workload: str, chunk_hash: str) -> str:
    """The redaction record of a chunk under a filesystem store: ``wl/<w>/redactions/<hex>``."""
    return f"wl/{check_workload_id(workload)}/redactions/{hex_of_hash(chunk_hash)}"


def _replace(final: Path, data: bytes) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".put-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_chunk_file(root: Path, ref: ChunkRef, *, workload: str,
                    keys: TenantKeys | None = None) -> bytes:
    """``workload``'s chunk ``ref`` under ``root``, opened (tenant keys ``keys``, default
    :class:`~fx_kafka.tenant_keys.TenantKeys()`) and hash-checked;
    :class:`~broker_schema.chunks.ChunkProblem` (``missing``, ``mismatch``, ``redacted``)."""
    path = root / fs_relpath(workload, ref.hash)
    try:
        stored = path.read_bytes()
    except FileNotFoundError:
        raise ChunkProblem("missing", f"no chunk {ref.hash} ({ref.size} B) of workload "
                           f"{workload} in {root} (no file {path})") from None
    entry: bytes | None
    try:
        entry = (root / fs_key_relpath(workload, ref.hash)).read_bytes()
    except FileNotFoundError:
        entry = None
    reason = None
    with contextlib.suppress(OSError):
        reason = (root / fs_redaction_relpath(workload, ref.hash)).read_text()[:500]
    if reason is not None:  # a redacted chunk stays redacted, whatever was put since
        entry = None
    return open_from_store(stored, entry, ref, workload=workload, keys=keys or TenantKeys(),
                           redaction=reason)


def stored_files(root: Path, workload: str, chunk_hash: str) -> tuple[bytes, bytes | None]:
    """The sealed bytes and key entry of a chunk under ``root`` (as written), to copy them
    elsewhere (``sys.chunks``); ``FileNotFoundError`` when the chunk is not there."""
    stored = (root / fs_relpath(workload, chunk_hash)).read_bytes()
    try:
        entry: bytes | None = (root / fs_key_relpath(workload, chunk_hash)).read_bytes()
    except FileNotFoundError:
        entry = None
    return stored, entry


def write_chunk_file(root: Path, data: bytes, *, workload: str,
                     media_type: str | None = None,
                     keys: TenantKeys | None = None) -> ChunkRef:
    """Store ``data`` as ``workload``'s chunk under ``root``, sealed under the tenant's key
    (``keys``, default :class:`~fx_kafka.tenant_keys.TenantKeys()`), and return its reference."""
    ref = chunk_ref_of(data, media_type=media_type)
    final = root / fs_relpath(workload, ref.hash)
    tenant_keys = keys or TenantKeys()
    # Only a file that really opens to these bytes makes the write unnecessary: a damaged file
    # (a flipped byte) is replaced, so a cache repaired from sys.chunks stays repaired.
    if (root / fs_redaction_relpath(workload, ref.hash)).exists():
        return ref  # redacted: putting the same bytes again does not bring them back
    if final.exists():
        with contextlib.suppress(ChunkProblem):
            read_chunk_file(root, ref, workload=workload, keys=tenant_keys)
            return ref
    sealed, entry = seal_for_store(data, ref, workload=workload, keys=tenant_keys)
    _replace(root / fs_key_relpath(workload, ref.hash), entry)
    _replace(final, sealed)
    return ref


def store_files(root: Path, workload: str, chunk_hash: str, stored: bytes,
                entry: bytes | None) -> None:
    """Write a chunk's sealed bytes and key entry under ``root`` as they are (a cache filled
    from ``sys.chunks``): key entry first."""
    if entry is not None:
        _replace(root / fs_key_relpath(workload, chunk_hash), entry)
    _replace(root / fs_relpath(workload, chunk_hash), stored)


def redact_chunk_file(root: Path, workload: str, chunk_hash: str, record: bytes) -> bool:
    """Redact ``workload``'s chunk ``chunk_hash`` under ``root``: write the redaction
    ``record`` and destroy the chunk's key entry (overwritten, then removed); the sealed chunk
    stays (it no longer opens); a chunk stored before encryption (plaintext) is destroyed the
    same way. Whether a chunk of that name was there."""
    _replace(root / fs_redaction_relpath(workload, chunk_hash), record)
    found = False
    chunk = root / fs_relpath(workload, chunk_hash)
    doomed = [root / fs_key_relpath(workload, chunk_hash)]
    if chunk.exists():
        found = True
        if not is_sealed(chunk.read_bytes()):
            doomed.append(chunk)
    for path in doomed:
        if path.exists():
            size = path.stat().st_size
            with open(path, "r+b") as f:
                f.write(b"\0" * size)
                f.flush()
                os.fsync(f.fileno())
            path.unlink()
    return found
