"""Node signatures: the key encodings, one check, and the signing key. Two key types:

- **Ed25519** (the default): the public key is the raw 32-byte key; a signature is the 64-byte
  Ed25519 signature of the message.
- **secp256k1** (ECDSA, for notarising on chains that use that curve): the public key is the
  33-byte SEC1 compressed point (``0x02``/``0x03`` then x); a signature is ECDSA over SHA-256 of
  the message, written as 64 bytes ``r || s`` (big-endian, 32 bytes each) with **low s**
  (``s <= n/2``; a high-s signature is refused, so a signature has one encoding only). The
  project signs with RFC 6979 deterministic nonces (verifiers need not care).

A key's type is told by its length (32 or 33 bytes); nothing else names it. Its text form on the
wire (``FactsRecord.public_key``, key certificates) is the standard base64 (with padding) of the
raw bytes; its ``key_id`` is ``sha256:<hex>`` of the same raw bytes. Readers also accept the
base64 of an Ed25519 key's DER SubjectPublicKeyInfo (a fixed 12-byte prefix and the same 32
bytes), which some recorded logs carry; nothing in the project writes it. The integer engine's
receipts carry the same raw bytes in hex (their own versioned format) and are checked by the same
:func:`verify`.

Every signature check of the project (the executor's own, ``fx why``, ``fx verify``, the ledger,
key certificates and the receipt verifier) goes through :func:`verify`; responses through
:func:`response_signature_problem`. Every signature the project makes comes from a
:class:`SigningKey`. ``cryptography`` is imported on first use, so importing the wire contract
does not load it.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import TYPE_CHECKING, Any, Literal

from broker_schema.canonical import sha256_hex
from broker_schema.records import HOLDER_OUTCOMES

if TYPE_CHECKING:
    from broker_schema.records import ResponseRecord, SpecRecord

__all__ = [
    "ED25519",
    "HOLDER_SIG_HEADER",
    "KEY_TYPES",
    "PUBLIC_KEY_BYTES",
    "SECP256K1",
    "KeyType",
    "SigningKey",
    "answer_refusal",
    "holder_signature",
    "holder_signature_problem",
    "key_id",
    "key_type",
    "public_key_from_text",
    "public_key_text",
    "response_signature_problem",
    "verify",
    "verify_ed25519",
]

KeyType = Literal["ed25519", "secp256k1"]
ED25519: KeyType = "ed25519"
SECP256K1: KeyType = "secp256k1"
KEY_TYPES: tuple[KeyType, ...] = (ED25519, SECP256K1)
#: Length of a raw Ed25519 public key (and a signature of either type is twice that).
PUBLIC_KEY_BYTES = 32
#: Length of a SEC1 compressed secp256k1 public key.
SECP256K1_KEY_BYTES = 33
SIGNATURE_BYTES = 64
#: DER SubjectPublicKeyInfo of an Ed25519 key: this prefix, then the 32 raw bytes (RFC 8410).
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
#: The order of the secp256k1 group.
_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def key_type(raw: bytes) -> KeyType:
    """The type of a raw public key, by its length and form (``ValueError`` for neither)."""
    if len(raw) == PUBLIC_KEY_BYTES:
        return ED25519
    if len(raw) == SECP256K1_KEY_BYTES and raw[0] in (2, 3):
        return SECP256K1
    raise ValueError(f"a public key is {PUBLIC_KEY_BYTES} bytes (Ed25519) or "
                     f"{SECP256K1_KEY_BYTES} bytes starting 02/03 (secp256k1, compressed), "
                     f"not {len(raw)} bytes")


def public_key_text(raw: bytes) -> str:
    """The wire form of a raw public key (either type): its standard base64."""
    key_type(raw)
    return base64.b64encode(raw).decode("ascii")


def public_key_from_text(text: str) -> bytes:
    """The raw bytes of a published public key (``ValueError`` when it is not one): base64 of a
    raw key of either type, or (read only) of an Ed25519 key's DER SubjectPublicKeyInfo."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"the public key is not base64: {exc}") from None
    if len(data) == len(_SPKI_PREFIX) + PUBLIC_KEY_BYTES and data.startswith(_SPKI_PREFIX):
        return data[len(_SPKI_PREFIX):]
    key_type(data)
    return data


def key_id(raw: bytes) -> str:
    """``sha256:<hex>`` of a raw public key (either type)."""
    key_type(raw)
    return sha256_hex(raw)


def verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """True when ``signature`` is a valid signature of ``message`` by the raw ``public_key`` of
    either type (told by its length); False for anything else (a wrong length, a key that is not
    a curve point, a high-s ECDSA signature, a signature that does not verify). Never raises for
    bad input."""
    try:
        kind = key_type(public_key)
    except ValueError:
        return False
    if len(signature) != SIGNATURE_BYTES:
        return False
    from cryptography.exceptions import InvalidSignature

    try:
        if kind == ED25519:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

            Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
            return True
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

        r = int.from_bytes(signature[:32], "big")
        s = int.from_bytes(signature[32:], "big")
        if not (0 < r < _SECP256K1_N and 0 < s <= _SECP256K1_N // 2):
            return False
        point = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256K1(), public_key)
        point.verify(encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
        return True
    except (InvalidSignature, ValueError):
        return False


def verify_ed25519(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """:func:`verify` for an Ed25519 key only (False for a key of another type)."""
    return len(public_key) == PUBLIC_KEY_BYTES and verify(public_key, signature, message)


class SigningKey:
    """A private key of either type: :meth:`sign` gives the 64-byte signature :func:`verify`
    checks, :attr:`public_key` the raw public bytes. Stored as PKCS#8 PEM (unencrypted; the
    file's permissions protect it)."""

    def __init__(self, private_key: Any) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        if isinstance(private_key, Ed25519PrivateKey):
            self.key_type: KeyType = ED25519
            self.public_key = private_key.public_key().public_bytes(
                serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        elif isinstance(private_key, ec.EllipticCurvePrivateKey) and \
                isinstance(private_key.curve, ec.SECP256K1):
            self.key_type = SECP256K1
            self.public_key = private_key.public_key().public_bytes(
                serialization.Encoding.X962, serialization.PublicFormat.CompressedPoint)
        else:
            raise ValueError(f"not an Ed25519 or secp256k1 private key: "
                             f"{type(private_key).__name__}")
        self._key = private_key
        #: ``sha256:<hex>`` of :attr:`public_key`; :attr:`public_key_b64` its wire form.
        self.key_id = key_id(self.public_key)
        self.public_key_b64 = public_key_text(self.public_key)

    @classmethod
    def generate(cls, kind: KeyType = ED25519) -> SigningKey:
        """A fresh key of type ``kind``."""
        if kind == ED25519:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            return cls(Ed25519PrivateKey.generate())
        if kind == SECP256K1:
            from cryptography.hazmat.primitives.asymmetric import ec

            return cls(ec.generate_private_key(ec.SECP256K1()))
        raise ValueError(f"unknown key type {kind!r} (one of {', '.join(KEY_TYPES)})")

    @classmethod
    def from_pem(cls, pem: bytes) -> SigningKey:
        """The key of a PKCS#8 PEM (``ValueError`` for anything else)."""
        from cryptography.hazmat.primitives import serialization

        try:
            return cls(serialization.load_pem_private_key(pem, password=None))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"not an unencrypted Ed25519 or secp256k1 PEM key: {exc}") from None

    def pem(self) -> bytes:
        """The PKCS#8 PEM of the private key."""
        from cryptography.hazmat.primitives import serialization

        return bytes(self._key.private_bytes(serialization.Encoding.PEM,
                                             serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()))

    def sign(self, message: bytes) -> bytes:
        """The 64-byte signature of ``message`` (Ed25519, or ECDSA-SHA256 ``r || s`` low-s)."""
        if self.key_type == ED25519:
            return bytes(self._key.sign(message))
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        # RFC 6979 deterministic nonces: the same key and message give the same signature (no
        # dependence on a random source at signing time; test vectors regenerate identically)
        r, s = decode_dss_signature(self._key.sign(
            message, ec.ECDSA(hashes.SHA256(), deterministic_signing=True)))
        if s > _SECP256K1_N // 2:
            s = _SECP256K1_N - s
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    def write_new(self, path: os.PathLike[str] | str) -> bool:
        """Write the PEM to ``path`` (0600, its directory created 0700) unless a file is there;
        True when written. O_EXCL: two processes creating a key at once never overwrite each
        other's."""
        from pathlib import Path

        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self.pem())
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
    if sig.alg != key_type(public_key):
        return f"the signature says {sig.alg}, the key is {key_type(public_key)}"
    try:
        value = base64.b64decode(sig.value, validate=True)
    except (binascii.Error, ValueError):
        return "the signature value is not base64"
    if not verify(public_key, value, response.signing_bytes()):
        return "the signature does not verify with the key"
    return None


def answer_refusal(response: ResponseRecord, spec: SpecRecord
                   ) -> tuple[Literal["unsigned", "untrusted_key"], str] | None:
    """Why the lease holder must not merge ``response`` under ``spec`` (the pass-over reason
    and a message for people), or None. Pure; the live holder and replay both ask it (the spec
    is a fact of the log), so they decide the same.

    - A ``timeout``/``unknown`` without a signature: None (the holder's own outcome).
    - No signature: ``unsigned`` when ``spec.unsigned`` is ``refuse``.
    - ``spec.signers`` set: the signature must verify with one of the keys it lists for the
      answering node (``executor.node_id``, else ``written_by``), else ``untrusted_key``.
    """
    sig = response.signature
    if sig is None:
        if response.outcome in HOLDER_OUTCOMES or spec.unsigned != "refuse":
            return None
        return "unsigned", "the answer carries no signature and the spec refuses unsigned ones"
    if not spec.signers:
        return None
    node = response.executor.node_id if response.executor is not None else response.written_by
    keys = spec.signers.get(node)
    if not keys:
        return "untrusted_key", f"the spec trusts no key for node {node!r}"
    problems = []
    for text in keys:
        try:
            raw = public_key_from_text(text)
        except ValueError as exc:
            problems.append(f"unusable key in the spec: {exc}")
            continue
        problem = response_signature_problem(response, raw)
        if problem is None:
            return None
        problems.append(problem)
    return "untrusted_key", f"not signed by a key the spec trusts for node {node!r}: " + (
        "; ".join(problems))


#: The Kafka record header in which a lease holder signs what it writes on ``.out``.
HOLDER_SIG_HEADER = "fx-holder-sig"


def holder_signature(key: SigningKey, value: bytes) -> bytes:
    """The ``fx-holder-sig`` header value of the record ``value``: ``<key id>:<base64 of the
    signature over value>`` (the bytes on ``.out`` themselves, so the request, its hash and
    replay are unchanged)."""
    return f"{key.key_id}:{base64.b64encode(key.sign(value)).decode()}".encode()


def holder_signature_problem(value: bytes, header: bytes | None,
                             public_key_text: str) -> str | None:
    """Why ``header`` is not a valid ``fx-holder-sig`` of ``value`` by the holder key
    ``public_key_text`` (a claim's ``holder_key``), or None when it is. Pure."""
    if header is None:
        return "the record carries no holder signature"
    try:
        raw = public_key_from_text(public_key_text)
        kid, _, b64 = header.decode("ascii").rpartition(":")
        signature = base64.b64decode(b64, validate=True)
    except (ValueError, UnicodeDecodeError, binascii.Error) as exc:
        return f"unusable holder signature or key: {exc}"
    if kid != key_id(raw):
        return f"signed by key {kid[:80]}, not the epoch's holder key {key_id(raw)}"
    if not verify(raw, signature, value):
        return "the holder signature does not verify"
    return None
