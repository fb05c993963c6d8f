"""Shadow evaluation, the pure part: which requests are re-issued, the fold over the shadow
answers, and the diff against the recorded decisions. No I/O.

A shadow evaluation (``fx shadow``) asks "what would this workload have decided with another
model?". It never replays over the live log and never writes to it:

1. :func:`plan` picks the recorded requests of steps ``from_seq``..``to_seq`` whose model is bound
   to a name the evaluation rebinds, and makes each a **shadow request**: the same request with
   the new model and the header's ``shadow`` set to the evaluation's id (so its effect id,
   ``shadow:<eval>/<workload>/<seq>/<index>@<epoch>``, never meets live deduplication). Requests
   that name no rebound model (other models, actuators) are never re-issued.
2. Executors answer them on the evaluation's own ``.resp``; :func:`answers` takes, per shadow
   effect id, the first answer there that is not ``backpressure`` (a backpressure answer means
   "not taken": the request is sent again).
3. :func:`fold` runs the workload's own fold (the same :class:`~workload_sdk._core.Core` the holder
   and replay run) along the recorded merge order, from the state replay rebuilds before
   ``from_seq``, under the spec with the rebinding applied, and delivers each re-issued request's
   shadow answer where the log delivered the recorded one. Every output it computes is compared
   with the recorded one at the same slot. A **decision** is an ``output`` record or a request
   the evaluation does not re-issue (an actuator command: a shadow never actuates); decisions
   may differ, and that is what is counted. A differing command is answered as the recorded
   one was (same slot, same effect id), so the fold goes on. A re-issued request must be the
   recorded one with the model rebound; one that is not, or a request where the log has none
   (or none where it has one), stops the fold: a **divergence of requests** (no answer exists
   for a question never asked).
4. :func:`request_diffs` compares each re-issued request's recorded answer with its shadow answer:
   outcome, and for classifiers the label and score, for the LLM the tokens.

Everything the report says comes from records (the live log, the evaluation's ``.eval``,
``.out`` and ``.resp``), so :func:`evaluate` run again over the same records gives the same
report, byte for byte (``report_hash``): the evaluation is replayable and can be cited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker_schema import (
    ChunkRef,
    EffectRequest,
    InlineBody,
    MergeEntry,
    OutputRecord,
    ResponseRecord,
    ShadowEvalRecord,
    SpecRecord,
    StreamRef,
    content_hash,
    decode,
    encode,
)
from broker_schema.binding import shadow_spec
from fx_kafka.workload_log import LogGap, TopicView, WorkloadLog
from workload_sdk._api import Workload, WorkloadError
from workload_sdk._code import Code
from workload_sdk._core import Core, Item
from workload_sdk._replay import (
    _item,
    _merge_records,
    _skip_differs,
    _Specs,
    first_workload,
    out_slots,
    recorded_skip,
    replay,
)

__all__ = [
    "DecisionDiff",
    "FoldResult",
    "ShadowPair",
    "answers",
    "cut_log",
    "cut_view",
    "decision_diff",
    "evaluate",
    "fold",
    "output_diff",
    "plan",
    "rebound_model",
    "request_diffs",
    "shadow_request",
]

#: Who writes the ``timeout`` of a shadow request nobody answered in time.
SHADOW_WRITER = "fx-shadow"


@dataclass(frozen=True)
class ShadowPair:
    """A recorded request (at ``out_offset`` on the live ``.out``) and its shadow request."""

    out_offset: int
    live: EffectRequest
    shadow: EffectRequest

    @property
    def seq(self) -> int:
        return self.live.header.input_offset


def rebound_model(request: EffectRequest, spec: SpecRecord,
                  rebind: Mapping[str, str]) -> str | None:
    """The model the evaluation puts in place of ``request.model``: the new hash of the first
    name (sorted) that the step's binding maps to the request's model and the evaluation
    rebinds to another hash; None when the request names no such model."""
    if request.model is None:
        return None
    for name, model in sorted(spec.models_at(request.header.input_offset).items()):
        if model == request.model and name in rebind and rebind[name] != model:
            return rebind[name]
    return None


def shadow_request(request: EffectRequest, ev: ShadowEvalRecord, model: str) -> EffectRequest:
    """``request`` re-issued for evaluation ``ev`` with ``model``: the shadow header and the
    evaluation's deadline; everything else as recorded."""
    header = request.header.model_copy(update={"shadow": ev.eval_id})
    return request.model_copy(update={"header": header, "model": model,
                                      "deadline_ms": ev.deadline_ms})


def plan(log: WorkloadLog, ev: ShadowEvalRecord, *, from_seq: int | None = None,
         to_seq: int | None = None) -> list[ShadowPair]:
    """The recorded requests of steps ``from_seq``..``to_seq`` (default: the evaluation's range)
    that name a model the evaluation rebinds, in ``.out`` order, with their shadow requests. The
    spec of each is the one in force for its step (:meth:`WorkloadLog.spec_for_step`)."""
    lo = ev.from_seq if from_seq is None else from_seq
    hi = ev.to_seq if to_seq is None else to_seq
    specs = _Specs(log)
    pairs: list[ShadowPair] = []
    for slot, (offset, raw) in sorted(out_slots(log).items(), key=lambda kv: kv[1][0]):
        if slot[0] < lo or (hi is not None and slot[0] > hi):
            continue
        record = decode(raw)
        if not isinstance(record, EffectRequest) or record.header.shadow is not None:
            continue
        spec = specs(record.header.epoch, record.header.input_offset)
        model = rebound_model(record, spec, ev.models)
        if model is not None:
            pairs.append(ShadowPair(offset, record, shadow_request(record, ev, model)))
    return pairs


def answer_refs(resp: TopicView) -> list[tuple[tuple[str, int], ChunkRef | StreamRef]]:
    """The output references of the answers :func:`answers` picks, keyed ``("resp", offset)``:
    what the I/O shell reads for :func:`evaluate` (``resp_resolved``)."""
    return [(("resp", offset), r.output) for offset, r in answers(resp).values()
            if isinstance(r.output, ChunkRef | StreamRef)]


def answers(resp: TopicView) -> dict[str, tuple[int, ResponseRecord]]:
    """Per shadow effect id, the first answer on the evaluation's ``.resp`` that is not
    ``backpressure``, with its offset. Undecodable records and ``accepted`` are left out."""
    found: dict[str, tuple[int, ResponseRecord]] = {}
    for rec in resp:
        try:
            record = rec.decode(resp.topic)
        except LogGap:  # undecodable: not an answer, not a spec
            continue
        if (isinstance(record, ResponseRecord) and record.outcome != "backpressure"
                and record.effect_id not in found):
            found[record.effect_id] = (rec.offset, record)
    return found


# ------------------------------------------------------------------------------- output diffs


def _json_output(resp: ResponseRecord | None) -> Any:
    if resp is None or resp.outcome != "ok" or not isinstance(resp.output, InlineBody):
        return None
    return resp.output.data if resp.output.encoding == "json" else None


def output_diff(old: ResponseRecord | None, new: ResponseRecord | None) -> dict[str, Any]:
    """How two answers to the same question differ: ``outcome`` (old, new) always; for
    classifier outputs (``label``/``score``) the labels, scores and ``score_delta``; for LLM
    outputs (``output_tokens``/``text``) the first differing token position, how many positions
    differ and the texts; ``same`` when the outputs are equal."""
    out: dict[str, Any] = {"outcome": [None if old is None else old.outcome,
                                       None if new is None else new.outcome]}
    a, b = _json_output(old), _json_output(new)
    if old is not None and new is not None and old.outcome == new.outcome == "ok":
        out["same"] = (old.output == new.output)
    else:
        out["same"] = (old is not None and new is not None and old.outcome == new.outcome
                       and old.error == new.error)
    if isinstance(a, dict) and isinstance(b, dict):
        if "label" in a or "label" in b:
            out["label"] = [a.get("label"), b.get("label")]
            sa, sb = a.get("score"), b.get("score")
            if isinstance(sa, int | float) and isinstance(sb, int | float):
                out["score"] = [sa, sb]
                out["score_delta"] = round(float(sb) - float(sa), 6)
        if "output_tokens" in a or "output_tokens" in b:
            ta = list(a.get("output_tokens") or [])
            tb = list(b.get("output_tokens") or [])
            first = next((i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y),
                         None if len(ta) == len(tb) else min(len(ta), len(tb)))
            out["tokens"] = {"first_diff": first,
                             "differ": sum(1 for x, y in zip(ta, tb, strict=False) if x != y)
                             + abs(len(ta) - len(tb)),
                             "len": [len(ta), len(tb)]}
            out["text"] = [a.get("text"), b.get("text")]
    return out


# ---------------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class DecisionDiff:
    """A decision (an ``output`` record at slot ``seq``/``index``) that the fold computes
    differently under the shadow answers: the recorded and the shadow body, the top-level fields
    that differ, and ``renamed_only`` when the only difference is the model hash the decision
    names (old hash in place of the new one makes them equal)."""

    seq: int
    index: int
    out_offset: int | None
    recorded: Any
    shadow: Any
    fields: tuple[str, ...]
    renamed_only: bool
    #: ``output`` (a decision record) or ``request`` (a command not re-issued: its params)
    what: str = "output"

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "index": self.index, "out_offset": self.out_offset,
                "what": self.what, "recorded": self.recorded, "shadow": self.shadow,
                "fields": list(self.fields), "renamed_only": self.renamed_only}


def _body(record: Any) -> Any:
    if isinstance(record, OutputRecord) and isinstance(record.body, InlineBody):
        return record.body.data
    return None if record is None else encode(record).decode()


def _rename(value: Any, names: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return names.get(value, value)
    if isinstance(value, list):
        return [_rename(v, names) for v in value]
    if isinstance(value, dict):
        return {k: _rename(v, names) for k, v in value.items()}
    return value


def decision_diff(seq: int, index: int, out_offset: int | None, recorded: Any, shadow: Any,
                  renames: Mapping[str, str], what: str = "output") -> DecisionDiff | None:
    """The difference between a recorded decision body and the shadow one (None: equal).
    ``renames``: new model hash -> the recorded one it replaces."""
    if recorded == shadow:
        return None
    if isinstance(recorded, dict) and isinstance(shadow, dict):
        keys = sorted(set(recorded) | set(shadow))
        fields = tuple(k for k in keys if recorded.get(k, ...) != shadow.get(k, ...))
    else:
        fields = ()
    renamed = _rename(shadow, renames) == recorded
    return DecisionDiff(seq, index, out_offset, recorded, shadow, fields, renamed, what)


@dataclass
class FoldResult:
    """What :func:`fold` found: steps folded, decisions compared, the differing ones (in step
    order), and where (and why) the fold stopped early on a divergence of requests."""

    steps: int = 0
    decisions: int = 0
    differing: list[DecisionDiff] = field(default_factory=list)
    diverged_at: int | None = None
    divergence: str = ""
    last_seq: int | None = None


def modules_run(log: WorkloadLog, from_seq: int, to_seq: int | None) -> list[str]:
    """The modules that ran the delivered steps ``from_seq``..``to_seq`` (None: to the end), by
    the spec in force for each (:meth:`SpecRecord.module_at`), in step order without repeats. A
    spec that names a module no step in the range ran does not count."""
    specs = _Specs(log)
    found: dict[str, None] = {}
    for _o, r in _merge_records(log):
        if (isinstance(r, MergeEntry) and r.action == "deliver" and r.seq >= from_seq
                and (to_seq is None or r.seq <= to_seq)):
            found[specs(r.epoch, r.seq).module_at(r.seq)[0]] = None
    return list(found)


def fold(workload: Workload, log: WorkloadLog, ev: ShadowEvalRecord,
         shadow_answers: Mapping[str, ResponseRecord], *, to_seq: int,
         shadow_resolved: Mapping[str, bytes] | None = None,
         code: Code | None = None) -> FoldResult:
    """Run the workload's fold over steps ``ev.from_seq``..``to_seq`` of the recorded merge
    order with the shadow answers in place of the recorded ones (see the module docstring).

    ``shadow_answers``: live effect id -> the shadow answer to its re-issued request;
    ``shadow_resolved``: live effect id -> the bytes its shadow answer's output reference names
    (read by the I/O shell, as the holder reads a live answer's). Raises
    :class:`~fx_kafka.workload_log.LogGap` when a record the fold needs is gone.

    ``code``: the recorded code of each step (:class:`~workload_sdk._code.Code`); the steps
    before ``ev.from_seq`` run it, and so do the evaluated ones unless ``ev.module_hash`` is
    set, when ``workload`` (that module) runs them. None: ``workload`` runs every step."""
    result = FoldResult()
    candidate = workload if ev.module_hash is not None else None
    if ev.from_seq > 0:
        core = replay(workload, log, to_seq=ev.from_seq - 1, code=code).core
    else:
        core = Core.initial(candidate or first_workload(workload, code, log, _merge_records(log)),
                            log.workload_id)
    if candidate is not None:
        core.workload, core.code = candidate, None
    else:
        core.code = code
    # the shadow fold's requests may differ from the recorded ones (that is what it measures):
    # the recorded answers stand for them, whichever request they name
    core.bind_answers = False
    if core.seq != ev.from_seq:
        result.diverged_at = ev.from_seq
        result.divergence = (f"the log holds only {core.seq} steps: nothing to fold from step "
                             f"{ev.from_seq}")
        return result
    recorded = out_slots(log)
    specs = _Specs(log)
    renames = {new: old for old, new in _renames(log, ev).items()}
    items = [(o, r) for o, r in _merge_records(log) if isinstance(r, MergeEntry)]
    start = next((i for i, (_, r) in enumerate(items) if r.seq >= ev.from_seq), len(items))
    for _offset, record in items[start:]:
        if record.seq > to_seq:
            break
        eid = record.effect_id
        if eid is not None and eid in shadow_answers and record.action != "deliver":
            continue  # the recorded bookkeeping of a re-issued request (accepted, late answers)
        item = recorded_skip(_item(log, record), record)
        substituted = eid is not None and eid in shadow_answers and record.action == "deliver"
        if substituted and eid is not None:
            answer = shadow_answers[eid]
            live_resp = item.record
            assert isinstance(live_resp, ResponseRecord)
            # the answer to the re-issued request stands for the live one
            item = Item(item.source, item.offset, item.time_ms, answer.model_copy(
                update={"effect_id": eid, "header": live_resp.header}),
                (shadow_resolved or {}).get(eid))
        decision = core.classify(item, None if substituted else specs(record.epoch, core.seq))
        input_step = decision.action == "deliver" and record.source == "in"
        if (decision.action, decision.reason) != (record.action, record.reason) and not (
                input_step and record.reason == "quarantined"):
            result.diverged_at = record.seq
            result.divergence = (f"at step {record.seq} the log recorded {record.action}/"
                                 f"{record.reason or '-'} for {record.source}@"
                                 f"{record.source_offset}, the shadow fold decides "
                                 f"{decision.action}/{decision.reason or '-'}")
            return result
        # the live answers' trust was judged by the live fold (recorded above); a shadow's own
        # answers are re-issued under other effect ids, so the spec's signature policy is not
        # asked of them again
        spec = shadow_spec(specs(record.epoch, core.seq), ev.models).model_copy(
            update={"unsigned": "count", "signers": {}})
        try:
            applied = core.apply(item, epoch=record.epoch, spec=spec)
        except WorkloadError as exc:
            result.diverged_at = record.seq
            result.divergence = f"the step raised under the shadow answers: {exc}"
            return result
        differs = _skip_differs(record, applied)
        if differs is not None:
            result.diverged_at = record.seq
            result.divergence = differs
            return result
        if applied.decision.action != "deliver":
            continue
        result.steps += 1
        result.last_seq = record.seq
        new_slots = {out.header.slot: out for out in applied.outputs}
        old_slots = {s: v for s, v in recorded.items() if s[0] == record.seq}
        for slot in sorted(set(new_slots) | set(old_slots)):
            new = new_slots.get(slot)
            old = old_slots.get(slot)
            old_rec = None if old is None else decode(old[1])
            if isinstance(new, EffectRequest) or isinstance(old_rec, EffectRequest):
                if not isinstance(new, EffectRequest) or not isinstance(old_rec, EffectRequest):
                    result.diverged_at = slot[0]
                    result.divergence = (
                        f"at step {slot[0]} index {slot[1]} the "
                        f"{'shadow fold' if isinstance(new, EffectRequest) else 'log'} has a "
                        "request and the other side has none: the fold stops here")
                    return result
                reissued = old_rec.effect_id in shadow_answers
                model = rebound_model(old_rec, specs(old_rec.header.epoch, slot[0]), ev.models)
                expected = (old_rec if model is None
                            else old_rec.model_copy(update={"model": model}))
                if encode(new) == encode(expected):
                    if not reissued:
                        result.decisions += 1  # a command, the same as recorded
                    continue
                if (reissued or model is not None or new.effect_kind != old_rec.effect_kind
                        or new.model != old_rec.model):
                    result.diverged_at = slot[0]
                    result.divergence = (
                        f"the shadow fold's request at step {slot[0]} index {slot[1]} is not "
                        "the recorded one with the model rebound: no shadow answer exists for "
                        "it, so the fold stops here")
                    return result
                # a command (not re-issued) with other params: a differing decision, answered
                # as the recorded one was
                result.decisions += 1
                diff = decision_diff(slot[0], slot[1], old[0] if old else None,
                                     {"effect_kind": old_rec.effect_kind, **old_rec.params},
                                     {"effect_kind": new.effect_kind, **new.params}, renames,
                                     what="request")
                if diff is not None:
                    result.differing.append(diff)
                continue
            result.decisions += 1
            diff = decision_diff(slot[0], slot[1], None if old is None else old[0],
                                 _body(old_rec), _body(new), renames)
            if diff is not None:
                result.differing.append(diff)
    return result


def _renames(log: WorkloadLog, ev: ShadowEvalRecord) -> dict[str, str]:
    """old hash -> new hash for every rebound name, over every spec on the log."""
    out: dict[str, str] = {}
    for rec in log["spec"]:
        try:
            spec = rec.decode(log["spec"].topic)
        except LogGap:  # undecodable: not an answer, not a spec
            continue
        if not isinstance(spec, SpecRecord):
            continue
        bindings = [spec.models, *(sw.models for sw in spec.binding_switches)]
        for models in bindings:
            for name, model in models.items():
                if name in ev.models and ev.models[name] != model:
                    out[model] = ev.models[name]
    return out


# ---------------------------------------------------------------------------------- the report


def _live_answers(log: WorkloadLog, ids: Iterable[str]) -> dict[str, ResponseRecord]:
    """Per live effect id among ``ids``: the answer the merge log delivered, else the first
    non-backpressure answer on ``.resp``."""
    wanted = set(ids)
    delivered: dict[str, ResponseRecord] = {}
    for _o, record in _merge_records(log):
        if (isinstance(record, MergeEntry) and record.action == "deliver"
                and record.effect_id in wanted and record.source == "resp"):
            r = log["resp"].get(record.source_offset)
            if isinstance(r, ResponseRecord):
                delivered.setdefault(record.effect_id, r)
    for rec in log["resp"]:
        try:
            r = rec.decode(log["resp"].topic)
        except LogGap:  # undecodable: not an answer, not a spec
            continue
        if (isinstance(r, ResponseRecord) and r.effect_id in wanted
                and r.outcome != "backpressure"):
            delivered.setdefault(r.effect_id, r)
    return delivered


def request_diffs(log: WorkloadLog, pairs: Iterable[ShadowPair],
                  found: Mapping[str, tuple[int, ResponseRecord]]) -> list[dict[str, Any]]:
    """Per re-issued request, in ``.out`` order: its step, index, ids, where its shadow answer is,
    and :func:`output_diff` of the recorded answer and the shadow one."""
    pairs = list(pairs)
    live = _live_answers(log, (p.live.effect_id for p in pairs))
    rows = []
    for p in pairs:
        shadow = found.get(p.shadow.effect_id)
        rows.append({"seq": p.seq, "index": p.live.header.index, "effect_id": p.live.effect_id,
                     "shadow_id": p.shadow.effect_id,
                     "shadow_resp_offset": None if shadow is None else shadow[0],
                     "models": [p.live.model, p.shadow.model],
                     **output_diff(live.get(p.live.effect_id),
                                   None if shadow is None else shadow[1])})
    return rows


def evaluate(workload: Workload, log: WorkloadLog, ev: ShadowEvalRecord, *,
             out_view: TopicView, resp_view: TopicView, to_seq: int,
             topics_of: Mapping[str, str],
             resp_resolved: Mapping[int, bytes] | None = None,
             code: Code | None = None) -> dict[str, Any]:
    """The full report of evaluation ``ev`` over steps ``ev.from_seq``..``to_seq``, from the
    records alone (the live log; the evaluation's ``.out`` and ``.resp`` views), each read up to
    its end (``ends`` in the report: the offsets to cut at when the report is computed again).
    Deterministic: the same records give the same dict, and ``report_hash`` is ``sha256:`` of
    its canonical JSON without that field. ``topics_of``: the evaluation's topic names;
    ``resp_resolved``: by offset on the evaluation's ``.resp``, the bytes an answer's output
    reference names (:func:`answer_refs`)."""
    ends = {name: view.end for name, view in sorted(log.views.items())}
    ends["shadow.out"], ends["shadow.resp"] = out_view.end, resp_view.end
    pairs = plan(log, ev, to_seq=to_seq)
    issued: dict[str, int] = {}
    for rec in out_view:
        try:
            r = rec.decode(out_view.topic)
        except LogGap:  # undecodable: not an answer, not a spec
            continue
        if isinstance(r, EffectRequest):
            issued.setdefault(r.effect_id, rec.offset)
    found = answers(resp_view)
    by_live = {p.live.effect_id: found[p.shadow.effect_id][1] for p in pairs
               if p.shadow.effect_id in found}
    resolved = resp_resolved or {}
    live_resolved = {p.live.effect_id: resolved[found[p.shadow.effect_id][0]] for p in pairs
                     if p.shadow.effect_id in found and found[p.shadow.effect_id][0] in resolved}
    missing = [p.shadow.effect_id for p in pairs if p.shadow.effect_id not in found]
    rows = request_diffs(log, pairs, found)
    outcomes: dict[str, int] = {}
    for _eid, (_o, r) in sorted(found.items()):
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    folded = FoldResult(diverged_at=ev.from_seq, divergence="not every re-issued request has "
                        f"an answer ({len(missing)} missing)") if missing else fold(
        workload, log, ev, by_live, to_seq=to_seq, shadow_resolved=live_resolved, code=code)
    substantive = [d for d in folded.differing if not d.renamed_only]
    report: dict[str, Any] = {
        "eval_id": ev.eval_id, "workload_id": ev.workload_id, "mode": ev.mode,
        "models": dict(ev.models), "from_seq": ev.from_seq, "to_seq": to_seq,
        **({} if ev.module_hash is None else {"module": {"module_hash": ev.module_hash,
                                                         "workload_class": ev.workload_class}}),
        "topics": dict(topics_of), "ends": ends,
        "requests": len(pairs),
        "requests_written": sum(1 for p in pairs if p.shadow.effect_id in issued),
        "answered": len(pairs) - len(missing), "missing": missing[:50],
        "shadow_outcomes": outcomes,
        "outputs_differ": sum(1 for r in rows if not r["same"]),
        "label_changes": sum(1 for r in rows if "label" in r and r["label"][0] != r["label"][1]),
        "steps": folded.steps, "last_seq": folded.last_seq,
        "decisions": folded.decisions,
        "decisions_differ": len(substantive),
        "decisions_renamed_only": len(folded.differing) - len(substantive),
        "first_differing": substantive[0].as_dict() if substantive else None,
        "differing": [d.as_dict() for d in substantive],
        "requests_diverged_at": folded.diverged_at,
        "divergence": folded.divergence,
        "per_request": rows,
    }
    report["report_hash"] = content_hash(report)
    return report


def cut_view(view: TopicView, end: int) -> TopicView:
    """``view`` without the records at or above ``end``: the topic as it was when an
    evaluation's report was written (records appended later, a late answer, the workload's next
    steps, never change a report that is shown again)."""
    cut = TopicView(topic=view.topic, start=view.start, end=min(view.end, end))
    cut.records = {o: r for o, r in view.records.items() if o < end}
    return cut


def cut_log(log: WorkloadLog, ends: Mapping[str, int]) -> WorkloadLog:
    """``log`` with each stream named in ``ends`` cut there (:func:`cut_view`)."""
    views = {name: cut_view(v, ends[name]) if name in ends else v
             for name, v in log.views.items()}
    return WorkloadLog(workload_id=log.workload_id, views=views, facts=list(log.facts),
                       resolved=log.resolved, unresolved=log.unresolved)
