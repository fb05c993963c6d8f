"""Canonical JSON per record: broker_schema's encoder vs the ``rfc8785`` reference, and the whole
``encode`` / ``decode`` of a record, on three real record shapes (a request, a magika response, an
integer-LLM response with its receipt).

    .venv/bin/python bench/canonical_json.py [--quick] [--json]

Each figure is the best of several timed loops (µs per record). No broker, no model.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rfc8785  # noqa: E402  (the reference, a dev dependency)

import broker_schema as bs  # noqa: E402
from broker_schema.canonical import canonical_json  # noqa: E402

VECTORS = ROOT / "tests" / "data" / "receipt_vectors" / "responses.jsonl"


def shapes() -> dict[str, Any]:
    """Three records as the services write them."""
    header = bs.EffectHeader(workload_id="cam-1", input_offset=41234, index=0, epoch=3)
    request = bs.EffectRequest(
        header=header, effect_kind=bs.INFERENCE_KIND, model="sha256:" + "ab" * 32,
        params={"mode": "high-confidence", "top_k": 3},
        input=bs.InlineBody.of_bytes(bytes(range(256)) * 4), deadline_ms=30_000)
    magika = bs.ResponseRecord(
        effect_id=header.effect_id, header=header, request_offset=99881, outcome="ok",
        output=bs.InlineBody.of_json({
            "label": "python", "dl_label": "python", "score": 0.9987654328346252,
            "top": [["python", 0.9987654328346252], ["javascript", 0.0007234567031264305],
                    ["txt", 0.00012345678987654321]], "overwritten": False}),
        model_hash="sha256:" + "cd" * 32,
        executor=bs.ExecutorInfo(node_id="exec-1", engine="onnxruntime",
                                 engine_version="1.23.2", device_class="cpu"),
        timing=bs.Timing(received_us=1764650000000000, started_us=1764650000001234,
                         finished_us=1764650000009876),
        written_by="exec-1",
        signature=bs.Signature(key_id="sha256:" + "ef" * 32,
                               value=base64.b64encode(bytes(64)).decode()))
    line = VECTORS.read_text(encoding="utf-8").splitlines()[0]
    llm = bs.decode(line.encode("utf-8"), strict=False)
    return {"request": request, "magika_response": magika, "llm_response_receipt": llm}


def best_us(fn: Any, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def measure(quick: bool = False) -> dict[str, Any]:
    number, repeat = (200, 3) if quick else (2000, 5)
    out: dict[str, Any] = {}
    for name, record in shapes().items():
        value = record.model_dump(mode="json")
        data = bs.encode(record)
        assert canonical_json(value) == rfc8785.dumps(value) == data
        row = {
            "bytes": len(data),
            "rfc8785_us": best_us(lambda v=value: rfc8785.dumps(v), number, repeat),
            "canonical_us": best_us(lambda v=value: canonical_json(v), number, repeat),
            "encode_us": best_us(lambda r=record: bs.encode(r), number, repeat),
            "decode_strict_us": best_us(lambda d=data: bs.decode(d), number, repeat),
        }
        row["speedup"] = row["rfc8785_us"] / row["canonical_us"]
        if isinstance(record, bs.ResponseRecord):
            # signing and encoding a response without the signature cost (a fixed signature):
            # the signing bytes and the record's bytes as two canonical passes (as before
            # encode_signed) vs spliced from one
            unsigned = record.model_copy(update={"signature": None})
            sig = record.signature

            def two_passes(r: bs.ResponseRecord = unsigned,
                           s: bs.Signature | None = sig) -> bytes:
                r.signing_bytes()
                return bs.encode(r.model_copy(update={"signature": s}))

            def one_pass(r: bs.ResponseRecord = unsigned, s: bs.Signature | None = sig) -> bytes:
                assert s is not None
                return bs.encode_signed(r, lambda _m: s)[1]

            assert two_passes() == one_pass()
            row["sign_encode_two_passes_us"] = best_us(two_passes, number, repeat)
            row["sign_encode_one_pass_us"] = best_us(one_pass, number, repeat)
        out[name] = {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer loops (a few seconds)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = measure(args.quick)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, row in report.items():
            print(f"{name:22} {row['bytes']:6} B  rfc8785 {row['rfc8785_us']:8.1f} µs  "
                  f"canonical {row['canonical_us']:6.1f} µs ({row['speedup']:.1f}×)  "
                  f"encode {row['encode_us']:7.1f} µs  decode {row['decode_strict_us']:7.1f} µs"
                  + (f"  sign+encode (no signing) two passes {row['sign_encode_two_passes_us']:.1f}"
                     f" µs, one {row['sign_encode_one_pass_us']:.1f} µs"
                     if "sign_encode_one_pass_us" in row else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
