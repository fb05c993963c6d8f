"""The tenant keys in a local key directory, and sealing / opening chunks with them.

A tenant is a workload (docs/security.md, "Chunk encryption"). Its keys are files
``<dir>/<tenant>/<key_id>.key`` (32 random bytes, mode 0600, the directory 0700), kept the way an
executor keeps its node key: on the machine, never on the broker. ``<dir>`` is
``$FX_TENANT_KEY_DIR``, else ``~/.local/share/ninelives-fx/tenant-keys`` (one per user and machine,
not per service data directory, so every service of one machine shares it; on several machines the
operator copies the directory, as with TLS keys). The newest key id (they sort by time) is the
one new chunks are wrapped under; older ones stay until rotation has re-wrapped every entry and
the operator destroys them.

:func:`seal_for_store` and :func:`open_from_store` are what every chunk writer and reader calls
(:mod:`fx_kafka.chunk_files`, :mod:`fx_kafka.refs`, :mod:`executor.chunks`,
:mod:`workload_sdk._refs_io`): the format is :mod:`broker_schema.chunk_crypto`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

from broker_schema.chunk_crypto import (
    ChunkKeyError,
    KeyEntry,
    is_sealed,
    new_data_key,
    open_chunk,
    seal_chunk,
    unwrap,
    wrap,
)
from broker_schema.chunks import ChunkProblem, check_chunk
from broker_schema.records import ChunkRef
from broker_schema.topics import check_workload_id

__all__ = ["TenantKeys", "default_tenant_key_dir", "open_from_store", "seal_for_store"]

TENANT_KEY_BYTES = 32


def default_tenant_key_dir() -> Path:
    """``$FX_TENANT_KEY_DIR`` or ``~/.local/share/ninelives-fx/tenant-keys``."""
    env = os.environ.get("FX_TENANT_KEY_DIR")
    return Path(env) if env else Path.home() / ".local" / "share" / "ninelives-fx" / "tenant-keys"


class TenantKeys:
    """The tenant keys under ``root`` (default :func:`default_tenant_key_dir`)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_tenant_key_dir()

    def _dir(self, tenant: str) -> Path:
        return self.root / check_workload_id(tenant)

    def key_ids(self, tenant: str) -> list[str]:
        """``tenant``'s key ids, oldest first."""
        d = self._dir(tenant)
        if not d.is_dir():
            return []
        return sorted(p.stem for p in d.glob("*.key"))

    def get(self, tenant: str, key_id: str) -> bytes | None:
        """Key ``key_id`` of ``tenant``; None when it is not here (destroyed, or never here)."""
        try:
            data = (self._dir(tenant) / f"{key_id}.key").read_bytes()
        except (FileNotFoundError, ValueError):
            return None
        return data if len(data) == TENANT_KEY_BYTES else None

    def create(self, tenant: str) -> str:
        """Make a new key for ``tenant`` (the newest from now on) and return its id."""
        d = self._dir(tenant)
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        key_id = f"k{time.time_ns():020d}"
        path = d / f"{key_id}.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(TENANT_KEY_BYTES))
        return key_id

    def current(self, tenant: str) -> tuple[str, bytes]:
        """The newest key of ``tenant`` (made on first use)."""
        for _ in range(3):
            ids = self.key_ids(tenant)
            if not ids:
                with contextlib.suppress(FileExistsError):  # another process, same instant
                    self.create(tenant)
                continue
            key = self.get(tenant, ids[-1])
            if key is not None:
                return ids[-1], key
            time.sleep(0.01)  # being written by another process
        raise OSError(f"no usable tenant key for {tenant} under {self.root}")

    def destroy(self, tenant: str, key_id: str | None = None) -> list[str]:
        """Destroy key ``key_id`` of ``tenant`` (every key when None); the ids destroyed."""
        d = self._dir(tenant)
        ids = self.key_ids(tenant) if key_id is None else [key_id]
        for kid in ids:
            path = d / f"{kid}.key"
            if path.exists():
                with open(path, "r+b") as f:  # overwrite before unlinking
                    f.write(b"\0" * TENANT_KEY_BYTES)
                    f.flush()
                    os.fsync(f.fileno())
                path.unlink()
        if key_id is None and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
        return ids


def seal_for_store(data: bytes, ref: ChunkRef, *, workload: str,
                   keys: TenantKeys) -> tuple[bytes, bytes]:
    """``(sealed chunk, key entry)`` of ``workload``'s chunk ``data`` (reference ``ref``): a
    fresh data key, wrapped by the tenant's current key."""
    key_id, tenant_key = keys.current(workload)
    data_key = new_data_key()
    sealed = seal_chunk(data, data_key, workload=workload, chunk_hash=ref.hash)
    entry = wrap(data_key, tenant_key, tenant=workload, key_id=key_id, workload=workload,
                 chunk_hash=ref.hash)
    return sealed, entry.to_bytes()


def open_from_store(stored: bytes, entry: bytes | None, ref: ChunkRef, *, workload: str,
                    keys: TenantKeys, redaction: str | None = None) -> bytes:
    """The plaintext of ``workload``'s chunk ``ref`` from what a store holds (``stored``, and
    its key entry, None when there is none), hash-checked. A value that hashes to ``ref`` is a
    chunk stored before encryption. :class:`~broker_schema.chunks.ChunkProblem`: ``redacted``
    (no key entry, or the tenant key is gone: ``redaction`` says why, when a redaction record was
    found), ``mismatch`` (tampered bytes, a wrong key, or not the reference's bytes)."""
    if not is_sealed(stored):
        return check_chunk(ref, stored)
    where = f"chunk {ref.hash} of workload {workload}"
    if entry is None:
        raise ChunkProblem("redacted", f"{where} is redacted: its data key was destroyed"
                           + (f" ({redaction})" if redaction else ""))
    try:
        parsed = KeyEntry.from_bytes(entry)
        tenant_key = keys.get(parsed.tenant, parsed.key_id)
        if tenant_key is None:
            raise ChunkProblem("redacted", f"{where} is redacted: tenant key "
                               f"{parsed.tenant}/{parsed.key_id} is not in this machine's "
                               "tenant key directory (destroyed, or never copied here)")
        data_key = unwrap(parsed, tenant_key, workload=workload, chunk_hash=ref.hash)
        plain = open_chunk(stored, data_key, workload=workload, chunk_hash=ref.hash)
    except ChunkKeyError as exc:
        raise ChunkProblem("mismatch", f"{where}: {exc.message}") from None
    return check_chunk(ref, plain)
