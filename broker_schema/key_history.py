"""Which node keys to trust: the history of key certificates on ``sys.keys``, judged against the
fleet keys a verifier is given. Pure: no I/O (the records come from whoever read the topic).

A **fleet key** is a key an operator holds offline-ish (``fx keys fleet-init``); its public key
is given to every verifier out of band (``--fleet-key``, ``FX_FLEET_PUBLIC_KEY``). It signs
:class:`~broker_schema.records.KeyCertRecord` s ("node N's key is K") and
:class:`~broker_schema.records.KeyRevokeRecord` s ("N's key K is not trusted for what it signed
from time T on"). A record not signed by a given fleet key is ignored (and reported).

The trust rule, one function (:meth:`KeyHistory.key_problem`): a signature by key K on behalf of
node N, dated t (a response's ``timing.finished_us``, or None when the signed thing carries no
time, as a bare receipt), is trusted when some certificate of K for N verifies with a fleet key,
``t >= not_before_us`` (when t is known), and no revocation of K for N has ``revoked_us <= t``
(when t is unknown: no revocation at all). Rotation is a second certificate: the old key stays
trusted for what it signed. ``sys.facts`` says which key a node uses *now*; it decides nothing.

Limits, stated: t is the signer's own clock, signed by the same key. A revocation after a key
leaked stops signatures dated later, but the thief can back-date; what was signed before the
revocation stays trusted only as far as the node's ledger (``fx ledger``) pins it. Revoke at 0
to distrust everything a key ever signed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Iterable, Sequence

from broker_schema import signatures
from broker_schema.records import KeyCertRecord, KeyRevokeRecord

__all__ = ["KeyHistory", "KeySpan", "build_history", "record_problem"]


@dataclasses.dataclass
class KeySpan:
    """One certified key of a node, and its revocation if any."""

    node_id: str
    public_key: bytes
    key_id: str
    not_before_us: int
    issued_us: int
    offset: int
    revoked_us: int | None = None
    revoke_reason: str = ""


@dataclasses.dataclass
class KeyHistory:
    """Every certified key per node, in certificate order, and what was ignored."""

    keys: dict[str, list[KeySpan]] = dataclasses.field(default_factory=dict)
    #: ``(offset, why)`` of records not taken: unsigned, signed by no fleet key, malformed.
    ignored: list[tuple[int, str]] = dataclasses.field(default_factory=list)

    def spans(self, node_id: str) -> list[KeySpan]:
        """The node's certified keys (oldest certificate first)."""
        return list(self.keys.get(node_id, []))

    def public_keys(self, node_id: str) -> list[bytes]:
        """Every key ever certified for ``node_id`` (revoked ones too: a ledger checkpoint
        signed before a revocation is still that key's)."""
        return list(dict.fromkeys(s.public_key for s in self.keys.get(node_id, [])))

    def span(self, node_id: str, public_key: bytes) -> KeySpan | None:
        """The certificate of ``public_key`` for ``node_id`` (the earliest), or None."""
        for s in self.keys.get(node_id, []):
            if s.public_key == public_key:
                return s
        return None

    def key_problem(self, node_id: str, public_key: bytes, at_us: int | None) -> str | None:
        """Why a signature by ``public_key`` for ``node_id`` dated ``at_us`` is not trusted, or
        None when it is (the rule in the module docstring)."""
        spans = [s for s in self.keys.get(node_id, []) if s.public_key == public_key]
        try:
            kid = signatures.key_id(public_key)
        except ValueError as exc:
            return f"unusable key: {exc}"
        if not spans:
            other = sorted(n for n, ss in self.keys.items()
                           if any(s.public_key == public_key for s in ss))
            if other:
                return (f"key {kid} is certified for {', '.join(other)}, not for node "
                        f"{node_id!r}")
            return f"no fleet certificate for key {kid} of node {node_id!r} on sys.keys"
        revoked = [s.revoked_us for s in spans if s.revoked_us is not None]
        if revoked:
            cut = min(revoked)
            if at_us is None:
                return (f"key {kid} of node {node_id!r} is revoked (from {cut} us) and what it "
                        "signed carries no time")
            if at_us >= cut:
                return (f"key {kid} of node {node_id!r} is revoked from {cut} us; this was "
                        f"signed at {at_us} us")
        if at_us is not None and all(at_us < s.not_before_us for s in spans):
            start = min(s.not_before_us for s in spans)
            return (f"key {kid} of node {node_id!r} is certified from {start} us; this was "
                    f"signed at {at_us} us")
        return None


def _fleet_problem(rec: KeyCertRecord | KeyRevokeRecord,
                   fleet_keys: Sequence[bytes]) -> str | None:
    sig = rec.signature
    if sig is None:
        return "unsigned"
    by_id = {}
    for k in fleet_keys:
        try:
            by_id[signatures.key_id(k)] = k
        except ValueError:
            continue
    if sig.key_id != rec.issuer_key_id:
        return f"the signature names key {sig.key_id}, the record issuer {rec.issuer_key_id}"
    key = by_id.get(sig.key_id)
    if key is None:
        return f"signed by {sig.key_id}, which is not a fleet key given to this verifier"
    try:
        value = base64.b64decode(sig.value, validate=True)
    except (binascii.Error, ValueError):
        return "the signature value is not base64"
    if sig.alg != signatures.key_type(key):
        return f"the signature says {sig.alg}, the fleet key is {signatures.key_type(key)}"
    if not signatures.verify(key, value, rec.signing_bytes()):
        return "the fleet signature does not verify"
    return None


def record_problem(rec: KeyCertRecord | KeyRevokeRecord,
                   fleet_keys: Sequence[bytes]) -> str | None:
    """Why ``rec`` is not to be taken (not signed by one of ``fleet_keys``, or a certificate
    whose ``key_id`` is not its key's), or None."""
    problem = _fleet_problem(rec, fleet_keys)
    if problem is not None:
        return problem
    if isinstance(rec, KeyCertRecord):
        try:
            raw = signatures.public_key_from_text(rec.public_key)
        except ValueError as exc:
            return f"the certified key is unusable: {exc}"
        if signatures.key_id(raw) != rec.key_id:
            return f"the certified key hashes to {signatures.key_id(raw)}, not {rec.key_id}"
    return None


def build_history(records: Iterable[tuple[int, KeyCertRecord | KeyRevokeRecord]],
                  fleet_keys: Sequence[bytes]) -> KeyHistory:
    """The history of ``records`` (``(offset, record)`` in log order) as ``fleet_keys`` see
    it. A revocation applies to the key's certificates whenever they were written (before or
    after it); the earliest revocation of a key wins."""
    out = KeyHistory()
    revokes: list[tuple[int, KeyRevokeRecord]] = []
    for offset, rec in records:
        problem = record_problem(rec, fleet_keys)
        if problem is not None:
            out.ignored.append((offset, f"{rec.kind} for node {rec.node_id!r}: {problem}"))
            continue
        if isinstance(rec, KeyRevokeRecord):
            revokes.append((offset, rec))
            continue
        raw = signatures.public_key_from_text(rec.public_key)
        out.keys.setdefault(rec.node_id, []).append(KeySpan(
            node_id=rec.node_id, public_key=raw, key_id=rec.key_id,
            not_before_us=rec.not_before_us, issued_us=rec.issued_us, offset=offset))
    for _offset, rev in revokes:
        for span in out.keys.get(rev.node_id, []):
            if span.key_id == rev.key_id and (span.revoked_us is None
                                              or rev.revoked_us < span.revoked_us):
                span.revoked_us = rev.revoked_us
                span.revoke_reason = rev.reason
    return out
