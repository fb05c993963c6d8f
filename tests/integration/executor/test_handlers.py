"""Kinds without a model (``ExecutorConfig.handlers``) on a real broker: the same accepted,
response and fencing rules as inference, with ``model_hash`` null and no model store involved."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_schema import encode, sha256_hex, topics
from broker_schema.records import INFERENCE_KIND, AcceptedRecord
from executor.models import ModelStore
from fx_node.identity import verify_response
from tests.integration.executor.digest_handler import DIGEST_KIND
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.unit.executor.helpers import claim, request

pytestmark = pytest.mark.integration

HANDLER = "tests.integration.executor.digest_handler:DigestHandler"


async def test_a_kind_without_a_model_is_served_by_its_handler(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    async with workload(kafka_bootstrap, "handler") as wl:
        wid = wl.workload_id
        await wl.setup({"magika": magika_hash}, epoch=1, kinds=(INFERENCE_KIND, DIGEST_KIND))
        await wl.write(topics.claims(wid), encode(claim(wid, 2)))
        ok = request(wid, None, b"some bytes", index=0, epoch=2, kind=DIGEST_KIND,
                     params={"n": 1})
        failed = request(wid, None, index=1, epoch=2, kind=DIGEST_KIND, params={"fail": True})
        cases = {
            "stale_epoch": request(wid, None, index=2, epoch=1, kind=DIGEST_KIND),
            "model_unknown": request(wid, magika_hash, index=3, epoch=2, kind=DIGEST_KIND),
            "deadline_passed": request(wid, None, index=4, epoch=2, kind=DIGEST_KIND,
                                       deadline_ms=1),
            # inference still needs a model: naming none is model_unknown, as documented
            "model_unknown (inference)": request(wid, None, index=5, epoch=2),
        }
        for req in (ok, failed, *cases.values()):
            await wl.send(req)
        cfg = executor_config(kafka_bootstrap, wid, tmp_path, store.root,
                              kinds={INFERENCE_KIND: 4, DIGEST_KIND: 4},
                              handlers={DIGEST_KIND: HANDLER}, preload=[])
        async with running(cfg) as svc:
            recs = await wl.responses([r.effect_id for r in (ok, failed, *cases.values())],
                                      settle=0.5)
            key = svc.identity.public_key_b64
            facts = svc.current_facts()

    answers = by_effect(recs)
    accepted = {r.effect_id for r in recs if isinstance(r, AcceptedRecord)}
    (resp,) = answers[ok.effect_id]
    assert resp.outcome == "ok" and resp.model_hash is None and ok.effect_id in accepted
    assert resp.output is not None and resp.output.data == {
        "digest": sha256_hex(b"some bytes"), "kind": DIGEST_KIND, "params": {"n": 1}}
    assert resp.executor is not None and resp.executor.engine == "digest"
    assert resp.receipt is not None and set(resp.receipt) == {"batch_size"}  # no manifest
    assert verify_response(resp, key)
    (err,) = answers[failed.effect_id]
    assert err.error is not None and err.error.code == "params_invalid"
    assert failed.effect_id in accepted
    for name, req in cases.items():
        (refusal,) = answers[req.effect_id]
        assert refusal.error is not None and refusal.error.code == name.split()[0], name
        assert req.effect_id not in accepted
    assert facts is not None and DIGEST_KIND in {k["kind"] for k in facts["kinds"]}
