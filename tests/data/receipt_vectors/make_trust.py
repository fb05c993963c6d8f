"""Regenerate ``trust.json``: negative (and matching positive) vectors for who a receipt, a
response and a ledger checkpoint are trusted from (docs/ledger.md, "Keys and dates";
docs/receipts.md, "Which time a signature is judged at").

    .venv/bin/python tests/data/receipt_vectors/make_trust.py

It reads the committed receipts and responses here (``chain.jsonl``, ``responses.jsonl``) and the
TEST-ONLY keys (``keys.json``), adds a TEST-ONLY fleet key (seed ``40..5f``), and writes, with
constant times, so running it again rewrites the same bytes:

- ``foreign_leaf`` (weakness 1): a ledger whose leaf 2 is a receipt signed by a key that is not
  the node's, under a checkpoint the node's own key signed;
- ``checkpoint_revoked_from_0``, ``checkpoint_certified_from_2096``,
  ``checkpoint_rotated_out_after_revocation`` (weakness 2): ledgers whose checkpoints are judged
  by the key history at the broker's append time of each checkpoint record;
- ``backdated_response_file``, ``backdated_response_on_log``, ``genuine_file_checkpointed_before``,
  ``genuine_on_log_before`` (weakness 3): a response signed by a revoked key and dated 1 us before
  the revocation, and the genuine answer logged before it.

Every ledger entry is ``{"offset", "append_us", "value"}`` (``value``: the record's bytes as a
UTF-8 string; ``append_us``: the broker's append time in µs, ``LogAppendTime``). ``sys_keys`` are
``KeyCertRecord`` / ``KeyRevokeRecord`` objects signed by the fleet key. Each case's ``expect``
is what a verifier must conclude; ``tests/unit/integer/test_trust_vectors.py`` checks the
project's code against it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from broker_schema import ResponseRecord, Signature, signatures
from fx_integer import ledger as L
from fx_integer.receipt import signing_bytes
from fx_kafka.keys import certify, revoke

HERE = Path(__file__).resolve().parent
FLEET_SEED = bytes(range(0x40, 0x60))
#: the times of the vectors (µs since the epoch): 2027-01-15 and after
T0 = 1_800_000_000_000_000
#: the revocation cut of the rotated and back-dated cases
CUT = T0 + 1_000_000
FUTURE = 4_000_000_000_000_000  # 2096


def _key(seed_hex: str) -> signatures.SigningKey:
    return signatures.SigningKey(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(seed_hex)))


def _json(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _resign(receipt: dict[str, Any], key: signatures.SigningKey, **changes: Any
            ) -> dict[str, Any]:
    body = {k: v for k, v in receipt.items() if k != "signature"}
    body.update(changes, public_key=key.public_key.hex())
    return {**body, "signature": key.sign(signing_bytes(body)).hex()}


class _Ledger:
    """A ledger stream being written, with append times."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.tree = L.MerkleTree()
        self.entries: list[dict[str, Any]] = []

    def _add(self, value: bytes, at: int) -> None:
        self.entries.append({"offset": len(self.entries), "append_us": at,
                             "value": value.decode("utf-8")})

    def leaf(self, receipt: dict[str, Any], at: int) -> None:
        self._add(L.leaf_record(len(self.tree), receipt), at)
        self.tree.append(L.leaf_data(receipt))

    def checkpoint(self, key: signatures.SigningKey, at: int) -> None:
        origin = L.origin(self.node)
        body = L.checkpoint_body(origin, len(self.tree), self.tree.root())
        self._add(L.checkpoint_record(L.sign_note(body, origin, key.sign, key.public_key)), at)


def build() -> dict[str, Any]:
    keys = json.loads((HERE / "keys.json").read_text())
    node_key, other = _key(keys["node"]["seed_hex"]), _key(keys["other"]["seed_hex"])
    fleet = signatures.SigningKey(Ed25519PrivateKey.from_private_bytes(FLEET_SEED))
    receipts = [json.loads(line) for line in (HERE / "chain.jsonl").read_text().splitlines()]
    responses = [json.loads(line) for line in
                 (HERE / "responses.jsonl").read_text().splitlines()]
    node = receipts[0]["node_id"]
    node_hex = node_key.public_key.hex()

    def cert(key: signatures.SigningKey, *, not_before: int = 0) -> Any:
        return _json(certify(fleet, node, key.public_key, not_before_us=not_before,
                             now_us=T0 - 10_000_000).model_dump(mode="json"))

    def rev(key: signatures.SigningKey, from_us: int) -> Any:
        return _json(revoke(fleet, node, key.key_id, from_us=from_us, reason="test vector",
                            now_us=CUT + 5_000_000).model_dump(mode="json"))

    cases: list[dict[str, Any]] = []

    # -- weakness 1: a foreign leaf under a genuine checkpoint
    led = _Ledger(node)
    led.leaf(receipts[0], T0 + 10)
    led.checkpoint(node_key, T0 + 11)
    led.leaf(receipts[1], T0 + 20)
    led.checkpoint(node_key, T0 + 21)
    foreign = _resign(receipts[2], other)
    led.leaf(foreign, T0 + 30)
    led.checkpoint(node_key, T0 + 31)  # what a genuine node did before the fix: never again
    cases.append({
        "name": "foreign_leaf", "weakness": 1, "node": node, "keys": [node_hex],
        "sys_keys": None, "ledger": led.entries,
        "expect": {"foreign_leaves": [2], "problem_kinds": ["foreign"],
                   "included": [{"receipt": receipts[0], "included": True},
                                {"receipt": foreign, "included": False}],
                   "executor_extends": False}})

    # -- weakness 2: checkpoint keys judged by their dates and revocations
    def small_ledger(key: signatures.SigningKey, start: int) -> list[dict[str, Any]]:
        led = _Ledger(node)
        led.leaf(receipts[0], start)
        led.checkpoint(key, start + 1)
        return led.entries

    cases.append({
        "name": "checkpoint_revoked_from_0", "weakness": 2, "node": node,
        "keys": None, "sys_keys": [cert(node_key), rev(node_key, 0)],
        "ledger": small_ledger(node_key, T0 + 10),
        "expect": {"trusted_checkpoint_offsets": [], "refused_checkpoint_offsets": [1],
                   "foreign_leaves": [0]}})
    cases.append({
        "name": "checkpoint_certified_from_2096", "weakness": 2, "node": node,
        "keys": None, "sys_keys": [cert(node_key, not_before=FUTURE)],
        "ledger": small_ledger(node_key, T0 + 10),
        "expect": {"trusted_checkpoint_offsets": [], "refused_checkpoint_offsets": [1],
                   "foreign_leaves": [0]}})
    led = _Ledger(node)
    led.leaf(receipts[0], CUT - 100)
    led.checkpoint(node_key, CUT - 99)           # the old key, before its revocation: trusted
    rotated = _resign(receipts[1], other, seq=0, prev_receipt_hash=None)
    led.leaf(rotated, CUT + 100)
    led.checkpoint(other, CUT + 101)              # the new key: trusted
    led.checkpoint(node_key, CUT + 200)           # the rotated-out key after the cut: refused
    cases.append({
        "name": "checkpoint_rotated_out_after_revocation", "weakness": 2, "node": node,
        "keys": None, "sys_keys": [cert(node_key), cert(other), rev(node_key, CUT)],
        "ledger": led.entries,
        "expect": {"trusted_checkpoint_offsets": [1, 3], "refused_checkpoint_offsets": [4],
                   "foreign_leaves": []}})

    # -- weakness 3: back-dating beats revocation no more
    history = [cert(node_key), rev(node_key, CUT)]
    genuine = responses[0]
    timing = dict(genuine["timing"], finished_us=CUT - 1)
    unsigned = ResponseRecord.model_validate({**genuine, "signature": None, "timing": timing,
                                              "output": genuine["output"]})
    backdated = unsigned.model_copy(update={"signature": Signature(
        key_id=node_key.key_id,
        value=base64.b64encode(node_key.sign(unsigned.signing_bytes())).decode())})
    backdated_json = _json(backdated.model_dump(mode="json"))
    logged = _Ledger(node)
    logged.leaf(receipts[0], CUT - 1_000)
    logged.checkpoint(node_key, CUT - 999)
    for name, response, appended, ledger, trusted in (
            ("backdated_response_file", backdated_json, None, [], False),
            ("backdated_response_on_log", backdated_json, CUT + 5, [], False),
            ("genuine_file_checkpointed_before", genuine, None, logged.entries, True),
            ("genuine_on_log_before", genuine, CUT - 1_000, [], True)):
        cases.append({
            "name": name, "weakness": 3, "node": node, "keys": None, "sys_keys": history,
            "response": response, "appended_us": appended, "ledger": ledger,
            "expect": {"trusted": trusted}})
    return {
        "TEST_ONLY": "fleet key and records for tests only: never trust these keys",
        "fleet_key": {"seed_hex": FLEET_SEED.hex(), "public_key_b64":
                      signatures.public_key_text(fleet.public_key), "key_id": fleet.key_id},
        "times": {"T0": T0, "CUT": CUT, "FUTURE": FUTURE},
        "cases": cases,
    }


def main() -> None:
    out = json.dumps(build(), sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"
    (HERE / "trust.json").write_text(out, encoding="utf-8")
    print(f"wrote {HERE / 'trust.json'}")


if __name__ == "__main__":
    main()
