"""Node identity: a signing key per node (an executor, an actuator gateway; Ed25519, or
secp256k1 ECDSA), and response signatures.

The key is created on first start at ``key_file`` (PKCS#8 PEM, mode 0600, its directory 0700),
of the type the config names (``key_type``); an existing file is used as it is, whatever its
type. ``key_id`` is ``sha256:<hex>`` of the raw public key (32 bytes Ed25519, 33 bytes compressed
secp256k1), published as its base64 (the one key encoding: :mod:`broker_schema.signatures`). A
response is signed over :meth:`broker_schema.ResponseRecord.signing_bytes` (its canonical bytes
with ``signature`` null); :func:`verify_response` checks a response against a public key with
:func:`broker_schema.signatures.response_signature_problem`, the same check ``fx why`` and
``fx verify`` make.
"""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

from broker_schema import signatures
from broker_schema.fast_codec import encode_signed
from broker_schema.records import ResponseRecord, Signature
from broker_schema.signatures import ED25519, KeyType, SigningKey

__all__ = ["NodeIdentity", "verify_response"]

log = logging.getLogger(__name__)


class NodeIdentity:
    """A node's signing key."""

    def __init__(self, key: SigningKey) -> None:
        self.signing_key = key
        self.key_type: KeyType = key.key_type
        #: the raw public key (32 or 33 bytes).
        self.public_key = key.public_key
        #: base64 of the raw public key (``FactsRecord.public_key``).
        self.public_key_b64 = key.public_key_b64
        self.key_id = key.key_id

    @classmethod
    def generate(cls, key_type: KeyType = ED25519) -> NodeIdentity:
        """A fresh key held only in memory (tests, benches)."""
        return cls(SigningKey.generate(key_type))

    @classmethod
    def load_or_create(cls, path: str | Path, key_type: KeyType = ED25519) -> NodeIdentity:
        """Load the key at ``path``, or create one of ``key_type`` there (0600) if there is none
        yet. A key already there is used whatever its type (a change of ``key_type`` takes a new
        ``key_file``: docs/security.md, "Node keys and their history")."""
        p = Path(path)
        try:
            pem = p.read_bytes()
        except FileNotFoundError:
            key = SigningKey.generate(key_type)
            if not key.write_new(p):  # another process created it first: use that one
                return cls.load_or_create(p, key_type)
            return cls(key)
        try:
            key = SigningKey.from_pem(pem)
        except ValueError as exc:
            raise ValueError(f"{p}: {exc}") from None
        if key.key_type != key_type:
            log.warning("%s holds a %s key; the config asks for %s keys for new key files: "
                        "using the %s key", p, key.key_type, key_type, key.key_type)
        if p.stat().st_mode & 0o077:
            os.chmod(p, 0o600)
        return cls(key)

    def sign(self, data: bytes) -> str:
        """base64 of the signature over ``data``."""
        return base64.b64encode(self.signing_key.sign(data)).decode("ascii")

    def sign_response(self, response: ResponseRecord) -> ResponseRecord:
        """``response`` with its ``signature`` set."""
        signature, _, _ = encode_signed(response, self.signature_of)
        return response.model_copy(update={"signature": signature})

    def sign_and_encode(self, response: ResponseRecord) -> bytes:
        """The canonical bytes of ``response`` signed: the signing bytes and the record's bytes
        from one pass (:func:`broker_schema.fast_codec.encode_signed`: msgspec, the same bytes
        as :func:`broker_schema.encode_signed`), no signed copy of the record made.
        :class:`broker_schema.RecordTooLarge` as :func:`broker_schema.encode` raises it."""
        return encode_signed(response, self.signature_of)[1]

    def signature_of(self, message: bytes) -> Signature:
        """The :class:`~broker_schema.records.Signature` of ``message`` by this node's key."""
        return Signature(alg=self.key_type, key_id=self.key_id, value=self.sign(message))


def verify_response(response: ResponseRecord, public_key: bytes | str) -> bool:
    """True when ``response`` carries a valid signature by ``public_key`` (its raw bytes, or
    their published text form) and names that key's id
    (:func:`broker_schema.signatures.response_signature_problem`)."""
    if isinstance(public_key, str):
        try:
            raw = signatures.public_key_from_text(public_key)
        except ValueError:
            return False
    else:
        raw = public_key
    return signatures.response_signature_problem(response, raw) is None
