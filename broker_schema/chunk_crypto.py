"""How a chunk is stored encrypted, in one place: the sealed bytes and the wrapped data key.
Pure (no I/O); ``cryptography`` (AES-GCM) is imported on first use.

A chunk's **content address stays the sha256 of its plaintext** (:class:`~broker_schema.records.
ChunkRef`), so responses, receipts and merge entries verify as before. What a chunk store holds:

- the **sealed chunk** (the file, or the parts on ``sys.chunks``): :data:`MAGIC`, a 12-byte
  nonce, then AES-256-GCM of the plaintext under a random **data key** made for this chunk, with
  the associated data ``fx-chunk/<workload>/<hash>`` (a sealed chunk moved under another name
  does not open);
- the **key entry** (:class:`KeyEntry`, JSON): the data key wrapped (AES-256-GCM) by the
  **tenant key** ``key_id`` of the chunk's tenant, with the associated data
  ``fx-chunk-key/<workload>/<hash>/<tenant>/<key_id>``. On ``sys.chunks`` it is keyed
  ``<workload>/<hash>/key`` (:func:`key_entry_key`); in a filesystem store it is the file
  :func:`fs_key_relpath`. A tenant is a workload (docs/security.md, "Chunk encryption").

Redaction destroys the key entry (a tombstone, or the file removed): the sealed chunk stays and
no longer opens. Destroying a tenant key makes every key entry it wraps useless. Rotation wraps
the data keys again under a newer tenant key: the sealed chunks are not touched.

A stored value that hashes to the reference itself is a chunk written before encryption (read as
it is). Anything else that fails raises :class:`ChunkKeyError` (``wrong_key``: the tenant key does
not unwrap the entry; ``tampered``: the sealed bytes or the entry were changed; ``redacted``: no key
entry, or no tenant key).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from broker_schema.canonical import hex_of_hash
from broker_schema.topics import check_workload_id

__all__ = [
    "DATA_KEY_BYTES",
    "MAGIC",
    "ChunkKeyError",
    "KeyEntry",
    "fs_key_relpath",
    "fs_keys_dir",
    "is_sealed",
    "key_entry_key",
    "new_data_key",
    "open_chunk",
    "parse_key_entry_key",
    "redaction_key",
    "rewrap",
    "seal_chunk",
    "unwrap",
    "wrap",
    "wrapped_under",
]

#: The first bytes of a sealed chunk.
MAGIC = b"\x00FXC1"
NONCE_BYTES = 12
DATA_KEY_BYTES = 32


class ChunkKeyError(ValueError):
    """A sealed chunk that does not open: ``wrong_key`` (the tenant key is not the one that
    wrapped the data key), ``tampered`` (the sealed bytes or the key entry fail their tag),
    ``redacted`` (its data key, or its tenant key, was destroyed)."""

    def __init__(self, why: Literal["wrong_key", "tampered", "redacted"], message: str) -> None:
        super().__init__(message)
        self.why = why
        self.message = message


@dataclass(frozen=True)
class KeyEntry:
    """A chunk's data key, wrapped by its tenant's key ``key_id``."""

    tenant: str
    key_id: str
    nonce: bytes
    wrapped: bytes

    def to_bytes(self) -> bytes:
        """The entry as stored (JSON, keys sorted)."""
        return json.dumps({"v": 1, "tenant": self.tenant, "key_id": self.key_id,
                           "nonce": base64.b64encode(self.nonce).decode(),
                           "wrapped": base64.b64encode(self.wrapped).decode()},
                          sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyEntry:
        """Parse a stored entry (:class:`ChunkKeyError` ``tampered`` if it is not one)."""
        try:
            raw = json.loads(data)
            return cls(tenant=str(raw["tenant"]), key_id=str(raw["key_id"]),
                       nonce=base64.b64decode(raw["nonce"], validate=True),
                       wrapped=base64.b64decode(raw["wrapped"], validate=True))
        except (ValueError, KeyError, TypeError) as exc:
            raise ChunkKeyError("tampered", f"not a chunk key entry: {exc}") from None


if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def _aead(key: bytes) -> AESGCM:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM(key)


def _chunk_aad(workload: str, chunk_hash: str) -> bytes:
    return f"fx-chunk/{workload}/{chunk_hash}".encode()


def _key_aad(workload: str, chunk_hash: str, tenant: str, key_id: str) -> bytes:
    return f"fx-chunk-key/{workload}/{chunk_hash}/{tenant}/{key_id}".encode()


def new_data_key() -> bytes:
    """A fresh random data key (32 bytes, AES-256)."""
    return os.urandom(DATA_KEY_BYTES)


def is_sealed(stored: bytes) -> bool:
    """Whether ``stored`` begins like a sealed chunk."""
    return stored.startswith(MAGIC)


def seal_chunk(plaintext: bytes, data_key: bytes, *, workload: str, chunk_hash: str) -> bytes:
    """``plaintext`` sealed under ``data_key`` (a fresh nonce each time)."""
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce + _aead(data_key).encrypt(nonce, plaintext,
                                                   _chunk_aad(workload, chunk_hash))


def open_chunk(stored: bytes, data_key: bytes, *, workload: str, chunk_hash: str) -> bytes:
    """The plaintext of a sealed chunk (:class:`ChunkKeyError` ``tampered`` when its tag fails:
    changed bytes, another chunk's name, or another data key)."""
    from cryptography.exceptions import InvalidTag

    if not is_sealed(stored) or len(stored) < len(MAGIC) + NONCE_BYTES + 16:
        raise ChunkKeyError("tampered", f"chunk {chunk_hash} of {workload} is not sealed")
    nonce = stored[len(MAGIC):len(MAGIC) + NONCE_BYTES]
    try:
        return _aead(data_key).decrypt(nonce, stored[len(MAGIC) + NONCE_BYTES:],
                                       _chunk_aad(workload, chunk_hash))
    except InvalidTag:
        raise ChunkKeyError("tampered", f"sealed chunk {chunk_hash} of {workload} fails its "
                            "tag: changed bytes") from None


def wrap(data_key: bytes, tenant_key: bytes, *, tenant: str, key_id: str, workload: str,
         chunk_hash: str) -> KeyEntry:
    """``data_key`` wrapped by ``tenant_key`` (``key_id`` of ``tenant``)."""
    nonce = os.urandom(NONCE_BYTES)
    wrapped = _aead(tenant_key).encrypt(nonce, data_key,
                                        _key_aad(workload, chunk_hash, tenant, key_id))
    return KeyEntry(tenant=tenant, key_id=key_id, nonce=nonce, wrapped=wrapped)


def unwrap(entry: KeyEntry, tenant_key: bytes, *, workload: str, chunk_hash: str) -> bytes:
    """The data key of ``entry`` (:class:`ChunkKeyError` ``wrong_key`` when ``tenant_key`` does
    not unwrap it: another key, or a changed entry)."""
    from cryptography.exceptions import InvalidTag

    try:
        return _aead(tenant_key).decrypt(
            entry.nonce, entry.wrapped,
            _key_aad(workload, chunk_hash, entry.tenant, entry.key_id))
    except InvalidTag:
        raise ChunkKeyError("wrong_key", f"tenant key {entry.tenant}/{entry.key_id} does not "
                            f"unwrap the data key of chunk {chunk_hash} (another key, or a "
                            "changed entry)") from None


def rewrap(entry: KeyEntry, old_key: bytes, new_key: bytes, *, new_key_id: str, workload: str,
           chunk_hash: str) -> KeyEntry:
    """``entry``'s data key wrapped again under ``new_key`` (rotation; the chunk is untouched)."""
    data_key = unwrap(entry, old_key, workload=workload, chunk_hash=chunk_hash)
    return wrap(data_key, new_key, tenant=entry.tenant, key_id=new_key_id, workload=workload,
                chunk_hash=chunk_hash)


def key_entry_key(workload: str, chunk_hash: str) -> bytes:
    """The ``sys.chunks`` key of ``workload``'s chunk's key entry: ``<workload>/<hash>/key``."""
    return f"{workload}/{chunk_hash}/key".encode()


def redaction_key(workload: str, chunk_hash: str) -> bytes:
    """The ``sys.chunks`` key of the redaction record of ``workload``'s chunk:
    ``<workload>/<hash>/redaction`` (never tombstoned: compaction keeps it)."""
    return f"{workload}/{chunk_hash}/redaction".encode()


def parse_key_entry_key(key: bytes | None) -> tuple[str, str, Literal["key", "redaction"]] | None:
    """``(workload, hash, "key" | "redaction")`` of a key entry's or a redaction record's key
    on ``sys.chunks``; None for anything else (a part's key among them)."""
    if key is None:
        return None
    try:
        w, h, tail = key.decode().split("/")
        hex_of_hash(h)
        w = check_workload_id(w)
    except ValueError:
        return None
    if tail == "key":
        return w, h, "key"
    if tail == "redaction":
        return w, h, "redaction"
    return None


def fs_key_relpath(workload: str, chunk_hash: str) -> str:
    """The key entry's file under a filesystem store: ``wl/<workload>/keys/<hex>``."""
    return f"{fs_keys_dir(workload)}/{hex_of_hash(chunk_hash)}"


def fs_keys_dir(workload: str) -> str:
    """The directory of ``workload``'s key entries under a filesystem store."""
    return f"wl/{check_workload_id(workload)}/keys"


def wrapped_under(entry: KeyEntry, key_id: str) -> bool:
    """Whether ``entry`` is wrapped by tenant key ``key_id`` already (rotation skips it)."""
    return entry.key_id == key_id
