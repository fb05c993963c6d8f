"""``fx why``: the audit walk from an output back to the input bytes, as a set of records.

output on ``.out`` -> its header (step input offset = merge seq, epoch) -> the claim of that epoch
-> the spec it names (module hash, models in force) -> the merge entry that step saw -> if it was an
answer: the response (model hash, output, executor, signature checked against ``sys.facts``) -> its
request on ``.out`` (params, input) -> the step that asked -> ... -> the input record on ``.in``;
and the snapshot before the earliest step of the walk. Pure: reads a :class:`WorkloadLog`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker_schema import (
    ClaimRecord,
    EffectRequest,
    FactsRecord,
    InlineBody,
    InputRecord,
    MergeEntry,
    OutputRecord,
    ResponseRecord,
    SnapshotRecord,
    sha256_hex,
)
from broker_schema.key_history import TrustedKey, response_node, response_signer
from fx_kafka.workload_log import LogGap, WorkloadLog
from workload_sdk._commands import replay_command

if TYPE_CHECKING:
    from broker_schema.key_history import KeyHistory

__all__ = ["render_tree", "verify_signature", "why"]

#: The walk stops after this many request -> step hops (a chain of answers asking again).
MAX_HOPS = 64


def verify_signature(resp: ResponseRecord, facts: list[FactsRecord],
                     history: KeyHistory | None = None, *,
                     appended_us: int | None = None) -> dict[str, Any]:
    """Check the signature of ``resp`` over :meth:`ResponseRecord.signing_bytes`: the rule is
    :func:`broker_schema.key_history.response_signer` (one for ``fx why``, ``fx audit``,
    ``fx verify`` and the holder); this says its verdict as ``fx why`` shows it.

    With ``history`` (the node keys a fleet key certified on ``sys.keys``,
    :mod:`broker_schema.key_history`): ``valid`` is True only when the signature's key is
    certified for the response's executor node, trusted at ``appended_us`` (the broker's append
    time of the response record; None: no time, a revoked key not trusted), and the
    signature verifies; ``authenticated`` is then True. Without it, with the public key the
    executor published on ``sys.facts`` under the signature's ``key_id`` (``authenticated``
    False: anyone who can write ``sys.facts`` decides that key):

    ``valid`` is True only when a facts record of the response's own executor node publishes a
    key whose raw bytes hash to ``key_id`` and the signature verifies with it; False when the
    signature fails, the key does not hash to its ``key_id``, or the key is published only by
    another node; None (not checked) when no facts record publishes the key at all.
    """
    sig = resp.signature
    if sig is None:
        return {"signed": False, "valid": None, "reason": "the response carries no signature"}
    found = response_signer(resp, facts, history, appended_us=appended_us)
    out: dict[str, Any] = {"signed": True, "key_id": sig.key_id, "node_id": response_node(resp),
                           "authenticated": False}
    if isinstance(found, TrustedKey):
        if found.source == "history":
            out.update(valid=True, authenticated=True,
                       reason=f"verified with a key the fleet key certified for node "
                              f"{found.node_id!r} (sys.keys@{found.offset})")
        else:
            out.update(valid=True, reason="verified with the key published on sys.facts",
                       facts_node=found.node_id)
        return out
    out.update(valid=None if found.code == "unknown_key" else False, reason=found.detail)
    if found.source == "facts" and found.code == "bad_signature":
        out["facts_node"] = found.node_id
    return out


def _claim_offset(log: WorkloadLog, claim: ClaimRecord) -> int:
    view = log["claims"]
    for rec in view:
        if rec.decode(view.topic) == claim:
            return rec.offset
    return -1


def _body(body: Any) -> dict[str, Any]:
    data: dict[str, Any] = body.model_dump(mode="json")
    if isinstance(body, InlineBody):
        raw = body.raw()
        data["bytes_sha256"] = sha256_hex(raw)
        data["size"] = len(raw)
    return data


def _find_output(log: WorkloadLog, out_offset: int | None, at_ms: int | None) -> int:
    view = log["out"]
    if out_offset is not None:
        return out_offset
    assert at_ms is not None
    best = None
    for rec in view:
        if rec.time_ms <= at_ms:
            best = rec.offset
    if best is None:
        if view.start > 0:
            raise LogGap(view.topic, view.start - 1, "trimmed",
                         f"no output at or before {at_ms} ms is retained: the log starts at "
                         f"{view.start} (offsets below it were trimmed by the audit horizon)")
        raise LogGap(view.topic, -1, "missing", f"no output at or before {at_ms} ms")
    return best


def _deliveries(log: WorkloadLog) -> tuple[dict[int, tuple[int, MergeEntry]],
                                           list[tuple[int, SnapshotRecord]]]:
    by_seq: dict[int, tuple[int, MergeEntry]] = {}
    snaps: list[tuple[int, SnapshotRecord]] = []
    view = log["merge"]
    for rec in view:
        record = rec.decode(view.topic)
        if isinstance(record, MergeEntry) and record.action == "deliver":
            by_seq[record.seq] = (rec.offset, record)
        elif isinstance(record, SnapshotRecord):
            snaps.append((rec.offset, record))
    return by_seq, snaps


def why(log: WorkloadLog, *, out_offset: int | None = None,
        at_ms: int | None = None, key_history: KeyHistory | None = None) -> dict[str, Any]:
    """The audit walk for the output at ``out_offset`` on ``.out`` (or the latest output appended
    at or before ``at_ms``), as a JSON-able tree. Raises :class:`LogGap` for a record that is
    trimmed or missing. Signatures are checked against ``key_history`` when given (see
    :func:`verify_signature`), else against ``sys.facts``."""
    if (out_offset is None) == (at_ms is None):
        raise ValueError("give exactly one of out_offset and at_ms")
    offset = _find_output(log, out_offset, at_ms)
    by_seq, snaps = _deliveries(log)
    steps_seen: list[int] = []

    names = log.model_names()  # hash -> the registry name a spec recorded (never re-resolved)

    def step_node(seq: int, epoch: int, hops: int) -> dict[str, Any]:
        steps_seen.append(seq)
        # the binding in force at this step, by the one rule (broker_schema.binding): the
        # epoch's claim, or the spec adoption by its holder that was in force at ``seq``
        spec_offset, spec, claim = log.spec_for_step(epoch, seq)
        claim_offset = _claim_offset(log, claim)
        switch = max((s.at_input_offset for s in spec.binding_switches
                      if s.at_input_offset <= seq), default=None)
        node: dict[str, Any] = {
            "seq": seq,
            "epoch": epoch,
            "claim": {"offset": claim_offset, "holder_id": claim.holder_id,
                      "spec_offset": claim.spec_offset, "spec_hash": claim.spec_hash,
                      "from_seq": claim.from_seq},
            # the code that ran the step (SpecRecord.module_at: fx workload deploy)
            "spec": {"offset": spec_offset, "module_hash": spec.module_at(seq)[0],
                     "effect_kinds": list(spec.effect_kinds), "models": spec.models_at(seq),
                     "binding_switch_at": switch,
                     # the names the spec in force recorded (else a later spec's)
                     "model_names": {h: (spec.model_names[h].text() if h in spec.model_names
                                         else names[h])
                                     for h in spec.models_at(seq).values()
                                     if h in spec.model_names or h in names}},
        }
        module_switch = max((s.at_step for s in spec.module_switches if s.at_step <= seq),
                            default=None)
        if module_switch is not None:
            node["spec"]["module_switch_at"] = module_switch
            node["spec"]["workload_class"] = spec.module_at(seq)[1]
        if seq not in by_seq:
            merge = log["merge"]
            first = min(by_seq, default=None)
            if merge.start > 0 and (first is None or seq < first):
                raise LogGap(merge.topic, merge.start - 1, "trimmed",
                             f"no merge entry delivers seq {seq}: .merge starts at "
                             f"{merge.start} (offsets below it were trimmed by the audit "
                             "horizon)" + ("" if first is None else
                                           f"; the earliest retained delivery is seq {first}"))
            raise LogGap(merge.topic, -1, "missing", f"no merge entry delivers seq {seq}")
        merge_offset, entry = by_seq[seq]
        node["merge"] = {"offset": merge_offset, "source": entry.source,
                         "source_offset": entry.source_offset, "epoch": entry.epoch}
        view = log[entry.source]
        raw = view.raw(entry.source_offset)
        record = raw.decode(view.topic)
        if isinstance(record, InputRecord):
            node["input"] = {"topic": view.topic, "offset": raw.offset, "time_ms": raw.time_ms,
                             "source": record.source, "body": _body(record.body)}
            if (entry.source, raw.offset) in log.redacted:
                # its chunk's data key was destroyed (fx redact): the hashes still verify, the
                # bytes are gone; replay stops here (Redacted)
                node["input"]["redacted"] = log.unresolved.get((entry.source, raw.offset), "")
            return node
        if not isinstance(record, ResponseRecord):
            raise LogGap(view.topic, raw.offset, "missing", f"merge names a {record.kind}")
        resp: dict[str, Any] = {
            "topic": view.topic, "offset": raw.offset, "time_ms": raw.time_ms,
            "effect_id": record.effect_id, "outcome": record.outcome,
            "model_hash": record.model_hash,
            "model_name": names.get(record.model_hash or ""),
            "output": None if record.output is None else _body(record.output),
            "error": None if record.error is None else record.error.model_dump(mode="json"),
            "executor": None if record.executor is None else record.executor.model_dump(
                mode="json"),
            "written_by": record.written_by,
            "signature": verify_signature(record, log.facts, key_history,
                                          appended_us=raw.time_ms * 1000),
        }
        node["response"] = resp
        out_view = log["out"]
        req_raw = out_view.raw(record.request_offset)
        req = req_raw.decode(out_view.topic)
        if not isinstance(req, EffectRequest) or req.effect_id != record.effect_id:
            raise LogGap(out_view.topic, record.request_offset, "missing",
                         f"the response names it as the request of {record.effect_id}")
        resp["model_matches_request"] = (record.model_hash == req.model
                                         if record.model_hash and req.model else None)
        resp["request"] = {
            "topic": out_view.topic, "offset": req_raw.offset, "time_ms": req_raw.time_ms,
            "effect_kind": req.effect_kind, "model": req.model,
            "model_name": names.get(req.model or ""), "params": dict(req.params),
            "input": None if req.input is None else _body(req.input),
            "deadline_ms": req.deadline_ms, "header": req.header.model_dump(mode="json"),
        }
        if hops >= MAX_HOPS:
            resp["request"]["step"] = {"truncated": f"more than {MAX_HOPS} hops"}
        else:
            resp["request"]["step"] = step_node(req.header.input_offset, req.header.epoch,
                                                hops + 1)
        return node

    out_view = log["out"]
    out_raw = out_view.raw(offset)
    out_rec = out_raw.decode(out_view.topic)
    if not isinstance(out_rec, OutputRecord | EffectRequest):
        raise LogGap(out_view.topic, offset, "missing", f"a {out_rec.kind} is not an output")
    tree: dict[str, Any] = {
        "workload_id": log.workload_id,
        "output": {"topic": out_view.topic, "offset": offset, "time_ms": out_raw.time_ms,
                   "kind": out_rec.kind, "header": out_rec.header.model_dump(mode="json"),
                   "effect_id": out_rec.header.effect_id,
                   "effect_kind": out_rec.effect_kind if isinstance(out_rec, EffectRequest)
                   else None,
                   "params": dict(out_rec.params) if isinstance(out_rec, EffectRequest) else None,
                   "body": _body(out_rec.body) if isinstance(out_rec, OutputRecord) else None},
    }
    tree["step"] = step_node(out_rec.header.input_offset, out_rec.header.epoch, 0)
    earliest = min(steps_seen)
    before = [(o, s) for o, s in snaps if s.seq <= earliest]
    tree["snapshot_before"] = (
        {"merge_offset": before[-1][0], "seq": before[-1][1].seq,
         "state_hash": before[-1][1].state_hash, "epoch": before[-1][1].epoch}
        if before else {"seq": 0, "note": "no snapshot before: replay starts from the initial "
                        "state"}
    )
    tree["replay"] = (replay_command(log.workload_id, earliest - 1) if earliest > 0
                      else "the earliest step saw the initial state")
    return tree


def render_tree(tree: dict[str, Any]) -> str:
    """The walk as an indented tree for a terminal."""
    lines: list[str] = []
    o = tree["output"]
    lines.append(f"output {o['topic']}@{o['offset']} ({o['kind']}"
                 f"{' ' + o['effect_kind'] if o['effect_kind'] else ''}) effect {o['effect_id']}")
    if o["params"] is not None:
        lines.append(f"  params {o['params']}")
    if o["body"] is not None:
        lines.append(f"  body {_short(o['body'])}")

    def step(node: dict[str, Any], depth: int) -> None:
        pad = "  " * depth
        if "truncated" in node:
            lines.append(f"{pad}... {node['truncated']}")
            return
        c, s, m = node["claim"], node["spec"], node["merge"]
        lines.append(f"{pad}└ step seq {node['seq']} epoch {node['epoch']} "
                     f"(merge @{m['offset']}: {m['source']}@{m['source_offset']})")
        adopted = "" if c.get("from_seq") is None else f" (adopted from step {c['from_seq']})"
        switched = ("" if s.get("binding_switch_at") is None
                    else f", binding switched at input offset {s['binding_switch_at']}")
        if s.get("module_switch_at") is not None:
            switched += (f", code deployed at step {s['module_switch_at']} "
                         f"({s['workload_class']})")
        lines.append(f"{pad}  claim @{c['offset']} holder {c['holder_id']} -> spec "
                     f"@{s['offset']}{adopted} module {s['module_hash'][:19]}… models "
                     f"{_named_models(s)}{switched}")
        if "input" in node:
            i = node["input"]
            lines.append(f"{pad}  input {i['topic']}@{i['offset']} t={i['time_ms']} "
                         f"source={i['source']} {_short(i['body'])}")
            if "redacted" in i:
                lines.append(f"{pad}    REDACTED: {i['redacted']}")
            return
        r = node["response"]
        sig = r["signature"]
        verdict = ("valid" if sig.get("valid") else "INVALID" if sig.get("valid") is False
                   else "not checked") if sig["signed"] else "unsigned"
        lines.append(f"{pad}  response {r['topic']}@{r['offset']} outcome {r['outcome']} "
                     f"model {_named(r['model_hash'], r.get('model_name'))} by "
                     f"{r['written_by']}")
        if r["executor"]:
            e = r["executor"]
            lines.append(f"{pad}    executor {e['node_id']} {e['engine']} "
                         f"{e['engine_version']} {e['device_class']}")
        if r["output"] is not None:
            lines.append(f"{pad}    output {_short(r['output'])}")
        if r["error"] is not None:
            lines.append(f"{pad}    error {r['error']}")
        lines.append(f"{pad}    signature {verdict}: {sig.get('reason')}")
        q = r["request"]
        lines.append(f"{pad}    request {q['topic']}@{q['offset']} {q['effect_kind']} model "
                     f"{_named(q['model'], q.get('model_name'))} params {q['params']} "
                     f"deadline {q['deadline_ms']} ms")
        if q["input"] is not None:
            lines.append(f"{pad}      input {_short(q['input'])}")
        step(q["step"], depth + 3)

    step(tree["step"], 1)
    snap = tree["snapshot_before"]
    lines.append(f"snapshot before: seq {snap['seq']}"
                 + (f" at .merge@{snap['merge_offset']} state {snap['state_hash']}"
                    if "merge_offset" in snap else f" ({snap['note']})"))
    lines.append(f"state at the time: {tree['replay']}")
    return "\n".join(lines)


def _named(model_hash: str | None, name: str | None) -> str:
    """A model hash with the registry name its spec recorded beside it, when there is one."""
    return f"{name} ({model_hash})" if name else str(model_hash)


def _named_models(spec_node: dict[str, Any]) -> str:
    names = spec_node.get("model_names") or {}
    if not names:
        return str(spec_node["models"])
    return "{" + ", ".join(f"{b}: {_named(h, names.get(h))}"
                           for b, h in sorted(spec_node["models"].items())) + "}"


def _short(body: dict[str, Any], limit: int = 80) -> str:
    if body.get("type") != "inline":
        return f"{body.get('type')} ref {body}"
    text = repr(body.get("data"))
    if len(text) > limit:
        text = text[:limit] + "…"
    return f"{body.get('encoding')} {text} ({body.get('size')} B, {body.get('bytes_sha256')})"
