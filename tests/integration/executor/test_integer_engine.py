"""The integer engine in the executor on a real broker with the full 30-layer SmolLM2 artifact:
request -> accepted -> ok response with a signed receipt; the receipt chain continues across an
executor restart; ``fx verify --workload`` (a subprocess) re-executes and verifies everything;
a tampered copy of a receipt fails ``fx verify FILE`` with reasons."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from broker_schema import record_hash, topics
from broker_schema.records import AcceptedRecord, FactsRecord, InlineBody, ResponseRecord
from executor.engines.integer import import_artifact
from executor.models import ModelManifest, ModelStore
from fx_integer.receipt import GENESIS, receipt_hash
from fx_node.identity import verify_response
from tests.integration.executor.harness import (
    REPO,
    by_effect,
    executor_config,
    running,
    workload,
)
from tests.unit.executor.helpers import request
from tests.unit.integer.real_model import real_artifact

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FRANCE = {"prompt": "What is the capital of France?", "chat": True, "max_tokens": 8}
TWO = {"prompt": "What is 2+2?", "chat": True, "max_tokens": 6}


@pytest.fixture(scope="module")
def int_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelStore, ModelManifest]:
    art = real_artifact()  # skipped without the model wheel, a failure in CI
    root = tmp_path_factory.mktemp("int-models")
    manifest = import_artifact(root, art)
    return ModelStore(root), manifest


def fx(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_EXECUTOR_")}
    return subprocess.run([sys.executable, "-m", "fx_cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def output(resp: ResponseRecord) -> dict[str, Any]:
    assert isinstance(resp.output, InlineBody) and isinstance(resp.output.data, dict)
    return resp.output.data


async def test_integer_engine_receipts_verify(
    kafka_bootstrap: str, tmp_path: Path, int_store: tuple[ModelStore, ModelManifest]
) -> None:
    store, manifest = int_store
    async with workload(kafka_bootstrap, "int") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              integer_backend="oracle")
        first = request(wl.workload_id, manifest.hash, b"", index=0, params=FRANCE)
        second = request(wl.workload_id, manifest.hash, b"", index=1, params=TWO)
        async with running(cfg) as svc:
            assert manifest.hash in svc.runner.engines.loaded_models()  # preloaded, hash-checked
            t0 = time.monotonic()
            await wl.send(first)
            recs = await wl.responses([first.effect_id], timeout=60)
            latency = time.monotonic() - t0
            public_key = svc.identity.public_key_b64
        print(f"\nrequest -> ok response through the executor (8 tokens max): {latency:.2f} s")
        # a restarted node (same key file, so the same chain head on disk) continues the chain
        async with running(cfg):
            await wl.send(second)
            recs = await wl.responses([first.effect_id, second.effect_id], timeout=60)
        facts = await wl.read(topics.FACTS, until=lambda rs: any(
            isinstance(r, FactsRecord) and r.node_id == cfg.node_id for r in rs))

        answers = by_effect(recs)
        (r1,) = answers[first.effect_id]
        (r2,) = answers[second.effect_id]
        accepted = {r.effect_id for r in recs if isinstance(r, AcceptedRecord)}
        assert {first.effect_id, second.effect_id} <= accepted
        for resp in (r1, r2):
            assert resp.outcome == "ok", resp.error
            assert resp.model_hash == manifest.hash
            assert resp.executor is not None
            assert (resp.executor.engine, resp.executor.device_class) == ("integer", "cpu")
            assert verify_response(resp, public_key)
        out1 = output(r1)
        assert str(out1["text"]).startswith("The capital of France is"), out1
        assert r1.receipt is not None and r2.receipt is not None
        assert r1.receipt["manifest_hash"] == manifest.manifest_hash()
        c1, c2 = r1.receipt["integer"], r2.receipt["integer"]
        assert isinstance(c1, dict) and isinstance(c2, dict)
        assert c1["model_hash"] == manifest.hash.removeprefix("sha256:")
        assert c1["context"] == {"workload_id": wl.workload_id, "effect_id": first.effect_id,
                                 "epoch": first.header.epoch, "request_hash": record_hash(first),
                                 "manifest_hash": manifest.manifest_hash()}
        assert c1["output_tokens"] == out1["output_tokens"]
        assert c1["public_key"] == base64.b64decode(public_key).hex()
        assert (c1["seq"], c1["prev_receipt_hash"]) == (0, GENESIS)
        assert (c2["seq"], c2["prev_receipt_hash"]) == (1, receipt_hash(c1))
        node_facts = [f for f in facts if isinstance(f, FactsRecord)
                      and f.node_id == cfg.node_id]
        assert node_facts[-1].public_key == public_key
        assert manifest.hash in node_facts[-1].models_loaded
        assert node_facts[-1].engines.get("integer") == "0.1.0"

        # fx verify --workload: re-executes both on the CPU oracle, checks everything
        t0 = time.monotonic()
        key_hex = base64.b64decode(public_key).hex()
        done = fx("verify", "--workload", wl.workload_id, "--bootstrap", kafka_bootstrap,
                  "--store", str(store.root), "--trusted-key", key_hex)
        verify_s = time.monotonic() - t0
        print(done.stdout)
        print(f"fx verify --workload (2 receipts, re-executed): {verify_s:.2f} s")
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert lines[-1].startswith(f"2/2 receipts verified on wl.{wl.workload_id}.resp")
        assert sum(line.startswith("OK   resp@") for line in lines) == 2
        assert "The capital of France is" in done.stdout

    # a tampered copy of the first receipt: one byte of an output token changed
    text = json.dumps(c1, sort_keys=True)
    start = text.index('"output_tokens": [') + len('"output_tokens": [')
    end = min(i for i in (text.find(",", start), text.find("]", start)) if i > 0)
    digit = text[end - 1]
    tampered = text[: end - 1] + str((int(digit) + 1) % 10) + text[end:]
    bad = tmp_path / "tampered.json"
    bad.write_text(tampered)
    failed = fx("verify", str(bad), "--artifact", str(store.path(manifest.hash)))
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "signature does not verify" in failed.stdout
    assert "output_tokens differ from re-execution at index 0" in failed.stdout
    # no --trusted-key: nothing is ever called "verified", even the count
    assert "0/1 receipts checked" in failed.stdout and "NOT AUTHENTICATED" in failed.stdout
    # the untouched copy (as the whole response record) verifies
    good = tmp_path / "response.json"
    good.write_text(json.dumps(r1.model_dump(mode="json")))
    fine = fx("verify", str(good), "--artifact", str(store.path(manifest.hash)),
              "--trusted-key", key_hex)
    assert fine.returncode == 0, fine.stdout + fine.stderr
    assert "response effect id, workload, epoch, manifest == receipt context" in fine.stdout
    # without a trusted key every check passes, yet nothing is called verified: exit 3
    unauth = fx("verify", str(good), "--artifact", str(store.path(manifest.hash)))
    assert unauth.returncode == 3 and "NOT AUTHENTICATED" in unauth.stdout, unauth.stdout
    # the same record moved to another workload (re-signed by the node): refused
    moved = r1.model_copy(update={"header": r1.header.model_copy(
        update={"workload_id": "elsewhere"})})
    moved = moved.model_copy(update={"effect_id": moved.header.effect_id})
    (tmp_path / "moved.json").write_text(json.dumps(moved.model_dump(mode="json")))
    refused = fx("verify", str(tmp_path / "moved.json"), "--artifact",
                 str(store.path(manifest.hash)), "--trusted-key", key_hex)
    assert refused.returncode == 1
    assert "workload: the response is on 'elsewhere'" in refused.stdout



async def test_keys_with_a_history_on_a_real_broker(
    kafka_bootstrap: str, tmp_path: Path, int_store: tuple[ModelStore, ModelManifest]
) -> None:
    """``fx keys``: a fleet key certifies a node's key from its facts; the node rotates to a
    secp256k1 key and the new key is certified too; ``fx verify --workload --fleet-key`` trusts
    both keys' receipts, a forged ``sys.facts`` record changes nothing, and a revocation of the
    old key fails what it signed."""
    from broker_schema import encode
    from fx_node.identity import NodeIdentity

    store, manifest = int_store
    fleet_file = tmp_path / "fleet.pem"
    init = fx("keys", "fleet-init", "--out", str(fleet_file))
    assert init.returncode == 0, init.stderr
    fleet_pub = json.loads(init.stdout)["fleet_public_key"]
    assert fx("keys", "fleet-init", "--out", str(fleet_file)).returncode == 2  # never overwritten
    small = {"prompt": "What is 2+2?", "chat": True, "max_tokens": 2}
    async with workload(kafka_bootstrap, "keys") as wl:
        await wl.setup({"llm": manifest.hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              integer_backend="oracle", key_file=tmp_path / "old.key")
        node = cfg.node_id
        reqs = [request(wl.workload_id, manifest.hash, b"", index=i, params=small)
                for i in range(2)]
        async with running(cfg) as svc:
            old_key = svc.identity
            await wl.send(reqs[0])
            await wl.responses([reqs[0].effect_id], timeout=60)
        boot = ("--bootstrap", kafka_bootstrap)
        cert = fx("keys", "certify", "--fleet-key", str(fleet_file), "--node", node,
                  "--from-facts", *boot)
        assert cert.returncode == 0 and old_key.key_id in cert.stdout, cert.stdout + cert.stderr
        # rotation: the same node, a new key file of the other type
        rotated = cfg.model_copy(update={"key_file": tmp_path / "new.key",
                                         "key_type": "secp256k1"})
        async with running(rotated) as svc:
            new_key = svc.identity
            assert new_key.key_type == "secp256k1"
            await wl.send(reqs[1])
            recs = await wl.responses([r.effect_id for r in reqs], timeout=60)
        assert all(r.outcome == "ok" for rs in by_effect(recs).values() for r in rs)
        cert = fx("keys", "certify", "--fleet-key", str(fleet_file), "--node", node,
                  "--from-facts", *boot)
        assert cert.returncode == 0 and new_key.key_id in cert.stdout, cert.stderr

        def verify(*extra: str) -> subprocess.CompletedProcess[str]:
            return fx("verify", "--workload", wl.workload_id, *boot, "--store",
                      str(store.root), "--no-reexecute", *extra)

        both = verify("--fleet-key", fleet_pub)
        assert both.returncode == 0, both.stdout + both.stderr
        assert "2/2 receipts verified" in both.stdout
        # the node's ledger holds checkpoints by both keys: clean with every certified key,
        # a signature problem with the new key alone
        watched = fx("ledger", "watch", "--once", "--node", node, "--fleet-key", fleet_pub, *boot)
        assert watched.returncode == 0, watched.stdout + watched.stderr
        assert json.loads(watched.stdout.splitlines()[-1])["size"] == 2
        new_only = fx("ledger", "watch", "--once", "--node", node, "--key",
                      new_key.public_key_b64, *boot)
        assert new_only.returncode == 1 and "signature" in new_only.stdout, new_only.stdout
        # a forged facts record (someone who can write sys.facts) decides nothing now
        rogue = NodeIdentity.generate()
        forged = FactsRecord(node_id=node, kinds=(), public_key=rogue.public_key_b64,
                             key_id=rogue.key_id, updated_us=int(time.time() * 1e6))
        await wl.write(topics.FACTS, encode(forged), key=node.encode())
        still = verify("--fleet-key", fleet_pub)
        assert still.returncode == 0, still.stdout + still.stderr
        without = verify()  # facts decide without a fleet key: the forged key fails both
        assert without.returncode == 1, without.stdout
        # another fleet key sees no certificates: nothing is trusted
        other = tmp_path / "other.pem"
        assert fx("keys", "fleet-init", "--out", str(other)).returncode == 0
        stranger = verify("--fleet-key", str(other))
        assert stranger.returncode == 1 and "no fleet certificate" in stranger.stdout
        # the old key revoked from the start: its receipt fails, the new key's stands
        rev = fx("keys", "revoke", "--fleet-key", str(fleet_file), "--node", node,
                 "--key-id", old_key.key_id, "--reason", "test", *boot)
        assert rev.returncode == 0, rev.stderr
        after = verify("--fleet-key", fleet_pub)
        assert after.returncode == 1 and "revoked" in after.stdout, after.stdout
        assert "1/2 receipts verified" in after.stdout
        listed = fx("keys", "list", "--fleet-key", fleet_pub, "--json", *boot)
        assert listed.returncode == 0, listed.stderr
        rows = {r["key_id"]: r for r in json.loads(listed.stdout)["keys"] if r["node_id"] == node}
        assert rows[old_key.key_id]["revoked_us"] == 0
        assert rows[new_key.key_id]["key_type"] == "secp256k1"
        assert rows[new_key.key_id]["revoked_us"] is None
