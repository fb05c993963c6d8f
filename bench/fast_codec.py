"""The hot-path records through the codec (pydantic) and through the msgspec fast path
(``broker_schema.fast_codec``), in one run, alternating: decode of a magika request (as an
executor reads it from ``.out``), encode of a signed magika response (as it writes it; the
signer returns a fixed signature, so the figure is the encoding, not ed25519), decode of that
response (as the holder reads it from ``.resp``), encode of the ``accepted`` written before it.

    .venv/bin/python bench/fast_codec.py [--rounds 9] [--number 2000] [--json]

Each figure is process CPU time (``time.process_time``) per record, median and best over the
rounds; in each round both paths run ``--number`` records, in alternating order. No broker, no
model.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import broker_schema as bs  # noqa: E402
from broker_schema import codec, fast_codec  # noqa: E402


def records() -> tuple[bytes, bs.ResponseRecord, bs.Signature]:
    """A magika request's bytes, its unsigned response and a signature."""
    header = bs.EffectHeader(workload_id="cam-1", input_offset=41234, index=0, epoch=3)
    sample = (ROOT / "broker_schema" / "records.py").read_bytes()[:1536]  # a file magika reads
    request = bs.EffectRequest(
        header=header, effect_kind=bs.INFERENCE_KIND, model="sha256:" + "ab" * 32,
        input=bs.InlineBody.of_bytes(sample, media_type="application/octet-stream"),
        deadline_ms=30_000)
    response = bs.ResponseRecord(
        effect_id=header.effect_id, header=header, request_offset=99881, outcome="ok",
        output=bs.InlineBody.of_json({
            "label": "python", "dl_label": "python", "score": 0.9987654328346252,
            "top": [["python", 0.9987654328346252], ["javascript", 0.0007234567031264305],
                    ["txt", 0.00012345678987654321]], "overwritten": False}),
        model_hash="sha256:" + "ab" * 32,
        executor=bs.ExecutorInfo(node_id="exec-1", engine="onnxruntime",
                                 engine_version="1.23.2", device_class="cpu",
                                 provider="CPUExecutionProvider"),
        timing=bs.Timing(received_us=1764650000000000, started_us=1764650000001234,
                         finished_us=1764650000009876),
        written_by="exec-1", request_hash=codec.request_hash(codec.encode(request)))
    signature = bs.Signature(key_id="sha256:" + "ef" * 32,
                             value=base64.b64encode(bytes(range(64))).decode())
    return codec.encode(request), response, signature


def cases() -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """name -> (the codec's call, the fast path's call), checked to agree."""
    request_bytes, response, signature = records()

    def signer(_message: bytes) -> bs.Signature:
        return signature

    signed = codec.encode_signed(response, signer)
    assert fast_codec.encode_signed(response, signer) == signed
    response_bytes = signed[1]
    assert codec.decode(request_bytes) == fast_codec.decode(request_bytes, topic="wl.cam-1.out")
    assert codec.decode(response_bytes) == fast_codec.decode(response_bytes)
    assert fast_codec._fast_decode(request_bytes, "wl.cam-1.out") is not None  # no fallback
    assert fast_codec._fast_decode(response_bytes, None) is not None
    accepted = bs.AcceptedRecord(
        effect_id=response.effect_id, header=response.header, request_offset=99881,
        node_id="exec-1", lease_ms=30_000, accepted_us=1764650000000100,
        request_hash=response.request_hash)
    assert fast_codec.encode(accepted) == codec.encode(accepted)
    return {
        "decode_request": (lambda: codec.decode(request_bytes, topic="wl.cam-1.out"),
                           lambda: fast_codec.decode(request_bytes, topic="wl.cam-1.out")),
        "encode_signed_response": (lambda: codec.encode_signed(response, signer),
                                   lambda: fast_codec.encode_signed(response, signer)),
        "decode_response": (lambda: codec.decode(response_bytes),
                            lambda: fast_codec.decode(response_bytes)),
        "encode_accepted": (lambda: codec.encode(accepted), lambda: fast_codec.encode(accepted)),
    }


def per_record_us(fn: Callable[[], Any], number: int) -> float:
    start = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - start) / number * 1e6


def measure(rounds: int, number: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, (slow, fast) in cases().items():
        for fn in (slow, fast):  # warm up
            per_record_us(fn, number // 10 or 1)
        times: dict[str, list[float]] = {"codec": [], "fast": []}
        for r in range(rounds):
            order = [("codec", slow), ("fast", fast)]
            for label, fn in order if r % 2 == 0 else reversed(order):
                times[label].append(per_record_us(fn, number))
        row = {f"{label}_{stat}": round(f(values), 2) for label, values in times.items()
               for stat, f in (("median_us", statistics.median), ("best_us", min))}
        row["speedup_median"] = round(row["codec_median_us"] / row["fast_median_us"], 2)
        out[name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--number", type=int, default=2000, help="records per path per round")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = measure(args.rounds, args.number)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, row in report.items():
            print(f"{name:24} codec {row['codec_median_us']:6.1f} µs"
                  f" (best {row['codec_best_us']:.1f})  fast {row['fast_median_us']:6.1f} µs"
                  f" (best {row['fast_best_us']:.1f})"
                  f"  {row['speedup_median']:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
