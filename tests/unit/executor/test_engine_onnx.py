"""The ONNX Runtime engine on the real models: magika and silero-vad."""

from __future__ import annotations

import io
import json
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import JsonValue

from executor.engines import Engine, EngineResult
from executor.engines.onnx import OnnxEngine, magika_features
from executor.models import ModelManifest
from fx_node.errors import EngineError
from tests.unit.executor.helpers import silence_wav, speech_wav, tone_wav, wav_bytes

REPO = Path(__file__).resolve().parents[3]


def out(result: EngineResult | EngineError) -> Any:
    assert isinstance(result, EngineResult), result
    return result.output


def test_is_an_engine(onnx_engine: OnnxEngine) -> None:
    assert isinstance(onnx_engine, Engine)
    assert onnx_engine.device_class in ("cpu", "cuda")
    assert onnx_engine.name == "onnxruntime" and onnx_engine.version


def test_features_match_magika_own_extraction(magika: ModelManifest) -> None:
    from magika import Magika

    data = b"  \n\t" + (REPO / "fx_node" / "admission.py").read_bytes() + b"\n\n   "
    ours = magika_features(data, magika.config)
    import io

    from magika.types.seekable import Seekable

    cfg: dict[str, Any] = dict(magika.config)
    theirs = Magika._extract_features_from_seekable(
        Seekable(io.BytesIO(data)), cfg["beg_size"], cfg["mid_size"], cfg["end_size"],
        cfg["padding_token"], cfg["block_size"], False,
    )
    assert ours == theirs.beg + theirs.end
    short = magika_features(b"abc", cfg)
    assert short is None


def test_magika_labels_real_files(onnx_engine: OnnxEngine, magika: ModelManifest) -> None:
    py = (REPO / "fx_node" / "admission.py").read_bytes()
    js = json.dumps({"a": [1, 2, 3], "b": {"c": "d"}} | {f"k{i}": i for i in range(50)}).encode()
    results = onnx_engine.run_batch(magika.hash, [({}, py), ({}, tone_wav()), ({"top_k": 5}, js)])
    labels = [out(r)["label"] for r in results]
    assert labels == ["python", "wav", "json"]
    assert out(results[0])["score"] > 0.9
    assert len(out(results[2])["top"]) == 5 and len(out(results[0])["top"]) == 3


def test_magika_batch_equals_single_labels(onnx_engine: OnnxEngine,
                                           magika: ModelManifest) -> None:
    files = [REPO / "pyproject.toml", REPO / "Makefile", REPO / "executor" / "service.py"]
    datas = [f.read_bytes() for f in files]
    batched = [out(r) for r in onnx_engine.run_batch(magika.hash, [({}, d) for d in datas])]
    single = [out(onnx_engine.run(magika.hash, {}, d)) for d in datas]
    assert [b["label"] for b in batched] == [s["label"] for s in single]
    for b, s in zip(batched, single, strict=True):
        assert b["score"] == pytest.approx(s["score"], abs=1e-5)


def test_magika_few_bytes_and_empty(onnx_engine: OnnxEngine, magika: ModelManifest) -> None:
    empty, short, binary = (out(r) for r in onnx_engine.run_batch(
        magika.hash, [({}, b""), ({}, b"hi"), ({}, b"\xff\xfe\x00\x81")]))
    assert empty["label"] == "empty"
    assert short["label"] == "txt" and binary["label"] == "unknown"


def test_magika_bad_params(onnx_engine: OnnxEngine, magika: ModelManifest) -> None:
    for params in ({"top_k": -1}, {"prediction_mode": "yolo"}, {"temperature": 1}):
        r = onnx_engine.run_batch(magika.hash, [(params, b"print('hello world')\n" * 5)])[0]
        assert isinstance(r, EngineError) and r.code == "params_invalid"


def test_speech_sample_is_16k_mono_pcm() -> None:
    """The committed sample (tests/data/make_speech_sample.sh) is what the VAD tests assume."""
    data = speech_wav()
    assert len(data) < 200_000
    with wave.open(io.BytesIO(data), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        assert w.getcomptype() == "NONE"
        assert 2.0 <= w.getnframes() / 16000 <= 8.0
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    assert data[:44] == wav_bytes(pcm.astype(np.float64) / 32767.0)[:44]  # canonical header
    assert int(np.abs(pcm).max()) > 8000  # not silence, not a near-silent recording


def test_silero_speech_vs_silence(onnx_engine: OnnxEngine, silero: ModelManifest) -> None:
    speech = speech_wav()
    results = onnx_engine.run_batch(silero.hash, [({}, speech), ({}, silence_wav())])
    s, q = out(results[0]), out(results[1])
    assert s["sample_rate"] == 16000 and s["chunk_samples"] == 512
    assert len(s["probabilities"]) == -(-(len(speech) - 44) // 2 // 512)
    assert len(q["probabilities"]) == 2 * 16000 // 512 + 1  # last chunk zero-padded
    assert s["mean_probability"] > 0.5, s["mean_probability"]
    assert q["mean_probability"] < 0.1
    assert s["speech_chunks"] > 10 and q["speech_chunks"] == 0


def test_silero_raw_pcm_equals_wav(onnx_engine: OnnxEngine, silero: ModelManifest) -> None:
    speech = speech_wav()
    pcm = speech[44:]  # the canonical 44-byte header (test_speech_sample_is_16k_mono_pcm)
    a = out(onnx_engine.run(silero.hash, {}, speech))
    b = out(onnx_engine.run(silero.hash, {"encoding": "pcm_s16le", "sample_rate": 16000}, pcm))
    assert a["probabilities"] == b["probabilities"]


def test_silero_batch_rows_are_independent(onnx_engine: OnnxEngine,
                                           silero: ModelManifest) -> None:
    speech = speech_wav()
    alone = out(onnx_engine.run(silero.hash, {}, speech))["probabilities"]
    mixed = onnx_engine.run_batch(silero.hash, [({}, silence_wav(5.0)), ({}, speech)])
    together = out(mixed[1])["probabilities"]
    assert len(together) == len(alone)
    assert np.allclose(together, alone, atol=1e-4)


def test_silero_rejects_bad_audio(onnx_engine: OnnxEngine, silero: ModelManifest) -> None:
    stereo = bytearray(wav_bytes(np.zeros(1000)))
    stereo[22] = 2  # channel count in the WAV header
    cases: list[tuple[Mapping[str, JsonValue], bytes]] = [
        ({}, b"RIFF not really a wav"),
        ({}, bytes(stereo)),
        ({"encoding": "pcm_s16le", "sample_rate": 44100}, b"\x00\x00" * 100),
        ({"encoding": "pcm_s16le"}, b"\x00\x00\x00"),
        ({"threshold": "high"}, silence_wav(0.1)),
    ]
    results = onnx_engine.run_batch(silero.hash, cases)
    codes = [r.code if isinstance(r, EngineError) else None for r in results]
    assert codes == ["input_invalid", "input_invalid", "input_invalid", "input_invalid",
                     "params_invalid"]


def test_silero_non_positive_sample_rate_fails_only_its_request(
        onnx_engine: OnnxEngine, silero: ModelManifest) -> None:
    # 0 was a zero slice step (a ValueError that failed the whole batch as engine_error) and
    # -16000 a step of -1 (the audio reversed and answered as 16 kHz)
    cases: list[tuple[Mapping[str, JsonValue], bytes]] = [
        ({"encoding": "pcm_s16le", "sample_rate": 0}, b"\x00\x00" * 600),
        ({"encoding": "pcm_s16le", "sample_rate": -16000}, b"\x00\x00" * 600),
        ({}, silence_wav(0.1)),
    ]
    results = onnx_engine.run_batch(silero.hash, cases)
    codes = [r.code if isinstance(r, EngineError) else None for r in results]
    assert codes == ["input_invalid", "input_invalid", None]


def test_unloaded_model_is_an_engine_error(magika: ModelManifest) -> None:
    engine = OnnxEngine()
    r = engine.run_batch(magika.hash, [({}, b"x" * 100)])
    assert isinstance(r[0], EngineError) and r[0].code == "engine_error"
