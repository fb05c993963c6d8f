"""Node keys and response signatures."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from broker_schema import decode, encode
from broker_schema.records import ExecutorInfo, InlineBody, ResponseRecord, Timing
from fx_node.identity import NodeIdentity, verify_response
from tests.unit.executor.helpers import request


def response() -> ResponseRecord:
    req = request("wl1", "sha256:" + "a" * 64)
    return ResponseRecord(
        effect_id=req.effect_id, header=req.header, request_offset=3, outcome="ok",
        output=InlineBody.of_json({"label": "python", "score": 0.99}),
        model_hash="sha256:" + "a" * 64,
        executor=ExecutorInfo(node_id="n1", engine="onnxruntime", engine_version="1",
                              device_class="cpu"),
        timing=Timing(received_us=1, started_us=2, finished_us=3), written_by="n1",
    )


def test_key_created_once_with_0600(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "node.key"
    first = NodeIdentity.load_or_create(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = NodeIdentity.load_or_create(path)
    assert again.key_id == first.key_id and again.public_key_b64 == first.public_key_b64
    assert len(base64.b64decode(first.public_key_b64)) == 32


def test_signature_verifies_after_the_wire_and_a_changed_byte_fails() -> None:
    ident = NodeIdentity.generate()
    signed = ident.sign_response(response())
    wire = encode(signed)
    back = decode(wire)
    assert isinstance(back, ResponseRecord)
    assert verify_response(back, ident.public_key_b64)
    assert verify_response(back, base64.b64decode(ident.public_key_b64))
    # change one byte of the output on the wire: still a valid record, no longer a valid signature
    tampered = wire.replace(b'"python"', b'"pythoN"')
    assert tampered != wire
    changed = decode(tampered)
    assert isinstance(changed, ResponseRecord)
    assert not verify_response(changed, ident.public_key_b64)


def test_every_field_is_covered() -> None:
    ident = NodeIdentity.generate()
    signed = ident.sign_response(response())
    for update in ({"request_offset": 4}, {"model_hash": "sha256:" + "b" * 64},
                   {"written_by": "n2"}):
        assert not verify_response(signed.model_copy(update=update), ident.public_key)


def test_wrong_key_or_missing_signature_fails() -> None:
    ident, other = NodeIdentity.generate(), NodeIdentity.generate()
    signed = ident.sign_response(response())
    assert not verify_response(signed, other.public_key)
    assert not verify_response(response(), ident.public_key)
    assert not verify_response(signed, "not base64!")


def test_a_secp256k1_key_file_is_created_and_kept_whatever_the_config_says(
        tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    first = NodeIdentity.load_or_create(path, "secp256k1")
    assert first.key_type == "secp256k1" and len(first.public_key) == 33
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # the file decides: a key is never replaced because the config's key_type changed
    again = NodeIdentity.load_or_create(path, "ed25519")
    assert again.key_type == "secp256k1" and again.key_id == first.key_id
    assert verify_response(again.sign_response(response()), first.public_key_b64)


def test_a_key_file_that_is_not_a_key_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    path.write_bytes(b"not a key")
    with pytest.raises(ValueError, match=r"node\.key"):
        NodeIdentity.load_or_create(path)
