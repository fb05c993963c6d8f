"""Which node keys to trust (broker_schema.key_history): certificates and revocations signed by
a fleet key, rotation keeping old keys valid for what they signed, and every forgery refused."""

from __future__ import annotations

import pytest

from broker_schema import decode, encode, signatures
from broker_schema.key_history import build_history
from broker_schema.records import KeyCertRecord, KeyRevokeRecord, Signature
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
