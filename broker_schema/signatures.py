"""Ed25519 signatures: one key encoding, one check.

A public key is the raw 32-byte Ed25519 key. Its text form on the wire (``FactsRecord.public_key``)
is the standard base64 (with padding) of those 32 bytes; its ``key_id`` is ``sha256:<hex>`` of the
same 32 bytes. Readers also accept the base64 of the key's DER SubjectPublicKeyInfo (a fixed
12-byte prefix and the same 32 bytes), which some recorded logs carry; nothing in the project
writes it. The integer engine's receipts carry the same 32 raw bytes in hex (their own versioned
format) and are checked by the same :func:`verify_ed25519`.

Every signature check of the project (the executor's own, ``fx why``, ``fx verify`` and the
receipt verifier) goes through :func:`verify_ed25519`; responses through
:func:`response_signature_problem`. ``cryptography`` is imported on first use, so importing the
wire contract does not load it.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING

from broker_schema.canonical import sha256_hex

if TYPE_CHECKING:
    from broker_schema.records import ResponseRecord

__all__ = [
    "PUBLIC_KEY_BYTES",
    "key_id",
    "public_key_from_text",
    "public_key_text",
    "response_signature_problem",
    "verify_ed25519",
]

#: Length of a raw Ed25519 public key (and a signature is twice that).
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
#: DER SubjectPublicKeyInfo of an Ed25519 key: this prefix, then the 32 raw bytes (RFC 8410).
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


def public_key_text(raw: bytes) -> str:
    """The wire form of a raw 32-byte public key: its standard base64."""
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, not {len(raw)}")
    return base64.b64encode(raw).decode("ascii")


def public_key_from_text(text: str) -> bytes:
    """The raw 32 bytes of a published public key (``ValueError`` when it is not one): base64 of
    the raw key, or (read only) of its DER SubjectPublicKeyInfo."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"the public key is not base64: {exc}") from None
    if len(data) == PUBLIC_KEY_BYTES:
        return data
    if len(data) == len(_SPKI_PREFIX) + PUBLIC_KEY_BYTES and data.startswith(_SPKI_PREFIX):
        return data[len(_SPKI_PREFIX):]
    raise ValueError(f"the public key is {len(data)} bytes, not a raw {PUBLIC_KEY_BYTES}-byte "
                     "Ed25519 key")


def key_id(raw: bytes) -> str:
    """``sha256:<hex>`` of a raw 32-byte public key."""
    if len(raw) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, not {len(raw)}")
    return sha256_hex(raw)


def verify_ed25519(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``message`` by the raw 32-byte
    ``public_key``; False for anything else (a wrong length, a key that is not a curve point, a
    signature that does not verify). Never raises for bad input."""
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def response_signature_problem(response: ResponseRecord, public_key: bytes) -> str | None:
    """Why ``response`` is not validly signed by the raw ``public_key``, or None when it is: it
    carries a signature, names that key's ``key_id``, and the signature verifies over
    :meth:`ResponseRecord.signing_bytes`."""
    sig = response.signature
    if sig is None:
        return "the response carries no signature"
    try:
        expected = key_id(public_key)
    except ValueError as exc:
        return f"unusable key: {exc}"
    if sig.key_id != expected:
        return f"the signature names key {sig.key_id}, not {expected}"
    try:
        value = base64.b64decode(sig.value, validate=True)
    except (binascii.Error, ValueError):
        return "the signature value is not base64"
    if not verify_ed25519(public_key, value, response.signing_bytes()):
        return "the signature does not verify with the key"
    return None
