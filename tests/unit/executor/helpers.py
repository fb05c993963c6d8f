"""Shared helpers for executor tests (unit and integration): records, audio, files."""

from __future__ import annotations

import io
import wave
from pathlib import Path

import numpy as np

from broker_schema.records import (
    INFERENCE_KIND,
    Body,
    ClaimRecord,
    EffectHeader,
    EffectRequest,
    InlineBody,
    SpecRecord,
)

ZERO_HASH = "sha256:" + "0" * 64
MODULE_HASH = "sha256:" + "1" * 64
# "The quick brown fox jumps over the lazy dog, twice.", read by espeak-ng (see speech_wav)
SPEECH_WAV = Path(__file__).resolve().parents[2] / "data" / "speech_16k.wav"


def spec(workload_id: str, models: dict[str, str], *, kinds: tuple[str, ...] = (INFERENCE_KIND,),
         lease_ms: int = 30_000) -> SpecRecord:
    """A spec binding ``kinds`` and ``models``."""
    return SpecRecord(workload_id=workload_id, module_hash=MODULE_HASH, effect_kinds=kinds,
                      models=models, executor_lease_ms=lease_ms)


def claim(workload_id: str, epoch: int) -> ClaimRecord:
    """A lease claim at ``epoch``."""
    return ClaimRecord(workload_id=workload_id, epoch=epoch, holder_id="holder-1",
                       spec_hash=ZERO_HASH, spec_offset=0)


def request(workload_id: str, model: str | None, data: bytes | Body = b"hello", *,
            input_offset: int = 0, index: int = 0, epoch: int = 1, deadline_ms: int = 60_000,
            kind: str = INFERENCE_KIND, params: dict[str, object] | None = None) -> EffectRequest:
    """An inference request; ``data`` bytes go inline (base64), a body goes as it is."""
    return EffectRequest(
        header=EffectHeader(workload_id=workload_id, input_offset=input_offset, index=index,
                            epoch=epoch),
        effect_kind=kind,
        model=model,
        params=dict(params or {}),  # type: ignore[arg-type]
        input=InlineBody.of_bytes(data) if isinstance(data, bytes) else data,
        deadline_ms=deadline_ms,
    )


def wav_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    """Mono 16-bit PCM WAV of float samples in [-1, 1]."""
    pcm = np.clip(samples * 32767.0, -32768, 32767).astype("<i2").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return buf.getvalue()


def tone_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 440 Hz tone as a WAV file (for magika: it is a WAV whatever it holds)."""
    t = np.arange(int(seconds * rate)) / rate
    return wav_bytes(0.25 * np.sin(2 * np.pi * 440 * t), rate)


def silence_wav(seconds: float = 2.0, rate: int = 16000) -> bytes:
    """Digital silence."""
    return wav_bytes(np.zeros(int(seconds * rate)), rate)


def speech_wav() -> bytes:
    """A few seconds of real synthesised speech, 16 kHz mono 16-bit PCM WAV with the canonical
    44-byte header: the committed :data:`SPEECH_WAV`, made once by
    ``tests/data/make_speech_sample.sh`` (espeak-ng, then sox). No program runs at test time."""
    return SPEECH_WAV.read_bytes()
