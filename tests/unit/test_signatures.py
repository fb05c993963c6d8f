"""One key encoding, one signature check (broker_schema.signatures), used by every reader."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_schema import (
    EncodeError,
    InlineBody,
    InputRecord,
    RecordTooLarge,
    ResponseRecord,
    decode,
    encode,
    encode_signed,
    signatures,
)
from fx_node.identity import NodeIdentity, verify_response
from tests.unit.executor.helpers import request
from tests.unit.schema_strategies import responses


def _signed(ident: NodeIdentity) -> ResponseRecord:
    req = request("wl1", "sha256:" + "a" * 64)
    resp = ResponseRecord(effect_id=req.effect_id, header=req.header, request_offset=0,
                          outcome="timeout", written_by="n1")
    return ident.sign_response(resp)


def test_the_published_key_is_base64_of_the_raw_32_bytes() -> None:
    ident = NodeIdentity.generate()
    raw = ident.public_key
    assert ident.public_key_b64 == signatures.public_key_text(raw)
    assert signatures.public_key_from_text(ident.public_key_b64) == raw
    assert ident.key_id == signatures.key_id(raw)
    # read only: the DER SubjectPublicKeyInfo form some recorded logs carry is the same key
    der = ident.signing_key._key.public_key().public_bytes(Encoding.DER,
                                                           PublicFormat.SubjectPublicKeyInfo)
    assert signatures.public_key_from_text(base64.b64encode(der).decode()) == raw
    for bad in ("", "not base64!", base64.b64encode(b"x" * 31).decode(),
                base64.b64encode(b"\x31" + der[1:]).decode()):
        with pytest.raises(ValueError):
            signatures.public_key_from_text(bad)
    with pytest.raises(ValueError):
        signatures.public_key_text(raw + b"\x00")


def test_the_one_check_never_raises_and_agrees_everywhere() -> None:
    ident, other = NodeIdentity.generate(), NodeIdentity.generate()
    raw = signatures.public_key_from_text(ident.public_key_b64)
    resp = _signed(ident)
    assert signatures.response_signature_problem(resp, raw) is None
    assert verify_response(resp, ident.public_key_b64) and verify_response(resp, raw)
    assert verify_response(resp, ident.public_key)
    tampered = resp.model_copy(update={"request_offset": 1})
    assert signatures.response_signature_problem(tampered, raw) == (
        "the signature does not verify with the key")
    assert not verify_response(tampered, ident.public_key_b64)
    wrong = signatures.public_key_from_text(other.public_key_b64)
    assert "names key" in (signatures.response_signature_problem(resp, wrong) or "")
    unsigned = resp.model_copy(update={"signature": None})
    assert signatures.response_signature_problem(unsigned, raw) == (
        "the response carries no signature")
    assert "unusable key" in (signatures.response_signature_problem(resp, b"short") or "")
    msg = b"m"
    sig = base64.b64decode(ident.sign(msg))
    assert signatures.verify_ed25519(raw, sig, msg)
    for key, value in ((raw, sig[:-1]), (raw[:-1], sig), (b"\xff" * 32, sig), (wrong, sig),
                       (raw, b"\x00" * 64)):
        assert not signatures.verify_ed25519(key, value, msg)


# ------------------------------------------------------------------------------ secp256k1

def test_secp256k1_keys_sign_and_verify_through_the_one_check(tmp_path: object) -> None:
    key = signatures.SigningKey.generate(signatures.SECP256K1)
    assert len(key.public_key) == 33 and key.public_key[0] in (2, 3)
    assert signatures.key_type(key.public_key) == "secp256k1"
    assert signatures.public_key_from_text(key.public_key_b64) == key.public_key
    assert key.key_id == signatures.key_id(key.public_key)
    msg = b"receipt bytes"
    sig = key.sign(msg)
    assert len(sig) == 64 and signatures.verify(key.public_key, sig, msg)
    assert not signatures.verify(key.public_key, sig, msg + b"!")
    assert not signatures.verify_ed25519(key.public_key, sig, msg)  # not an Ed25519 key
    other = signatures.SigningKey.generate(signatures.SECP256K1)
    assert not signatures.verify(other.public_key, sig, msg)
    assert key.sign(msg) == sig  # RFC 6979: deterministic
    again = signatures.SigningKey.from_pem(key.pem())
    assert again.public_key == key.public_key and signatures.verify(key.public_key,
                                                                    again.sign(msg), msg)


def test_secp256k1_signatures_are_low_s_and_high_s_is_refused() -> None:
    n = signatures._SECP256K1_N
    key = signatures.SigningKey.generate(signatures.SECP256K1)
    for i in range(20):  # about half of raw ECDSA signatures are high-s: each is normalised
        msg = b"m%d" % i
        sig = key.sign(msg)
        s = int.from_bytes(sig[32:], "big")
        assert s <= n // 2
        high = sig[:32] + (n - s).to_bytes(32, "big")
        assert signatures.verify(key.public_key, sig, msg)
        assert not signatures.verify(key.public_key, high, msg)  # one encoding per signature


def test_secp256k1_responses_verify_and_bad_keys_never_raise() -> None:
    ident = NodeIdentity.generate("secp256k1")
    resp = _signed(ident)
    assert resp.signature is not None and resp.signature.key_id == ident.key_id
    assert verify_response(resp, ident.public_key_b64)
    assert not verify_response(resp.model_copy(update={"request_offset": 9}),
                               ident.public_key_b64)
    assert not verify_response(resp, NodeIdentity.generate().public_key_b64)
    for bad in (b"\x04" + b"\x01" * 32, b"\x02" + b"\xff" * 32, b"\x02" * 34, b""):
        assert not signatures.verify(bad, b"\x01" * 64, b"m")
    with pytest.raises(ValueError):
        signatures.public_key_text(b"\x05" + b"\x00" * 32)
    with pytest.raises(ValueError):
        signatures.SigningKey.from_pem(
            b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")


_IDENTS = {kind: NodeIdentity.generate(kind) for kind in signatures.KEY_TYPES}


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(responses(), st.sampled_from(signatures.KEY_TYPES))
def test_one_canonical_pass_signs_and_encodes_as_the_two_passes_did(
        resp: ResponseRecord, kind: signatures.KeyType) -> None:
    # encode_signed splices the signing bytes and the record's bytes from one encoding of the
    # members other than the signature: byte for byte the separate passes, and it verifies
    ident = _IDENTS[kind]
    signature, data, signing = encode_signed(resp, ident.signature_of)
    signed = resp.model_copy(update={"signature": signature})
    assert signing == resp.signing_bytes() == signed.signing_bytes()
    assert data == encode(signed)
    assert decode(data) == signed
    assert signatures.response_signature_problem(signed, ident.public_key) is None
    assert ident.sign_and_encode(resp) == encode(ident.sign_response(resp))


def test_encode_signed_refuses_what_encode_refuses() -> None:
    ident = NodeIdentity.generate()
    resp = _signed(ident).model_copy(update={"signature": None})
    with pytest.raises(RecordTooLarge):
        encode_signed(resp, ident.signature_of, limit=100)
    with pytest.raises(EncodeError) as err:
        encode_signed(InputRecord(workload_id="w", body=InlineBody.of_json(1)),  # type: ignore[type-var]
                      ident.signature_of)
    assert err.value.code == "unknown_kind"
