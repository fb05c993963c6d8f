"""The node's receipt ledger on a real broker: an executor with the integer engine logs every
receipt it signs on ``sys.ledger.<node>`` with a signed checkpoint after each; ``fx ledger prove``
and ``fx ledger consistency`` pass; ``fx ledger watch`` passes on the ledger and catches a
truncated copy and a forked (re-signed by the node's own key) copy."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from broker_schema import signatures
from executor.engines.integer import import_artifact
from executor.ledger import read_ledger
from executor.models import ModelManifest, ModelStore
from fx_integer import ledger as L
from fx_kafka.client import create_topics, make_producer
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.integration.executor.test_integer_engine import fx
from tests.unit.executor.helpers import request
from tests.unit.integer.real_model import real_artifact

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def int_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, ModelManifest]:
    art = real_artifact()  # skipped without the model wheel, a failure in CI
    root = tmp_path_factory.mktemp("int-models")
    return ModelStore(root), import_artifact(root, art)


async def _copy(bootstrap: str, values: list[bytes]) -> str:
    topic = f"ledger-copy-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic])
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        for v in values:
            await producer.send_and_wait(topic, v, key=b"copy")
    finally:
        await producer.stop()
    return topic


def _watch(bootstrap: str, node: str, key: str, state: Path, *extra: str) -> tuple[int, Any]:
    done = fx("ledger", "watch", "--once", "--node", node, "--bootstrap", bootstrap,
              "--key", key, "--state", str(state), *extra)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


async def test_ledger_holds_every_receipt(
    kafka_bootstrap: str, tmp_path: Path, int_store: tuple[ModelStore, ModelManifest]
) -> None:
    store, manifest = int_store
    async with workload(kafka_bootstrap, "ledger") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              integer_backend="oracle")
        reqs = [request(wl.workload_id, manifest.hash, b"", index=i,
                        params={"prompt": f"Count to {i + 2}.", "max_tokens": 2})
                for i in range(3)]
        async with running(cfg) as svc:
            for r in reqs:
                await wl.send(r)
            recs = await wl.responses([r.effect_id for r in reqs], timeout=90)
            identity = svc.identity
    node, key_b64 = cfg.node_id, identity.public_key_b64
    raw_key = signatures.public_key_from_text(key_b64)
    answers = by_effect(recs)
    receipts = []
    for r in reqs:
        (resp,) = answers[r.effect_id]
        assert resp.outcome == "ok", resp.error
        assert resp.receipt is not None and isinstance(resp.receipt["integer"], dict)
        receipts.append(resp.receipt["integer"])

    values = await read_ledger(kafka_bootstrap, node)
    audit = L.audit(values, node, raw_key)
    assert audit.ok, audit.problems
    assert len(audit.tree) == 3 and audit.latest is not None and audit.latest.size == 3
    assert sorted(r["seq"] for r in audit.receipts) == [0, 1, 2]
    assert all(audit.find(r) is not None for r in receipts)
    assert [L.parse_record(v)["type"] for _, v, _ in values] == ["leaf", "checkpoint"] * 3

    # inclusion of every receipt, as a file of the response's receipts
    receipt_file = tmp_path / "receipts.json"
    receipt_file.write_text(json.dumps(receipts))
    proved = fx("ledger", "prove", str(receipt_file), "--node", node,
                "--bootstrap", kafka_bootstrap, "--key", key_b64)
    assert proved.returncode == 0, proved.stdout + proved.stderr
    out = json.loads(proved.stdout)
    assert [r["included"] for r in out["receipts"]] == [True] * 3
    assert out["checkpoint"]["size"] == 3
    # a tampered receipt is not included
    bad = dict(receipts[0], output_tokens=[1, 2])
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    refused = fx("ledger", "prove", str(tmp_path / "bad.json"), "--node", node,
                 "--bootstrap", kafka_bootstrap, "--key", key_b64)
    assert refused.returncode == 1 and '"included": false' in refused.stdout

    for old in (0, 1, 2, 3):
        cons = fx("ledger", "consistency", "--node", node, "--old", str(old),
                  "--bootstrap", kafka_bootstrap, "--key", key_b64,
                  "--old-root", audit.tree.root(old).hex())
        assert cons.returncode == 0, cons.stdout + cons.stderr
        assert json.loads(cons.stdout)["consistent"] is True

    state = tmp_path / "watch.json"
    rc, seen = _watch(kafka_bootstrap, node, key_b64, state)
    assert (rc, seen["ok"], seen["size"]) == (0, True, 3), seen
    assert seen["key"] == "--key", seen  # it says which key the checkpoints were checked with
    rc, seen = _watch(kafka_bootstrap, node, key_b64, state)  # again: unchanged is fine
    assert rc == 0, seen

    # a truncated copy: the last receipt and its checkpoint dropped
    raw_values = [v for _, v, _ in values]
    truncated = await _copy(kafka_bootstrap, raw_values[:4])
    rc, seen = _watch(kafka_bootstrap, node, key_b64, state, "--topic", truncated)
    assert rc == 1 and any(p.startswith("truncation") for p in seen["problems"]), seen

    # a fork: the node's own key signs a ledger whose leaf 1 is another receipt
    tree = L.MerkleTree()
    forked: list[bytes] = []
    for i, receipt in enumerate(audit.receipts):
        if i == 1:
            receipt = dict(receipt, output_tokens=[0])
        tree.append(L.leaf_data(receipt))
        forked.append(L.leaf_record(i, receipt))
        body = L.checkpoint_body(L.origin(node), len(tree), tree.root())
        forked.append(L.checkpoint_record(
            L.sign_note(body, L.origin(node), identity.signing_key.sign, raw_key)))
    fork_topic = await _copy(kafka_bootstrap, forked)
    rc, seen = _watch(kafka_bootstrap, node, key_b64, state, "--topic", fork_topic)
    assert rc == 1 and any(p.startswith("fork") for p in seen["problems"]), seen
    # a gap: a leaf missing in the middle
    gapped = await _copy(kafka_bootstrap, raw_values[:2] + raw_values[4:])
    rc, seen = _watch(kafka_bootstrap, node, key_b64, tmp_path / "fresh.json",
                      "--topic", gapped)
    assert rc == 1 and any(p.startswith("gap") for p in seen["problems"]), seen
