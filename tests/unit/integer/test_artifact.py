from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from fx_integer import artifact, model_paths


def test_synthetic_roundtrip_is_byte_stable(synth_path: Path, synth: artifact.Artifact) -> None:
    data = synth_path.read_bytes()
    again = artifact.serialize(config=synth.config, tokenizer=synth.tokenizer,
                               source=synth.source, tensors=synth.tensors)
    assert again == data
    assert synth.model_hash == hashlib.sha256(data).hexdigest()
    assert artifact.synthetic(seed=7) == data


def test_header_checks(synth_path: Path, tmp_path: Path) -> None:
    data = bytearray(synth_path.read_bytes())
    bad = tmp_path / "bad"
    bad.write_bytes(b"XXXXXXXX" + data[8:])
    with pytest.raises(artifact.ArtifactError, match="magic"):
        artifact.load(bad)
    data2 = bytearray(data)
    data2[8] = 99
    bad.write_bytes(bytes(data2))
    with pytest.raises(artifact.ArtifactError, match="format version"):
        artifact.load(bad)
    with pytest.raises(artifact.ArtifactError, match="modelHash mismatch"):
        artifact.load(synth_path, expected_hash="0" * 64)


def test_nibble_packing_roundtrip() -> None:
    rng = np.random.default_rng(3)
    c = rng.integers(0, 16, (5, 64), dtype=np.uint8)
    assert np.array_equal(artifact.unpack_nibbles(artifact.pack_nibbles(c)), c)


def test_real_codes_exact_vs_gguf(real: artifact.Artifact) -> None:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(str(model_paths.locate_gguf()))
    t = {x.name: x for x in r.tensors}
    for name in ("blk.0.attn_k", "blk.29.ffn_down"):
        ref = dequantize(t[name + ".weight"].data, t[name + ".weight"].tensor_type)
        q = artifact.unpack_nibbles(real.tensors[name + ".codes"]).astype(np.float64)
        d = np.repeat(real.tensors[name + ".scale"].astype(np.float64), 32, axis=1)
        m = np.repeat(real.tensors[name + ".offset"].astype(np.float64), 32, axis=1)
        assert np.array_equal((d * q + m) / 2.0**24, ref.astype(np.float64))
    cfg = real.config
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size) == (
        30, 576, 9, 3, 49152)


@pytest.mark.slow
def test_reimport_is_deterministic(real: artifact.Artifact, tmp_path: Path) -> None:
    out = tmp_path / "again.nlfxint"
    _, h = model_paths.import_int(out=out, force=True)
    assert h == real.model_hash


def _with_header(data: bytes, edit: object) -> bytes:
    """``data`` with its JSON header replaced by ``edit(header)`` (prefix length updated)."""
    import json
    import struct

    magic, version, reserved, hlen = struct.unpack_from("<8sIIQ", data, 0)
    header = json.loads(data[24:24 + hlen])
    new = json.dumps(edit(header)).encode()  # type: ignore[operator]
    return struct.pack("<8sIIQ", magic, version, reserved, len(new)) + new + data[24 + hlen:]


@pytest.mark.parametrize("edit", [
    lambda h: {k: v for k, v in h.items() if k != "tensors"},
    lambda h: {k: v for k, v in h.items() if k != "config"},
    lambda h: {**h, "config": {**h["config"], "n_layers": None}},
    lambda h: {**h, "tensors": [{**t, "dtype": "f64"} for t in h["tensors"]]},
    lambda h: {**h, "tensors": [{**t, "offset": -64} for t in h["tensors"]]},
    lambda h: {**h, "tensors": [{**t, "shape": "big"} for t in h["tensors"]]},
    lambda h: [h],
])
def test_malformed_header_is_an_artifact_error(synth_path: Path, edit: object) -> None:
    # a damaged header of the right version must be refused as an artifact, never surface as a
    # KeyError / TypeError in the executor's load or a verifier
    with pytest.raises(artifact.ArtifactError):
        artifact.parse(_with_header(synth_path.read_bytes(), edit))
