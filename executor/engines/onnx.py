"""The ONNX Runtime engine: one warm session per model hash, three interfaces.

- ``magika``: input bytes of any file; output the content-type label. Preprocessing
  ``magika-features-v2`` follows ``magika==1.0.3`` (``Magika._extract_features_from_seekable``):
  read at most ``block_size`` (4096) bytes from each end; the first ``beg_size`` (1024) bytes after
  ``lstrip()`` padded at the end with 256, the last ``end_size`` (1024) bytes after ``rstrip()``
  padded at the front with 256: int32 ``[N, 2048]``. Inputs shorter than 8 bytes, or with fewer
  than 8 bytes left after stripping, skip the model (``txt`` if they decode as UTF-8, else
  ``unknown``); empty input is ``empty``. Batched: N requests are one ``[N, 2048]`` call.
- ``silero-vad``: 16 kHz (or 8 kHz) mono PCM as WAV bytes or raw ``pcm_s16le``; output the speech
  probability of every 512-sample chunk (256 at 8 kHz; the last chunk zero-padded). The model is
  stateful: each call gets 64 samples of context (32 at 8 kHz) from the previous chunk and the
  recurrent state ``[2, B, 128]``. Batched: B requests run in lock step, one row each.
- ``onnx-tensors``: input JSON ``{"inputs": {name: {"dtype", "shape", "data"}}}``, output the same
  shape for every (or the ``outputs``-named) output. Not batched.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import wave
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
from pydantic import JsonValue

from broker_schema import OnnxProviderFact
from executor.engines import EngineOptions, EngineResult
from executor.models import ModelManifest
from fx_node.errors import EngineError

__all__ = ["CPU_PROVIDER", "CUDA_PROVIDER", "OnnxEngine", "choose_providers", "decode_audio",
           "magika_features"]

log = logging.getLogger(__name__)

CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def choose_providers(asked: str, device: str, available: Sequence[str]
                     ) -> tuple[list[str], str | None]:
    """The providers to open sessions with, and why CUDA is not among them when it was asked
    (``asked``: the ``onnx_provider`` option; ``device``: the ``device`` option; ``available``:
    ``onnxruntime.get_available_providers()``). Pure."""
    if asked == "cpu":
        return [CPU_PROVIDER], None
    if device == "cpu":
        why = "device = cpu" if asked == "auto" else "device = cpu overrides onnx_provider = cuda"
        return [CPU_PROVIDER], why
    if CUDA_PROVIDER not in available:
        return [CPU_PROVIDER], (f"this onnxruntime ({ort.__version__}) has no {CUDA_PROVIDER} "
                                f"(it has {', '.join(available) or 'none'}; a GPU node needs the "
                                "onnxruntime-gpu package)")
    return [CUDA_PROVIDER, CPU_PROVIDER], None

Items = Sequence[tuple[Mapping[str, JsonValue], bytes]]


@dataclass
class _Loaded:
    manifest: ModelManifest
    session: ort.InferenceSession


def magika_features(data: bytes, cfg: Mapping[str, Any]) -> list[int] | None:
    """The int features of ``data`` (length ``beg_size + end_size``), or None when magika decides
    without the model (empty, or too few non-whitespace bytes)."""
    beg_size, end_size = int(cfg["beg_size"]), int(cfg["end_size"])
    block, pad = int(cfg["block_size"]), int(cfg["padding_token"])
    min_size = int(cfg["min_file_size_for_dl"])
    size = len(data)
    if size < min_size:
        return None
    n = min(block, size)
    beg = data[:n].lstrip()[:beg_size]
    beg_ints = list(beg) + [pad] * (beg_size - len(beg))
    if beg_ints[min_size - 1] == pad:
        return None
    end = data[size - n :].rstrip()
    end = end[len(end) - end_size :] if len(end) > end_size else end
    end_ints = [pad] * (end_size - len(end)) + list(end)
    return beg_ints + end_ints


def _few_bytes_label(data: bytes, cfg: Mapping[str, Any]) -> dict[str, JsonValue]:
    if not data:
        return {"label": "empty", "dl_label": "undefined", "score": 1.0, "top": [],
                "overwrite_reason": "none"}
    head = data[: int(cfg["block_size"])]
    try:
        head.decode("utf-8")
        label = "txt"
    except UnicodeDecodeError:
        label = "unknown"
    return {"label": label, "dl_label": "undefined", "score": 1.0, "top": [],
            "overwrite_reason": "none"}


_MODES = ("high-confidence", "medium-confidence", "best-guess")


def _magika_params(params: Mapping[str, JsonValue], manifest: ModelManifest) -> tuple[str, int]:
    unknown = set(params) - set(manifest.params)
    if unknown:
        raise EngineError("params_invalid", f"unknown parameters {sorted(unknown)}")
    mode = params.get("prediction_mode", manifest.params["prediction_mode"].default)
    if mode not in _MODES:
        raise EngineError("params_invalid", f"prediction_mode must be one of {_MODES}")
    top_k = params.get("top_k", manifest.params["top_k"].default)
    n_labels = len(manifest.config["labels"])  # type: ignore[arg-type]
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 <= top_k <= n_labels:
        raise EngineError("params_invalid", f"top_k must be an integer in 0..{n_labels}")
    return str(mode), top_k


def _magika_label(
    scores: np.ndarray, mode: str, top_k: int, cfg: Mapping[str, Any]
) -> dict[str, JsonValue]:
    labels: list[str] = cfg["labels"]
    best = int(np.argmax(scores))
    dl_label, score = labels[best], float(scores[best])
    output = cfg["overwrite_map"].get(dl_label, dl_label)
    reason = "overwrite_map" if output != dl_label else "none"
    if mode == "best-guess":
        keep = True
    elif mode == "high-confidence":
        keep = score >= cfg["thresholds"].get(dl_label, cfg["medium_confidence_threshold"])
    else:
        keep = score >= cfg["medium_confidence_threshold"]
    if not keep:
        reason = "low_confidence"
        output = "txt" if output in cfg["text_labels"] else "unknown"
        if output == dl_label:
            reason = "none"
    order = np.argsort(-scores, kind="stable")[:top_k]
    top: list[JsonValue] = [
        {"label": labels[int(i)], "score": float(scores[int(i)])} for i in order
    ]
    return {"label": output, "dl_label": dl_label, "score": score, "top": top,
            "overwrite_reason": reason}


def decode_audio(
    data: bytes, params: Mapping[str, JsonValue], manifest: ModelManifest
) -> tuple[np.ndarray, int, float]:
    """``(samples float32 in [-1, 1), sample_rate, threshold)`` from WAV or raw s16le bytes."""
    unknown = set(params) - set(manifest.params)
    if unknown:
        raise EngineError("params_invalid", f"unknown parameters {sorted(unknown)}")
    enc = params.get("encoding", manifest.params["encoding"].default)
    threshold = params.get("threshold", manifest.params["threshold"].default)
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise EngineError("params_invalid", "threshold must be a number")
    if enc == "auto":
        enc = "wav" if data[:4] == b"RIFF" else "pcm_s16le"
    if enc == "wav":
        try:
            with wave.open(io.BytesIO(data), "rb") as w:
                channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
                frames = w.readframes(w.getnframes())
        except (wave.Error, EOFError) as exc:
            raise EngineError("input_invalid", f"not a readable WAV file: {exc}") from None
        if channels != 1 or width != 2:
            raise EngineError(
                "input_invalid", f"WAV must be mono 16-bit PCM (got {channels} ch, {width} B)"
            )
        pcm = frames
    elif enc == "pcm_s16le":
        rate_param = params.get("sample_rate", manifest.params["sample_rate"].default)
        if not isinstance(rate_param, int) or isinstance(rate_param, bool):
            raise EngineError("params_invalid", "sample_rate must be an integer")
        rate, pcm = rate_param, data
        if len(pcm) % 2:
            raise EngineError("input_invalid", "raw pcm_s16le input has an odd number of bytes")
    else:
        raise EngineError("params_invalid", f"encoding must be auto, wav or pcm_s16le: {enc!r}")
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
    # rate > 0 first: 0 would be a zero slice step (a ValueError failing the whole batch) and
    # -16000 a step of -1 (the audio silently reversed and answered as 16 kHz)
    if rate > 0 and rate not in (8000, 16000) and rate % 16000 == 0:
        samples, rate = samples[:: rate // 16000], 16000  # the decimation silero-vad's own does
    if rate not in (8000, 16000):
        raise EngineError(
            "input_invalid", f"sample rate {rate} Hz: only 8000 or 16000 (or k*16000)"
        )
    if samples.size == 0:
        raise EngineError("input_invalid", "no audio samples")
    return samples, rate, float(threshold)


def _tensor_input(value: Any, spec_name: str) -> np.ndarray:
    if not isinstance(value, dict) or not {"dtype", "shape", "data"} <= set(value):
        raise EngineError("input_invalid", f"input {spec_name!r} needs dtype, shape and data")
    try:
        arr = np.asarray(value["data"], dtype=np.dtype(str(value["dtype"])))
        return arr.reshape([int(d) for d in value["shape"]])
    except (TypeError, ValueError) as exc:
        raise EngineError("input_invalid", f"input {spec_name!r}: {exc}") from None


class OnnxEngine:
    """ONNX Runtime sessions kept warm per model hash. Thread-safe (ORT sessions are)."""

    name = "onnxruntime"

    def __init__(self, options: EngineOptions | None = None) -> None:
        self.options = options or EngineOptions()
        self.version: str = ort.__version__
        asked = self.options.onnx_provider
        self.providers, self.provider_reason = choose_providers(
            asked, self.options.device, ort.get_available_providers())
        self.provider = self.providers[0]
        if self.provider_reason is not None and asked == "cuda":
            log.warning("onnx_provider = cuda asked, running %s: %s", CPU_PROVIDER,
                        self.provider_reason)
        self.device_class = "cuda" if self.provider == CUDA_PROVIDER else "cpu"
        self.max_batch = 64
        self._models: dict[str, _Loaded] = {}
        #: model hash -> the provider its session runs on (ORT may start CUDA's and fall back)
        self._provider_of: dict[str, str] = {}
        self._lock = threading.Lock()

    def provider_of(self, model_hash: str | None) -> str:
        """The execution provider ``model_hash``'s session runs on (the engine's if unknown)."""
        if model_hash is None:
            return self.provider
        with self._lock:
            return self._provider_of.get(model_hash, self.provider)

    def device_class_of(self, model_hash: str) -> str:
        """``cuda`` when ``model_hash`` runs on CUDA's provider, else ``cpu``."""
        return "cuda" if self.provider_of(model_hash) == CUDA_PROVIDER else "cpu"

    def provider_fact(self) -> OnnxProviderFact:
        """What the node's facts say of the provider (``FactsRecord.onnx_provider``)."""
        return OnnxProviderFact(asked=self.options.onnx_provider, running=self.provider,
                                reason=self.provider_reason)

    # -- loading ---------------------------------------------------------------------------------
    def load(self, manifest: ModelManifest, model_bytes: bytes) -> None:
        """Create the session from verified bytes (idempotent)."""
        with self._lock:
            if manifest.hash in self._models:
                return
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.options.intra_op_threads
        opts.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(
                model_bytes, sess_options=opts, providers=self.providers
            )
        except Exception as exc:  # ORT raises its own untyped errors for bad models
            raise EngineError("engine_error", f"onnxruntime cannot load the model: {exc}") from None
        running = session.get_providers()[0] if session.get_providers() else CPU_PROVIDER
        with self._lock:
            self._models.setdefault(manifest.hash, _Loaded(manifest, session))
            self._provider_of[manifest.hash] = running
            if self.provider == CUDA_PROVIDER and running != CUDA_PROVIDER:
                # ORT had the provider but could not start it (no driver, no libcudart): it ran
                # the session on the CPU; the engine says so from here on
                self.provider, self.device_class = running, "cpu"
                self.provider_reason = (f"onnxruntime could not start {CUDA_PROVIDER} for "
                                        f"{manifest.hash}: the session runs on {running}")
                log.warning("%s", self.provider_reason)

    def loaded(self) -> frozenset[str]:
        """Hashes with a warm session."""
        with self._lock:
            return frozenset(self._models)

    def unload(self, model_hash: str) -> None:
        """Drop the session of ``model_hash``."""
        with self._lock:
            self._models.pop(model_hash, None)
            self._provider_of.pop(model_hash, None)

    def _get(self, model_hash: str) -> _Loaded:
        with self._lock:
            loaded = self._models.get(model_hash)
        if loaded is None:
            raise EngineError("engine_error", f"model {model_hash} is not loaded")
        return loaded

    # -- running ---------------------------------------------------------------------------------
    def run(self, model_hash: str, params: Mapping[str, JsonValue], data: bytes) -> EngineResult:
        """One request (raises :class:`EngineError`)."""
        result = self.run_batch(model_hash, [(params, data)])[0]
        if isinstance(result, EngineError):
            raise result
        return result

    def run_batch(self, model_hash: str, items: Items) -> list[EngineResult | EngineError]:
        """Run ``items`` together where the interface allows it."""
        try:
            loaded = self._get(model_hash)
            interface = loaded.manifest.interface
            if interface == "magika":
                return self._magika(loaded, items)
            if interface == "silero-vad":
                return self._silero(loaded, items)
            if interface == "onnx-tensors":
                return [self._catch(self._tensors, loaded, p, d) for p, d in items]
        except EngineError as exc:
            return [exc for _ in items]
        except Exception as exc:  # an ORT failure for the whole batch
            err = EngineError("engine_error", f"{type(exc).__name__}: {exc}")
            return [err for _ in items]
        err = EngineError("engine_error", f"interface {interface!r} is not implemented")
        return [err for _ in items]

    @staticmethod
    def _catch(fn: Any, *args: Any) -> EngineResult | EngineError:
        try:
            result: EngineResult = fn(*args)
            return result
        except EngineError as exc:
            return exc
        except Exception as exc:
            return EngineError("engine_error", f"{type(exc).__name__}: {exc}")

    def _magika(self, loaded: _Loaded, items: Items) -> list[EngineResult | EngineError]:
        cfg = loaded.manifest.config
        results: list[EngineResult | EngineError | None] = [None] * len(items)
        rows: list[list[int]] = []
        row_of: list[tuple[int, str, int]] = []
        for i, (params, data) in enumerate(items):
            try:
                mode, top_k = _magika_params(params, loaded.manifest)
            except EngineError as exc:
                results[i] = exc
                continue
            feats = magika_features(data, cfg)
            if feats is None:
                results[i] = EngineResult(_few_bytes_label(data, cfg))
            else:
                rows.append(feats)
                row_of.append((i, mode, top_k))
        if rows:
            batch = np.asarray(rows, dtype=np.int32)  # [N, 2048]
            (scores,) = loaded.session.run(["target_label"], {"bytes": batch})  # [N, 214]
            for r, (i, mode, top_k) in enumerate(row_of):
                results[i] = EngineResult(_magika_label(scores[r], mode, top_k, cfg))
        return [r if r is not None else EngineError("internal", "no result") for r in results]

    def _silero(self, loaded: _Loaded, items: Items) -> list[EngineResult | EngineError]:
        results: list[EngineResult | EngineError | None] = [None] * len(items)
        by_rate: dict[int, list[tuple[int, np.ndarray, float]]] = {}
        for i, (params, data) in enumerate(items):
            try:
                samples, rate, threshold = decode_audio(data, params, loaded.manifest)
            except EngineError as exc:
                results[i] = exc
                continue
            by_rate.setdefault(rate, []).append((i, samples, threshold))
        for rate, group in by_rate.items():
            chunk, ctx = (512, 64) if rate == 16000 else (256, 32)
            n_chunks = [-(-s.size // chunk) for _, s, _ in group]
            steps = max(n_chunks)
            audio = np.zeros((len(group), steps * chunk), dtype=np.float32)  # [B, T]
            for row, (_, s, _) in enumerate(group):
                audio[row, : s.size] = s
            state = np.zeros((2, len(group), 128), dtype=np.float32)  # [2, B, 128]
            context = np.zeros((len(group), ctx), dtype=np.float32)  # [B, ctx]
            sr = np.array(rate, dtype=np.int64)
            probs = np.zeros((len(group), steps), dtype=np.float32)  # [B, steps]
            for k in range(steps):
                x = np.concatenate([context, audio[:, k * chunk : (k + 1) * chunk]], axis=1)
                out, state = loaded.session.run(None, {"input": x, "state": state, "sr": sr})
                probs[:, k] = out[:, 0]
                context = x[:, -ctx:]
            for row, (i, _, threshold) in enumerate(group):
                p = probs[row, : n_chunks[row]]
                results[i] = EngineResult(
                    {
                        "sample_rate": rate,
                        "chunk_samples": chunk,
                        "probabilities": [round(float(v), 6) for v in p],
                        "threshold": threshold,
                        "speech_chunks": int(np.sum(p >= threshold)),
                        "mean_probability": round(float(np.mean(p)), 6),
                    }
                )
        return [r if r is not None else EngineError("internal", "no result") for r in results]

    def _tensors(
        self, loaded: _Loaded, params: Mapping[str, JsonValue], data: bytes
    ) -> EngineResult:
        try:
            doc = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EngineError("input_invalid", f"input is not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
            raise EngineError("input_invalid", 'input must be {"inputs": {name: tensor}}')
        feeds = {name: _tensor_input(v, name) for name, v in doc["inputs"].items()}
        wanted = params.get("outputs")
        names = [o.name for o in loaded.manifest.outputs]
        if wanted is not None:
            if not isinstance(wanted, list) or not set(map(str, wanted)) <= set(names):
                raise EngineError("params_invalid", f"outputs must be a subset of {names}")
            names = [str(w) for w in wanted]
        try:
            arrays = loaded.session.run(names, feeds)
        except Exception as exc:  # ORT's InvalidArgument etc.: the caller's tensors are wrong
            raise EngineError("input_invalid", f"{type(exc).__name__}: {exc}") from None
        out: dict[str, JsonValue] = {
            name: {"dtype": str(a.dtype), "shape": list(a.shape), "data": a.ravel().tolist()}
            for name, a in zip(names, arrays, strict=True)
        }
        return EngineResult({"outputs": out})
