"""Speculative reads (``speculative_reads``) on a real broker, requests written in transactions
as the lease holder writes them: every committed request is answered once, with the answer an
executor without speculation gives (timing and signature aside); a request whose transaction
aborts is prepared (its model run) but never answered; a kind served without a model is never
prepared."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from broker_schema import encode, topics
from broker_schema.records import INFERENCE_KIND, AcceptedRecord, EffectRequest, ResponseRecord
from executor.models import ModelStore
from fx_kafka.client import make_producer
from fx_node.identity import verify_response
from tests.integration.executor.digest_handler import DIGEST_KIND
from tests.integration.executor.harness import executor_config, running, workload
from tests.integration.executor.test_routing import _trivial_model
from tests.unit.executor.helpers import request

pytestmark = pytest.mark.integration

HANDLER = "tests.integration.executor.digest_handler:DigestHandler"
TENSOR = json.dumps({"inputs": {"x": {"dtype": "float32", "shape": [1, 4],
                                      "data": [[1, 2, 3, 4]]}}}).encode()


def _comparable(resp: ResponseRecord) -> dict[str, Any]:
    """What must be the same with speculation and without: all but the times and the signature
    over them."""
    out = resp.model_dump(mode="json")
    out.pop("timing")
    out.pop("signature")
    return out


async def test_speculative_reads_answer_committed_requests_once_and_never_an_aborted_one(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    _trivial_model(tmp_path / "add1.onnx")
    add1 = store.import_path(tmp_path / "add1.onnx", name="add1").hash
    source = (Path(__file__).resolve().parents[3] / "fx_node" / "admission.py").read_bytes()
    async with workload(kafka_bootstrap, "spec") as wl:
        wid = wl.workload_id
        await wl.setup({"magika": magika_hash, "add1": add1},
                       kinds=(INFERENCE_KIND, DIGEST_KIND))
        common: dict[str, Any] = dict(
            node_id=f"spec-{wid[-8:]}", key_file=str(tmp_path / "node.key"), max_batch=1,
            kinds={INFERENCE_KIND: 16, DIGEST_KIND: 4}, handlers={DIGEST_KIND: HANDLER})
        warm = request(wid, add1, TENSOR, index=0)  # its cost unknown: a worker runs it
        committed: list[EffectRequest] = [
            request(wid, add1, TENSOR, index=1), request(wid, add1, TENSOR, index=2),
            request(wid, magika_hash, source, index=3),
            request(wid, magika_hash, source[:900], index=4),
            request(wid, None, b"digest me", index=5, kind=DIGEST_KIND),
        ]
        aborted = [request(wid, add1, TENSOR, index=6),
                   request(wid, magika_hash, source[:500], index=7)]
        txn = make_producer(kafka_bootstrap, transactional_id=f"test-spec-{wid}")
        await txn.start()
        try:
            cfg = executor_config(kafka_bootstrap, wid, tmp_path, store.root,
                                  group_prefix=f"spec-on-{wid}", speculative_reads=True,
                                  **common)
            async with running(cfg) as svc:
                reader = svc.runner.speculation
                assert reader is not None and reader.kinds == {INFERENCE_KIND}
                for _ in range(200):  # it follows the group consumer's assignment
                    if reader._assigned:
                        break
                    await asyncio.sleep(0.05)
                assert reader._assigned
                await wl.send(warm)
                await wl.responses([warm.effect_id])
                # a transaction that aborts: prepared while open, never answered
                await txn.begin_transaction()
                places = []
                for r in aborted:
                    meta = await (await txn.send(topics.out(wid), encode(r),
                                                 key=r.effect_id.encode()))
                    places.append((meta.topic, meta.partition, meta.offset))
                for _ in range(200):
                    if all(p in reader.cache._entries for p in places):
                        break
                    await asyncio.sleep(0.05)
                entries = [reader.cache._entries[p] for p in places]
                assert entries[0].ran is not None or entries[1].running is not None
                await txn.abort_transaction()
                for r in committed:  # one transaction each, as the holder's steps
                    await txn.begin_transaction()
                    await txn.send(topics.out(wid), encode(r), key=r.effect_id.encode())
                    await txn.commit_transaction()
                ids = [r.effect_id for r in [warm, *committed]]
                first = await wl.responses(ids, settle=1.5)
                metric = svc.metrics.speculative.labels
                counts = {k: metric(k)._value.get()
                          for k in ("prepared", "ran", "hit", "miss")}
                public_key = svc.identity.public_key_b64
            # the same requests answered again by an executor without speculation (same node
            # id and key, a group of its own: it reads .out from the start)
            cfg_off = executor_config(kafka_bootstrap, wid, tmp_path, store.root,
                                      group_prefix=f"spec-off-{wid}", **common)
            async with running(cfg_off) as plain:
                assert plain.runner.speculation is None

                def twice(recs: list[Any]) -> bool:
                    got = [r.effect_id for r in recs if isinstance(r, ResponseRecord)]
                    return all(got.count(i) >= 2 for i in ids)

                both = await wl.read(topics.resp(wid), until=twice, timeout=60)
                await asyncio.sleep(1.0)
                both = await wl.read(topics.resp(wid), until=lambda r: len(r) >= len(both))
        finally:
            await txn.stop()

    responses = [r for r in first if isinstance(r, ResponseRecord)]
    # every committed request answered once with speculation, the aborted ones never
    assert sorted(r.effect_id for r in responses) == sorted(ids)
    never = {r.effect_id for r in aborted}
    assert not [r for r in both if getattr(r, "effect_id", None) in never]
    accepted = [r.effect_id for r in first if isinstance(r, AcceptedRecord)]
    assert sorted(accepted) == sorted(ids)
    # the inference requests of the committed transactions were prepared and taken; the
    # digest kind (served without a model) never was
    assert counts["hit"] + counts["miss"] == 5  # warm + four inference requests
    assert counts["hit"] >= 1 and counts["ran"] >= 1
    assert counts["prepared"] + counts["ran"] == 5 + len(aborted)
    # the same answer as without speculation
    by_id: dict[str, list[ResponseRecord]] = {}
    for r in both:
        if isinstance(r, ResponseRecord):
            by_id.setdefault(r.effect_id, []).append(r)
    for effect_id in ids:
        spec_resp, plain_resp = by_id[effect_id][:2]
        assert spec_resp.outcome == "ok", spec_resp.error
        assert verify_response(spec_resp, public_key)
        assert _comparable(spec_resp) == _comparable(plain_resp)
