"""Which node keys to trust (broker_schema.key_history): certificates and revocations signed by
a fleet key, rotation keeping old keys valid for what they signed, and every forgery refused."""

from __future__ import annotations

import base64

import pytest

from broker_schema import decode, encode, signatures
from broker_schema.key_history import (
    KeyProblem,
    TrustedKey,
    build_history,
    node_keys,
    receipt_key_problem,
    response_key_problem,
    response_node,
    response_signer,
)
from broker_schema.records import (
    ExecutorInfo,
    FactsRecord,
    InlineBody,
    KeyCertRecord,
    KeyRevokeRecord,
    ResponseRecord,
    Signature,
    Timing,
)
from broker_schema.signatures import SigningKey
from fx_kafka.keys import certify, fleet_public_keys, revoke

NOW = 1_800_000_000_000_000


@pytest.fixture(params=["ed25519", "secp256k1"])
def fleet(request: pytest.FixtureRequest) -> SigningKey:
    return SigningKey.generate(request.param)


def test_certified_keys_are_trusted_and_rotation_keeps_the_old_one(fleet: SigningKey) -> None:
    old, new = SigningKey.generate(), SigningKey.generate("secp256k1")
    recs = [(0, certify(fleet, "n1", old.public_key, now_us=NOW)),
            (1, certify(fleet, "n1", new.public_key, now_us=NOW + 10))]
    h = build_history(recs, [fleet.public_key])
    assert not h.ignored
    assert h.public_keys("n1") == [old.public_key, new.public_key]
    assert h.key_problem("n1", old.public_key, NOW + 50) is None  # rotated, still its own
    assert h.key_problem("n1", new.public_key, None) is None
    assert "not for node 'n2'" in (h.key_problem("n2", old.public_key, NOW) or "")
    stranger = SigningKey.generate()
    assert "no fleet certificate" in (h.key_problem("n1", stranger.public_key, NOW) or "")
    # the records survive the wire byte for byte
    for _, rec in recs:
        assert decode(encode(rec), strict=True) == rec


def test_revocation_cuts_from_its_time_and_a_bare_receipt_has_no_time(fleet: SigningKey) -> None:
    key = SigningKey.generate()
    recs: list[tuple[int, KeyCertRecord | KeyRevokeRecord]] = [
        (0, certify(fleet, "n1", key.public_key, now_us=NOW)),
        (1, revoke(fleet, "n1", key.key_id, from_us=NOW + 100, reason="leaked", now_us=NOW)),
    ]
    h = build_history(recs, [fleet.public_key])
    assert h.key_problem("n1", key.public_key, NOW + 99) is None
    assert "revoked from" in (h.key_problem("n1", key.public_key, NOW + 100) or "")
    assert "carries no time" in (h.key_problem("n1", key.public_key, None) or "")
    assert h.spans("n1")[0].revoke_reason == "leaked"
    # a revocation written before the certificate applies too; the earliest revocation wins
    h2 = build_history([recs[1], recs[0],
                        (2, revoke(fleet, "n1", key.key_id, from_us=NOW + 500, now_us=NOW))],
                       [fleet.public_key])
    assert h2.spans("n1")[0].revoked_us == NOW + 100
    # not_before: signatures dated earlier are not covered
    h3 = build_history([(0, certify(fleet, "n1", key.public_key, not_before_us=NOW))],
                       [fleet.public_key])
    assert "certified from" in (h3.key_problem("n1", key.public_key, NOW - 1) or "")


def test_forged_unsigned_and_mismatched_records_are_ignored(fleet: SigningKey) -> None:
    key, rogue = SigningKey.generate(), SigningKey.generate()
    good = certify(fleet, "n1", key.public_key, now_us=NOW)
    by_rogue = certify(rogue, "n1", rogue.public_key, now_us=NOW)  # a self-made "fleet"
    unsigned = good.model_copy(update={"signature": None})
    # a genuine certificate with the key swapped: the fleet signature no longer verifies
    swapped = good.model_copy(update={"public_key": rogue.public_key_b64,
                                      "key_id": rogue.key_id})
    # a rogue signature claiming the fleet's key id
    claimed = by_rogue.model_copy(update={
        "issuer_key_id": fleet.key_id,
        "signature": Signature(key_id=fleet.key_id, value=by_rogue.signature.value)})  # type: ignore[union-attr]
    # key_id not the key's hash, signed by the fleet all the same
    wrong_id = certify(fleet, "n1", key.public_key, now_us=NOW).model_copy(
        update={"key_id": rogue.key_id, "signature": None})
    import base64

    wrong_id = wrong_id.model_copy(update={"signature": Signature(
        alg=fleet.key_type, key_id=fleet.key_id,
        value=base64.b64encode(fleet.sign(wrong_id.signing_bytes())).decode())})
    revoke_forged = revoke(rogue, "n1", key.key_id, from_us=0, now_us=NOW)
    recs = [(0, good), (1, by_rogue), (2, unsigned), (3, swapped), (4, claimed),
            (5, wrong_id), (6, revoke_forged)]
    h = build_history(recs, [fleet.public_key])
    assert [o for o, _ in h.ignored] == [1, 2, 3, 4, 5, 6], h.ignored
    reasons = dict(h.ignored)
    assert "not a fleet key" in reasons[1] and "unsigned" in reasons[2]
    assert "does not verify" in reasons[3]
    assert "does not verify" in reasons[4] or "the signature says" in reasons[4]
    assert "hashes to" in reasons[5]
    assert h.public_keys("n1") == [key.public_key]
    assert h.key_problem("n1", key.public_key, NOW) is None  # the forged revocation did nothing
    assert h.key_problem("n1", rogue.public_key, NOW) is not None
    # with no fleet key given, nothing is trusted
    assert build_history(recs, []).keys == {}


def test_fleet_public_keys_read_text_hex_env_and_pem_files(tmp_path: object,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from pathlib import Path

    key = SigningKey.generate("secp256k1")
    path = Path(str(tmp_path)) / "fleet.pem"
    assert key.write_new(path)
    assert fleet_public_keys([key.public_key_b64]) == [key.public_key]
    assert fleet_public_keys([key.public_key.hex()]) == [key.public_key]
    assert fleet_public_keys([str(path)]) == [key.public_key]
    monkeypatch.setenv("FX_FLEET_PUBLIC_KEY", key.public_key_b64)
    assert fleet_public_keys([]) == [key.public_key]
    with pytest.raises(ValueError):
        fleet_public_keys(["not a key"])
    assert signatures.key_type(fleet_public_keys([key.public_key_b64])[0]) == "secp256k1"


def test_the_documented_example_certificate_verifies_with_its_fleet_key() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "records.md").read_text()
    fleet_b64 = re.search(r"fleet key whose public key is `([A-Za-z0-9+/=]+)`", text)
    assert fleet_b64 is not None
    recs = [decode(b.encode(), strict=True)
            for b in re.findall(r"```json\n(.*?)\n```", text, flags=re.S)]
    keyed = [(i, r) for i, r in enumerate(recs) if isinstance(r, KeyCertRecord | KeyRevokeRecord)]
    assert len(keyed) == 2
    h = build_history(keyed, [signatures.public_key_from_text(fleet_b64.group(1))])  # type: ignore[arg-type]
    assert not h.ignored
    (span,) = h.spans("gpu-node-1")
    assert span.revoked_us == 1797000000000000


# -- responses: the one rule (response_key_problem) --------------------------------------------


def _response(key: SigningKey, *, executor_node: str, written_by: str) -> ResponseRecord:
    from tests.unit.executor.helpers import request

    req = request("wl1", "sha256:" + "a" * 64)
    resp = ResponseRecord(
        effect_id=req.effect_id, header=req.header, request_offset=3, outcome="ok",
        output=InlineBody.of_json({"text": "hi"}), model_hash="sha256:" + "a" * 64,
        executor=ExecutorInfo(node_id=executor_node, engine="integer", engine_version="1",
                              device_class="cpu"),
        timing=Timing(received_us=NOW, started_us=NOW, finished_us=NOW + 5),
        written_by=written_by)
    sig = Signature(alg=key.key_type, key_id=key.key_id,
                    value=base64.b64encode(key.sign(resp.signing_bytes())).decode())
    return resp.model_copy(update={"signature": sig})


def _facts(node: str, key: SigningKey) -> FactsRecord:
    return FactsRecord(node_id=node, kinds=(), public_key=key.public_key_b64, key_id=key.key_id,
                       updated_us=NOW)


def test_a_response_is_judged_for_the_node_it_claims(fleet: SigningKey) -> None:
    node_a = SigningKey.generate()
    history = build_history([(0, certify(fleet, "n1", node_a.public_key, now_us=NOW))],
                            [fleet.public_key])
    genuine = _response(node_a, executor_node="n1", written_by="n1")
    assert response_key_problem(genuine, [], history) is None
    assert response_key_problem(genuine, [_facts("n1", node_a)], None) is None
    signer = response_signer(genuine, [], history)
    assert isinstance(signer, TrustedKey) and signer.public_key == node_a.public_key
    # signed by n1's key, written by n1, but naming executor n2: the case where `fx verify`
    # (which checked written_by) trusted it and `fx why`/`fx audit`/the holder (which check the
    # executor's node) refused it. The one rule checks the node it claims produced it: n2.
    posing = _response(node_a, executor_node="n2", written_by="n1")
    assert response_node(posing) == "n2"
    assert history.key_problem("n1", node_a.public_key, NOW + 5) is None  # the old fx verify
    by_history = response_key_problem(posing, [], history)
    assert by_history is not None and by_history.code == "not_certified"
    assert by_history.node_id == "n2" and "'n2'" in by_history.detail
    by_facts = response_key_problem(posing, [_facts("n1", node_a)], None)
    assert by_facts is not None and by_facts.code == "other_node"
    # fx verify now says the same (its facts rule refused nothing here before)
    from executor.verify_workload import ReceiptLog, verify_records

    def reasons(resp: ResponseRecord) -> list[str]:
        log = ReceiptLog("wl1", [(0, resp)], {}, {"n1": _facts("n1", node_a)})
        result = verify_records(log, resolve=lambda _: None)  # type: ignore[arg-type,return-value]
        return result.receipts[0].reasons

    assert reasons(genuine) == ["an ok response of the integer engine without a receipt"]
    assert reasons(posing)[0] == ("no facts for node n2 on sys.facts: its public key is "
                                  "unknown")


def test_response_key_problems_are_typed(fleet: SigningKey) -> None:
    key, other = SigningKey.generate(), SigningKey.generate()
    resp = _response(key, executor_node="n1", written_by="n1")
    unsigned = resp.model_copy(update={"signature": None})
    assert (response_key_problem(unsigned, [], None) or _NO).code == "unsigned"
    assert (response_key_problem(resp, [], None) or _NO).code == "unknown_key"
    tampered = resp.model_copy(update={"request_offset": 4})
    assert (response_key_problem(tampered, [_facts("n1", key)], None) or _NO).code \
        == "bad_signature"
    history = build_history([(0, certify(fleet, "n1", key.public_key, now_us=NOW)),
                             (1, revoke(fleet, "n1", key.key_id, from_us=NOW + 1))],
                            [fleet.public_key])
    assert (response_key_problem(resp, [], history) or _NO).code == "untrusted"
    assert (receipt_key_problem(resp, other.public_key, [_facts("n1", key)], None)
            or _NO).code == "untrusted"
    assert receipt_key_problem(resp, key.public_key, [_facts("n1", key)], None) is None
    assert node_keys("n1", [_facts("n1", other), _facts("n1", key)], None) == [key.public_key]
    assert node_keys("n9", [_facts("n1", key)], None) == []


_NO = KeyProblem("unsigned", "", None, "facts", "no problem where one was expected")
