"""The cost of the lease holder's signature check (``fx workload run``, on by default;
``--no-signature-check`` turns it off), per response and per read batch, CPU only.

    .venv/bin/python bench/holder_signatures.py [--responses 500] [--rounds 5] [--nodes 4]

Builds ``--responses`` Ed25519-signed ``ok`` responses (copies of one in the golden log, an
executor's, re-signed) of ``--nodes`` nodes, the facts records that
publish their keys, and times :func:`workload_sdk._signature_tally.check_signatures` over the whole
batch, best of ``--rounds`` (the holder checks 32 at a time in a task of its own, between other
work); then its two parts alone, the canonical signing bytes (RFC 8785 JSON) and the Ed25519
verify, and ``decode`` (what the holder does to every record anyway), for scale. Prints JSON.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import time
from pathlib import Path
from typing import Any

from broker_schema import FactsRecord, ResponseRecord, Signature, decode, encode, signatures
from workload_sdk import ReadResponse, WorkloadLog, check_signatures

#: A recorded log whose signed responses serve as the template (an executor's ``ok``).
GOLDEN = (Path(__file__).resolve().parents[1] / "tests" / "unit" / "workload_sdk" / "golden"
          / "asker_failover.jsonl")


def _batch(n: int, nodes: int) -> tuple[list[ReadResponse], list[FactsRecord]]:
    log = WorkloadLog.from_jsonl(GOLDEN)
    template = next(r for r in (decode(x.value) for x in log["resp"])
                    if isinstance(r, ResponseRecord) and r.signature is not None)
    (fact,) = log.facts
    keys = [signatures.SigningKey.generate() for _ in range(nodes)]
    facts = [fact.model_copy(update={"node_id": f"exec-{i}", "key_id": k.key_id,
                                     "public_key": signatures.public_key_text(k.public_key)})
             for i, k in enumerate(keys)]
    assert template.executor is not None
    out: list[ReadResponse] = []
    for i in range(n):
        node = i % nodes
        resp = template.model_copy(update={
            "request_offset": i, "signature": None, "written_by": f"exec-{node}",
            "executor": template.executor.model_copy(update={"node_id": f"exec-{node}"})})
        sig = Signature(key_id=keys[node].key_id, value=base64.b64encode(
            keys[node].sign(resp.signing_bytes())).decode())
        out.append((i, resp.model_copy(update={"signature": sig}), None))
    return out, facts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--responses", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()
    batch, facts = _batch(args.responses, args.nodes)
    wire = [encode(r) for _, r, _ in batch]
    keys = {f.key_id: signatures.public_key_from_text(f.public_key) for f in facts}
    signed = [(keys[r.signature.key_id], base64.b64decode(r.signature.value), r.signing_bytes())
              for _, r, _ in batch if r.signature is not None]
    check_best = decode_best = bytes_best = verify_best = float("inf")
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        tally = check_signatures(batch, facts, holder_ids=set(), final=False)
        check_best = min(check_best, time.perf_counter() - t0)
        assert tally.checked == len(batch) and not tally.failures and not tally.retry
        t0 = time.perf_counter()
        for value in wire:
            decode(value)
        decode_best = min(decode_best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _, r, _ in batch:
            r.signing_bytes()
        bytes_best = min(bytes_best, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for raw, sig, data in signed:
            assert signatures.verify(raw, sig, data)
        verify_best = min(verify_best, time.perf_counter() - t0)
    result: dict[str, Any] = {
        "responses": len(batch), "nodes": args.nodes, "rounds": args.rounds,
        "check_batch_ms": round(check_best * 1000, 2),
        "check_per_response_us": round(check_best / len(batch) * 1e6, 1),
        "of_which_signing_bytes_us": round(bytes_best / len(batch) * 1e6, 1),
        "of_which_verify_us": round(verify_best / len(batch) * 1e6, 1),
        "decode_per_response_us": round(decode_best / len(batch) * 1e6, 1),
        "load_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
