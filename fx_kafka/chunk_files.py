"""A chunk store's files: the one atomic, idempotent write of a chunk under a directory.

The executor's :class:`executor.chunks.FsChunkStore` and the lease holder's
:class:`workload_sdk._refs_io.FsChunks` share a directory layout
(:func:`broker_schema.chunks.fs_relpath`, ``<workload>/<hash>``), so they share this write too:
a file that already holds exactly these bytes is left alone, anything else (missing, or damaged
with the same size) is replaced through a temporary file and ``os.replace``, so a reader never
sees half a chunk. Blocking: callers run it in a thread.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from broker_schema.canonical import sha256_hex
from broker_schema.chunks import chunk_ref_of, fs_relpath
from broker_schema.records import ChunkRef

__all__ = ["write_chunk_file"]


def write_chunk_file(root: Path, data: bytes, *, workload: str,
                     media_type: str | None = None) -> ChunkRef:
    """Store ``data`` as ``workload``'s chunk under ``root`` and return its reference."""
    ref = chunk_ref_of(data, media_type=media_type)
    final = root / fs_relpath(workload, ref.hash)
    # Only a file that really holds these bytes makes the write unnecessary: a damaged file of
    # the same size (a flipped byte) is replaced, so a cache repaired from sys.chunks stays
    # repaired.
    if final.exists() and final.stat().st_size == len(data) and \
            sha256_hex(final.read_bytes()) == ref.hash:
        return ref
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=".put-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return ref
