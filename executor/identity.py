"""Node identity: an Ed25519 key per executor node, and response signatures.

The key is created on first start and kept on disk (PKCS#8 PEM, mode 0600, its directory 0700).
``key_id`` is ``sha256:<hex>`` of the raw 32-byte public key, published as its base64 (the one key
encoding: :mod:`broker_schema.signatures`). A response is signed over
:meth:`broker_schema.ResponseRecord.signing_bytes` (its canonical bytes with ``signature`` null);
:func:`verify_response` checks a response against a public key with
:func:`broker_schema.signatures.response_signature_problem`, the same check ``fx why`` and
``fx verify`` make.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from broker_schema import signatures
from broker_schema.records import ResponseRecord, Signature

__all__ = ["NodeIdentity", "key_id_of", "public_key_from_b64", "verify_response"]


def key_id_of(public_key: Ed25519PublicKey) -> str:
    """``sha256:<hex>`` of the raw 32-byte public key."""
    return signatures.key_id(_raw(public_key))


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_from_b64(text: str) -> Ed25519PublicKey:
    """The public key from its published form (``FactsRecord.public_key``)."""
    return Ed25519PublicKey.from_public_bytes(signatures.public_key_from_text(text))


class NodeIdentity:
    """An executor node's signing key."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        self.public_key = private_key.public_key()
        #: base64 of the raw public key (``FactsRecord.public_key``).
        self.public_key_b64 = signatures.public_key_text(_raw(self.public_key))
        self.key_id = key_id_of(self.public_key)

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The private key, for signers inside this process that must sign with the node's key
        (the integer engine's receipts, so they verify against the key on ``sys.facts``)."""
        return self._key

    @classmethod
    def generate(cls) -> NodeIdentity:
        """A fresh key held only in memory (tests, benches)."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load_or_create(cls, path: str | Path) -> NodeIdentity:
        """Load the key at ``path``, or create it there (0600) if there is none yet."""
        p = Path(path)
        try:
            pem = p.read_bytes()
        except FileNotFoundError:
            p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            # O_EXCL: two processes starting at once never overwrite each other's key.
            try:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                return cls.load_or_create(p)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            return cls(key)
        loaded = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(loaded, Ed25519PrivateKey):
            raise ValueError(f"{p} holds a {type(loaded).__name__}, not an Ed25519 key")
        if p.stat().st_mode & 0o077:
            os.chmod(p, 0o600)
        return cls(loaded)

    def sign(self, data: bytes) -> str:
        """base64 of the Ed25519 signature over ``data``."""
        return base64.b64encode(self._key.sign(data)).decode("ascii")

    def sign_response(self, response: ResponseRecord) -> ResponseRecord:
        """``response`` with its ``signature`` set."""
        value = self.sign(response.signing_bytes())
        return response.model_copy(
            update={"signature": Signature(key_id=self.key_id, value=value)}
        )


def verify_response(
    response: ResponseRecord, public_key: Ed25519PublicKey | bytes | str
) -> bool:
    """True when ``response`` carries a valid signature by ``public_key`` (an
    ``Ed25519PublicKey``, its 32 raw bytes, or their published text form) and names that key's
    id (:func:`broker_schema.signatures.response_signature_problem`)."""
    if isinstance(public_key, str):
        try:
            raw = signatures.public_key_from_text(public_key)
        except ValueError:
            return False
    elif isinstance(public_key, bytes):
        raw = public_key
    else:
        raw = _raw(public_key)
    return signatures.response_signature_problem(response, raw) is None
