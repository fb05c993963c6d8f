"""The filesystem chunk store: content addressing per workload and hash-checked reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker_schema.canonical import sha256_hex
from broker_schema.records import ChunkRef
from executor.chunks import FsChunkStore, check_chunk
from fx_node.errors import OutcomeError


async def test_put_get_roundtrip(tmp_path: Path) -> None:
    store = FsChunkStore(tmp_path)
    data = os.urandom(200_000)
    ref = await store.put(data, workload="wa", media_type="application/octet-stream")
    assert ref.hash == sha256_hex(data) and ref.size == len(data)
    assert await store.get(ref, workload="wa") == data
    assert await store.put(data, workload="wa") == ChunkRef(hash=ref.hash, size=ref.size)


async def test_missing_and_mismatched(tmp_path: Path) -> None:
    store = FsChunkStore(tmp_path)
    ghost = ChunkRef(hash="sha256:" + "d" * 64, size=3)
    with pytest.raises(OutcomeError) as info:
        await store.get(ghost, workload="wa")
    assert info.value.code == "input_missing"
    ref = await store.put(b"abcdef", workload="wa")
    store.path(ref.hash, "wa").write_bytes(b"abcdeF")
    with pytest.raises(OutcomeError) as info:
        await store.get(ref, workload="wa")
    assert info.value.code == "input_hash_mismatch"


def test_size_is_checked_too() -> None:
    ref = ChunkRef(hash=sha256_hex(b"abc"), size=4)
    with pytest.raises(OutcomeError):
        check_chunk(ref, b"abc")


async def test_damaged_file_of_the_right_size_is_repaired_by_put(tmp_path: Path) -> None:
    # a cached chunk with a flipped byte used to stay: put() only compared sizes, so the
    # Kafka store's "read it from sys.chunks and cache it again" never repaired the cache
    store = FsChunkStore(tmp_path)
    data = os.urandom(5000)
    ref = await store.put(data, workload="wa")
    store.path(ref.hash, "wa").write_bytes(bytes([data[0] ^ 0x01]) + data[1:])
    with pytest.raises(OutcomeError):
        await store.get(ref, workload="wa")
    assert await store.put(data, workload="wa") == ref
    assert await store.get(ref, workload="wa") == data


async def test_a_chunk_is_stored_for_one_workload_only(tmp_path: Path) -> None:
    # the same bytes stored for workload wa are not there for wb: naming the hash is not enough
    store = FsChunkStore(tmp_path)
    data = os.urandom(70_000)
    ref = await store.put(data, workload="wa")
    assert store.path(ref.hash, "wa") == tmp_path / "wl" / "wa" / "sha256" / ref.hash[7:]
    with pytest.raises(OutcomeError) as info:
        await store.get(ref, workload="wb")
    assert info.value.code == "input_missing" and "workload wb" in info.value.message
    assert await store.put(data, workload="wb") == ref
    assert await store.get(ref, workload="wb") == data


async def test_chunks_of_the_unscoped_layout_are_never_read(tmp_path: Path) -> None:
    # <dir>/sha256/<hex> is where chunks lived before they were per workload: no owner, no read
    data = b"old chunk"
    legacy = tmp_path / "sha256" / sha256_hex(data)[7:]
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(data)
    with pytest.raises(OutcomeError) as info:
        await FsChunkStore(tmp_path).get(ChunkRef(hash=sha256_hex(data), size=len(data)),
                                         workload="wa")
    assert info.value.code == "input_missing"


@pytest.mark.parametrize("workload", ["", "../wb", "a/b", "wa.x", "-a"])
async def test_a_bad_workload_name_never_names_a_path(tmp_path: Path, workload: str) -> None:
    with pytest.raises(OutcomeError) as info:
        await FsChunkStore(tmp_path).put(b"x", workload=workload)
    assert info.value.code == "input_missing"
    assert list(tmp_path.iterdir()) == []
