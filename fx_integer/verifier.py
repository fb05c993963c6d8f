"""Checking an integer-engine receipt: its fields, signature, hashes and chain link
(:func:`check_static`), a byte-exact re-execution on the numpy oracle (:func:`verify`,
:func:`verify_chain`), and a response record against the receipt it carries
(:func:`check_record`). The format itself is :mod:`fx_integer.receipt`.

Layering: this module sits above the engine (it re-executes), the engine above the receipt format
(it builds receipts), so ``receipt -> engine -> verifier`` has no circle. The wire contract
(:mod:`broker_schema`: the one signature check, the effect id, the response record) is imported
inside the functions that need it, so running the engine needs numpy alone.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

from . import model_paths
from .artifact import ArtifactError
from .engine import IntegerEngine, ParamError, reexecute_receipt
from .receipt import (
    CONTEXT_FIELDS,
    FIELDS_BY_VERSION,
    GENESIS,
    PARAM_FIELDS,
    PARITY_GATE_FIELDS,
    input_hash,
    output_hash,
    receipt_hash,
    signing_bytes,
    text_hash,
)

__all__ = ["MALFORMED", "VerifyResult", "check_record", "check_static", "verify",
           "verify_chain"]

@dataclasses.dataclass
class VerifyResult:
    ok: bool
    reasons: list[str]  # empty when ok; otherwise one line per failed check
    checks: list[str]  # what was checked and passed
    notes: list[str] = dataclasses.field(default_factory=list)  # what could not be checked

    def __bool__(self) -> bool:
        return self.ok


MALFORMED: Final = "malformed receipt: "


def _is_hex(v: Any, n: int) -> bool:
    return isinstance(v, str) and len(v) == n and all(c in "0123456789abcdef" for c in v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _malformed(receipt: dict[str, Any]) -> list[str]:
    """What is structurally wrong with a receipt that has every field (wrong JSON types, bad hex):
    such a receipt fails with a reason instead of crashing the checks that follow."""
    bad: list[str] = []
    for f in ("model_hash", "prev_receipt_hash", "input_hash", "output_hash", "logits_digest"):
        if not _is_hex(receipt[f], 64):
            bad.append(f"{f} is not 64 lowercase hex digits")
    if not (_is_hex(receipt["public_key"], 64) or _is_hex(receipt["public_key"], 66)):
        bad.append("public_key is not 64 (Ed25519) or 66 (secp256k1) lowercase hex digits")
    if not _is_hex(receipt["signature"], 128):
        bad.append("signature is not 128 lowercase hex digits")
    if not _is_int(receipt["seq"]) or receipt["seq"] < 0:
        bad.append("seq is not a non-negative integer")
    for f in ("kind", "node_id"):
        if not isinstance(receipt[f], str):
            bad.append(f"{f} is not a string")
    if not isinstance(receipt["engine"], dict):
        bad.append("engine is not an object")
    if receipt["prompt_text_hash"] is not None and not _is_hex(receipt["prompt_text_hash"], 64):
        bad.append("prompt_text_hash is neither null nor 64 lowercase hex digits")
    if not _is_hex(receipt["output_text_hash"], 64):
        bad.append("output_text_hash is not 64 lowercase hex digits")
    ctx = receipt["context"]
    if ctx is not None:
        if not isinstance(ctx, dict) or sorted(ctx) != sorted(CONTEXT_FIELDS):
            bad.append(f"context must be null or have exactly the fields "
                       f"{', '.join(CONTEXT_FIELDS)}")
        else:
            for f in ("workload_id", "effect_id"):
                if not isinstance(ctx[f], str):
                    bad.append(f"context.{f} is not a string")
            if not _is_int(ctx["epoch"]) or ctx["epoch"] < 1:
                bad.append("context.epoch is not a positive integer")
            from broker_schema.canonical import is_hash

            for f in ("request_hash", "manifest_hash"):
                v = ctx[f]
                if not (isinstance(v, str) and is_hash(v)):
                    bad.append(f"context.{f} is not sha256:<64 lowercase hex digits>")
    for f in ("prompt_tokens", "output_tokens"):
        v = receipt[f]
        if not isinstance(v, list) or not all(_is_int(t) for t in v):
            bad.append(f"{f} is not a list of integers")
    prm = receipt["params"]
    if not isinstance(prm, dict) or sorted(prm) != sorted(PARAM_FIELDS):
        bad.append(f"params must have exactly the fields {', '.join(PARAM_FIELDS)}")
    elif not all(_is_int(prm[k]) for k in PARAM_FIELDS if k != "stop_token") or not (
            prm["stop_token"] is None or _is_int(prm["stop_token"])):
        bad.append("params values must be integers (stop_token: an integer or null)")
    if "parity_gate" in receipt:  # version 3
        bad.extend(_gate_malformed(receipt["parity_gate"]))
    return [MALFORMED + b for b in bad]


def _gate_malformed(gate: Any) -> list[str]:
    if not isinstance(gate, dict) or sorted(gate) != sorted(PARITY_GATE_FIELDS):
        return [f"parity_gate must have exactly the fields {', '.join(PARITY_GATE_FIELDS)}"]
    bad: list[str] = []
    from fx_integer.parity_gate import GATED_BACKENDS

    if gate["backend"] not in GATED_BACKENDS:
        bad.append(f"parity_gate.backend is not a gated backend ({', '.join(GATED_BACKENDS)})")
    if gate["result"] not in ("passed", "refused"):
        bad.append("parity_gate.result is neither passed nor refused")
    from broker_schema.canonical import is_hash

    if not (isinstance(gate["canary_set_hash"], str) and is_hash(gate["canary_set_hash"])):
        bad.append("parity_gate.canary_set_hash is not sha256:<64 lowercase hex digits>")
    return bad


def _gate_reasons(receipt: dict[str, Any]) -> list[str]:
    """A gated receipt's engine must be what its gate allowed: the gated backend when it
    passed, the oracle (the fallback) when it refused; a refused backend never signs."""
    gate = receipt.get("parity_gate")
    if gate is None:
        return []
    backend = receipt["engine"].get("backend")
    want = gate["backend"] if gate["result"] == "passed" else "oracle"
    if backend != want:
        return [f"parity_gate says {gate['backend']} {gate['result']}, but the receipt was "
                f"produced by backend {backend!r} (expected {want!r})"]
    return []


def check_static(receipt: dict[str, Any], *, prev: dict[str, Any] | None = None,
                 trusted_keys: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
    """Signature, hashes, chain link; no re-execution. Returns (reasons, passed checks)."""
    reasons: list[str] = []
    passed: list[str] = []
    if not isinstance(receipt, dict):
        return [MALFORMED + f"a receipt is a JSON object, not {type(receipt).__name__}"], passed
    version = receipt.get("receipt_version")
    fields = FIELDS_BY_VERSION.get(version) if isinstance(version, int) \
        and not isinstance(version, bool) else None
    if fields is None:
        return [f"unknown receipt_version {version!r}: this verifier reads versions "
                f"{', '.join(map(str, FIELDS_BY_VERSION))} only (version 1 receipts bound no "
                "request context and are not accepted)"], passed
    missing = [f for f in fields if f not in receipt]
    if missing:
        return [f"receipt lacks fields: {', '.join(missing)}"], passed
    malformed = _malformed(receipt)
    if malformed:
        return malformed, passed
    try:  # NaN, mixed-type keys, lone surrogates, nesting deeper than the JSON encoder goes
        signing_bytes(receipt)
        receipt_hash(receipt)
    except (TypeError, ValueError, RecursionError) as exc:
        return [MALFORMED + f"not encodable as canonical JSON ({type(exc).__name__})"], passed
    extra = sorted(set(receipt) - set(fields))
    if extra:
        reasons.append(f"receipt has unknown fields: {', '.join(extra)}")
    gate_reasons = _gate_reasons(receipt)
    reasons.extend(gate_reasons)
    if "parity_gate" in receipt and not gate_reasons:
        passed.append("parity_gate (the backend that signed is the one the gate allowed)")
    ctx = receipt["context"]
    if ctx is not None:
        from broker_schema.records import parse_effect_id

        try:
            header = parse_effect_id(ctx["effect_id"])
        except ValueError as exc:
            reasons.append(f"context.effect_id: {exc}")
        else:
            if (header.workload_id, header.epoch) != (ctx["workload_id"], ctx["epoch"]):
                reasons.append(f"context: effect id {ctx['effect_id']} does not name workload "
                               f"{ctx['workload_id']!r} at epoch {ctx['epoch']}")
            else:
                passed.append("context (effect id names its workload and epoch)")
    # the project's one signature check (imported here: the engine's modules load without it)
    from broker_schema.signatures import verify

    try:
        good = verify(bytes.fromhex(receipt["public_key"]),
                      bytes.fromhex(receipt["signature"]), signing_bytes(receipt))
    except (ValueError, TypeError):
        good = False
    if good:
        passed.append("signature")
    else:
        reasons.append("signature does not verify: the receipt was changed after signing "
                       "or signed by another key")
    if trusted_keys is not None and receipt["public_key"] not in set(trusted_keys):
        reasons.append(f"public key {receipt['public_key']} is not trusted")
    if input_hash(receipt["prompt_tokens"]) != receipt["input_hash"]:
        reasons.append("input_hash does not match prompt_tokens")
    else:
        passed.append("input_hash")
    if output_hash(receipt["output_tokens"]) != receipt["output_hash"]:
        reasons.append("output_hash does not match output_tokens")
    else:
        passed.append("output_hash")
    if prev is not None:
        try:
            link = receipt_hash(prev) if isinstance(prev, dict) else None
        except (TypeError, ValueError, RecursionError):
            link = None
        if link is None:
            reasons.append("chain broken: the previous receipt is not a canonical JSON object")
        elif receipt["prev_receipt_hash"] != link:
            reasons.append(f"chain broken: prev_receipt_hash {receipt['prev_receipt_hash']} "
                           f"!= hash of previous receipt {link}")
        elif not _is_int(prev.get("seq")) or receipt["seq"] != prev["seq"] + 1:
            reasons.append(f"chain broken: seq {receipt['seq']} does not follow {prev.get('seq')}")
        elif receipt["public_key"] != prev.get("public_key"):
            reasons.append("chain broken: the previous receipt was signed by another key")
        else:
            passed.append("chain link")
    elif receipt["seq"] == 0 and receipt["prev_receipt_hash"] != GENESIS:
        reasons.append("chain broken: seq 0 must have the genesis prev_receipt_hash")
    return reasons, passed


def verify(receipt: dict[str, Any], *, artifact_path: str | os.PathLike[str] | None = None,
           prev: dict[str, Any] | None = None, trusted_keys: Iterable[str] | None = None,
           reexecute: bool = True, step_by_step: bool = False,
           backend: str | None = None) -> VerifyResult:
    """Check signature, hashes and chain link, then re-execute the oracle from the committed
    artifact (pinned by ``model_hash``) and compare every output byte.

    Re-execution teacher-forces the receipt's output in one forward (``step_by_step`` decodes
    token by token instead; both give the same tokens and digest). ``backend``: ``oracle``
    (the numpy oracle, the default: :func:`int_kernel.verifier_backend`) or ``oracle-native``
    (this machine's compiled twin), which is used only after the parity gate's canaries
    passed on it for this model (:func:`gated_native`); otherwise the numpy oracle runs and a
    note says why. The checks name the backend that re-executed."""
    reasons, passed = check_static(receipt, prev=prev, trusted_keys=trusted_keys)
    if any(r.startswith(("receipt lacks", "unknown receipt_version", MALFORMED))
           for r in reasons):
        return VerifyResult(ok=False, reasons=reasons, checks=passed)
    if reexecute:
        path = (Path(artifact_path) if artifact_path is not None
                else model_paths.default_artifact_path())
        if backend is None:
            from .int_kernel import verifier_backend

            backend = verifier_backend()
        gate_notes: list[str] = []
        try:
            if backend != "oracle":
                backend, why = gated_native(path, receipt["model_hash"], backend)
                gate_notes.append(why)
            eng = IntegerEngine.cached(path, expected_model_hash=receipt["model_hash"],
                                       backend=backend)
        except (ArtifactError, OSError) as e:
            reasons.append(f"cannot load the committed artifact: {e}")
            return VerifyResult(ok=False, reasons=reasons, checks=passed)
        passed.append("artifact hash == model_hash")
        try:
            toks, digest = reexecute_receipt(eng, receipt, step_by_step=step_by_step)
        except (ParamError, ValueError, ArithmeticError) as e:
            reasons.append(f"re-execution failed: {e}")
            return VerifyResult(ok=False, reasons=reasons, checks=passed)
        claimed = [int(t) for t in receipt["output_tokens"]]
        if toks != claimed:
            first = next((i for i, (a, b) in enumerate(zip(toks, claimed, strict=False))
                          if a != b), min(len(toks), len(claimed)))
            reasons.append(f"output_tokens differ from re-execution at index {first}: "
                           f"receipt has {claimed[first:first + 4]}, oracle gives "
                           f"{toks[first:first + 4]} (lengths {len(claimed)} vs {len(toks)})")
        else:
            passed.append("output_tokens == oracle re-execution")
        if digest != receipt["logits_digest"]:
            reasons.append("logits_digest differs from the oracle's: the producer's logits "
                           "were not byte-identical")
        else:
            passed.append("logits_digest == oracle re-execution")
        passed.append(f"re-executed on {backend}, "
                      f"{'step by step' if step_by_step else 'teacher-forced'}")
        stop = receipt["params"]["stop_token"]
        text_toks = claimed[:-1] if claimed and claimed[-1] == stop else claimed
        try:
            text = eng.tokenizer.decode(text_toks)
        except (TypeError, ValueError, IndexError, KeyError):
            text = None
        if text is None or text_hash(text) != receipt["output_text_hash"]:
            reasons.append("output_text_hash is not the hash of the decoding of output_tokens")
        else:
            passed.append("output_text_hash == decoding of output_tokens")
    notes = [] if receipt["context"] is not None else [
        "the receipt binds no context (signed outside an executor): it is tied to no workload, "
        "request or manifest"]
    if reexecute:
        notes = gate_notes + notes
    return VerifyResult(ok=not reasons, reasons=reasons, checks=passed, notes=notes)


_GATED: dict[tuple[str, str, str], tuple[str, str]] = {}


def gated_native(path: Path, model_hash: str, backend: str) -> tuple[str, str]:
    """(the backend to re-execute on, what was decided): a compiled backend built on this
    machine is trusted for a model only after the parity gate's canaries, run through it and
    through the numpy oracle, gave byte-identical logits and tokens here (once per process
    and model); otherwise the numpy oracle re-executes."""
    key = (str(path.resolve()), model_hash, backend)
    if key not in _GATED:
        from .parity_gate import run_gate

        try:
            gated = IntegerEngine.cached(path, expected_model_hash=model_hash, backend=backend)
        except Exception as e:  # a backend that does not even start here is refused
            _GATED[key] = ("oracle", f"{backend} could not start here ({e}); re-executed on the "
                                     "numpy oracle")
        else:
            oracle = IntegerEngine.cached(path, expected_model_hash=model_hash, backend="oracle")
            res = run_gate(gated, oracle=oracle)
            if res.passed:
                _GATED[key] = (backend, f"{backend} passed the parity canaries on this machine "
                                        f"({res.canaries} canaries byte-identical to the "
                                        "numpy oracle) before re-executing")
            else:
                _GATED[key] = ("oracle", f"{backend} failed the parity canaries here "
                                         f"({res.mismatch}); re-executed on the numpy oracle")
    return _GATED[key]


def check_record(record: dict[str, Any], receipt: dict[str, Any], *,
                 check_signature: bool = True) -> tuple[list[str], list[str], list[str]]:
    """A response record (its JSON) against the receipt it carries: everything the receipt binds
    that the record also states. Returns (reasons, passed checks, notes).

    Checked: the record's signature is by the receipt's key (``check_signature``); ``outcome`` is
    ``ok``; ``effect_id``, ``header.workload_id`` and ``header.epoch`` are the receipt's context;
    ``model_hash`` is ``sha256:`` + the receipt's modelHash; ``receipt.manifest_hash`` is the
    context's; ``written_by`` is the receipt's ``node_id``; the inline JSON output's
    ``output_tokens``, ``finish_reason`` and ``prompt_token_count`` follow from the receipt, and
    the sha256 of its ``text`` is ``output_text_hash``. The request (``request_hash``,
    ``prompt_text_hash``) is not in the record: ``fx verify --workload`` checks it on ``.out``."""
    from broker_schema.canonical import hash_from_hex

    reasons: list[str] = []
    passed: list[str] = []
    notes: list[str] = []
    if check_signature:
        from broker_schema.records import ResponseRecord
        from broker_schema.signatures import response_signature_problem

        try:
            resp = ResponseRecord.model_validate(record)
        except ValueError as exc:  # pydantic's ValidationError is one
            reasons.append(f"not a valid response record: {str(exc)[:300]}")
            return reasons, passed, notes
        try:
            key = bytes.fromhex(str(receipt.get("public_key")))
        except ValueError:
            key = b""
        problem = response_signature_problem(resp, key)
        if problem is None:
            passed.append("response signature (by the receipt's key)")
        else:
            reasons.append(f"the response record is not signed by the receipt's key: {problem}")
    if record.get("outcome") != "ok":
        reasons.append(f"the response's outcome is {record.get('outcome')!r}, not 'ok'")
    ctx = receipt.get("context")
    raw_header = record.get("header")
    header: dict[str, Any] = raw_header if isinstance(raw_header, dict) else {}
    if not isinstance(ctx, dict):
        reasons.append("the receipt binds no context: nothing ties it to this response")
    else:
        before = len(reasons)
        if record.get("effect_id") != ctx.get("effect_id"):
            reasons.append(f"effect id: the response is {record.get('effect_id')!r}, the "
                           f"receipt was signed for {ctx.get('effect_id')!r}")
        if header.get("workload_id") != ctx.get("workload_id"):
            reasons.append(f"workload: the response is on {header.get('workload_id')!r}, the "
                           f"receipt was signed for {ctx.get('workload_id')!r}")
        if header.get("epoch") != ctx.get("epoch"):
            reasons.append(f"epoch: the response is at epoch {header.get('epoch')!r}, the "
                           f"receipt was signed at {ctx.get('epoch')!r}")
        raw_extra = record.get("receipt")
        extra: dict[str, Any] = raw_extra if isinstance(raw_extra, dict) else {}
        if extra.get("manifest_hash") != ctx.get("manifest_hash"):
            reasons.append(f"manifest: the response names manifest "
                           f"{extra.get('manifest_hash')!r}, the receipt was signed for "
                           f"{ctx.get('manifest_hash')!r}")
        if len(reasons) == before:
            passed.append("response effect id, workload, epoch, manifest == receipt context")
    try:
        model = hash_from_hex(str(receipt.get("model_hash")))
    except ValueError:
        model = None
    if model is None or record.get("model_hash") != model:
        reasons.append(f"model: the response names {record.get('model_hash')!r}, the receipt's "
                       f"model_hash is {receipt.get('model_hash')!r}")
    else:
        passed.append("response model_hash == receipt model_hash")
    if record.get("written_by") != receipt.get("node_id"):
        reasons.append(f"node: the response was written by {record.get('written_by')!r}, the "
                       f"receipt by node {receipt.get('node_id')!r}")
    body = record.get("output")
    out = body.get("data") if isinstance(body, dict) and body.get("type") == "inline" \
        and body.get("encoding") == "json" else None
    if not isinstance(out, dict):
        notes.append("output not inline JSON: its text was not compared with the receipt")
        return reasons, passed, notes
    before = len(reasons)
    toks = receipt.get("output_tokens")
    if out.get("output_tokens") != toks:
        reasons.append("output: the response's output_tokens differ from the receipt's")
    params = receipt.get("params")
    stop = params.get("stop_token") if isinstance(params, dict) else None
    finish = "stop" if isinstance(toks, list) and toks and toks[-1] == stop else "length"
    if out.get("finish_reason") != finish:
        reasons.append(f"output: the response's finish_reason {out.get('finish_reason')!r} is "
                       f"not {finish!r}, as the receipt's output_tokens and stop_token say")
    prompt = receipt.get("prompt_tokens")
    if isinstance(prompt, list) and out.get("prompt_token_count") != len(prompt):
        reasons.append("output: the response's prompt_token_count is not the length of the "
                       "receipt's prompt_tokens")
    text = out.get("text")
    if not isinstance(text, str) or text_hash(text) != receipt.get("output_text_hash"):
        reasons.append("output text: the sha256 of the response's text is not the receipt's "
                       "output_text_hash")
    if len(reasons) == before:
        passed.append("response output (tokens, finish_reason, text) == receipt")
    return reasons, passed, notes


def verify_chain(receipts: Sequence[dict[str, Any]], **kw: Any) -> list[VerifyResult]:
    """Verify each receipt, linking each to the one before it in the sequence."""
    out = []
    prev: dict[str, Any] | None = None
    for r in receipts:
        out.append(verify(r, prev=prev, **kw))
        prev = r
    return out
