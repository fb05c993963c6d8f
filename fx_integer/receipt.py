"""Signed, hash-chained receipts of integer-engine runs: the format, its hashes, the signer.

A receipt is a JSON object (integers, strings, lists, booleans, null only; no floats)::

    receipt_version   2, or 3 for an engine that ran the parity gate (below)
    kind              "ninelives:inference/run@0.1.0"
    model_hash        sha256 of the committed artifact file (hex)
    engine            {"name", "version", "backend", "device_class"}
    context           what the receipt answers, or null for a run outside an executor:
                      {"workload_id", "effect_id", "epoch",
                       "request_hash":  sha256:<hex> of the EffectRequest's canonical bytes,
                       "manifest_hash": sha256:<hex> of the model manifest as loaded}
    node_id           the producing executor node
    seq               index of this receipt in the node's chain (0 = first)
    prev_receipt_hash receipt_hash of the node's previous receipt, or 64 zeros at seq 0
    prompt_tokens     the input token ids
    input_hash        sha256(canonical({"prompt_tokens": [...]}))
    prompt_text_hash  sha256 of the prompt text's UTF-8 (hex; the ``prompt`` parameter or input
                      body as given, before any chat wrapping), or null for ``prompt_tokens``
    params            normalised integer parameters (max_tokens, temperature_q16, top_k,
                      top_p_q16, seed, stop_token)
    output_tokens     the generated token ids
    output_hash       sha256(canonical({"output_tokens": [...]}))
    output_text_hash  sha256 of the output text's UTF-8 (hex): the decoding of output_tokens
                      without a final stop_token, the response's ``text``
    logits_digest     sha256 over every decoding step's logits row (int64 little-endian)
    parity_gate       version 3 only: the parity gate's verdict the engine serves under
                      (:mod:`fx_integer.parity_gate`): {"backend": the gated backend,
                      "result": "passed" | "refused", "canary_set_hash": sha256:<hex> of the
                      canary set}; a refused backend never signs, so "refused" goes with
                      engine.backend "oracle" (the fallback)
    public_key        the node's public key, hex: raw 32 bytes (Ed25519, 64 hex digits) or
                      the 33-byte SEC1 compressed point (secp256k1, 66 hex digits)
    signature         over b"nlfx-receipt-v<version>\\0" + canonical(receipt without the
                      signature key): Ed25519, or ECDSA-SHA256 as r || s with low s
                      (secp256k1); the 64 signature bytes as 128 lowercase hex digits
                      (docs/receipts.md)

canonical(x) = JSON with sorted keys, no whitespace, UTF-8 (for these float-free objects this is
RFC 8785). receipt_hash = sha256(canonical(full receipt, signature included)). Version 1 receipts
(no context, no text hashes) are refused: nothing committed uses them. Versions 2 and 3 are both
current: an engine without a gate (the oracle configured as such) signs version 2, one behind
the gate version 3; one chain may hold both.

The engine builds receipts with this module; checking one (which re-executes the engine) is
:mod:`fx_integer.verifier`. This module imports no other engine module but ``artifact`` (for
``canonical_json``), and the wire contract's signing key only inside :class:`ReceiptSigner`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from .artifact import canonical_json

RECEIPT_VERSION: Final = 2
#: a receipt of an engine behind the parity gate: version 2 plus ``parity_gate``
RECEIPT_VERSION_GATED: Final = 3
SIGNING_CONTEXT: Final = b"nlfx-receipt-v2\x00"
#: receipt_version -> the prefix its signature covers
SIGNING_CONTEXTS: Final = {2: SIGNING_CONTEXT, 3: b"nlfx-receipt-v3\x00"}
GENESIS: Final = "0" * 64
FIELDS: Final = (
    "receipt_version", "kind", "model_hash", "engine", "context", "node_id", "seq",
    "prev_receipt_hash", "prompt_tokens", "input_hash", "prompt_text_hash", "params",
    "output_tokens", "output_hash", "output_text_hash", "logits_digest", "public_key",
    "signature",
)
#: receipt_version -> its fields
FIELDS_BY_VERSION: Final[dict[int, tuple[str, ...]]] = {
    2: FIELDS, 3: (*FIELDS[:-2], "parity_gate", *FIELDS[-2:])}
PARITY_GATE_FIELDS: Final = ("backend", "canary_set_hash", "result")
CONTEXT_FIELDS: Final = ("effect_id", "epoch", "manifest_hash", "request_hash", "workload_id")
PARAM_FIELDS: Final = ("max_tokens", "seed", "stop_token", "temperature_q16", "top_k",
                       "top_p_q16")


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def input_hash(prompt_tokens: Sequence[int]) -> str:
    return sha256_hex(canonical_json({"prompt_tokens": [int(t) for t in prompt_tokens]}))


def output_hash(output_tokens: Sequence[int]) -> str:
    return sha256_hex(canonical_json({"output_tokens": [int(t) for t in output_tokens]}))


def text_hash(text: str) -> str:
    """sha256 (hex) of a text's UTF-8 bytes: ``prompt_text_hash``, ``output_text_hash``."""
    return sha256_hex(text.encode("utf-8"))


def receipt_context(*, workload_id: str, effect_id: str, epoch: int, request_hash: str,
                    manifest_hash: str) -> dict[str, Any]:
    """A receipt's ``context``: the request it answers and the model manifest as loaded."""
    return {"workload_id": workload_id, "effect_id": effect_id, "epoch": int(epoch),
            "request_hash": request_hash, "manifest_hash": manifest_hash}


def receipt_hash(receipt: dict[str, Any]) -> str:
    return sha256_hex(canonical_json(receipt))


def signing_bytes(receipt: dict[str, Any]) -> bytes:
    """The bytes a receipt's signature covers: its version's prefix (version 2's for an unknown
    version) + canonical(receipt without ``signature``)."""
    body = {k: v for k, v in receipt.items() if k != "signature"}
    version = receipt.get("receipt_version")
    prefix = SIGNING_CONTEXTS.get(version, SIGNING_CONTEXT) if isinstance(version, int) \
        and not isinstance(version, bool) else SIGNING_CONTEXT
    return prefix + canonical_json(body)


class ReceiptSigner:
    """A node key (:class:`broker_schema.signatures.SigningKey`, Ed25519 or secp256k1; a bare
    ``cryptography`` private key of either type is wrapped) plus this node's chain state
    (``seq``, ``prev``).

    The executor owns one per node and persists ``state()`` if the chain must survive restarts.
    Not thread-safe: the caller serialises ``sign``.
    """

    def __init__(self, key: Any, *, node_id: str, seq: int = 0,
                 prev: str = GENESIS) -> None:
        from broker_schema.signatures import SigningKey

        self.key: SigningKey = key if isinstance(key, SigningKey) else SigningKey(key)
        self.node_id = node_id
        self.seq = seq
        self.prev = prev

    @classmethod
    def generate(cls, *, node_id: str, key_type: str = "ed25519") -> ReceiptSigner:
        from broker_schema.signatures import SigningKey

        return cls(SigningKey.generate(key_type), node_id=node_id)  # type: ignore[arg-type]

    @classmethod
    def load_or_create(cls, path: str | os.PathLike[str], *, node_id: str,
                       key_type: str = "ed25519") -> ReceiptSigner:
        """PEM PKCS#8 private key at ``path`` (created with mode 0600 if missing)."""
        from broker_schema.signatures import SigningKey

        p = Path(path)
        if p.is_file():
            return cls(SigningKey.from_pem(p.read_bytes()), node_id=node_id)
        key = SigningKey.generate(key_type)  # type: ignore[arg-type]
        if not key.write_new(p):
            return cls.load_or_create(p, node_id=node_id, key_type=key_type)
        return cls(key, node_id=node_id)

    @property
    def public_key_hex(self) -> str:
        return self.key.public_key.hex()

    def sign(self, body: dict[str, Any]) -> dict[str, Any]:
        """Complete ``body`` with node, chain and key fields, sign it, advance the chain."""
        r = dict(body)
        r.update(node_id=self.node_id, seq=self.seq, prev_receipt_hash=self.prev,
                 public_key=self.public_key_hex)
        r.pop("signature", None)
        r["signature"] = self.key.sign(signing_bytes(r)).hex()
        self.prev = receipt_hash(r)
        self.seq += 1
        return r


def load_receipts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A receipt file: one JSON object, a JSON list, or JSON Lines (a chain)."""
    text = Path(path).read_text(encoding="utf-8").strip()
    if not text:
        return []
    try:
        if text[0] == "[":
            items = json.loads(text)
        else:
            try:
                items = [json.loads(text)]
            except json.JSONDecodeError:
                items = [json.loads(line) for line in text.splitlines() if line.strip()]
    except RecursionError:  # a JSON decode error is already a ValueError
        raise ValueError(f"{path}: nested too deeply to be a receipt") from None
    if not isinstance(items, list) or not all(isinstance(r, dict) for r in items):
        raise ValueError(f"{path}: every receipt must be a JSON object")
    return [dict(r) for r in items]
