"""The content-addressed model store: import, hash check, tamper detection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from executor.models import ModelStore, file_sha256, locate_package_model
from fx_node.errors import ModelError


def test_import_names_the_file_by_its_sha256(fresh_store: ModelStore) -> None:
    m = fresh_store.import_package("magika")
    src = locate_package_model("magika", "models/standard_v3_3/model.onnx")
    assert m.hash == file_sha256(src)
    assert m.size == src.stat().st_size
    assert fresh_store.path(m.hash).read_bytes() == src.read_bytes()
    assert m.interface == "magika" and m.engine == "onnxruntime"
    assert len(m.config["labels"]) == 214  # type: ignore[arg-type]
    assert m.inputs[0].name == "bytes" and m.inputs[0].dtype == "int32"
    assert m.params["prediction_mode"].default == "high-confidence"
    assert fresh_store.hashes() == [m.hash]
    # importing again is idempotent
    assert fresh_store.import_package("magika") == m


def test_silero_is_located_without_importing_torch(fresh_store: ModelStore) -> None:
    import sys

    m = fresh_store.import_package("silero-vad")
    assert m.interface == "silero-vad"
    assert [i.name for i in m.inputs] == ["input", "state", "sr"]
    assert "torch" not in sys.modules


def test_tampered_file_is_refused(fresh_store: ModelStore) -> None:
    m = fresh_store.import_package("silero-vad")
    assert fresh_store.status(m.hash) == "ready"
    assert not fresh_store.needs_hashing(m.hash)
    path = fresh_store.path(m.hash)
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert fresh_store.needs_hashing(m.hash)
    assert fresh_store.status(m.hash) == "corrupt"
    with pytest.raises(ModelError) as info:
        fresh_store.read_verified(m.hash)
    assert info.value.code == "model_hash_mismatch"
    assert fresh_store.verify_all() == {m.hash: False}


def test_truncated_file_is_refused(fresh_store: ModelStore) -> None:
    m = fresh_store.import_package("silero-vad")
    path = fresh_store.path(m.hash)
    os.chmod(path, 0o644)
    path.write_bytes(path.read_bytes()[:1000])
    assert fresh_store.status(m.hash) == "corrupt"


def test_unknown_hash(fresh_store: ModelStore) -> None:
    h = "sha256:" + "c" * 64
    assert fresh_store.status(h) == "absent"
    assert fresh_store.status("not-a-hash") == "absent"
    with pytest.raises(ModelError) as info:
        fresh_store.read_verified(h)
    assert info.value.code == "model_unknown"


def test_import_plain_onnx_file(fresh_store: ModelStore, tmp_path: Path) -> None:
    src = locate_package_model("silero_vad", "data/silero_vad_16k_op15.onnx")
    m = fresh_store.import_path(src, name="silero-op15")
    assert m.interface == "onnx-tensors" and m.name == "silero-op15"
    assert m.hash == file_sha256(src)


def test_damaged_or_misplaced_manifest_is_model_unknown(fresh_store: ModelStore,
                                                         tmp_path: Path) -> None:
    import json

    src = tmp_path / "a.bin"
    src.write_bytes(b"a")
    a = fresh_store.add(src, {"name": "a", "engine": "onnxruntime", "interface": "x",
                              "preprocessing_version": "x/1"})
    src.write_bytes(b"b")
    b = fresh_store.add(src, {"name": "b", "engine": "onnxruntime", "interface": "x",
                              "preprocessing_version": "x/1"})
    mpath = fresh_store.path(a.hash).with_suffix(".json")
    good = mpath.read_text()
    for damaged in ("{not json", json.dumps({"format": "fx-model-manifest/1"}),
                    fresh_store.path(b.hash).with_suffix(".json").read_text()):
        mpath.write_text(damaged)
        with pytest.raises(ModelError) as exc:
            fresh_store.manifest(a.hash)
        assert exc.value.code == "model_unknown"
    mpath.write_text(good)
    assert fresh_store.manifest(a.hash) == a


def test_manifest_is_read_once_per_content(fresh_store: ModelStore, tmp_path: Path) -> None:
    """The manifest and its hash are cached under the file's stamp: asked again, the same
    object comes back without a read; rewritten, it is read and validated again; removed, it is
    ``model_unknown`` again."""
    src = tmp_path / "m.bin"
    src.write_bytes(b"m")
    m = fresh_store.add(src, {"name": "m", "engine": "onnxruntime", "interface": "x",
                              "preprocessing_version": "x/1"})
    first = fresh_store.manifest(m.hash)
    assert fresh_store.manifest(m.hash) is first
    assert fresh_store.manifest(m.hash, stat=False) is first
    assert fresh_store.manifest_hash(m.hash) == m.manifest_hash()
    mpath = fresh_store.path(m.hash).with_suffix(".json")
    renamed = m.model_copy(update={"name": "renamed"})
    mpath.write_text(renamed.model_dump_json())
    assert fresh_store.manifest(m.hash) == renamed
    assert fresh_store.manifest_hash(m.hash) == renamed.manifest_hash() != m.manifest_hash()
    mpath.unlink()
    with pytest.raises(ModelError) as exc:
        fresh_store.manifest(m.hash)
    assert exc.value.code == "model_unknown"
