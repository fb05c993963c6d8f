"""Which node keys to trust: the history of key certificates on ``sys.keys``, judged against the
fleet keys a verifier is given. Pure: no I/O (the records come from whoever read the topic).

A **fleet key** is a key an operator holds offline-ish (``fx keys fleet-init``); its public key
is given to every verifier out of band (``--fleet-key``, ``FX_FLEET_PUBLIC_KEY``). It signs
:class:`~broker_schema.records.KeyCertRecord` s ("node N's key is K") and
:class:`~broker_schema.records.KeyRevokeRecord` s ("N's key K is not trusted for what it signed
from time T on"). A record not signed by a given fleet key is ignored (and reported).

The trust rule, one function (:meth:`KeyHistory.key_problem`): a signature by key K on behalf of
node N, dated t (a time the signer does not choose: the broker's append time of the record that
carries it, the response record on ``.resp`` or the checkpoint on ``sys.ledger.<node>``; None
when there is none, as for a bare receipt or response in a file), is trusted when some
certificate of K for N verifies with a fleet key, ``t >= not_before_us`` (when t is known), and
no revocation of K for N has ``revoked_us <= t`` (when t is unknown: no revocation at all).
Rotation is a second certificate: the old key stays trusted for what it signed. ``sys.facts``
says which key a node uses *now*; it decides nothing.

Which key a *response* may be signed with is decided once, by :func:`response_key_problem`
(``fx why``, ``fx audit``, ``fx verify --workload``, the lease holder's signature watcher and
the console all ask it): with a key history by the rule above, else by the keys nodes publish
on ``sys.facts`` (unauthenticated: whoever can write ``sys.facts`` decides them). The node it
checks is the one the response claims produced it (:func:`response_node`).

Why the append time and not ``timing.finished_us`` (issue 31): ``finished_us`` is the signer's
own clock, signed by the same key, so a thief holding a revoked key could date an answer one
microsecond before the revocation. The broker stamps a record's append time
(``LogAppendTime`` on every workload and ledger topic); a mirrored copy keeps the site's. An
answer appended after the revocation is refused, even one computed before it. A bare receipt
(``fx verify FILE``) has no such time: a revoked key's receipt is refused unless a checkpoint
the broker appended before the revocation includes it (``fx verify`` says so), and
``not_before_us`` is not judged for it (nothing dates it). Revoke at 0 to distrust everything a
key ever signed.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from broker_schema import signatures
from broker_schema.records import (
    FactsRecord,
    KeyCertRecord,
    KeyRevokeRecord,
    ResponseRecord,
    Signature,
)

__all__ = [
    "KeyHistory",
    "KeyProblem",
    "KeyProblemCode",
    "KeySpan",
    "TrustedKey",
    "build_history",
    "file_receipt_key_problem",
    "fleet_signature_problem",
    "ledger_key_judge",
    "node_keys",
    "receipt_key_problem",
    "record_problem",
    "response_key_problem",
    "response_node",
    "response_signer",
    "revoked_from",
]


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


def fleet_signature_problem(sig: Signature | None, signed: bytes,
                            fleet_keys: Sequence[bytes]) -> str | None:
    """Why ``sig`` over ``signed`` is not a signature by one of ``fleet_keys`` (the operator's
    fleet keys: key certificates and revocations, the model registry's records), or None when
    it is."""
    if sig is None:
        return "unsigned"
    by_id = {}
    for k in fleet_keys:
        try:
            by_id[signatures.key_id(k)] = k
        except ValueError:
            continue
    key = by_id.get(sig.key_id)
    if key is None:
        return f"signed by {sig.key_id}, which is not a fleet key given to this verifier"
    try:
        value = base64.b64decode(sig.value, validate=True)
    except (binascii.Error, ValueError):
        return "the signature value is not base64"
    if sig.alg != signatures.key_type(key):
        return f"the signature says {sig.alg}, the fleet key is {signatures.key_type(key)}"
    if not signatures.verify(key, value, signed):
        return "the fleet signature does not verify"
    return None


def _fleet_problem(rec: KeyCertRecord | KeyRevokeRecord,
                   fleet_keys: Sequence[bytes]) -> str | None:
    sig = rec.signature
    if sig is not None and sig.key_id != rec.issuer_key_id:
        return f"the signature names key {sig.key_id}, the record issuer {rec.issuer_key_id}"
    return fleet_signature_problem(sig, rec.signing_bytes(), fleet_keys)


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


# ------------------------------------------------------------------------ responses: the one rule

#: Why a response's signing key is not trusted (:class:`KeyProblem`):
#:
#: - ``unsigned``: the response carries no signature;
#: - ``unknown_key``: no key is known for it (no facts record publishes its key id; for a
#:   receipt key checked against facts: no facts of the node);
#: - ``other_node``: the key is published on ``sys.facts`` by another node only;
#: - ``not_certified``: no fleet certificate gives the node that key;
#: - ``bad_signature``: the key is the node's, but the signature does not verify with it (or the
#:   published key is unusable);
#: - ``untrusted``: the key is certified for the node but not at the response's time (revoked,
#:   or not yet valid), or a receipt is signed by another key than the node's.
KeyProblemCode = Literal["unsigned", "unknown_key", "other_node", "not_certified",
                         "bad_signature", "untrusted"]


@dataclasses.dataclass(frozen=True)
class KeyProblem:
    """Why a response's signature is not trusted: a :data:`KeyProblemCode`, the node checked,
    the key id the signature names (None: unsigned), where the keys came from (``facts`` or
    ``history``), and a sentence for people (``detail``; ``fx why`` shows it as it is)."""

    code: KeyProblemCode
    node_id: str
    key_id: str | None
    source: Literal["facts", "history"]
    detail: str


@dataclasses.dataclass(frozen=True)
class TrustedKey:
    """The key a response's signature verified with: the node, the raw key and its id, and
    where it came from (``facts``: the facts record's node; ``history``: the certificate's
    offset on ``sys.keys``)."""

    node_id: str
    public_key: bytes
    key_id: str
    source: Literal["facts", "history"]
    offset: int | None = None


def response_node(response: ResponseRecord) -> str:
    """The node a response claims produced it: its executor block's ``node_id``, else
    ``written_by``. Its signing key must be trusted for this node: the holder's merge rule
    (:func:`broker_schema.signatures.answer_refusal`) goes by the same node."""
    return response.executor.node_id if response.executor is not None else response.written_by


def response_signer(response: ResponseRecord, facts: Sequence[FactsRecord],
                    history: KeyHistory | None, *,
                    appended_us: int | None = None) -> TrustedKey | KeyProblem:
    """The key ``response`` is validly signed with, trusted for the node it claims
    (:func:`response_node`) at its time, or why not. Pure.

    With ``history`` (the node keys a fleet key certified, :func:`build_history`): a
    certificate of the signature's key for the node, the signature verifying with it, and the
    key trusted at ``appended_us``, the broker's append time of the response record in µs
    (:meth:`KeyHistory.key_problem`; None, for a record read from a file: no time, so a revoked
    key is not trusted);
    ``facts`` are not read. Without: a record of ``facts`` (the records on ``sys.facts``,
    oldest first) of that node publishing a key whose raw bytes hash to the signature's key id
    and with which the signature verifies (the latest such record first).

    Before this one function, ``fx verify --workload`` checked the key against ``written_by``
    while ``fx why``/``fx audit`` and the holder checked it against the executor's node: a
    response signed by node A's key that names executor node B was trusted by ``fx verify`` and
    refused by the others. The executor's node is the right one: it is whom the response says
    produced the output (and whom the holder's merge rule and people read it as); ``fx verify``
    was wrong. An executor writes both fields the same, so genuine responses are unaffected.
    """
    node = response_node(response)
    sig = response.signature
    if sig is None:
        return KeyProblem("unsigned", node, None, "history" if history is not None else "facts",
                          "the response carries no signature")
    if history is not None:
        span = next((s for s in history.spans(node) if s.key_id == sig.key_id), None)
        if span is None:
            return KeyProblem("not_certified", node, sig.key_id, "history",
                              f"no fleet certificate on sys.keys gives node {node!r} key "
                              f"{sig.key_id}")
        problem = signatures.response_signature_problem(response, span.public_key)
        if problem is not None:
            return KeyProblem("bad_signature", node, sig.key_id, "history", problem)
        problem = history.key_problem(node, span.public_key, appended_us)
        if problem is not None:
            return KeyProblem("untrusted", node, sig.key_id, "history", problem)
        return TrustedKey(node, span.public_key, span.key_id, "history", span.offset)
    published = [f for f in facts if f.key_id == sig.key_id]
    if not published:
        return KeyProblem("unknown_key", node, sig.key_id, "facts",
                          f"no facts record on sys.facts publishes key {sig.key_id}")
    own = [f for f in published if f.node_id == node]
    if not own:
        others = sorted({f.node_id for f in published})
        return KeyProblem("other_node", node, sig.key_id, "facts",
                          f"key {sig.key_id} is published by {others}, not by the executor "
                          f"node {node!r} the response names")
    failures: list[str] = []
    for fact in reversed(own):  # latest first
        try:
            raw = signatures.public_key_from_text(fact.public_key)
        except ValueError as exc:
            failures.append(f"unusable key or signature: {exc}")
            continue
        if signatures.key_id(raw) != sig.key_id:
            failures.append(f"unusable key or signature: the published key hashes to "
                            f"{signatures.key_id(raw)}, not to its key_id")
            continue
        problem = signatures.response_signature_problem(response, raw)
        if problem is not None:
            failures.append("the signature does not verify with the published key"
                            if problem.startswith("the signature does not verify") else
                            f"unusable key or signature: {problem}")
            continue
        return TrustedKey(fact.node_id, raw, sig.key_id, "facts")
    return KeyProblem("bad_signature", node, sig.key_id, "facts",
                      "; ".join(dict.fromkeys(failures)))


def response_key_problem(response: ResponseRecord, facts: Sequence[FactsRecord],
                         history: KeyHistory | None, *,
                         appended_us: int | None = None) -> KeyProblem | None:
    """None when the key that signed ``response`` is trusted for the node it claims at its
    time (with ``history``: by the fleet certificates; else: published by that node on
    ``facts``) and the signature verifies with it; else why not (:func:`response_signer`, whose
    docstring says which node, and which caller had it wrong before). Pure."""
    found = response_signer(response, facts, history, appended_us=appended_us)
    return found if isinstance(found, KeyProblem) else None


def receipt_key_problem(response: ResponseRecord, receipt_key: bytes,
                        facts: Sequence[FactsRecord],
                        history: KeyHistory | None, *,
                        appended_us: int | None = None) -> KeyProblem | None:
    """Why ``receipt_key`` (the raw key an integer-engine receipt of ``response`` names) is not
    trusted for the node the response claims (:func:`response_node`) at ``appended_us`` (the
    response record's append time, as :func:`response_signer`), or None.
    With ``history``: certified for the node and not revoked then. Without: the key the
    node's latest record of ``facts`` publishes (``unknown_key`` when the node has none)."""
    node = response_node(response)
    if history is not None:
        problem = history.key_problem(node, receipt_key, appended_us)
        return None if problem is None else KeyProblem(
            "untrusted", node, None, "history", problem)
    latest = [f for f in facts if f.node_id == node][-1:]
    if not latest:
        return KeyProblem("unknown_key", node, None, "facts",
                          f"no facts for node {node} on sys.facts")
    try:
        published: bytes | None = signatures.public_key_from_text(latest[0].public_key)
    except ValueError:
        published = None
    if published != receipt_key:
        return KeyProblem("untrusted", node, None, "facts",
                          f"not node {node}'s key on sys.facts")
    return None


def node_keys(node_id: str, facts: Sequence[FactsRecord],
              history: KeyHistory | None) -> list[bytes]:
    """The keys to check what ``node_id`` signed outside a response (its ledger's
    checkpoints) with: every key the fleet certified for it (``history``), else the key of its
    latest record on ``facts`` (none when it has none, or an unusable one)."""
    if history is not None:
        return history.public_keys(node_id)
    latest = [f for f in facts if f.node_id == node_id][-1:]
    try:
        return [signatures.public_key_from_text(f.public_key) for f in latest]
    except ValueError:
        return []


def ledger_key_judge(history: KeyHistory, node_id: str) -> Callable[[bytes, int | None],
                                                                     str | None]:
    """The rule for what a node signs on its ledger (``sys.ledger.<node>``): a checkpoint, or
    the receipt of a leaf, signed by key K is trusted when K is certified for ``node_id`` and
    trusted at the broker's append time of its record (µs; None: no such time, so a revoked key
    is not trusted): :meth:`KeyHistory.key_problem`, the rule receipts on the log are judged by.
    Given to :func:`fx_integer.ledger.audit` as its ``key_problem``."""

    def judge(public_key: bytes, at_us: int | None) -> str | None:
        return history.key_problem(node_id, public_key, at_us)

    return judge


def revoked_from(history: KeyHistory, node_id: str, public_key: bytes) -> int | None:
    """When ``public_key``'s trust for ``node_id`` ends (the earliest revocation, µs), or None
    when it is not revoked."""
    cuts = [s.revoked_us for s in history.spans(node_id)
            if s.public_key == public_key and s.revoked_us is not None]
    return min(cuts) if cuts else None


def file_receipt_key_problem(history: KeyHistory, node_id: str, public_key: bytes,
                             logged_before: Callable[[int], str | None]
                             ) -> tuple[str | None, str | None]:
    """Why a receipt read from a file (``fx verify FILE``), signed by ``public_key`` for
    ``node_id``, is not trusted, or None; and a note. Such a receipt carries no time its signer
    did not choose (its response's ``finished_us`` is the signer's own clock), so it is judged
    undated (:meth:`KeyHistory.key_problem` with no time): a revoked key's receipt is refused,
    unless ``logged_before(revoked_us)`` says how a checkpoint the broker appended before the
    revocation includes it (then trusted, and that is the note). ``not_before_us`` is not
    judged: nothing dates the receipt."""
    problem = history.key_problem(node_id, public_key, None)
    cut = revoked_from(history, node_id, public_key)
    if problem is None or cut is None:
        return problem, None
    note = logged_before(cut)
    if note is None:
        return (f"{problem}; a receipt in a file carries no time its signer did not choose, "
                f"and no checkpoint of the node's ledger appended before the revocation "
                f"includes it"), None
    return None, note
