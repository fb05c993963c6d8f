"""The committed receipt test vectors (``tests/data/receipt_vectors``, docs/receipts.md).

Three kinds of checks:

1. **independent**: every stated digest, signature and encoding re-derived from the spec with
   hashlib, json, base64, struct, decimal and cryptography only (the ``_i_*`` helpers below import
   nothing of the project), as a third party's verifier would; a small independent verifier gives
   the same verdicts as the project's on the negative vectors;
2. **the project's verifier**: the positive vectors verify (receipt files, response records, the
   workload log), every negative one fails with its stated reasons;
3. **re-execution** (``slow``): the real engine re-runs each positive vector and reproduces the
   committed bytes exactly: every step's logits row, the prefill trace, the receipt (signature
   included: Ed25519 is deterministic) and the response record.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.util
import json
import re
import struct
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

VEC = Path(__file__).resolve().parents[2] / "data" / "receipt_vectors"
N_RECEIPTS = 3


def _load(name: str) -> Any:
    return json.loads((VEC / name).read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _no_fleet_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fx verify FILE`` reads sys.keys when a fleet key is in the environment: not here."""
    monkeypatch.delenv("FX_FLEET_PUBLIC_KEY", raising=False)


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    out: dict[str, Any] = _load("keys.json")
    return out


@pytest.fixture(scope="module")
def vectors() -> list[dict[str, Any]]:
    return [_load(f"receipt-{i}.json") for i in range(N_RECEIPTS)]


@pytest.fixture(scope="module")
def negative() -> dict[str, Any]:
    out: dict[str, Any] = _load("negative.json")
    return out


# ================================================================== 1. independent re-derivation
# Only the standard library and cryptography below (no project import), written from
# docs/receipts.md.
_PREFIX = b"nlfx-receipt-v2\x00"
_GENESIS = "0" * 64
_FIELDS = {"receipt_version", "kind", "model_hash", "engine", "context", "node_id", "seq",
           "prev_receipt_hash", "prompt_tokens", "input_hash", "prompt_text_hash", "params",
           "output_tokens", "output_hash", "output_text_hash", "logits_digest", "public_key",
           "signature"}
_PARAMS = {"max_tokens", "temperature_q16", "top_k", "top_p_q16", "seed", "stop_token"}
_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
_M64 = (1 << 64) - 1


def _i_canon(x: Any) -> bytes:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _i_sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _i_prefixed(value: str) -> str:
    """The hex digest of a ``sha256:<hex>`` reference."""
    algo, _, digest = value.partition(":")
    assert algo == "sha256" and re.fullmatch(r"[0-9a-f]{64}", digest), value
    return digest


def _i_ed25519_ok(public_key: bytes, signature: bytes, message: bytes) -> bool:
    if len(public_key) != 32 or len(signature) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def _i_signing_bytes(receipt: dict[str, Any]) -> bytes:
    return _PREFIX + _i_canon({k: v for k, v in receipt.items() if k != "signature"})


def _i_q16(value: Any) -> int:
    """A JSON number to Q.16: the decimal of its shortest round-trip text, times 2**16, rounded
    half up (the value is >= 0 wherever it is valid)."""
    return int((Decimal(str(value)) * 65536).to_integral_value(rounding=ROUND_HALF_UP))


def _i_rshift_round(x: int, s: int) -> int:
    return x if s == 0 else (x + (1 << (s - 1))) >> s


def _i_div_round(a: int, b: int) -> int:
    return (a + b // 2) // b


def _i_exp2_neg_q30(t: int) -> int:
    poly = (1073741824, 744261124, 257941118, 59598166, 10323001, 1441201, 154140, 23074)
    t = max(t, -(1 << 26))
    i = t >> 16
    f = t - (i << 16)
    acc = poly[7]
    for c in reversed(poly[:7]):
        acc = _i_rshift_round(acc * f, 16) + c
    return _i_rshift_round(acc, min(-i, 40))


def _i_sigmoid_q30(x: int) -> int:
    a = min(abs(x), 1 << 26)
    e = _i_exp2_neg_q30(-_i_rshift_round(a * 1549082005, 30))
    den = (1 << 30) + e
    return _i_div_round(1 << 60, den) if x >= 0 else _i_div_round(e << 30, den)


def _i_splitmix64(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _i_random_u64(seed: int, step: int) -> int:
    return _i_splitmix64((_i_splitmix64(seed) + step * 0x9E3779B97F4A7C15) & _M64)


def _i_byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> character map, inverted."""
    bs = [*range(33, 127), *range(161, 173), *range(174, 256)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _i_artifact(path: Path) -> tuple[bytes, dict[str, Any], int]:
    data = path.read_bytes()
    magic, version, reserved, hlen = struct.unpack_from("<8sIIQ", data, 0)
    assert (magic, version, reserved) == (b"NLFXINT\x00", 1, 0)
    header = json.loads(data[24:24 + hlen])
    return data, header, 24 + hlen + (-(24 + hlen)) % 64


def _i_decode(tokenizer: dict[str, Any], ids: list[int]) -> str:
    dec = _i_byte_decoder()
    out = b""
    for i in ids:
        tok = tokenizer["tokens"][i]
        out += tok.encode() if tokenizer["token_types"][i] in (3, 4) else bytes(dec[c] for c in tok)
    return out.decode("utf-8", errors="replace")


def _i_check_receipt(r: Any, prev: Any, trusted: list[str]) -> set[str]:
    """An independent static verifier: the categories of what is wrong with ``r``."""
    if not isinstance(r, dict) or r.get("receipt_version") != 2:
        return {"version"}
    if _FIELDS - set(r):
        return {"missing"}

    def hexn(v: Any, n: int) -> bool:
        return isinstance(v, str) and re.fullmatch(f"[0-9a-f]{{{n}}}", v) is not None

    prm = r["params"]
    if not (hexn(r["signature"], 128) and (hexn(r["public_key"], 64) or hexn(r["public_key"], 66))
            and isinstance(prm, dict) and set(prm) == _PARAMS):
        return {"malformed"}
    bad = set()
    if set(r) - _FIELDS:
        bad.add("unknown-field")
    ctx = r["context"]
    if ctx is not None:
        m = re.fullmatch(r"(?:shadow:[^/]+/)?([A-Za-z0-9_-]+)/(\d+)/(\d+)@(\d+)", ctx["effect_id"])
        if m is None or (m.group(1), int(m.group(4))) != (ctx["workload_id"], ctx["epoch"]):
            bad.add("binding")
    if not _i_ed25519_ok(bytes.fromhex(r["public_key"]), bytes.fromhex(r["signature"]),
                         _i_signing_bytes(r)):
        bad.add("signature")
    if trusted and r["public_key"] not in trusted:
        bad.add("trust")
    if _i_sha(_i_canon({"prompt_tokens": r["prompt_tokens"]})) != r["input_hash"]:
        bad.add("hash")
    if _i_sha(_i_canon({"output_tokens": r["output_tokens"]})) != r["output_hash"]:
        bad.add("hash")
    if prev is not None:
        if (r["prev_receipt_hash"] != _i_sha(_i_canon(prev)) or r["seq"] != prev["seq"] + 1
                or r["public_key"] != prev["public_key"]):
            bad.add("chain")
    elif r["seq"] == 0 and r["prev_receipt_hash"] != _GENESIS:
        bad.add("chain")
    return bad


def _i_check_record(rec: dict[str, Any], r: dict[str, Any]) -> set[str]:
    """An independent check of a response record against the receipt it carries."""
    bad = set()
    raw = bytes.fromhex(r["public_key"])
    sig = rec["signature"] or {}
    msg = _i_canon({**rec, "signature": None})
    if (sig.get("key_id") != "sha256:" + _i_sha(raw)
            or not _i_ed25519_ok(raw, base64.b64decode(sig.get("value", "")), msg)):
        bad.add("record-signature")
    ctx = r["context"]
    out = rec["output"]["data"]
    stop = r["params"]["stop_token"]
    finish = "stop" if r["output_tokens"] and r["output_tokens"][-1] == stop else "length"
    if (rec["outcome"] != "ok" or ctx is None or rec["effect_id"] != ctx["effect_id"]
            or rec["header"]["workload_id"] != ctx["workload_id"]
            or rec["header"]["epoch"] != ctx["epoch"]
            or rec["receipt"]["manifest_hash"] != ctx["manifest_hash"]
            or _i_prefixed(rec["model_hash"]) != r["model_hash"]
            or rec["written_by"] != r["node_id"]
            or out["output_tokens"] != r["output_tokens"] or out["finish_reason"] != finish
            or out["prompt_token_count"] != len(r["prompt_tokens"])
            or _i_sha(out["text"].encode()) != r["output_text_hash"]):
        bad.add("binding")
    return bad


#: the project's reasons, by the category the independent verifier gives them
_CATEGORY = [("signature does not verify", "signature"), ("input_hash", "hash"),
             ("output_hash", "hash"), ("chain broken", "chain"), ("public key ", "trust"),
             ("unknown receipt_version", "version"), ("malformed receipt", "malformed"),
             ("receipt has unknown fields", "unknown-field"), ("context:", "binding"),
             ("the response record is not signed", "record-signature"),
             ("output_tokens differ", None), ("logits_digest differs", None),
             ("output_text_hash is not", None), ("cannot load the committed artifact", None)]


def _category(reason: str) -> str | None:
    for prefix, cat in _CATEGORY:
        if reason.startswith(prefix):
            return cat
    return "binding"  # effect id:, workload:, epoch:, manifest:, model:, node:, output...


def test_the_vectors_are_small_and_all_there() -> None:
    names = {p.name for p in VEC.iterdir()}
    assert {"README.md", "make.py", "keys.json", "artifact.json", "manifest.json", "chain.jsonl",
            "responses.jsonl", "facts.json", "negative.json", "primitives.json",
            "trust.json", "make_trust.py",
            *(f"receipt-{i}.json" for i in range(N_RECEIPTS))} <= names
    data = sum(p.stat().st_size for p in VEC.iterdir() if p.suffix in (".json", ".jsonl"))
    assert data < 240_000, data  # trust.json (issue 31) added ~40 KB


def test_the_secp256k1_vector_verifies_independently_and_in_the_project() -> None:
    """ECDSA-SHA256 over the signed bytes, r || s with low s, RFC 6979 (so re-signing with the
    stated scalar gives the same bytes); the high-s copy is refused."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import (
        decode_dss_signature,
        encode_dss_signature,
    )

    from fx_integer import verifier

    vec = _load("secp256k1.json")
    key = ec.derive_private_key(int(vec["key"]["scalar_hex"], 16), ec.SECP256K1())
    pub = bytes.fromhex(vec["key"]["public_key_hex"])
    assert len(pub) == 33 and pub[0] in (2, 3)
    assert key.public_key().public_bytes(serialization.Encoding.X962,
                                         serialization.PublicFormat.CompressedPoint) == pub
    r0 = vec["receipt"]
    assert r0["public_key"] == pub.hex()
    body = {k: v for k, v in r0.items() if k != "signature"}
    msg = _PREFIX + json.dumps(body, sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False).encode()
    assert msg.hex() == vec["signed_bytes_hex"]
    sig = bytes.fromhex(r0["signature"])
    r_int, s_int = int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big")
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    assert s_int <= n // 2 and f"{r_int:064x}" == vec["r_hex"]
    point = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256K1(), pub)
    point.verify(encode_dss_signature(r_int, s_int), msg, ec.ECDSA(hashes.SHA256()))
    again_r, again_s = decode_dss_signature(key.sign(
        msg, ec.ECDSA(hashes.SHA256(), deterministic_signing=True)))
    assert again_r == r_int and min(again_s, n - again_s) == s_int  # RFC 6979: reproducible
    reasons, passed = verifier.check_static(r0)
    assert not reasons and "signature" in passed
    bad, _ = verifier.check_static(vec["negative"]["receipt"])
    assert any(vec["negative"]["expect"] in r for r in bad)


def test_keys_are_the_fixed_test_seeds(keys: dict[str, Any]) -> None:
    from cryptography.hazmat.primitives import serialization

    for k in keys.values():
        assert "TEST_ONLY" in k and k["type"] == "ed25519"
        raw = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(k["seed_hex"])).public_key() \
            .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        assert k["public_key_hex"] == raw.hex()
        assert base64.b64decode(k["public_key_b64"]) == raw and len(k["public_key_b64"]) == 44
        spki = base64.b64decode(k["public_key_spki_b64"])
        assert spki == bytes.fromhex("302a300506032b6570032100") + raw and len(spki) == 44
        assert _i_prefixed(k["key_id"]) == _i_sha(raw)
    assert keys["node"]["seed_hex"] == bytes(range(32)).hex()


def test_independent_digests_and_signatures(vectors: list[dict[str, Any]],
                                            keys: dict[str, Any]) -> None:
    node_pk = keys["node"]["public_key_hex"]
    manifest = _load("manifest.json")
    assert manifest["canonical"].encode() == _i_canon(manifest["manifest"])
    assert _i_prefixed(manifest["manifest_hash"]) == _i_sha(manifest["canonical"].encode())
    model_hash = _load("artifact.json")["model_hash"]
    chain_lines = (VEC / "chain.jsonl").read_bytes().splitlines()
    resp_lines = (VEC / "responses.jsonl").read_bytes().splitlines()
    assert len(chain_lines) == len(resp_lines) == N_RECEIPTS
    prev: dict[str, Any] | None = None
    for i, v in enumerate(vectors):
        r, d, req = v["receipt"], v["derivation"], v["request"]
        # the request record: its canonical bytes and record hash (request_hash)
        assert json.loads(req["canonical"]) == req["record"]
        assert req["canonical"].encode() == _i_canon(req["record"])
        assert _i_prefixed(req["record_hash"]) == _i_sha(req["canonical"].encode())
        ctx = r["context"]
        assert ctx == d["context"] and ctx["request_hash"] == req["record_hash"]
        assert ctx["manifest_hash"] == manifest["manifest_hash"]
        hdr = req["record"]["header"]
        assert ctx["effect_id"] == (f"{hdr['workload_id']}/{hdr['input_offset']}/{hdr['index']}"
                                    f"@{hdr['epoch']}")
        assert (ctx["workload_id"], ctx["epoch"]) == (hdr["workload_id"], hdr["epoch"])
        # params: documented defaults, Q.16 rounding, stop_at_eos -> stop_token
        p = {"max_tokens": 64, "temperature": 0, "seed": 0, "top_k": 0, "top_p": 1,
             "stop_at_eos": True, **req["record"]["params"]}
        assert r["params"] == d["params"] == {
            "max_tokens": p["max_tokens"], "temperature_q16": _i_q16(p["temperature"]),
            "top_k": p["top_k"], "top_p_q16": _i_q16(p["top_p"]), "seed": p["seed"],
            "stop_token": 2 if p["stop_at_eos"] else None}
        # prompt text hash: the prompt parameter's UTF-8, before chat wrapping; null for tokens
        prompt = req["record"]["params"].get("prompt")
        want = None if prompt is None else _i_sha(prompt.encode("utf-8"))
        assert r["prompt_text_hash"] == d["prompt_text_hash"] == want
        # input and output hashes, text hash, finish reason
        assert d["input_hash_preimage"].encode() == _i_canon({"prompt_tokens": r["prompt_tokens"]})
        assert r["input_hash"] == d["input_hash"] == _i_sha(d["input_hash_preimage"].encode())
        assert d["output_hash_preimage"].encode() == _i_canon(
            {"output_tokens": r["output_tokens"]})
        assert r["output_hash"] == d["output_hash"] == _i_sha(d["output_hash_preimage"].encode())
        assert r["output_text_hash"] == d["output_text_hash"] == _i_sha(d["output_text"].encode())
        stop = r["params"]["stop_token"]
        assert d["finish_reason"] == ("stop" if r["output_tokens"][-1] == stop else "length")
        assert [s["token"] for s in d["steps"]] == r["output_tokens"] == d["output_tokens"]
        assert r["logits_digest"] == d["logits_digest"] and r["model_hash"] == model_hash
        # what is signed, the signature, the receipt hash, the chain
        assert set(r) == _FIELDS and r["public_key"] == node_pk
        msg = bytes.fromhex(d["signing_bytes_hex"])
        assert msg == _i_signing_bytes(r) and msg[:16] == b"nlfx-receipt-v2\x00"
        assert b'"signature"' not in msg
        assert _i_ed25519_ok(bytes.fromhex(node_pk), bytes.fromhex(r["signature"]), msg)
        assert d["receipt_canonical"].encode() == _i_canon(r) == chain_lines[i]
        assert d["receipt_hash"] == _i_sha(_i_canon(r))
        assert r["seq"] == i
        assert r["prev_receipt_hash"] == (_GENESIS if prev is None else _i_sha(_i_canon(prev)))
        prev = r
        # the response record: RFC 8785 bytes, signed (base64) with "signature": null
        rec_bytes = v["response"]["canonical"].encode()
        assert rec_bytes == resp_lines[i]
        rec = json.loads(rec_bytes)
        assert _i_canon(rec) == rec_bytes and rec["receipt"]["integer"] == r
        assert v["response"]["signing_bytes"].encode() == _i_canon({**rec, "signature": None})
        assert '"signature":null' in v["response"]["signing_bytes"]
        assert _i_prefixed(v["response"]["record_hash"]) == _i_sha(rec_bytes)
        assert rec["signature"]["alg"] == "ed25519"
        assert _i_check_record(rec, r) == set()
        assert rec["request_offset"] == req["offset_on_out"]
        assert rec["output"]["data"]["text"] == d["output_text"]
    facts = _load("facts.json")
    assert facts["canonical"].encode() == _i_canon(facts["record"])
    assert base64.b64decode(facts["record"]["public_key"]).hex() == node_pk
    assert facts["record"]["key_id"] == keys["node"]["key_id"]


def test_independent_primitives() -> None:
    prim = _load("primitives.json")
    for q in prim["to_q16"]:
        v = json.loads(q["json_text"])
        assert str(v) == q["shortest_repr"] and _i_q16(v) == q["q16"], q
    for s in prim["splitmix64"]:
        assert _i_splitmix64(s["x"]) == s["splitmix64"]
    for s in prim["random_u64"]:
        assert _i_random_u64(s["seed"], s["step"]) == s["u64"]
    assert all(_i_rshift_round(c["x"], c["s"]) == c["y"] for c in prim["rshift_round"])
    assert all(_i_div_round(c["a"], c["b"]) == c["y"] for c in prim["div_round"])
    import math

    assert all(math.isqrt(c["x"]) == c["y"] for c in prim["isqrt"])
    assert all(_i_exp2_neg_q30(c["x"]) == c["y"] for c in prim["exp2_neg_q30"])
    assert all(_i_sigmoid_q30(c["x"]) == c["y"] for c in prim["sigmoid_q30"])
    assert all(_i_rshift_round(c["x"] * _i_sigmoid_q30(c["x"]), 30) == c["y"]
               for c in prim["silu_q16"])


def test_independent_sampling_draws(vectors: list[dict[str, Any]]) -> None:
    """The sampled vector's per-step draw: u = random_u64(seed, step), r = (u * total) >> 64."""
    v = vectors[1]
    seed = v["receipt"]["params"]["seed"]
    for s in v["derivation"]["steps"]:
        smp = s["sampling"]
        assert smp["u64"] == _i_random_u64(seed, s["step"])
        assert smp["r"] == (smp["u64"] * smp["total_weight_kept"]) >> 64
        assert smp["candidates"] == v["receipt"]["params"]["top_k"]
        assert smp["first_weights"][0][2] == 1 << 30  # the top candidate weighs exactly 2**30


def test_independent_artifact_and_text(real_path: Path, vectors: list[dict[str, Any]]) -> None:
    data, header, start = _i_artifact(real_path)
    info = _load("artifact.json")
    assert _i_sha(data) == info["model_hash"] and len(data) == info["size"]
    assert data[:24].hex() == info["prefix_hex"] and start == info["data_start"]
    assert _i_sha(data[24:24 + info["header_length"]]) == info["header_sha256"]
    assert header["config"] == info["config"] and sorted(header) == info["header_keys"]
    assert data[24 + info["header_length"]:start] == b"\x00" * (start - 24 - info["header_length"])
    table = {t["name"]: t for t in header["tensors"]}
    ends = [start + t["offset"] + t["nbytes"] for t in header["tensors"]]
    assert max(ends) == info["last_tensor_end"] == len(data)
    assert all(t["offset"] % 64 == 0 for t in header["tensors"])
    for t in info["tensors"]:
        assert table[t["name"]]["offset"] == t["offset"]
        raw = data[t["absolute_offset"]:t["absolute_offset"] + t["nbytes"]]
        assert t["absolute_offset"] == start + t["offset"] and _i_sha(raw) == t["sha256"]
        fmt = {"i8": "b", "u8": "B", "i32": "i"}[t["dtype"]]
        n = len(t["first_values"])
        assert list(struct.unpack_from(f"<{n}{fmt}", raw)) == t["first_values"]
    tok = header["tokenizer"]
    assert tok["eos_id"] == 2 and [i for i, ty in enumerate(tok["token_types"]) if ty in (3, 4)] \
        == list(range(17))
    for v in vectors:
        r, d = v["receipt"], v["derivation"]
        stop = r["params"]["stop_token"]
        toks = r["output_tokens"]
        text = _i_decode(tok, toks[:-1] if toks[-1] == stop else toks)
        assert _i_sha(text.encode()) == r["output_text_hash"]
        if d["chat_text"] is not None:
            user = v["request"]["record"]["params"]["prompt"]
            chatml = (f"<|im_start|>system\n{_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}"
                      "<|im_end|>\n<|im_start|>assistant\n")
            assert _i_decode(tok, r["prompt_tokens"]) == chatml == d["chat_text"]
            # exactly five control ids, at the template's places, whatever the user typed
            ids = [(i, t) for i, t in enumerate(r["prompt_tokens"]) if t < 17]
            assert [t for _, t in ids] == [1, 2, 1, 2, 1]
    prim = _load("primitives.json")
    for c in prim["tokenize"]:
        assert _i_decode(tok, c["ids"]) == c["text"] == "".join(c["pieces"])
    for c in prim["chat_tokens"]:
        assert [t for t in c["ids"] if t < 17] == [1, 2, 1, 2, 1]


def test_independent_verdicts_on_negative_vectors(negative: dict[str, Any]) -> None:
    """A verifier written from the spec alone fails each negative vector for the same reasons
    (by category) as the project's, and finds nothing wrong where only re-execution can."""
    for case in negative["cases"]:
        trusted = case["args"]["trusted_keys"]
        prev = None
        for i, item in enumerate(case["items"]):
            if item.get("kind") == "response":
                r = item["receipt"]["integer"]
                got = _i_check_receipt(r, prev, trusted) | _i_check_record(item, r)
            else:
                r = item
                got = _i_check_receipt(r, prev, trusted)
            reasons = case["expect"]["reasons"].get(str(i), [])
            want = {c for c in map(_category, reasons) if c is not None}
            assert got == want, (case["name"], i, got, reasons)
            prev = r


# ================================================================== 2. the project's verifier
def _cli(capsys: pytest.CaptureFixture[str], path: Path, args: list[str]
         ) -> tuple[int, dict[int, list[str]], dict[int, str]]:
    """``fx verify FILE ARGS``: exit code, FAIL reasons and status line per item."""
    from executor.integer_cli import main

    code = main(["verify", str(path), *args])
    out = capsys.readouterr().out
    fails: dict[int, list[str]] = {}
    status: dict[int, str] = {}
    item = -1
    for line in out.splitlines():
        m = re.match(r"receipt (\d+) seq=\S* node=\S*: (.*)$", line)
        if m:
            item = int(m.group(1))
            status[item] = m.group(2)
        elif line.startswith("  FAIL  "):
            fails.setdefault(item, []).append(line[len("  FAIL  "):])
    return code, fails, status


def test_project_verifier_accepts_the_positive_vectors(
        vectors: list[dict[str, Any]], keys: dict[str, Any],
        capsys: pytest.CaptureFixture[str]) -> None:
    from fx_integer import receipt, verifier

    pk = keys["node"]["public_key_hex"]
    chain = receipt.load_receipts(VEC / "chain.jsonl")
    assert chain == [v["receipt"] for v in vectors]
    results = verifier.verify_chain(chain, reexecute=False, trusted_keys=[pk])
    assert [r.ok for r in results] == [True] * N_RECEIPTS, [r.reasons for r in results]
    for v in vectors:
        r = v["receipt"]
        assert receipt.signing_bytes(r).hex() == v["derivation"]["signing_bytes_hex"]
        assert receipt.receipt_hash(r) == v["derivation"]["receipt_hash"]
        assert receipt.input_hash(r["prompt_tokens"]) == r["input_hash"]
        assert receipt.output_hash(r["output_tokens"]) == r["output_hash"]
        reasons, passed, notes = verifier.check_record(json.loads(v["response"]["canonical"]), r)
        assert not reasons and not notes, reasons
        assert "response signature (by the receipt's key)" in passed
    art = ["--no-reexecute"]
    for name in ("chain.jsonl", "responses.jsonl"):
        code, fails, status = _cli(capsys, VEC / name, [*art, "--trusted-key", pk])
        assert (code, fails) == (0, {}) and set(status.values()) == {"OK"}
        code, fails, _ = _cli(capsys, VEC / name, art)
        assert (code, fails) == (3, {})  # checked, NOT AUTHENTICATED


def test_project_code_derives_the_stated_values(vectors: list[dict[str, Any]],
                                                real_path: Path) -> None:
    import numpy as np

    from broker_schema import decode, encode, record_hash
    from broker_schema.records import EffectRequest, FactsRecord, ResponseRecord
    from executor.engines.integer import default_params, request_params
    from executor.models import ModelManifest
    from fx_integer import fixed_point as fx
    from fx_integer import sampling
    from fx_integer.engine import IntegerEngine
    from fx_integer.tokenizer import pre_tokenize

    eng = IntegerEngine.cached(real_path, expected_model_hash=vectors[0]["receipt"]["model_hash"])
    for v in vectors:
        req = decode(v["request"]["canonical"].encode())
        assert isinstance(req, EffectRequest) and record_hash(req) == v["request"]["record_hash"]
        rec = decode(v["response"]["canonical"].encode())
        assert isinstance(rec, ResponseRecord)
        assert encode(rec) == v["response"]["canonical"].encode()
        assert rec.signing_bytes() == v["response"]["signing_bytes"].encode()
        eff = request_params(default_params(), dict(req.params), b"")
        assert eff == v["derivation"]["effective_params"]
        gen, canon = eng.prepare(eff)
        assert list(gen.prompt_tokens) == v["receipt"]["prompt_tokens"]
        assert canon == v["receipt"]["params"]
    manifest = _load("manifest.json")
    assert ModelManifest.model_validate(manifest["manifest"]).manifest_hash() == \
        manifest["manifest_hash"]
    facts = decode(_load("facts.json")["canonical"].encode())
    assert isinstance(facts, FactsRecord)
    prim = _load("primitives.json")
    for c in prim["tokenize"]:
        assert pre_tokenize(c["text"]) == c["pieces"]
        assert eng.tokenizer.encode(c["text"]) == c["ids"]
    for c in prim["chat_tokens"]:
        assert eng.tokenizer.chat_tokens(c["user"]) == c["ids"]
    for q in prim["to_q16"]:
        assert sampling.to_q16(json.loads(q["json_text"]), "x") == q["q16"]
    for s in prim["random_u64"]:
        assert sampling.random_u64(s["seed"], s["step"]) == s["u64"]
    for name, f in (("isqrt", fx.isqrt), ("exp2_neg_q30", fx.exp2_neg_q30),
                    ("sigmoid_q30", fx.sigmoid_q30), ("silu_q16", fx.silu_q16)):
        xs = [c["x"] for c in prim[name]]
        assert f(np.asarray(xs, dtype=np.int64)).tolist() == [c["y"] for c in prim[name]]


def _negative_params() -> list[Any]:
    cases = _load("negative.json")["cases"]
    return [pytest.param(c, id=c["name"], marks=[pytest.mark.slow] if c["args"]["reexecute"]
                         else []) for c in cases]


@pytest.mark.parametrize("case", _negative_params())
def test_project_verifier_refuses_each_negative_vector(
        case: dict[str, Any], tmp_path: Path, request: pytest.FixtureRequest,
        capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "items.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in case["items"]), encoding="utf-8")
    args = [a for k in case["args"]["trusted_keys"] for a in ("--trusted-key", k)]
    if case["args"]["reexecute"]:  # only these need the real artifact
        args += ["--artifact", str(request.getfixturevalue("real_path"))]
    else:
        args.append("--no-reexecute")
    code, fails, _ = _cli(capsys, f, args)
    exp = case["expect"]
    assert code == exp["exit_code"] == 1
    assert sorted(fails) == sorted(int(i) for i in exp["reason_prefixes"]), fails
    for i, prefixes in exp["reason_prefixes"].items():
        for p in prefixes:
            assert any(x.startswith(p) for x in fails[int(i)]), (p, fails[int(i)])
        assert fails[int(i)] == exp["reasons"][i]


def _workload_log(vectors: list[dict[str, Any]], *, facts_key: str | None = None,
                  request_change: tuple[int, dict[str, Any]] | None = None,
                  keys: dict[str, Any] | None = None, spki: bool = False) -> Any:
    from broker_schema import decode
    from broker_schema.records import EffectRequest, FactsRecord, ResponseRecord
    from executor.verify_workload import ReceiptLog

    facts = decode(_load("facts.json")["canonical"].encode())
    assert isinstance(facts, FactsRecord)
    if facts_key is not None and keys is not None:
        facts = facts.model_copy(update={"public_key": keys[facts_key]["public_key_b64"],
                                         "key_id": keys[facts_key]["key_id"]})
    if spki and keys is not None:
        facts = facts.model_copy(update={"public_key": keys["node"]["public_key_spki_b64"]})
    responses = []
    requests = {}
    for i, v in enumerate(vectors):
        rec = decode(v["response"]["canonical"].encode())
        req = decode(v["request"]["canonical"].encode())
        assert isinstance(rec, ResponseRecord) and isinstance(req, EffectRequest)
        if request_change is not None and request_change[0] == i:
            change = dict(request_change[1])
            if "prompt" in change:
                change = {"params": {**req.params, "prompt": change["prompt"]}}
            req = req.model_copy(update=change)
        responses.append((i, rec))
        requests[v["request"]["offset_on_out"]] = req
    workload = vectors[0]["receipt"]["context"]["workload_id"]
    return ReceiptLog(workload, responses, requests, {facts.node_id: facts})


def test_project_workload_verifier(vectors: list[dict[str, Any]], keys: dict[str, Any],
                                   negative: dict[str, Any], real_path: Path) -> None:
    """``verify_records`` (``fx verify --workload``) over the vectors as a log: requests on .out,
    responses on .resp, the node's facts; then each workload-level negative."""
    from executor.verify_workload import artifact_resolver, verify_records

    pk = keys["node"]["public_key_hex"]
    resolve = artifact_resolver(artifact=real_path)
    for spki in (False, True):  # sys.facts may carry the raw key's base64 or (read only) SPKI
        res = verify_records(_workload_log(vectors, keys=keys, spki=spki), resolve=resolve,
                             reexecute=False, trusted_keys=[pk])
        assert res.verified, [c.reasons for c in res.receipts] + res.problems
        for c in res.receipts:
            for check in ("response signature (node key on sys.facts)",
                          "receipt key == node key on sys.facts",
                          "prompt and params == the request on .out",
                          "request hash and prompt text hash == the request on .out",
                          "response text == decoding of the receipt's output_tokens"):
                assert check in c.checks, (c.seq, check, c.checks)
    for case in negative["workload"]:
        ch = case["change"]
        log = _workload_log(vectors, keys=keys, facts_key=ch.get("facts_key"),
                            request_change=(ch["request"], {k: v for k, v in ch.items()
                                                            if k != "request"})
                            if "request" in ch else None)
        res = verify_records(log, resolve=resolve, reexecute=False, trusted_keys=[pk])
        assert not res.ok
        got = res.receipts[case["expect"]["receipt"]].reasons
        for p in case["expect"]["reason_prefixes"]:
            assert any(x.startswith(p) for x in got), (case["name"], p, got)


# ================================================================== 3. re-execution
def _make_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("receipt_vectors_make", VEC / "make.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.parametrize("k", range(N_RECEIPTS))
def test_reexecution_reproduces_every_byte(k: int, vectors: list[dict[str, Any]],
                                           keys: dict[str, Any], real_path: Path) -> None:
    from broker_schema import decode, encode
    from broker_schema.records import EffectRequest
    from executor.engines.integer import default_params, request_params
    from fx_integer import receipt
    from fx_integer.engine import IntegerEngine
    from fx_integer.receipt import ReceiptSigner, receipt_context
    from fx_node.identity import NodeIdentity

    make = _make_module()
    v = vectors[k]
    want = v["receipt"]
    eng = IntegerEngine.cached(real_path, expected_model_hash=want["model_hash"])
    req = decode(v["request"]["canonical"].encode())
    assert isinstance(req, EffectRequest)
    eff = request_params(default_params(), dict(req.params), b"")
    gen, _ = eng.prepare(eff)
    # every step's logits row (and the prefill trace), through the oracle's forward pass
    steps, toks, digest, log = make.steps_of(eng, list(gen.prompt_tokens), gen.max_tokens,
                                             gen.sampling, gen.stop_token, trace=k == 0)
    assert steps == v["derivation"]["steps"]
    assert (toks, digest) == (want["output_tokens"], want["logits_digest"])
    if k == 0:
        assert make.compact_trace(log, eng.config.n_layers) == v["prefill_trace"]
    # the engine's own run: the receipt, signed by the node key at this seq, byte for byte
    ctx = want["context"]
    out = eng.run(eff, receipt_context(**{f: ctx[f] for f in receipt.CONTEXT_FIELDS}))
    seed = bytes.fromhex(keys["node"]["seed_hex"])
    signer = ReceiptSigner(Ed25519PrivateKey.from_private_bytes(seed), node_id=want["node_id"],
                           seq=want["seq"], prev=want["prev_receipt_hash"])
    got = signer.sign(out["receipt"])
    assert receipt.canonical_json(got) == v["derivation"]["receipt_canonical"].encode()
    assert signer.prev == v["derivation"]["receipt_hash"]
    # the response record, signed by the node, byte for byte
    ident = NodeIdentity(signer.key)
    output = {"text": out["text"], "finish_reason": out["finish_reason"],
              "output_tokens": out["output_tokens"],
              "prompt_token_count": len(out["prompt_tokens"])}
    rec = make.response_record(req, v["request"]["offset_on_out"], k, output, got,
                               ctx["manifest_hash"], want["model_hash"], ident)
    assert encode(rec) == v["response"]["canonical"].encode()


@pytest.mark.slow
def test_project_verifier_reexecutes_the_chain(keys: dict[str, Any], real_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """``fx verify responses.jsonl --trusted-key K``: every check, re-execution included."""
    code, fails, status = _cli(capsys, VEC / "responses.jsonl",
                               ["--artifact", str(real_path), "--trusted-key",
                                keys["node"]["public_key_hex"]])
    assert (code, fails) == (0, {}) and set(status.values()) == {"OK"}


def test_negative_vectors_are_what_they_say(negative: dict[str, Any],
                                            vectors: list[dict[str, Any]]) -> None:
    """Each negative vector changes the positive one it names and nothing else it does not
    describe (spot checks of the generator's bookkeeping)."""
    by_name = {c["name"]: c for c in negative["cases"]}
    r2 = vectors[2]["receipt"]
    bumped = copy.deepcopy(r2)
    bumped["output_tokens"][-1] += 1
    assert by_name["changed-output-tokens"]["items"] == [bumped]
    assert by_name["chain-gap"]["items"] == [vectors[0]["receipt"], r2]
    assert by_name["chain-reordered"]["items"] == [vectors[1]["receipt"], vectors[0]["receipt"]]
    wrong = by_name["signed-with-signature-null"]["items"][0]
    msg = _PREFIX + _i_canon({**{k: v for k, v in wrong.items() if k != "signature"},
                             "signature": None})
    assert _i_ed25519_ok(bytes.fromhex(wrong["public_key"]), bytes.fromhex(wrong["signature"]),
                         msg)
    nopre = by_name["signed-without-prefix"]["items"][0]
    assert _i_ed25519_ok(bytes.fromhex(nopre["public_key"]), bytes.fromhex(nopre["signature"]),
                         _i_signing_bytes(nopre)[16:])
    assert len({c["name"] for c in negative["cases"]}) == len(negative["cases"])
