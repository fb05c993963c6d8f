"""The receipt ledger's Merkle tree (RFC 9162) and signed-note checkpoints (C2SP)."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_schema import signatures
from fx_integer import ledger as L

# The Certificate Transparency reference leaves and tree heads (RFC 6962 / RFC 9162 hashing).
CT_LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657",
    "606162636465666768696a6b6c6d6e6f")]
CT_ROOTS = [bytes.fromhex(h) for h in (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
)]
CT_INCLUSION = {
    (0, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (5, 8): ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
}
CT_CONSISTENCY = {
    (1, 8): ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
             "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (2, 8): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"],
    (6, 8): ["0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
             "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
             "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"],
    (2, 5): ["5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
             "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"],
}
HASHES = [L.leaf_hash(d) for d in CT_LEAVES]


def test_reference_heads() -> None:
    tree = L.MerkleTree()
    assert tree.root() == CT_ROOTS[0] == L.EMPTY_ROOT
    for n, data in enumerate(CT_LEAVES, start=1):
        tree.append(data)
        assert L.root(HASHES[:n]) == CT_ROOTS[n]
        assert tree.root() == CT_ROOTS[n]
    for n in range(9):
        assert tree.root(n) == CT_ROOTS[n]


@pytest.mark.parametrize(("index", "size"), sorted(CT_INCLUSION))
def test_reference_inclusion_proofs(index: int, size: int) -> None:
    want = [bytes.fromhex(h) for h in CT_INCLUSION[(index, size)]]
    tree = L.MerkleTree(HASHES)
    assert L.inclusion_proof(HASHES, index, size) == want
    assert tree.inclusion_proof(index, size) == want
    assert L.verify_inclusion(HASHES[index], index, size, want, CT_ROOTS[size])


@pytest.mark.parametrize(("old", "new"), sorted(CT_CONSISTENCY))
def test_reference_consistency_proofs(old: int, new: int) -> None:
    want = [bytes.fromhex(h) for h in CT_CONSISTENCY[(old, new)]]
    tree = L.MerkleTree(HASHES)
    assert L.consistency_proof(HASHES, old, new) == want
    assert tree.consistency_proof(old, new) == want
    assert L.verify_consistency(old, new, CT_ROOTS[old], CT_ROOTS[new], want)


def test_degenerate_consistency() -> None:
    assert L.verify_consistency(0, 8, L.EMPTY_ROOT, CT_ROOTS[8], [])
    assert not L.verify_consistency(0, 8, CT_ROOTS[1], CT_ROOTS[8], [])
    assert L.verify_consistency(4, 4, CT_ROOTS[4], CT_ROOTS[4], [])
    assert not L.verify_consistency(4, 4, CT_ROOTS[4], CT_ROOTS[5], [])
    assert not L.verify_consistency(4, 4, CT_ROOTS[4], CT_ROOTS[4], [CT_ROOTS[1]])
    assert not L.verify_consistency(4, 8, CT_ROOTS[4], CT_ROOTS[8], [])
    assert not L.verify_consistency(8, 4, CT_ROOTS[8], CT_ROOTS[4], [])
    assert not L.verify_inclusion(HASHES[0], 8, 8, [], CT_ROOTS[8])
    assert not L.verify_inclusion(HASHES[0][:31], 0, 1, [], CT_ROOTS[1])
    with pytest.raises(L.LedgerError):
        L.inclusion_proof(HASHES, 8)
    with pytest.raises(L.LedgerError):
        L.consistency_proof(HASHES, 5, 3)


def _leaves(n: int) -> list[bytes]:
    return [L.leaf_hash(i.to_bytes(4, "big")) for i in range(n)]


def test_every_proof_in_small_trees() -> None:
    """Exhaustive for sizes 0..33: every inclusion and every consistency proof verifies, the
    incremental tree agrees with the recursive definition, and one flipped bit fails."""
    hashes = _leaves(33)
    tree = L.MerkleTree(hashes)
    for n in range(34):
        head = L.root(hashes[:n])
        assert tree.root(n) == head
        for i in range(n):
            proof = tree.inclusion_proof(i, n)
            assert proof == L.inclusion_proof(hashes, i, n)
            assert L.verify_inclusion(hashes[i], i, n, proof, head)
            if n > 1:
                assert not L.verify_inclusion(hashes[i], (i + 1) % n, n, proof, head)
                assert not L.verify_inclusion(hashes[i], i, n, proof[:-1], head)
                assert not L.verify_inclusion(hashes[i], i, n, [*proof, head], head)
        for m in range(n + 1):
            proof = tree.consistency_proof(m, n)
            assert proof == L.consistency_proof(hashes, m, n)
            assert L.verify_consistency(m, n, tree.root(m), head, proof)
            if 0 < m < n:
                bad = [bytes([proof[0][0] ^ 1]) + proof[0][1:], *proof[1:]]
                assert not L.verify_consistency(m, n, tree.root(m), head, bad)
                assert not L.verify_consistency(m, n, tree.root(m), head, proof[:-1])
                assert not L.verify_consistency(m, n, tree.root(m), head, [*proof, head])
                assert not L.verify_consistency(m, n, head, head, proof)


def _flip(b: bytes, bit: int) -> bytes:
    i = bit // 8 % len(b)
    return b[:i] + bytes([b[i] ^ (1 << (bit % 8))]) + b[i + 1:]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_inclusion_property(n: int, data: st.DataObject) -> None:
    hashes = _leaves(n)
    tree = L.MerkleTree(hashes)
    size = data.draw(st.integers(1, n))
    index = data.draw(st.integers(0, size - 1))
    head = tree.root(size)
    proof = tree.inclusion_proof(index, size)
    assert L.verify_inclusion(hashes[index], index, size, proof, head)
    bit = data.draw(st.integers(0, 255))
    assert not L.verify_inclusion(_flip(hashes[index], bit), index, size, proof, head)
    assert not L.verify_inclusion(hashes[index], index, size, proof, _flip(head, bit))
    if proof:
        k = data.draw(st.integers(0, len(proof) - 1))
        tampered = [*proof[:k], _flip(proof[k], bit), *proof[k + 1:]]
        assert not L.verify_inclusion(hashes[index], index, size, tampered, head)
    if size > 1:
        other = data.draw(st.integers(0, size - 1).filter(lambda j: j != index))
        assert not L.verify_inclusion(hashes[index], other, size, proof, head)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_consistency_property(n: int, data: st.DataObject) -> None:
    hashes = _leaves(n)
    tree = L.MerkleTree(hashes)
    m = data.draw(st.integers(0, n))
    proof = tree.consistency_proof(m, n)
    assert L.verify_consistency(m, n, tree.root(m), tree.root(), proof)
    if 0 < m < n:
        bit = data.draw(st.integers(0, 255))
        k = data.draw(st.integers(0, len(proof) - 1))
        tampered = [*proof[:k], _flip(proof[k], bit), *proof[k + 1:]]
        assert not L.verify_consistency(m, n, tree.root(m), tree.root(), tampered)
        assert not L.verify_consistency(m, n, _flip(tree.root(m), bit), tree.root(), proof)
        # a fork: the same sizes, one different leaf before m
        forked = list(hashes)
        forked[data.draw(st.integers(0, m - 1))] = L.leaf_hash(b"forged")
        other = L.MerkleTree(forked)
        assert not L.verify_consistency(m, n, tree.root(m), other.root(), proof)
        assert not L.verify_consistency(m, n, tree.root(m), other.root(),
                                        other.consistency_proof(m, n))


# ------------------------------------------------------------------------------ notes
def _key() -> tuple[Ed25519PrivateKey, bytes]:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    return key, pub


def _receipt(key: Ed25519PrivateKey, pub: bytes, seq: int, node: str = "n1",
             **extra: object) -> dict[str, object]:
    """A receipt-shaped leaf signed by ``key`` over its signing bytes (a leaf the node did not
    sign is foreign: L.leaf_problem)."""
    from fx_integer.receipt import signing_bytes

    receipt: dict[str, object] = {"seq": seq, "node_id": node, "public_key": pub.hex(), **extra}
    return {**receipt, "signature": key.sign(signing_bytes(receipt)).hex()}


def test_checkpoint_note_format() -> None:
    key, pub = _key()
    name = L.origin("n1")
    body = L.checkpoint_body(name, 8, CT_ROOTS[8])
    assert body == f"{name}\n8\n{base64.b64encode(CT_ROOTS[8]).decode()}\n"
    note = L.sign_note(body, name, key.sign, pub)
    text, sig_line = note.split("\n\n")
    assert text + "\n" == body
    assert sig_line.startswith(f"\u2014 {name} ") and sig_line.endswith("\n")
    raw = base64.b64decode(sig_line.split(" ")[2])
    assert raw[:4] == hashlib.sha256(name.encode() + b"\n\x01" + pub).digest()[:4]
    assert len(raw) == 68
    assert signatures.verify(pub, raw[4:], body.encode())
    cp = L.open_checkpoint(note, "n1", pub)
    assert (cp.origin, cp.size, cp.root) == (name, 8, CT_ROOTS[8])
    vkey = L.verifier_key(name, pub)
    assert vkey.split("+", 2)[1] == raw[:4].hex()
    assert base64.b64decode(vkey.split("+", 2)[2]) == b"\x01" + pub


def test_signed_note_known_vector() -> None:
    """The signed-note spec's example key (PeterNeumann, from the Go note package) and note."""
    skey_b64 = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
    seed = base64.b64decode(skey_b64)[1:]
    key = Ed25519PrivateKey.from_private_bytes(seed)
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    assert L.key_hash("PeterNeumann", pub).hex() == "c74f20a3"
    text = ("If you think cryptography is the answer to your problem,\n"
            "then you don't know what your problem is.\n")
    note = L.sign_note(text, "PeterNeumann", key.sign, pub)
    assert note == text + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIu" \
                          "GUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
    assert L.open_note(note, "PeterNeumann", pub) == text


def test_tampered_notes_fail() -> None:
    key, pub = _key()
    name = L.origin("n1")
    note = L.sign_note(L.checkpoint_body(name, 8, CT_ROOTS[8]), name, key.sign, pub)
    for bad in (note.replace("\n8\n", "\n9\n"), note.replace(name, L.origin("n2"), 1),
                note.replace("\n\n", "\n"), note[:-2] + "A\n"):
        with pytest.raises(L.LedgerError):
            L.open_checkpoint(bad, "n1", pub)
    _, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate().public_key()
    with pytest.raises(L.LedgerError):
        L.open_checkpoint(note, "n1", other.public_bytes(serialization.Encoding.Raw,
                                                         serialization.PublicFormat.Raw))
    with pytest.raises(L.LedgerError):
        L.open_checkpoint(note, "n2", pub)  # another node's origin
    # a witness's cosignature beside ours is ignored
    wit = L.sign_note(L.checkpoint_body(name, 8, CT_ROOTS[8]), "witness", key.sign, pub)
    both = note + wit.split("\n\n")[1]
    assert L.open_checkpoint(both, "n1", pub).size == 8


# ------------------------------------------------------------------------------ audit
def _stream(key: Ed25519PrivateKey, pub: bytes, n: int, node: str = "n1"
            ) -> list[tuple[int, bytes]]:
    tree = L.MerkleTree()
    out: list[bytes] = []
    for seq in range(n):
        receipt = _receipt(key, pub, seq, node, x="r" * seq)
        index = tree.append(L.leaf_data(receipt))
        out.append(L.leaf_record(index, receipt))
        body = L.checkpoint_body(L.origin(node), len(tree), tree.root())
        out.append(L.checkpoint_record(L.sign_note(body, L.origin(node), key.sign, pub)))
    return list(enumerate(out))


def test_audit_clean_and_tampered() -> None:
    key, pub = _key()
    values = _stream(key, pub, 6)
    a = L.audit(values, "n1", pub)
    assert a.ok and len(a.tree) == 6 and a.latest is not None and a.latest.size == 6
    assert a.pending == 0 and a.find(_receipt(key, pub, 3, x="rrr")) == 3
    # a leaf dropped: a gap
    kinds = {k for k, _ in L.audit(values[:4] + values[6:], "n1", pub).problems}
    assert "gap" in kinds
    # a leaf changed after its checkpoint: a fork
    forged = list(values)
    forged[2] = (2, L.leaf_record(1, _receipt(key, pub, 1, x="forged")))
    assert "fork" in {k for k, _ in L.audit(forged, "n1", pub).problems}
    # an old checkpoint replayed at the end: truncation
    replay = [*values, (99, values[3][1])]
    assert "truncation" in {k for k, _ in L.audit(replay, "n1", pub).problems}
    # extends: the latest of a shorter copy does not extend what a monitor saw
    full = L.audit(values, "n1", pub)
    short = L.audit(values[:6], "n1", pub)
    assert short.latest is not None and full.latest is not None
    assert L.check_extends(full.latest, short.latest, []) is not None
    assert L.check_extends(short.latest, full.latest,
                           full.tree.consistency_proof(short.latest.size)) is None


# ------------------------------------------------------------------------------ key types, rotation
def test_secp256k1_checkpoints_use_the_0xff_type_byte() -> None:
    from broker_schema.signatures import SECP256K1, SigningKey, verify

    key = SigningKey.generate(SECP256K1)
    name = L.origin("n1")
    body = L.checkpoint_body(name, 8, CT_ROOTS[8])
    note = L.sign_note(body, name, key.sign, key.public_key)
    raw = base64.b64decode(note.split("\n\n")[1].split(" ")[2])
    assert raw[:4] == hashlib.sha256(name.encode() + b"\n\xff" + key.public_key).digest()[:4]
    assert len(raw) == 68 and verify(key.public_key, raw[4:], body.encode())
    assert L.open_checkpoint(note, "n1", key.public_key).size == 8
    assert base64.b64decode(L.verifier_key(name, key.public_key).split("+", 2)[2]) == \
        b"\xff" + key.public_key
    with pytest.raises(L.LedgerError):
        L.open_checkpoint(note.replace("\n8\n", "\n9\n"), "n1", key.public_key)


def test_a_rotated_node_audits_clean_with_all_its_keys() -> None:
    # checkpoints by the old key, then by the new one (whose receipt chain restarts at seq 0)
    old, old_pub = _key()
    new = Ed25519PrivateKey.generate()
    new_pub = new.public_key().public_bytes(serialization.Encoding.Raw,
                                            serialization.PublicFormat.Raw)
    tree = L.MerkleTree()
    values: list[bytes] = []
    for key, pub, seqs in ((old, old_pub, range(3)), (new, new_pub, range(2))):
        for seq in seqs:
            receipt = _receipt(key, pub, seq)
            values.append(L.leaf_record(tree.append(L.leaf_data(receipt)), receipt))
            body = L.checkpoint_body(L.origin("n1"), len(tree), tree.root())
            values.append(L.checkpoint_record(L.sign_note(body, L.origin("n1"), key.sign, pub)))
    stream = list(enumerate(values))
    assert L.audit(stream, "n1", [old_pub, new_pub]).ok
    # with the new key alone the old checkpoints are unsigned as far as the verifier knows
    only_new = L.audit(stream, "n1", new_pub)
    # and the old key's leaves are foreign
    assert {k for k, _ in only_new.problems} == {"signature", "foreign"}
    assert only_new.foreign == [0, 1, 2]
    # seq 0 twice under one key is still a fork
    dup = _receipt(new, new_pub, 0, x=1)
    forked = [*stream, (99, L.leaf_record(len(tree), dup))]
    assert "fork" in {k for k, _ in L.audit(forked, "n1", [old_pub, new_pub]).problems}


# ------------------------------------------------------------------------------ issue 31
def _stranger() -> tuple[Ed25519PrivateKey, bytes]:
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
    return key, key.public_key().public_bytes(serialization.Encoding.Raw,
                                              serialization.PublicFormat.Raw)


def test_a_foreign_leaf_is_found_even_under_a_genuine_checkpoint() -> None:
    # weakness 1: anyone who may write sys.ledger.<node> appends a leaf signed by another key;
    # the genuine node then (before the fix) checkpointed over it with its own key
    key, pub = _key()
    thief, thief_pub = _stranger()
    values = [v for _, v in _stream(key, pub, 2)]
    tree = L.MerkleTree([L.leaf_hash(L.leaf_data(_receipt(key, pub, s, x="r" * s)))
                         for s in range(2)])
    foreign = _receipt(thief, thief_pub, 7, x="forged")
    values.append(L.leaf_record(tree.append(L.leaf_data(foreign)), foreign))
    body = L.checkpoint_body(L.origin("n1"), len(tree), tree.root())
    values.append(L.checkpoint_record(L.sign_note(body, L.origin("n1"), key.sign, pub)))
    a = L.audit(list(enumerate(values)), "n1", pub)
    assert a.foreign == [2]
    messages = [m for k, m in a.problems if k == "foreign"]
    assert len(messages) == 2 and "not a key of node 'n1'" in messages[0]
    assert "covers foreign leaves [2]" in messages[1]
    # its receipt chain is not counted as the node's (no seq gap 2..6 reported)
    assert not [m for k, m in a.problems if k == "gap"]
    assert a.checkpointed_before(2, 10**18) is None
    # other foreign shapes: another node's name, a bad signature, no signature
    for bad in (_receipt(key, pub, 2, "n2"), {**_receipt(key, pub, 2), "x": "changed"},
                {"seq": 2, "node_id": "n1", "public_key": pub.hex()}):
        assert L.leaf_problem(bad, "n1", pub) is not None
    assert L.leaf_problem(_receipt(key, pub, 2), "n1", pub) is None


def test_checkpoints_are_judged_by_their_append_time() -> None:
    # weakness 2: the key that signed a checkpoint is judged by its history at the broker's
    # append time of the checkpoint record (which the signer does not choose)
    key, pub = _key()
    stream = [(off, v, 1_000 * (off + 1)) for off, v in _stream(key, pub, 3)]
    # the record at offset k is appended at 1000 (k + 1) us; the key is revoked from 3500 us:
    # the checkpoint at offset 1 (2000 us) stands, those at offsets 3 and 5 are refused
    def revoked_from_3500(k: bytes, at: int | None) -> str | None:
        assert k == pub
        return None if at is not None and at < 3_500 else "revoked from 3500 us"

    a = L.audit(stream, "n1", pub, key_problem=revoked_from_3500)
    assert [cp.size for cp in a.checkpoints] == [1]
    assert a.checkpoint_times == [2_000]
    sig = [m for k, m in a.problems if k == "signature"]
    assert len(sig) == 2 and "appended at 4000 us: revoked from 3500 us" in sig[0]
    # a leaf appended after the revocation is foreign (leaf 2, 5000 us; leaf 1, 3000 us, is not)
    assert a.foreign == [2]
    # a receipt checkpointed before the revocation stays provably logged before it
    assert a.checkpointed_before(0, 3_500) == (a.checkpoints[0], 2_000)
    assert a.checkpointed_before(1, 3_500) is None  # its checkpoint came after
    # with no append time a key with a problem is not trusted at all
    undated = L.audit(_stream(key, pub, 1), "n1", pub, key_problem=revoked_from_3500)
    assert undated.checkpoints == [] and undated.foreign == [0]


def test_ledger_records_are_strict() -> None:
    # issue 31's guess: extra fields and non-canonical bytes are malformed (a verifier must not
    # read a record the writer would never write)
    key, pub = _key()
    leaf = L.leaf_record(0, _receipt(key, pub, 0))
    assert L.parse_record(leaf)["type"] == "leaf"
    rec = json.loads(leaf)
    for bad in (json.dumps(rec).encode(),  # whitespace
                L._canonical({**rec, "extra": 1}),
                json.dumps(rec, sort_keys=True, separators=(",", ":"),
                           ensure_ascii=True).replace("leaf", "le\\u0061f").encode()):
        with pytest.raises(L.LedgerError):
            L.parse_record(bad)
    kinds = {k for k, _ in L.audit([(0, json.dumps(rec).encode())], "n1", pub).problems}
    assert kinds == {"malformed"}
