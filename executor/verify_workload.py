"""``fx verify --workload ID``: check every integer-engine receipt on a workload's ``.resp``.

Reads ``wl.<id>.resp`` and ``wl.<id>.out`` (read_committed, up to their last stable offsets) and
``sys.facts`` (the latest facts of each node), then, for every response that carries a receipt
(``receipt.integer``) or was written by the integer engine:

1. **the response record's own signature**: over its canonical bytes, against the public key
   the node it claims (its executor's ``node_id``, else ``written_by``:
   :func:`broker_schema.key_history.response_node`) publishes on ``sys.facts``
   (:func:`broker_schema.key_history.response_signer`, the rule ``fx why`` and ``fx audit`` use);
2. **who signed the receipt**: the receipt's ``public_key`` is that same node key
   (:func:`broker_schema.key_history.receipt_key_problem`) and its ``node_id`` is the writer;
3. **the record matches the receipt**: ``model_hash`` is ``sha256:`` + the receipt's modelHash,
   the output's ``output_tokens`` are the receipt's and its ``text`` is their decoding;
4. **the receipt answers the request**: the request at ``request_offset`` on ``.out`` has the same
   effect id and model, and its parameters (with the documented defaults, the input body as the
   prompt when no prompt parameter is given) tokenize to the receipt's ``prompt_tokens`` and
   normalise to its ``params``;
5. **the chain**: per node and key (a rotated key starts a new chain), receipts ordered by
   ``seq``; where ``seq - 1`` is in this workload,
   ``prev_receipt_hash`` must be its hash (and the key the same); two different receipts with one
   ``seq`` are a fork. A node's chain spans every workload it serves, so a missing ``seq - 1`` is
   a *gap* (receipts for other workloads), reported, and a failure only with ``strict_chain``;
6. **the context**: the receipt's ``context`` names the response's effect id, workload, epoch
   and ``receipt.manifest_hash``; its ``request_hash`` is the request's ``record_hash`` and its
   ``prompt_text_hash`` the hash of the request's prompt text; ``output_text_hash`` is the hash
   of the response's ``text`` (:func:`fx_integer.verifier.check_record`);
7. **the receipt itself** (:func:`fx_integer.verifier.verify`): its signature, input and
   output hashes, then the numpy oracle re-executes the request on the CPU from the committed
   artifact (found by modelHash: ``--artifact``, the model store, then the cache; its sha256 must
   equal the modelHash) and output tokens and logits digest must be identical.

Trust: with a key history (``--fleet-key``: :mod:`broker_schema.key_history`, the certificates on
``sys.keys`` signed by a fleet key the verifier is given) the response signature and the receipt
must be by a key certified for the node and not revoked at the response's time
(``timing.finished_us``), whichever of its keys that is (rotated keys stay valid for what they
signed); ``sys.facts`` then decides nothing. With ``trusted_keys`` (``--trusted-key``) every
receipt must be signed by one of those keys. With neither, the node keys come from ``sys.facts``,
which is unsigned, so a result whose checks all pass is "checked", not "verified"
(``verified``).

The checks are pure functions over decoded records (:func:`verify_records`); :func:`read_log` is
the only part that talks to the broker.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_schema import DecodeError, decode, hash_from_hex, topics
from broker_schema.key_history import (
    KeyProblem,
    TrustedKey,
    receipt_key_problem,
    response_node,
    response_signer,
)
from broker_schema.records import (
    EffectRequest,
    FactsRecord,
    InlineBody,
    ResponseRecord,
)
from fx_kafka.workload_log import WorkloadLog

if TYPE_CHECKING:
    from broker_schema.key_history import KeyHistory
    from fx_integer.engine import IntegerEngine

__all__ = [
    "ReceiptCheck",
    "ReceiptLog",
    "Resolved",
    "WorkloadVerification",
    "artifact_resolver",
    "read_log",
    "verify_records",
]


@dataclasses.dataclass
class ReceiptLog:
    """What the verifier reads of a workload's log (:class:`fx_kafka.workload_log.WorkloadLog`):
    responses in append order, requests by offset, facts by node."""

    workload_id: str
    responses: list[tuple[int, ResponseRecord]]
    requests: dict[int, EffectRequest]
    facts: dict[str, FactsRecord]
    undecodable: int = 0
    #: the broker's append time (µs) of each response by offset: the time its signer's key is
    #: judged at (a time the signer does not choose)
    appended_us: dict[int, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, log: WorkloadLog) -> ReceiptLog:
        """The responses on ``log``'s ``.resp`` (counting the undecodable records), the requests
        on its ``.out`` and the latest facts of each node."""
        out = cls(log.workload_id, [], {}, {})
        for rec in log["resp"]:
            try:
                record = decode(rec.value)
            except DecodeError:
                out.undecodable += 1
                continue
            if isinstance(record, ResponseRecord):
                out.responses.append((rec.offset, record))
                out.appended_us[rec.offset] = rec.time_ms * 1000
        for rec in log["out"]:
            try:
                record = decode(rec.value)
            except DecodeError:
                continue
            if isinstance(record, EffectRequest):
                out.requests[rec.offset] = record
        for fact in log.facts:
            out.facts[fact.node_id] = fact  # compacted, keyed by node: the latest wins
        return out


@dataclasses.dataclass
class ReceiptCheck:
    """The verdict on one response with a receipt."""

    offset: int
    effect_id: str
    node_id: str
    seq: int | None
    text: str
    reasons: list[str] = dataclasses.field(default_factory=list)
    checks: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons


@dataclasses.dataclass
class WorkloadVerification:
    workload_id: str
    receipts: list[ReceiptCheck]
    skipped: dict[str, int]
    problems: list[str]
    notes: list[str] = dataclasses.field(default_factory=list)
    #: every receipt's key was one the caller trusts (``--trusted-key``)
    authenticated: bool = False

    @property
    def ok(self) -> bool:
        """Every check passed (the signers may still be unauthenticated: see ``verified``)."""
        return bool(self.receipts) and not self.problems and all(r.ok for r in self.receipts)

    @property
    def verified(self) -> bool:
        """Every check passed and every signer is a trusted key."""
        return self.ok and self.authenticated


# ------------------------------------------------------------------------------ reading
async def read_log(bootstrap: str, workload_id: str, *, timeout: float = 60.0) -> ReceiptLog:
    """``.resp``, ``.out`` and ``sys.facts`` as the verifier needs them (read_committed)."""
    from fx_kafka.client import make_consumer
    from fx_kafka.workload_log import read_facts, read_topic

    consumer = make_consumer(bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        present = await consumer.topics()
    finally:
        await consumer.stop()
    resp_topic = topics.resp(workload_id)
    if resp_topic not in present:
        raise LookupError(f"no topic {resp_topic} on {bootstrap}")
    log = WorkloadLog.empty(workload_id)
    log.views["resp"] = await read_topic(bootstrap, resp_topic, timeout=timeout)
    if topics.out(workload_id) in present:
        log.views["out"] = await read_topic(bootstrap, topics.out(workload_id), timeout=timeout)
    if topics.FACTS in present:
        log.facts = await read_facts(bootstrap, timeout=timeout)
    return ReceiptLog.of(log)


# ------------------------------------------------------------------------------ artifacts
@dataclasses.dataclass
class Resolved:
    """The committed artifact for one modelHash, as found by :func:`artifact_resolver`."""

    path: Path | None
    engine: IntegerEngine | None
    defaults: dict[str, Any]
    tried: list[str]


def artifact_resolver(*, artifact: Path | None = None, store: Path | None = None,
                      backend: str | None = None) -> Callable[[str], Resolved]:
    """``modelHash -> Resolved``: the first of ``artifact``, ``<store>/sha256/<modelHash>`` and
    the integer engine's cache whose sha256 is the modelHash, with an oracle engine over it
    (``backend``: ``oracle`` or ``oracle-native``, by default the verifier's choice,
    ``fx_integer.int_kernel.verifier_backend``), and the parameter defaults of the store's
    manifest (else the documented defaults)."""
    from executor.engines.integer import default_params
    from executor.models import ModelManifest
    from fx_integer import model_paths
    from fx_integer.artifact import ArtifactError
    from fx_integer.engine import IntegerEngine
    from fx_integer.int_kernel import verifier_backend

    chosen = backend or verifier_backend()

    def resolve(model_hash: str) -> Resolved:
        defaults = default_params()
        tried: list[str] = []
        # the modelHash comes from the receipt: never let it name a path outside the store
        if len(model_hash) != 64 or any(c not in "0123456789abcdef" for c in model_hash):
            return Resolved(None, None, defaults, [f"{model_hash!r} is not a modelHash"])
        if store is not None:
            mpath = store / "sha256" / (model_hash + ".json")
            if mpath.is_file():
                try:
                    manifest = ModelManifest.model_validate_json(mpath.read_bytes())
                    defaults = {k: d.default for k, d in manifest.params.items()}
                except (OSError, ValueError) as exc:  # pydantic's ValidationError is one
                    tried.append(f"{mpath}: unreadable manifest, documented defaults used "
                                 f"({type(exc).__name__})")
        candidates: list[Path] = []
        if artifact is not None:
            candidates.append(artifact)
        if store is not None:
            candidates.append(store / "sha256" / model_hash)
        candidates.append(model_paths.default_artifact_path())
        for path in candidates:
            if not path.is_file():
                tried.append(f"{path}: absent")
                continue
            try:  # cached per (path, hash): the re-execution reuses this engine
                eng = IntegerEngine.cached(path, expected_model_hash=model_hash,
                                           backend=chosen)
            except (ArtifactError, OSError) as exc:
                tried.append(f"{path}: {exc}")
                continue
            return Resolved(path, eng, defaults, tried)
        return Resolved(None, None, defaults, tried)

    return resolve


# ------------------------------------------------------------------------------ checks
def _output_json(resp: ResponseRecord) -> Any:
    body = resp.output
    if isinstance(body, InlineBody) and body.encoding == "json":
        return body.data
    return None


def _check_request(check: ReceiptCheck, resp: ResponseRecord, receipt: Mapping[str, Any],
                   request: EffectRequest | None, found: Resolved) -> None:
    from executor.engines.integer import request_params
    from fx_integer.engine import ParamError
    from fx_node.errors import OutcomeError

    if request is None:
        check.reasons.append(f"no request at offset {resp.request_offset} of .out: the receipt "
                             "cannot be tied to what was asked")
        return
    if request.effect_id != resp.effect_id:
        check.reasons.append(f"the request at .out offset {resp.request_offset} is "
                             f"{request.effect_id}, not {resp.effect_id}")
        return
    if request.model != resp.model_hash:
        check.reasons.append(f"the request asked for model {request.model}, the response "
                             f"names {resp.model_hash}")
    body = request.input
    if body is not None and not isinstance(body, InlineBody):
        check.notes.append("request input by reference: prompt not re-derived here")
        return
    data = body.raw() if isinstance(body, InlineBody) else b""
    if found.engine is None:
        check.notes.append("no artifact: the request's prompt was not re-tokenized")
        return
    try:
        req, canon = found.engine.prepare(
            request_params(found.defaults, dict(request.params), data))
    except (ParamError, OutcomeError) as exc:
        check.reasons.append(f"the request's params do not parse ({exc}), yet it was answered ok")
        return
    if list(req.prompt_tokens) != receipt.get("prompt_tokens"):
        check.reasons.append("the receipt's prompt_tokens are not the tokenization of the "
                             f"request at .out offset {resp.request_offset}")
    elif canon != receipt.get("params"):
        check.reasons.append(f"the receipt's params {receipt.get('params')} are not the "
                             f"request's {canon}")
    else:
        check.checks.append("prompt and params == the request on .out")


def _check_context(check: ReceiptCheck, receipt: Mapping[str, Any],
                   request: EffectRequest | None) -> None:
    """The receipt's ``request_hash`` and ``prompt_text_hash`` against the request on .out."""
    from broker_schema import record_hash
    from fx_integer.receipt import text_hash

    ctx = receipt.get("context")
    if request is None or not isinstance(ctx, dict):
        return  # said already (no request; a receipt without context)
    if ctx.get("request_hash") != record_hash(request):
        check.reasons.append(f"request: the receipt was signed for request "
                             f"{ctx.get('request_hash')}, the request on .out "
                             f"({request.effect_id}) hashes to {record_hash(request)}")
        return
    prompt = request.params.get("prompt")
    if "prompt_tokens" in request.params:
        want: str | None = None
    elif isinstance(prompt, str):
        want = text_hash(prompt)
    elif isinstance(request.input, InlineBody):
        try:
            want = text_hash(request.input.raw().decode("utf-8"))
        except UnicodeDecodeError:
            want = None
    else:  # by reference: the request hash binds the reference, hence the text
        check.checks.append("request hash == the request on .out")
        return
    if receipt.get("prompt_text_hash") != want:
        check.reasons.append("prompt text: the receipt's prompt_text_hash is not the hash of "
                             "the request's prompt text")
        return
    check.checks.append("request hash and prompt text hash == the request on .out")


def _check_output(check: ReceiptCheck, resp: ResponseRecord, receipt: Mapping[str, Any],
                  found: Resolved) -> None:
    """The record against the receipt (:func:`fx_integer.verifier.check_record`), then the text
    against the tokenizer's decoding of the receipt's output tokens."""
    from fx_integer.verifier import check_record

    reasons, passed, notes = check_record(resp.model_dump(mode="json"), dict(receipt),
                                          check_signature=False)
    check.reasons.extend(reasons)
    check.checks.extend(passed)
    check.notes.extend(notes)
    out = _output_json(resp)
    toks = receipt.get("output_tokens")
    if reasons or not isinstance(out, dict) or not isinstance(toks, list):
        return
    params = receipt.get("params")
    stop = params.get("stop_token") if isinstance(params, dict) else None
    finish = "stop" if toks and toks[-1] == stop else "length"
    eng = found.engine
    if eng is not None:
        text_toks = toks[:-1] if finish == "stop" else toks
        try:
            text = eng.tokenizer.decode([int(t) for t in text_toks])
        except (TypeError, ValueError, IndexError, KeyError):
            text = None
        if text != out.get("text"):
            check.reasons.append("the response's text is not the decoding of the receipt's "
                                 "output_tokens")
            return
        check.checks.append("response text == decoding of the receipt's output_tokens")


def verify_records(
    log: ReceiptLog,
    *,
    resolve: Callable[[str], Resolved],
    strict_chain: bool = False,
    reexecute: bool = True,
    progress: Callable[[str], None] | None = None,
    trusted_keys: Iterable[str] | None = None,
    key_history: KeyHistory | None = None,
    step_by_step: bool = False,
) -> WorkloadVerification:
    """Check every receipt-carrying response of ``log`` (see the module docstring).

    ``key_history``: the node keys certified by a fleet key; every signer must be one of the
    writer node's, trusted at the response's time. ``trusted_keys`` (hex raw keys): every
    receipt must be signed by one of them. Either authenticates the result; without both the
    keys come from ``sys.facts``, which is unsigned: every check can pass, yet the signers are
    not authenticated."""
    trusted = None if trusted_keys is None else set(trusted_keys)
    from executor.engines.integer import ENGINE
    from fx_integer import receipt as rc
    from fx_integer import verifier

    skipped: dict[str, int] = {}
    problems: list[str] = []
    found: list[tuple[int, ResponseRecord, dict[str, Any] | None]] = []
    for offset, resp in log.responses:
        receipt: Any = (resp.receipt or {}).get("integer")
        engine = resp.executor.engine if resp.executor else None
        if isinstance(receipt, dict):
            found.append((offset, resp, receipt))
        elif resp.outcome == "ok" and engine == ENGINE:
            found.append((offset, resp, None))
        else:
            why = (f"{resp.outcome} outcome" if resp.outcome != "ok"
                   else f"no integer receipt (engine {engine})")
            skipped[why] = skipped.get(why, 0) + 1
    if log.undecodable:
        problems.append(f"{log.undecodable} undecodable records on {topics.resp(log.workload_id)}")

    # the chain: per node and key (a rotated key starts a new chain at seq 0), by seq
    by_node: dict[tuple[str, str], dict[int, list[dict[str, Any]]]] = {}
    append_seqs: dict[tuple[str, str], list[int]] = {}
    for _, resp, receipt in found:
        seq_of = receipt.get("seq") if receipt is not None else None
        if not isinstance(seq_of, int):
            continue
        chain_key = (resp.written_by, str(receipt.get("public_key")) if receipt else "")
        by_node.setdefault(chain_key, {}).setdefault(seq_of, []).append(receipt)
        append_seqs.setdefault(chain_key, []).append(seq_of)
    notes = [f"node {node}: receipts appended out of seq order {seqs} (several workers); "
             "the chain is checked by seq" for (node, _), seqs in append_seqs.items()
             if seqs != sorted(seqs)]

    checks: list[ReceiptCheck] = []
    total = len(found)
    facts = list(log.facts.values())
    for n, (offset, resp, receipt) in enumerate(found):
        text = ""
        out = _output_json(resp)
        if isinstance(out, dict) and isinstance(out.get("text"), str):
            text = out["text"]
        seq_val = receipt.get("seq") if receipt else None
        check = ReceiptCheck(offset=offset, effect_id=resp.effect_id, node_id=resp.written_by,
                             seq=seq_val if isinstance(seq_val, int) else None, text=text)
        checks.append(check)
        # 0. the workload: a response copied onto another workload's .resp names its own
        # (its header, and the receipt's context, which the signatures cover)
        if resp.header.workload_id != log.workload_id:
            check.reasons.append(f"the response names workload {resp.header.workload_id!r}, not "
                                 f"{log.workload_id!r} whose .resp it is on (replayed onto "
                                 "another workload's topic)")
        # 1. the response record's own signature: against a certified key of the node it claims
        # (with a key history), else against that node's key on sys.facts (the one rule:
        # broker_schema.key_history)
        node = response_node(resp)
        signer: bytes | None = None
        appended_us = log.appended_us.get(offset)
        verdict = response_signer(resp, facts, key_history, appended_us=appended_us)
        if isinstance(verdict, TrustedKey):
            signer = verdict.public_key
            check.checks.append(f"response signature (key {verdict.key_id}, certified for the "
                                "node)" if key_history is not None else
                                "response signature (node key on sys.facts)")
        else:
            check.reasons.append(_signature_reason(verdict, node, log.facts.get(node)))
        if receipt is None:
            check.reasons.append("an ok response of the integer engine without a receipt")
            continue
        if progress is not None:
            progress(f"receipt {n + 1}/{total} (offset {offset}): re-executing on the CPU oracle")
        # 2. who signed the receipt: a key trusted for the node, the same as the record's
        try:
            receipt_key = bytes.fromhex(str(receipt.get("public_key")))
        except ValueError:
            receipt_key = b""
        problem = receipt_key_problem(resp, receipt_key, facts, key_history,
                                      appended_us=appended_us)
        if key_history is not None:
            if problem is not None:
                check.reasons.append(f"the receipt's key is not trusted: {problem.detail}")
            elif signer is not None and receipt_key != signer:
                check.reasons.append("the receipt is signed by another certified key of the node "
                                     "than its response record")
            else:
                check.checks.append("receipt key certified for the node")
        elif problem is None:
            check.checks.append("receipt key == node key on sys.facts")
        elif problem.code != "unknown_key":  # no facts of the node: said in 1.
            check.reasons.append(f"the receipt is signed by key {receipt.get('public_key')}, "
                                 f"not node {node}'s key on sys.facts")
        if receipt.get("node_id") != resp.written_by:
            check.reasons.append(f"receipt node_id {receipt.get('node_id')!r} is not the "
                                 f"response's writer {resp.written_by!r}")
        # 3. the record's model hash; the artifact it names
        model_hex = str(receipt.get("model_hash", ""))
        try:
            receipt_model: str | None = hash_from_hex(model_hex)
        except ValueError:
            receipt_model = None
        if receipt_model is None or resp.model_hash != receipt_model:
            check.reasons.append(f"response model_hash {resp.model_hash} != receipt model_hash "
                                 f"{receipt_model or repr(model_hex[:80])}")
        found_art = resolve(model_hex)
        if found_art.path is None:
            missing = (f"no committed artifact with modelHash {model_hex} "
                       f"({'; '.join(found_art.tried)})")
            if reexecute:
                check.reasons.append(missing + ": cannot re-execute")
            else:
                check.notes.append(missing)
        _check_output(check, resp, receipt, found_art)
        # 4. the request it answers
        request = log.requests.get(resp.request_offset)
        _check_request(check, resp, receipt, request, found_art)
        _check_context(check, receipt, request)
        # 5. the chain link
        seq = receipt.get("seq")
        prev: dict[str, Any] | None = None
        chain = by_node.get((resp.written_by, str(receipt.get("public_key"))), {})
        if isinstance(seq, int):
            same = chain.get(seq, [])
            if len({rc.receipt_hash(r) for r in same}) > 1:
                check.reasons.append(f"chain fork: node {resp.written_by} signed "
                                     f"{len(same)} different receipts with seq {seq}")
            before = chain.get(seq - 1)
            if before:
                prev = before[0]
            elif seq > 0:
                gap = (f"chain gap: seq {seq - 1} of node {resp.written_by} is not in this "
                       "workload (a receipt for another workload, or missing)")
                (check.reasons if strict_chain else check.notes).append(gap)
        # 6. the receipt: signature, hashes, link, oracle re-execution
        if found_art.path is not None or not reexecute:
            backend = found_art.engine.backend if found_art.engine is not None else None
            res = verifier.verify(receipt, artifact_path=found_art.path, prev=prev,
                                  reexecute=reexecute, trusted_keys=trusted,
                                  step_by_step=step_by_step, backend=backend)
            check.reasons.extend(res.reasons)
            check.checks.extend(res.checks)
        else:
            static_reasons, passed = verifier.check_static(receipt, prev=prev, trusted_keys=trusted)
            check.reasons.extend(static_reasons)
            check.checks.extend(passed)
    if not found:
        problems.append(f"no integer-engine receipts on {topics.resp(log.workload_id)} "
                        f"({len(log.responses)} responses)")
    return WorkloadVerification(log.workload_id, checks, skipped, problems, notes,
                                authenticated=trusted is not None or key_history is not None)


def _signature_reason(problem: KeyProblem, node: str, facts: FactsRecord | None) -> str:
    """The reason ``fx verify`` gives when the response's signature is not trusted."""
    if problem.code == "unsigned":
        return "the response record carries no signature"
    if problem.source == "history":
        if problem.code == "not_certified":
            return (f"the response is signed by key {problem.key_id}, which no fleet "
                    f"certificate on {topics.KEYS} gives node {node!r}")
        if problem.code == "bad_signature":
            return (f"the response record's signature does not verify against node {node}'s "
                    f"certified key {problem.key_id}")
        return f"the response's signing key is not trusted: {problem.detail}"
    if facts is None:
        return f"no facts for node {node} on sys.facts: its public key is unknown"
    return (f"the response record's signature does not verify against node {node}'s key on "
            f"sys.facts ({facts.key_id})")


def render(result: WorkloadVerification) -> list[str]:
    """One line per receipt (then its failures and notes) and a summary."""
    lines: list[str] = []
    for c in result.receipts:
        status = "OK  " if c.ok else "FAIL"
        text = c.text if len(c.text) <= 60 else c.text[:57] + "..."
        lines.append(f"{status} resp@{c.offset} {c.effect_id} node={c.node_id} seq={c.seq} "
                     f"({len(c.checks)} checks) {text!r}")
        lines.extend(f"     FAIL {r}" for r in c.reasons)
        lines.extend(f"     note {n}" for n in c.notes)
    for p in result.problems:
        lines.append(f"FAIL {p}")
    lines.extend(f"note {n}" for n in result.notes)
    good = sum(c.ok for c in result.receipts)
    skipped = ", ".join(f"{v} {k}" for k, v in sorted(result.skipped.items()))
    what = "verified" if result.authenticated else "checked"
    lines.append(f"{good}/{len(result.receipts)} receipts {what} on "
                 f"{topics.resp(result.workload_id)}"
                 + (f"; not receipts: {skipped}" if skipped else ""))
    if not result.authenticated:
        lines.append("NOT AUTHENTICATED: re-execution, chain and bindings were checked, but the "
                     "signers' keys come from sys.facts (unsigned): give --fleet-key (the "
                     "certificates on sys.keys) or --trusted-key HEX to verify who signed")
    return lines


def run(bootstrap: str, workload_id: str, *, artifact: Path | None, store: Path | None,
        strict_chain: bool, reexecute: bool,
        progress: Callable[[str], None] | None = None,
        trusted_keys: Iterable[str] | None = None,
        fleet_keys: list[bytes] | None = None, step_by_step: bool = False,
        backend: str | None = None) -> tuple[WorkloadVerification, list[str]]:
    """Read the log (and, given ``fleet_keys``, the key history on ``sys.keys``) and verify it;
    returns the result and its rendered lines."""
    log = asyncio.run(read_log(bootstrap, workload_id))
    history = None
    if fleet_keys:
        from fx_kafka.keys import read_history

        history = asyncio.run(read_history(bootstrap, fleet_keys))
    result = verify_records(log, resolve=artifact_resolver(artifact=artifact, store=store,
                                                           backend=backend),
                            strict_chain=strict_chain, reexecute=reexecute, progress=progress,
                            trusted_keys=trusted_keys, key_history=history,
                            step_by_step=step_by_step)
    if history is not None:
        result.notes.extend(f"ignored {topics.KEYS}@{o}: {why}" for o, why in history.ignored)
    return result, render(result)

