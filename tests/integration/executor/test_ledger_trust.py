"""Issue 31 on a real broker: the ledger trusts only its node.

1. A leaf appended to ``sys.ledger.<node>`` by anyone who may write it (a receipt signed by an
   uncertified key) is never covered by a checkpoint of the genuine node: the restarted executor
   refuses to extend the ledger (``ledger_refused`` answers, the metric), ``fx ledger watch``
   reports the foreign leaf and ``fx ledger prove`` does not call it included. (Before: the
   executor adopted the tree as found and signed a checkpoint over it; watch said ok and prove
   said "included", exit 0.)
2. Checkpoints are judged by the key history at their append time: a key revoked from 0, a key
   certified only from 2096, and a rotated-out key after its revocation sign no trusted
   checkpoint. (Before: ``fx ledger`` accepted all three.)
3. Revocation beats back-dating: an answer signed with a revoked key and dated one microsecond
   before the revocation is refused by ``fx verify FILE --fleet-key``; a receipt the ledger
   checkpointed before the revocation stays trusted, and the output says why. (Before: passed.)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from broker_schema import encode, signatures, topics
from broker_schema.records import ResponseRecord
from executor.engines.integer import import_artifact
from executor.ledger import read_ledger
from executor.models import ModelManifest, ModelStore
from fx_integer import ledger as L
from fx_integer.receipt import signing_bytes
from fx_kafka.client import make_producer
from fx_node.identity import NodeIdentity
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.integration.executor.test_integer_engine import fx
from tests.unit.executor.helpers import request
from tests.unit.integer.real_model import real_artifact

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = {"prompt": "What is 2+2?", "chat": True, "max_tokens": 2}


@pytest.fixture(scope="module")
def int_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, ModelManifest]:
    art = real_artifact()  # skipped without the model wheel, a failure in CI
    root = tmp_path_factory.mktemp("int-models")
    return ModelStore(root), import_artifact(root, art)


async def _append(bootstrap: str, topic: str, value: bytes, key: bytes) -> None:
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def _signed_by(identity: NodeIdentity, receipt: dict[str, Any]) -> dict[str, Any]:
    raw = signatures.public_key_from_text(identity.public_key_b64)
    body = {k: v for k, v in receipt.items() if k != "signature"}
    body["public_key"] = raw.hex()
    return {**body, "signature": identity.signing_key.sign(signing_bytes(body)).hex()}


def _last_json(text: str) -> Any:
    return json.loads(text.strip().splitlines()[-1])


async def test_a_foreign_leaf_is_never_checkpointed(
    kafka_bootstrap: str, tmp_path: Path, int_store: tuple[ModelStore, ModelManifest]
) -> None:
    store, manifest = int_store
    boot = ("--bootstrap", kafka_bootstrap)
    async with workload(kafka_bootstrap, "foreign") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              integer_backend="oracle")
        node = cfg.node_id
        reqs = [request(wl.workload_id, manifest.hash, b"", index=i, params=SMALL)
                for i in range(2)]
        async with running(cfg) as svc:
            await wl.send(reqs[0])
            await wl.responses([reqs[0].effect_id], timeout=90)
            identity = svc.identity
        key_b64 = identity.public_key_b64
        before = await read_ledger(kafka_bootstrap, node)
        genuine = L.audit(before, node, signatures.public_key_from_text(key_b64))
        assert genuine.ok and len(genuine.tree) == 1, genuine.problems

        # anyone who may write sys.ledger.<node> appends leaf 1: a receipt of the node's shape,
        # signed by a key nobody certified for it
        thief = NodeIdentity.generate()
        forged = _signed_by(thief, dict(genuine.receipts[0], seq=1))
        await _append(kafka_bootstrap, topics.ledger(node), L.leaf_record(1, forged),
                      node.encode())

        # the executor restarts: it checks its ledger at start and refuses to extend it
        async with running(cfg) as svc:
            assert svc.metrics.ledger_foreign_leaves._value.get() == 1
            await wl.send(reqs[1])
            recs = await wl.responses([reqs[1].effect_id], timeout=90)
        (resp,) = by_effect(recs)[reqs[1].effect_id]
        assert resp.outcome == "error" and resp.error is not None
        assert resp.error.code == "ledger_refused", resp.error
        assert "did not append" in resp.error.message and resp.receipt is None

        after = await read_ledger(kafka_bootstrap, node)
        assert len(after) == len(before) + 1  # the foreign leaf, and no checkpoint over it
        assert L.parse_record(after[-1][1])["type"] == "leaf"

        watched = fx("ledger", "watch", "--once", "--node", node, "--key", key_b64, *boot)
        seen = _last_json(watched.stdout)
        assert watched.returncode == 1 and not seen["ok"], seen
        assert any(p.startswith("foreign: ") and "leaf 1" in p for p in seen["problems"]), seen

        (tmp_path / "forged.json").write_text(json.dumps(forged))
        proved = fx("ledger", "prove", str(tmp_path / "forged.json"), "--node", node,
                    "--key", key_b64, *boot)
        assert proved.returncode == 1, proved.stdout + proved.stderr
        (row,) = json.loads(proved.stdout)["receipts"]
        assert row["included"] is False and "foreign" in row["why"]


async def test_checkpoints_are_judged_by_the_key_history(
    kafka_bootstrap: str, tmp_path: Path, int_store: tuple[ModelStore, ModelManifest]
) -> None:
    store, manifest = int_store
    boot = ("--bootstrap", kafka_bootstrap)
    fleet_file = tmp_path / "fleet.pem"
    init = fx("keys", "fleet-init", "--out", str(fleet_file))
    assert init.returncode == 0, init.stderr
    fleet_pub = json.loads(init.stdout)["fleet_public_key"]

    # a node whose key is certified only from 2096: its checkpoint (appended now) is refused
    async with workload(kafka_bootstrap, "cpfuture") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path / "a", store.root,
                              integer_backend="oracle", key_file=tmp_path / "a" / "node.key")
        req = request(wl.workload_id, manifest.hash, b"", index=0, params=SMALL)
        async with running(cfg):
            await wl.send(req)
            await wl.responses([req.effect_id], timeout=90)
        future = fx("keys", "certify", "--fleet-key", str(fleet_file), "--node", cfg.node_id,
                    "--from-facts", "--not-before-us", str(4_000_000_000_000_000), *boot)
        assert future.returncode == 0, future.stdout + future.stderr
        seen = watch_of(cfg.node_id, fleet_pub, boot)
        assert not seen["ok"] and seen["size"] == 0, seen
        assert any("certified from 4000000000000000" in p for p in seen["problems"]), seen

    async with workload(kafka_bootstrap, "cprotate") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path / "b", store.root,
                              integer_backend="oracle", key_file=tmp_path / "b" / "old.key")
        node = cfg.node_id
        reqs = [request(wl.workload_id, manifest.hash, b"", index=i, params=SMALL)
                for i in range(2)]
        async with running(cfg) as svc:
            old = svc.identity
            await wl.send(reqs[0])
            await wl.responses([reqs[0].effect_id], timeout=90)
        cert = fx("keys", "certify", "--fleet-key", str(fleet_file), "--node", node,
                  "--from-facts", *boot)
        assert cert.returncode == 0 and old.key_id in cert.stdout, cert.stdout + cert.stderr
        seen = watch_of(node, fleet_pub, boot)
        assert seen["ok"] and seen["size"] == 1, seen
        # rotation: the node moves to a new key (its old leaves stay its own: it remembers the
        # keys it signed its ledger with), certified too
        rotated = cfg.model_copy(update={"key_file": tmp_path / "b" / "new.key"})
        async with running(rotated) as svc:
            new = svc.identity
            await wl.send(reqs[1])
            recs = await wl.responses([reqs[1].effect_id], timeout=90)
        assert all(r.outcome == "ok" for rs in by_effect(recs).values() for r in rs), recs
        cert = fx("keys", "certify", "--fleet-key", str(fleet_file), "--node", node,
                  "--from-facts", *boot)
        assert cert.returncode == 0 and new.key_id in cert.stdout, cert.stdout + cert.stderr
        seen = watch_of(node, fleet_pub, boot)
        assert seen["ok"] and seen["size"] == 2, seen
        # the old key revoked from now: its checkpoint (appended before) stands
        cut_us = int(time.time() * 1e6)
        rev = fx("keys", "revoke", "--fleet-key", str(fleet_file), "--node", node,
                 "--key-id", old.key_id, "--from-us", str(cut_us), "--reason", "rotated out",
                 *boot)
        assert rev.returncode == 0, rev.stdout + rev.stderr
        assert watch_of(node, fleet_pub, boot)["ok"]
        # someone who kept the rotated-out key signs a checkpoint after its revocation: refused,
        # dated by the broker's append time, whatever the note says
        values = await read_ledger(kafka_bootstrap, node)
        raws = [signatures.public_key_from_text(k.public_key_b64) for k in (old, new)]
        tree = L.audit(values, node, raws).tree
        body = L.checkpoint_body(L.origin(node), len(tree), tree.root())
        await _append(kafka_bootstrap, topics.ledger(node), L.checkpoint_record(
            L.sign_note(body, L.origin(node), old.signing_key.sign, raws[0])), node.encode())
        seen = watch_of(node, fleet_pub, boot)
        assert not seen["ok"], seen
        assert any(p.startswith("signature: ") and "revoked from" in p
                   for p in seen["problems"]), seen
        # revoked from 0: every checkpoint the old key signed is refused
        rev0 = fx("keys", "revoke", "--fleet-key", str(fleet_file), "--node", node,
                  "--key-id", old.key_id, "--reason", "stolen", *boot)
        assert rev0.returncode == 0, rev0.stdout + rev0.stderr
        seen = watch_of(node, fleet_pub, boot)
        assert not seen["ok"] and "revoked from 0 us" in " ".join(seen["problems"]), seen


def watch_of(node: str, fleet_pub: str, boot: tuple[str, ...]) -> dict[str, Any]:
    done = fx("ledger", "watch", "--once", "--node", node, "--fleet-key", fleet_pub, *boot)
    assert done.stdout.strip(), done.stderr
    seen = _last_json(done.stdout)
    assert (done.returncode == 0) == seen["ok"], done.stdout + done.stderr
    return dict(seen)


async def test_revocation_beats_back_dating(
    kafka_bootstrap: str, tmp_path: Path, int_store: tuple[ModelStore, ModelManifest]
) -> None:
    store, manifest = int_store
    boot = ("--bootstrap", kafka_bootstrap)
    fleet_file = tmp_path / "fleet.pem"
    init = fx("keys", "fleet-init", "--out", str(fleet_file))
    assert init.returncode == 0, init.stderr
    fleet_pub = json.loads(init.stdout)["fleet_public_key"]
    async with workload(kafka_bootstrap, "backdate") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              integer_backend="oracle")
        node = cfg.node_id
        first = request(wl.workload_id, manifest.hash, b"", index=0, params=SMALL)
        async with running(cfg) as svc:
            identity = svc.identity
            await wl.send(first)
            recs = await wl.responses([first.effect_id], timeout=90)
        (logged,) = by_effect(recs)[first.effect_id]
        assert logged.outcome == "ok" and logged.receipt is not None
        cert = fx("keys", "certify", "--fleet-key", str(fleet_file), "--node", node,
                  "--from-facts", *boot)
        assert cert.returncode == 0, cert.stdout + cert.stderr
        cut_us = int(time.time() * 1e6)
        rev = fx("keys", "revoke", "--fleet-key", str(fleet_file), "--node", node,
                 "--key-id", identity.key_id, "--from-us", str(cut_us), "--reason", "stolen",
                 *boot)
        assert rev.returncode == 0, rev.stdout + rev.stderr

        def verify(path: Path) -> Any:
            return fx("verify", str(path), "--fleet-key", fleet_pub, "--store",
                      str(store.root), "--no-reexecute", *boot)

        # the genuine answer, logged and checkpointed before the revocation: trusted, and the
        # output says why
        genuine = tmp_path / "genuine.json"
        genuine.write_text(logged.model_dump_json())
        ok = verify(genuine)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "before the revocation" in ok.stdout and "1/1 receipts verified" in ok.stdout

        # the thief, holding the revoked key, signs a new answer dated 1 us before the
        # revocation: it is in no checkpoint made before the revocation, so it is refused
        receipt = dict(logged.receipt["integer"])
        receipt = _signed_by(identity, dict(receipt, output_text_hash="00" * 32))
        timing = (logged.timing.model_copy(update={"finished_us": cut_us - 1})
                  if logged.timing is not None else None)
        forged = identity.sign_response(ResponseRecord.model_validate({
            **json.loads(logged.model_dump_json()), "signature": None,
            "receipt": {"integer": receipt},
            "timing": None if timing is None else json.loads(timing.model_dump_json())}))
        backdated = tmp_path / "backdated.json"
        backdated.write_bytes(encode(forged))
        refused = verify(backdated)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "revoked" in refused.stdout and "no checkpoint" in refused.stdout, refused.stdout
        # and the same answer on the log is judged at its append time: after the revocation
        await wl.write(topics.resp(wl.workload_id), encode(forged), key=forged.effect_id.encode())
        on_log = fx("verify", "--workload", wl.workload_id, "--fleet-key", fleet_pub, "--store",
                    str(store.root), "--no-reexecute", *boot)
        assert on_log.returncode == 1 and "revoked" in on_log.stdout, on_log.stdout
