"""A node's receipt ledger: an RFC 9162 Merkle tree with C2SP signed-note checkpoints.

Pure and service-free (stdlib only; signatures are checked through
:func:`broker_schema.signatures.verify`, imported on first use), so a verifier can use it
without the executor.

Merkle tree (RFC 9162 §2.1): ``leaf_hash(d) = SHA-256(0x00 || d)``, ``node_hash(l, r) =
SHA-256(0x01 || l || r)``, the head of the empty tree is ``SHA-256("")``; a tree of n > 1 leaves
splits at k, the largest power of two smaller than n. Inclusion proofs (§2.1.3) and consistency
proofs (§2.1.4) are generated and verified exactly as the RFC's algorithms say.

A leaf of the ledger is the canonical JSON (sorted keys, no whitespace, UTF-8) of one receipt,
its signature included: the same bytes whose SHA-256 is the receipt's ``receipt_hash``.

Checkpoint (c2sp.org/tlog-checkpoint), the body of a signed note::

    <origin>\\n
    <tree size, decimal>\\n
    <base64 of the 32-byte root hash>\\n

The origin is ``ninelives-fx/ledger/<node id>``. Signed note (c2sp.org/signed-note): the body,
an empty line, then one line per signature ``"\\u2014 " + key name + " " + base64(key hash ||
signature)``, where the key name is the origin, the signature covers the body (with its final
newline), and key hash = the first 4 bytes of ``SHA-256(key name || 0x0A || type || raw public
key)``. The type byte is signed-note's ``0x01`` for an Ed25519 key (32 bytes); a secp256k1 key
(33-byte compressed point, ECDSA-SHA256 ``r || s`` low-s signatures, 64 bytes) uses ``0xff``,
the byte the signed-note spec leaves for algorithms it does not assign. :func:`verifier_key`
gives the note ecosystem's ``<name>+<hex key hash>+<base64(type || key)>`` form.

A node whose key was rotated has checkpoints signed by each of its keys in turn: :func:`audit`
and :func:`open_checkpoint` take every key the verifier trusts for the node.

Ledger stream records (``sys.ledger.<node>``, one partition, key = node id), JSON objects::

    {"format": "fx-ledger/1", "type": "leaf", "index": i, "receipt": {...}}
    {"format": "fx-ledger/1", "type": "checkpoint", "note": "<signed note>"}

:func:`audit` walks such a stream and reports gaps, forks (a checkpoint whose root is not the
tree of the leaves before it) and truncation (a checkpoint smaller than one seen before), and
:func:`check_extends` compares a new checkpoint with one remembered from an earlier read.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = [
    "EMPTY_ROOT",
    "FORMAT",
    "Audit",
    "Checkpoint",
    "KeyJudge",
    "LedgerError",
    "MerkleTree",
    "audit",
    "check_extends",
    "checkpoint_body",
    "checkpoint_record",
    "consistency_proof",
    "inclusion_proof",
    "key_hash",
    "leaf_data",
    "leaf_hash",
    "leaf_problem",
    "leaf_record",
    "logged_before_note",
    "node_hash",
    "open_checkpoint",
    "open_checkpoint_key",
    "open_note_key",
    "origin",
    "parse_checkpoint",
    "parse_record",
    "root",
    "sign_note",
    "verifier_key",
    "verify_consistency",
    "verify_inclusion",
]

FORMAT: Final = "fx-ledger/1"
HASH_SIZE: Final = 32
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
_ED25519: Final = b"\x01"
#: signed-note's type byte for algorithms it does not assign; here: secp256k1 ECDSA-SHA256
_OTHER: Final = b"\xff"
_SIG_PREFIX: Final = "\u2014 "
#: at most this many signature lines are read from a note (the signed-note spec's bound)
_MAX_SIGNATURES: Final = 100


class LedgerError(ValueError):
    """A malformed proof, checkpoint, note or ledger record."""


# ------------------------------------------------------------------------------ Merkle tree
def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def _range(hashes: Sequence[bytes], lo: int, hi: int) -> bytes:
    n = hi - lo
    if n == 0:
        return EMPTY_ROOT
    if n == 1:
        return hashes[lo]
    k = _split(n)
    return node_hash(_range(hashes, lo, lo + k), _range(hashes, lo + k, hi))


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH over the leaf hashes (RFC 9162 §2.1.1)."""
    return _range(leaf_hashes, 0, len(leaf_hashes))


def _path(hashes: Sequence[bytes], m: int, lo: int, hi: int,
          rng: Callable[[int, int], bytes]) -> list[bytes]:
    n = hi - lo
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return [*_path(hashes, m, lo, lo + k, rng), rng(lo + k, hi)]
    return [*_path(hashes, m - k, lo + k, hi, rng), rng(lo, lo + k)]


def _subproof(m: int, lo: int, hi: int, whole: bool,
              rng: Callable[[int, int], bytes]) -> list[bytes]:
    n = hi - lo
    if m == n:
        return [] if whole else [rng(lo, hi)]
    k = _split(n)
    if m <= k:
        return [*_subproof(m, lo, lo + k, whole, rng), rng(lo + k, hi)]
    return [*_subproof(m - k, lo + k, hi, False, rng), rng(lo, lo + k)]


def inclusion_proof(leaf_hashes: Sequence[bytes], index: int,
                    size: int | None = None) -> list[bytes]:
    """PATH(index, D[0:size]) (RFC 9162 §2.1.3.1); ``size`` defaults to every leaf."""
    n = len(leaf_hashes) if size is None else size
    if not 0 <= index < n <= len(leaf_hashes):
        raise LedgerError(f"no leaf {index} in a tree of {n}")
    return _path(leaf_hashes, index, 0, n, lambda a, b: _range(leaf_hashes, a, b))


def consistency_proof(leaf_hashes: Sequence[bytes], old: int,
                      new: int | None = None) -> list[bytes]:
    """PROOF(old, D[0:new]) (RFC 9162 §2.1.4.1); empty for ``old`` 0 or ``old == new``."""
    n = len(leaf_hashes) if new is None else new
    if not 0 <= old <= n <= len(leaf_hashes):
        raise LedgerError(f"no consistency proof from {old} to {n}")
    if old == 0 or old == n:
        return []
    return _subproof(old, 0, n, True, lambda a, b: _range(leaf_hashes, a, b))


def _is_hash(h: object) -> bool:
    return isinstance(h, bytes) and len(h) == HASH_SIZE


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes],
                     root_hash: bytes) -> bool:
    """RFC 9162 §2.1.3.2: ``leaf`` (a leaf hash) is leaf ``index`` of the tree of ``size``
    leaves whose head is ``root_hash``. False for anything malformed; never raises."""
    if not (_is_hash(leaf) and _is_hash(root_hash) and all(_is_hash(p) for p in proof)):
        return False
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root_hash


def verify_consistency(old: int, new: int, old_root: bytes, new_root: bytes,
                       proof: Sequence[bytes]) -> bool:
    """RFC 9162 §2.1.4.2: the tree of ``new`` leaves with head ``new_root`` extends the tree of
    ``old`` leaves with head ``old_root``. ``old`` 0 (any tree extends the empty one) and
    ``old == new`` (same head) take an empty proof. False for anything malformed."""
    if not (_is_hash(old_root) and _is_hash(new_root) and all(_is_hash(p) for p in proof)):
        return False
    if not 0 <= old <= new:
        return False
    if old == 0:
        return not proof and old_root == EMPTY_ROOT
    if old == new:
        return not proof and old_root == new_root
    if not proof:
        return False
    path = list(proof)
    if old & (old - 1) == 0:  # a power of two: the old head is the proof's first node
        path.insert(0, old_root)
    fn, sn = old - 1, new - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


class MerkleTree:
    """An append-only tree of leaf hashes that keeps every complete subtree's hash, so appends,
    heads and proofs cost O(log n) hashes each."""

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self._levels: list[list[bytes]] = [[]]
        for h in leaf_hashes:
            self.append_hash(h)

    def __len__(self) -> int:
        return len(self._levels[0])

    @property
    def leaf_hashes(self) -> Sequence[bytes]:
        return self._levels[0]

    def append(self, data: bytes) -> int:
        """Append a leaf's data; returns its index."""
        return self.append_hash(leaf_hash(data))

    def append_hash(self, h: bytes) -> int:
        if not _is_hash(h):
            raise LedgerError("a leaf hash is 32 bytes")
        index = len(self._levels[0])
        self._levels[0].append(h)
        level, i = 0, index
        while i & 1:  # completes a subtree one level up
            left = self._levels[level][i - 1]
            right = self._levels[level][i]
            level, i = level + 1, i >> 1
            if len(self._levels) == level:
                self._levels.append([])
            self._levels[level].append(node_hash(left, right))
        return index

    def _rng(self, lo: int, hi: int) -> bytes:
        n = hi - lo
        if n == 0:
            return EMPTY_ROOT
        if n & (n - 1) == 0 and lo % n == 0:  # a complete subtree: kept
            return self._levels[n.bit_length() - 1][lo // n]
        k = _split(n)
        return node_hash(self._rng(lo, lo + k), self._rng(lo + k, hi))

    def root(self, size: int | None = None) -> bytes:
        n = len(self) if size is None else size
        if not 0 <= n <= len(self):
            raise LedgerError(f"no tree of {n} leaves (there are {len(self)})")
        return self._rng(0, n)

    def inclusion_proof(self, index: int, size: int | None = None) -> list[bytes]:
        n = len(self) if size is None else size
        if not 0 <= index < n <= len(self):
            raise LedgerError(f"no leaf {index} in a tree of {n}")
        return _path(self.leaf_hashes, index, 0, n, self._rng)

    def consistency_proof(self, old: int, new: int | None = None) -> list[bytes]:
        n = len(self) if new is None else new
        if not 0 <= old <= n <= len(self):
            raise LedgerError(f"no consistency proof from {old} to {n}")
        if old == 0 or old == n:
            return []
        return _subproof(old, 0, n, True, self._rng)


# ------------------------------------------------------------------------------ checkpoints
def origin(node_id: str) -> str:
    """The checkpoint origin (and note key name) of a node's ledger."""
    name = f"ninelives-fx/ledger/{node_id}"
    _check_name(name)
    return name


def _check_name(name: str) -> None:
    if not name or "+" in name or any(c.isspace() for c in name):
        raise LedgerError(f"{name!r} is not a note key name (non-empty, no spaces, no '+')")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        return checkpoint_body(self.origin, self.size, self.root, self.extensions)

    def to_json(self) -> dict[str, Any]:
        return {"origin": self.origin, "size": self.size, "root": self.root.hex()}


def checkpoint_body(origin_line: str, size: int, root_hash: bytes,
                    extensions: Sequence[str] = ()) -> str:
    if not origin_line or "\n" in origin_line or size < 0 or not _is_hash(root_hash):
        raise LedgerError("a checkpoint needs an origin line, a size >= 0 and a 32-byte root")
    lines = [origin_line, str(size), base64.b64encode(root_hash).decode("ascii"), *extensions]
    return "".join(line + "\n" for line in lines)


def parse_checkpoint(body: str) -> Checkpoint:
    if not body.endswith("\n"):
        raise LedgerError("a checkpoint body ends with a newline")
    lines = body[:-1].split("\n")
    if len(lines) < 3 or not lines[0]:
        raise LedgerError("a checkpoint has an origin, a size and a root hash line")
    size_text, root_text = lines[1], lines[2]
    if not size_text.isascii() or not size_text.isdigit() or (
            len(size_text) > 1 and size_text[0] == "0"):
        raise LedgerError(f"checkpoint size {size_text!r} is not a decimal number")
    try:
        root_hash = base64.b64decode(root_text, validate=True)
    except (binascii.Error, ValueError):
        raise LedgerError("the checkpoint root is not base64") from None
    if len(root_hash) != HASH_SIZE:
        raise LedgerError(f"the checkpoint root is {len(root_hash)} bytes, not 32")
    if any(not line for line in lines[3:]):
        raise LedgerError("an empty checkpoint extension line")
    return Checkpoint(lines[0], int(size_text), root_hash, tuple(lines[3:]))


def _type_byte(public_key: bytes) -> bytes:
    return _ED25519 if len(public_key) == 32 else _OTHER


def key_hash(name: str, public_key: bytes) -> bytes:
    """The signed-note key hash: SHA-256(name || 0x0A || type || key)[:4], type 0x01 for an
    Ed25519 key, 0xff for a secp256k1 one."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + _type_byte(public_key)
                          + public_key).digest()[:4]


def verifier_key(name: str, public_key: bytes) -> str:
    """``<name>+<hex key hash>+<base64(type || key)>``."""
    _check_name(name)
    return (f"{name}+{key_hash(name, public_key).hex()}+"
            f"{base64.b64encode(_type_byte(public_key) + public_key).decode('ascii')}")


def sign_note(body: str, name: str, sign: Callable[[bytes], bytes], public_key: bytes) -> str:
    """The signed note of ``body`` by ``sign`` (a signing function giving 64-byte signatures by
    ``public_key``, such as :meth:`broker_schema.signatures.SigningKey.sign`) under key
    ``name``."""
    _check_name(name)
    if not body.endswith("\n") or "\n\n" in body:
        raise LedgerError("a note body ends with one newline and has no empty line")
    sig = sign(body.encode("utf-8"))
    if len(sig) != 64:
        raise LedgerError("a note signature is 64 bytes")
    value = base64.b64encode(key_hash(name, public_key) + sig).decode("ascii")
    return f"{body}\n{_SIG_PREFIX}{name} {value}\n"


def _keys(public_keys: bytes | Iterable[bytes]) -> list[bytes]:
    return [public_keys] if isinstance(public_keys, bytes) else list(public_keys)


def open_note(note: str, name: str, public_keys: bytes | Iterable[bytes]) -> str:
    """The body of ``note`` when it carries a valid signature under ``name`` by ``public_keys``
    (one raw key, or every key trusted for the signer); :class:`LedgerError` otherwise (as the
    spec says, a failing signature by a known key rejects the note, whatever other lines
    say)."""
    return open_note_key(note, name, public_keys)[0]


def open_note_key(note: str, name: str,
                  public_keys: bytes | Iterable[bytes]) -> tuple[str, bytes]:
    """:func:`open_note`, and the key of ``public_keys`` whose signature verified (so a caller
    can judge that key's dates: :func:`audit` with ``key_problem``)."""
    from broker_schema.signatures import verify

    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise LedgerError("not a signed note (no empty line before the signatures)")
    body, sig_lines = note[:cut + 1], note[cut + 2:-1].split("\n")
    if len(sig_lines) > _MAX_SIGNATURES:
        raise LedgerError("too many signature lines")
    known = {key_hash(name, k): k for k in _keys(public_keys)}
    for line in sig_lines:
        if not line.startswith(_SIG_PREFIX):
            raise LedgerError(f"a malformed signature line {line!r}")
        parts = line[len(_SIG_PREFIX):].split(" ")
        if len(parts) != 2:
            raise LedgerError(f"a malformed signature line {line!r}")
        try:
            raw = base64.b64decode(parts[1], validate=True)
        except (binascii.Error, ValueError):
            raise LedgerError("a signature line is not base64") from None
        if len(raw) < 5:
            raise LedgerError("a signature line is too short")
        key = known.get(raw[:4])
        if parts[0] != name or key is None:
            continue  # another signer (a witness): not ours to check
        if not verify(key, raw[4:], body.encode("utf-8")):
            raise LedgerError(f"the signature by {name} does not verify")
        return body, key
    raise LedgerError(f"the note carries no signature by {name} with "
                      f"{'this key' if len(known) == 1 else 'any of its keys'}")


def open_checkpoint(note: str, node_id: str,
                    public_keys: bytes | Iterable[bytes]) -> Checkpoint:
    """The checkpoint in ``note``, signed by one of ``public_keys`` and naming ``node_id``'s
    origin."""
    return open_checkpoint_key(note, node_id, public_keys)[0]


def open_checkpoint_key(note: str, node_id: str,
                        public_keys: bytes | Iterable[bytes]) -> tuple[Checkpoint, bytes]:
    """:func:`open_checkpoint`, and the key that signed it."""
    name = origin(node_id)
    body, key = open_note_key(note, name, public_keys)
    cp = parse_checkpoint(body)
    if cp.origin != name:
        raise LedgerError(f"the checkpoint's origin is {cp.origin!r}, not {name!r}")
    return cp, key


# ------------------------------------------------------------------------------ stream records
def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def leaf_data(receipt: Mapping[str, Any]) -> bytes:
    """A receipt's leaf: its canonical JSON (whose sha256 is its ``receipt_hash``)."""
    return _canonical(dict(receipt))


def leaf_record(index: int, receipt: Mapping[str, Any]) -> bytes:
    return _canonical({"format": FORMAT, "type": "leaf", "index": index,
                       "receipt": dict(receipt)})


def checkpoint_record(note: str) -> bytes:
    return _canonical({"format": FORMAT, "type": "checkpoint", "note": note})


_FIELDS: Final = {"leaf": {"format", "type", "index", "receipt"},
                  "checkpoint": {"format", "type", "note"}}


def parse_record(value: bytes) -> dict[str, Any]:
    """A ledger record (``LedgerError`` when it is not one)."""
    try:
        rec = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise LedgerError(f"not JSON: {exc}") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise LedgerError(f"not a {FORMAT} record")
    kind = rec.get("type")
    if kind == "leaf":
        index = rec.get("index")
        if (not isinstance(index, int) or isinstance(index, bool) or index < 0
                or not isinstance(rec.get("receipt"), dict)):
            raise LedgerError("a leaf record has an index and a receipt object")
    elif kind == "checkpoint":
        if not isinstance(rec.get("note"), str):
            raise LedgerError("a checkpoint record has a note")
    else:
        raise LedgerError(f"unknown ledger record type {kind!r}")
    extra = sorted(set(rec) - _FIELDS[kind])
    if extra:
        raise LedgerError(f"a {kind} record with fields it does not have: {', '.join(extra)}")
    try:
        canonical = _canonical(rec)
    except (TypeError, ValueError):
        raise LedgerError("not encodable as canonical JSON") from None
    if canonical != value:
        raise LedgerError(f"a {kind} record not in its canonical bytes (sorted keys, no "
                          "whitespace, UTF-8, as the writer writes it)")
    return rec


# ------------------------------------------------------------------------------ monitoring
#: Why a key of the node is not trusted for what it signed at a time (µs since the epoch; None
#: when no time the signer could not choose is known), or None when it is: a node's key
#: history bound to the node (``KeyHistory.key_problem``), given to :func:`audit` by
#: ``fx ledger --fleet-key``.
KeyJudge = Callable[[bytes, "int | None"], "str | None"]


def leaf_problem(receipt: Mapping[str, Any], node_id: str,
                 public_keys: bytes | Iterable[bytes]) -> str | None:
    """Why a leaf's receipt is not one ``node_id`` signed with one of ``public_keys`` (it names
    another node, its ``public_key`` is not one of them, or its signature does not verify over
    its signing bytes), or None. A leaf that fails this is *foreign*: anyone allowed to write
    the topic could have appended it, and no checkpoint of the node may cover it."""
    from broker_schema.signatures import verify
    from fx_integer.receipt import signing_bytes

    if receipt.get("node_id") != node_id:
        return f"the receipt names node {receipt.get('node_id')!r}, not {node_id!r}"
    try:
        key = bytes.fromhex(str(receipt.get("public_key")))
        signature = bytes.fromhex(str(receipt.get("signature")))
    except ValueError:
        return "the receipt's public_key or signature is not hex"
    if key not in _keys(public_keys):
        return f"the receipt is signed by key {key.hex()[:16]}..., not a key of node {node_id!r}"
    try:
        good = verify(key, signature, signing_bytes(dict(receipt)))
    except (TypeError, ValueError):
        good = False
    return None if good else "the receipt's signature does not verify with its key"


@dataclasses.dataclass
class Audit:
    """What a walk of a ledger stream found."""

    tree: MerkleTree = dataclasses.field(default_factory=MerkleTree)
    receipts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: the checkpoints that verified, in stream order
    checkpoints: list[Checkpoint] = dataclasses.field(default_factory=list)
    #: the broker's append time (µs) of each of :attr:`checkpoints`, None when not read
    checkpoint_times: list[int | None] = dataclasses.field(default_factory=list)
    #: the stream offset of each of :attr:`checkpoints`
    checkpoint_offsets: list[int] = dataclasses.field(default_factory=list)
    #: leaf indexes whose receipt is not the node's own (:func:`leaf_problem`)
    foreign: list[int] = dataclasses.field(default_factory=list)
    #: (kind, message): kind is "gap", "fork", "truncation", "signature", "foreign" or
    #: "malformed"
    problems: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def latest(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    @property
    def pending(self) -> int:
        """Leaves after the latest checkpoint (one being written, or never checkpointed)."""
        return len(self.tree) - (self.latest.size if self.latest else 0)

    def find(self, receipt: Mapping[str, Any]) -> int | None:
        """The leaf index of ``receipt``, or None."""
        h = leaf_hash(leaf_data(receipt))
        for i, lh in enumerate(self.tree.leaf_hashes):
            if lh == h:
                return i
        return None

    def checkpointed_before(self, index: int, cut_us: int) -> tuple[Checkpoint, int] | None:
        """The first verified checkpoint that covers leaf ``index`` and that the broker appended
        before ``cut_us`` (its append time, which its signer does not choose), with that time;
        None when there is none. A revoked key's receipt stays trusted when such a checkpoint
        made before the revocation includes it (``fx verify FILE --fleet-key``)."""
        if index in self.foreign:
            return None
        for cp, at in zip(self.checkpoints, self.checkpoint_times, strict=True):
            if at is not None and at < cut_us and cp.size > index \
                    and self.tree.root(cp.size) == cp.root:
                return cp, at
        return None


def logged_before_note(found: Audit, receipt: Mapping[str, Any], cut_us: int) -> str | None:
    """How ``receipt`` is shown logged before ``cut_us`` (a sentence), or None: its leaf in
    ``found`` is under a verified checkpoint the broker appended before ``cut_us``
    (:meth:`Audit.checkpointed_before`)."""
    index = found.find(receipt)
    before = None if index is None else found.checkpointed_before(index, cut_us)
    if index is None or before is None:
        return None
    cp, at = before
    return (f"signed by a key revoked from {cut_us} us, but leaf {index} of the node's ledger is "
            f"under its checkpoint of {cp.size} leaves, which the broker appended at {at} us, "
            "before the revocation: trusted as logged before it")


def _entry(item: Sequence[Any]) -> tuple[int, bytes, int | None]:
    return item[0], item[1], (item[2] if len(item) > 2 else None)


def audit(values: Iterable[Sequence[Any]], node_id: str,
          public_keys: bytes | Iterable[bytes], *, key_problem: KeyJudge | None = None) -> Audit:
    """Walk a ledger stream (``(offset, value)`` or ``(offset, value, append_us)`` in order,
    ``append_us`` the broker's append time of the record in µs): rebuild the tree from its
    leaves and check every checkpoint against the leaves before it.

    - gap: a leaf whose index is past the next one (a record missing), or receipts whose
      ``seq`` skips a number (a receipt signed and never logged);
    - fork: a checkpoint whose root is not the head of the leaves before it, or a second,
      different leaf at an index (the same leaf twice is a retried send, and harmless);
    - truncation: a checkpoint smaller than an earlier one;
    - signature: a checkpoint not signed by one of the node's keys for its origin, or (with
      ``key_problem``) signed by a key not trusted at the checkpoint record's append time
      (revoked by then, or certified only from later; no append time: a revoked key is not
      trusted at all);
    - foreign: a leaf whose receipt the node did not sign (:func:`leaf_problem`), or (with
      ``key_problem``) signed by a key not trusted at the leaf record's append time. It stays in
      the tree (the tree is what the topic holds) and is listed in :attr:`Audit.foreign`.

    Receipt chains are per key (a rotated key starts a new chain at seq 0), so the seq checks
    run per ``public_key`` of the receipts.
    """
    keys = _keys(public_keys)
    out = Audit()
    for item in values:
        offset, value, at = _entry(item)
        try:
            rec = parse_record(value)
        except LedgerError as exc:
            out.problems.append(("malformed", f"offset {offset}: {exc}"))
            continue
        if rec["type"] == "leaf":
            index = rec["index"]
            if index < len(out.tree):
                if out.tree.leaf_hashes[index] != leaf_hash(leaf_data(rec["receipt"])):
                    out.problems.append(("fork", f"offset {offset}: another leaf {index}"))
                continue  # the same leaf again (a retried send): harmless, not appended again
            if index > len(out.tree):
                out.problems.append(("gap", f"offset {offset}: leaf {index} where leaf "
                                            f"{len(out.tree)} was due"))
            foreign = leaf_problem(rec["receipt"], node_id, keys)
            if foreign is None and key_problem is not None:
                foreign = key_problem(bytes.fromhex(rec["receipt"]["public_key"]), at)
            if foreign is not None:
                out.foreign.append(len(out.tree))
                out.problems.append(("foreign", f"offset {offset}: leaf {len(out.tree)}: "
                                                f"{foreign}"))
            out.tree.append(leaf_data(rec["receipt"]))
            out.receipts.append(rec["receipt"])
            continue
        try:
            cp, key = open_checkpoint_key(rec["note"], node_id, keys)
        except LedgerError as exc:
            out.problems.append(("signature", f"offset {offset}: {exc}"))
            continue
        if key_problem is not None:
            dated = key_problem(key, at)
            if dated is not None:
                out.problems.append(("signature", f"offset {offset}: checkpoint of {cp.size} "
                                                  f"appended at {at} us: {dated}"))
                continue
        prev = out.latest
        if prev is not None and cp.size < prev.size:
            out.problems.append(("truncation", f"offset {offset}: checkpoint of {cp.size} "
                                               f"after one of {prev.size}"))
        if cp.size > len(out.tree):
            out.problems.append(("gap", f"offset {offset}: checkpoint of {cp.size} leaves, "
                                        f"only {len(out.tree)} logged before it"))
        elif out.tree.root(cp.size) != cp.root:
            out.problems.append(("fork", f"offset {offset}: checkpoint root of {cp.size} is "
                                         "not the head of the leaves logged"))
        covered = [i for i in out.foreign if i < cp.size]
        if covered:
            out.problems.append(("foreign", f"offset {offset}: the checkpoint of {cp.size} "
                                            f"covers foreign leaves {covered}"))
        out.checkpoints.append(cp)
        out.checkpoint_times.append(at)
        out.checkpoint_offsets.append(offset)
    chains: dict[str, list[int]] = {}
    for i, r in enumerate(out.receipts):
        if isinstance(r.get("seq"), int) and i not in out.foreign:
            chains.setdefault(str(r.get("public_key")), []).append(r["seq"])
    for key_text, seqs in chains.items():
        whose = f" (key {key_text[:16]}...)" if len(chains) > 1 else ""
        for a, b in itertools.pairwise(sorted(seqs)):
            if b > a + 1:
                out.problems.append(("gap", f"receipt seq {a + 1}..{b - 1} not in the "
                                            f"ledger{whose}"))
            elif b == a:
                out.problems.append(("fork", f"receipt seq {a} logged twice{whose}"))
    return out


def check_extends(old: Checkpoint, new: Checkpoint, proof: Sequence[bytes]) -> str | None:
    """Why ``new`` does not extend ``old`` (truncation or fork), or None when it does."""
    if new.origin != old.origin:
        return f"fork: origin {new.origin!r} is not {old.origin!r}"
    if new.size < old.size:
        return f"truncation: the ledger holds {new.size} leaves, {old.size} were checkpointed"
    if not verify_consistency(old.size, new.size, old.root, new.root, proof):
        return (f"fork: the checkpoint of {new.size} leaves does not extend the one of "
                f"{old.size}")
    return None
