"""Shared helpers for executor tests (unit and integration): records, audio, files."""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
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


def synthetic_voice(seconds: float = 2.0, rate: int = 16000) -> np.ndarray:
    """A speech-like signal without a synthesiser: a 120 Hz glottal pulse train through three
    formant resonators, with syllable-rate (4 Hz) amplitude modulation."""
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = 120 + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = np.cumsum(f0 / rate)
    pulses = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
    out = np.zeros(n)
    for freq, bw, gain in ((700, 110, 1.0), (1200, 120, 0.6), (2600, 160, 0.3)):
        r = np.exp(-np.pi * bw / rate)
        a1, a2 = -2 * r * np.cos(2 * np.pi * freq / rate), r * r
        y = np.zeros(n)
        for i in range(n):
            y[i] = pulses[i] - a1 * (y[i - 1] if i else 0) - a2 * (y[i - 2] if i > 1 else 0)
        out += gain * y
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    out = out * envelope
    scaled: np.ndarray = 0.5 * out / np.max(np.abs(out))
    return scaled


def speech_wav(
    text: str = "The quick brown fox jumps over the lazy dog, twice.",
) -> tuple[bytes, str]:
    """16 kHz mono speech as WAV, and how it was made: espeak-ng when installed (resampled from its
    22,050 Hz by linear interpolation), else :func:`synthetic_voice`."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        return wav_bytes(synthetic_voice()), "synthetic"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "speech.wav"
        subprocess.run([exe, "-w", str(path), text], check=True, capture_output=True, timeout=60)
        with wave.open(str(path), "rb") as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
    pcm /= 32768.0
    n_out = int(len(pcm) * 16000 / rate)
    resampled = np.interp(np.arange(n_out) * rate / 16000, np.arange(len(pcm)), pcm)
    return wav_bytes(resampled), "espeak-ng"
