"""Chunks stored sealed under per-chunk data keys wrapped by tenant keys
(:mod:`broker_schema.chunk_crypto`, :mod:`fx_kafka.tenant_keys`, :mod:`fx_kafka.chunk_files`):
round trip, wrong key, tampered bytes and entries, redaction, tenant-key destruction, rotation."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_schema.canonical import sha256_hex
from broker_schema.chunk_crypto import (
    ChunkKeyError,
    KeyEntry,
    fs_key_relpath,
    is_sealed,
    key_entry_key,
    new_data_key,
    open_chunk,
    parse_key_entry_key,
    redaction_key,
    rewrap,
    seal_chunk,
    unwrap,
    wrap,
)
from broker_schema.chunks import ChunkProblem, chunk_ref_of, fs_relpath
from fx_kafka.chunk_files import read_chunk_file, redact_chunk_file, write_chunk_file
from fx_kafka.tenant_keys import TenantKeys, open_from_store, seal_for_store

WL = "tenant-a"
DATA = b"personal data " * 100
H = sha256_hex(DATA)


def test_seal_and_open_round_trip_and_the_address_is_the_plaintexts() -> None:
    key = new_data_key()
    sealed = seal_chunk(DATA, key, workload=WL, chunk_hash=H)
    assert is_sealed(sealed) and DATA not in sealed
    assert sealed != seal_chunk(DATA, key, workload=WL, chunk_hash=H)  # a fresh nonce
    assert open_chunk(sealed, key, workload=WL, chunk_hash=H) == DATA
    assert chunk_ref_of(DATA).hash == H  # what records name is unchanged


def test_a_wrong_data_key_or_tampered_bytes_or_another_name_fail_typed() -> None:
    key = new_data_key()
    sealed = seal_chunk(DATA, key, workload=WL, chunk_hash=H)
    with pytest.raises(ChunkKeyError) as wrong:
        open_chunk(sealed, new_data_key(), workload=WL, chunk_hash=H)
    assert wrong.value.why == "tampered"
    flipped = bytearray(sealed)
    flipped[-5] ^= 1
    with pytest.raises(ChunkKeyError) as tampered:
        open_chunk(bytes(flipped), key, workload=WL, chunk_hash=H)
    assert tampered.value.why == "tampered" and "changed bytes" in tampered.value.message
    with pytest.raises(ChunkKeyError):  # moved under another workload's name
        open_chunk(sealed, key, workload="tenant-b", chunk_hash=H)


def test_wrap_unwrap_wrong_tenant_key_and_a_changed_entry() -> None:
    tenant_key, data_key = new_data_key(), new_data_key()
    entry = wrap(data_key, tenant_key, tenant=WL, key_id="k1", workload=WL, chunk_hash=H)
    again = KeyEntry.from_bytes(entry.to_bytes())
    assert unwrap(again, tenant_key, workload=WL, chunk_hash=H) == data_key
    with pytest.raises(ChunkKeyError) as wrong:
        unwrap(again, new_data_key(), workload=WL, chunk_hash=H)
    assert wrong.value.why == "wrong_key"
    relabelled = KeyEntry(tenant=WL, key_id="k2", nonce=entry.nonce, wrapped=entry.wrapped)
    with pytest.raises(ChunkKeyError):
        unwrap(relabelled, tenant_key, workload=WL, chunk_hash=H)
    with pytest.raises(ChunkKeyError) as garbage:
        KeyEntry.from_bytes(b"{not json")
    assert garbage.value.why == "tampered"


def test_rotation_rewraps_the_data_key_and_the_sealed_chunk_still_opens() -> None:
    old, new, data_key = new_data_key(), new_data_key(), new_data_key()
    sealed = seal_chunk(DATA, data_key, workload=WL, chunk_hash=H)
    entry = wrap(data_key, old, tenant=WL, key_id="k1", workload=WL, chunk_hash=H)
    rotated = rewrap(entry, old, new, new_key_id="k2", workload=WL, chunk_hash=H)
    assert rotated.key_id == "k2"
    opened = unwrap(rotated, new, workload=WL, chunk_hash=H)
    assert open_chunk(sealed, opened, workload=WL, chunk_hash=H) == DATA
    with pytest.raises(ChunkKeyError):
        unwrap(rotated, old, workload=WL, chunk_hash=H)


def test_keys_on_sys_chunks_are_told_apart_from_parts() -> None:
    assert parse_key_entry_key(key_entry_key(WL, H)) == (WL, H, "key")
    assert parse_key_entry_key(redaction_key(WL, H)) == (WL, H, "redaction")
    assert parse_key_entry_key(f"{WL}/{H}/0/1".encode()) is None
    assert parse_key_entry_key(f"{WL}/tenant/redaction".encode()) is None
    assert parse_key_entry_key(None) is None


def test_open_from_store_types_every_failure(tmp_path: Path) -> None:
    keys = TenantKeys(tmp_path / "keys")
    ref = chunk_ref_of(DATA)
    sealed, entry = seal_for_store(DATA, ref, workload=WL, keys=keys)
    assert open_from_store(sealed, entry, ref, workload=WL, keys=keys) == DATA
    # a chunk stored before encryption is read as it is (hash-checked)
    assert open_from_store(DATA, None, ref, workload=WL, keys=keys) == DATA
    with pytest.raises(ChunkProblem) as redacted:
        open_from_store(sealed, None, ref, workload=WL, keys=keys, redaction="by op: gdpr")
    assert redacted.value.why == "redacted" and "gdpr" in redacted.value.message
    with pytest.raises(ChunkProblem) as elsewhere:  # another machine without the tenant key
        open_from_store(sealed, entry, ref, workload=WL, keys=TenantKeys(tmp_path / "none"))
    assert elsewhere.value.why == "redacted"
    other = TenantKeys(tmp_path / "other")
    other_id = other.create(WL)
    forged = KeyEntry.from_bytes(entry)
    (other.root / WL / f"{other_id}.key").rename(other.root / WL / f"{forged.key_id}.key")
    with pytest.raises(ChunkProblem) as wrong:
        open_from_store(sealed, entry, ref, workload=WL, keys=other)
    assert wrong.value.why == "mismatch" and "does not unwrap" in wrong.value.message
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(ChunkProblem) as bad:
        open_from_store(tampered, entry, ref, workload=WL, keys=keys)
    assert bad.value.why == "mismatch"


def test_the_fs_store_seals_redacts_and_loses_a_tenant(tmp_path: Path) -> None:
    keys = TenantKeys(tmp_path / "keys")
    root = tmp_path / "chunks"
    ref = write_chunk_file(root, DATA, workload=WL, keys=keys)
    assert ref.hash == H
    stored = (root / fs_relpath(WL, H)).read_bytes()
    assert is_sealed(stored) and DATA[:20] not in stored  # a stolen disk holds ciphertext
    assert (root / fs_key_relpath(WL, H)).exists()
    # idempotent: a second put leaves the sealed file as it is
    write_chunk_file(root, DATA, workload=WL, keys=keys)
    assert (root / fs_relpath(WL, H)).read_bytes() == stored
    assert read_chunk_file(root, ref, workload=WL, keys=keys) == DATA
    # redaction: the key entry is destroyed, the sealed chunk stays, the reason is said
    assert redact_chunk_file(root, WL, H, b'{"reason":"gdpr art. 17"}')
    assert (root / fs_relpath(WL, H)).read_bytes() == stored
    with pytest.raises(ChunkProblem) as redacted:
        read_chunk_file(root, ref, workload=WL, keys=keys)
    assert redacted.value.why == "redacted" and "gdpr art. 17" in redacted.value.message
    # putting the same bytes again does not bring them back
    write_chunk_file(root, DATA, workload=WL, keys=keys)
    with pytest.raises(ChunkProblem):
        read_chunk_file(root, ref, workload=WL, keys=keys)
    # another chunk of the tenant, then the tenant key destroyed: redacted too
    other = b"other bytes " * 50
    other_ref = write_chunk_file(root, other, workload=WL, keys=keys)
    assert read_chunk_file(root, other_ref, workload=WL, keys=keys) == other
    assert keys.destroy(WL)
    with pytest.raises(ChunkProblem) as gone:
        read_chunk_file(root, other_ref, workload=WL, keys=keys)
    assert gone.value.why == "redacted" and "tenant key" in gone.value.message


def test_tenant_keys_newest_first_and_destroy_one(tmp_path: Path) -> None:
    keys = TenantKeys(tmp_path)
    first, _ = keys.current(WL)
    assert keys.current(WL)[0] == first  # made once
    second = keys.create(WL)
    assert keys.current(WL)[0] == second and keys.key_ids(WL) == [first, second]
    assert (tmp_path / WL / f"{second}.key").stat().st_mode & 0o777 == 0o600
    keys.destroy(WL, first)
    assert keys.get(WL, first) is None and keys.key_ids(WL) == [second]
