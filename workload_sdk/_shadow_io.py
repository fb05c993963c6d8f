"""Shadow evaluation, the I/O shell: ``fx shadow`` over history and live traffic, and
``fx shadow show``. The decisions (what to re-issue, the fold, the diff) are
:mod:`workload_sdk._shadow`; this module reads and writes the records.

Everything an evaluation writes goes to its own topics, ``wl.<id>.shadow.<eval>.eval/.out/.resp``
(:func:`broker_schema.topics.shadow_stream`): the definition (``shadow_eval``) and the result
(``shadow_report``) on ``.eval``, the shadow requests on ``.out``, the executors' answers (and
the ``timeout`` this shell writes for a request nobody answered) on ``.resp``. Nothing is written
to the live workload's streams, and the live holder never reads these.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import TopicPartition

from broker_schema import (
    AcceptedRecord,
    DecodeError,
    EffectRequest,
    MergeEntry,
    ModelName,
    ResponseRecord,
    ShadowEvalRecord,
    ShadowReportRecord,
    SpecRecord,
    decode,
    encode,
    topics,
)
from broker_schema.canonical import hex_of_hash, is_hash
from fx_kafka.client import make_consumer, make_producer
from fx_kafka.workload import ensure_shadow_topics
from fx_kafka.workload_log import LogGap, TopicView, WorkloadLog, read_facts, read_topic
from workload_sdk._api import Workload, module_hash
from workload_sdk._code import Code
from workload_sdk._kafka_io import read_workload_log
from workload_sdk._module_store import read_modules
from workload_sdk._refs_io import RefResolver
from workload_sdk._replay import _Specs
from workload_sdk._shadow import (
    SHADOW_WRITER,
    answer_refs,
    cut_log,
    cut_view,
    evaluate,
    modules_run,
    plan,
    rebound_model,
    shadow_request,
)

__all__ = ["ShadowError", "find_workload", "run_history", "run_live", "show"]

log = logging.getLogger("workload_sdk.shadow")

Progress = Callable[[str], None]


class ShadowError(Exception):
    """An evaluation that cannot be run or shown as asked (a clear message, exit 2)."""


def _who() -> str:
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"[:200]
    except (KeyError, OSError):
        return "unknown"


def default_eval_id(rebind: Mapping[str, str], suffix: str, module: str | None = None) -> str:
    """``<name>-<first 8 hex of the new hash>-<suffix>`` for the first rebound name
    (``module-<first 8 hex of its hash>-<suffix>`` for a module change without one)."""
    name, new = sorted(rebind.items())[0] if rebind else ("module", module or "")
    safe = "".join(c if c.isalnum() or c in "_-" else "-" for c in name)
    return topics.check_eval_id(f"{safe}-{hex_of_hash(new)[:8]}-{suffix}"[:120])


def _last_step(log_: WorkloadLog) -> int:
    """The last step the merge log delivered (-1: none)."""
    last = -1
    for rec in log_["merge"]:
        try:
            r = decode(rec.value)
        except DecodeError:
            continue
        if isinstance(r, MergeEntry) and r.action == "deliver":
            last = max(last, r.seq)
    return last


def _module_change(workload: Workload, live: WorkloadLog, lo: int, hi: int | None
                   ) -> tuple[str, str] | None:
    """``(module hash, class)`` of ``workload`` when it is a module change for steps
    ``lo``..``hi`` (None: to the end): its code is not the code that ran them (:func:`
    modules_run`; for steps not taken yet, the latest spec's module from ``lo``). None: the
    code at hand ran them, so the evaluation rebinds models only. A module a spec named but no
    step ran is never compared."""
    mine = module_hash(workload)
    ran = modules_run(live, lo, hi)
    if not ran:
        specs = [r for r in (_decoded_or_none(rec.value) for rec in live["spec"])
                 if isinstance(r, SpecRecord)]
        ran = [specs[-1].module_at(lo)[0]] if specs else []
    return None if mine in ran else (mine, type(workload).__name__)


async def _code(bootstrap: str, workload: Workload, live: WorkloadLog,
                ev: ShadowEvalRecord, to_seq: int | None) -> Code:
    """The recorded code of the steps the evaluation folds with it (the steps before
    ``ev.from_seq``, and the evaluated ones unless it shadows a module change): ``workload``
    and the module store; ``ShadowError`` when some of it cannot be had, or when ``workload``
    is not the module change the evaluation recorded."""
    mine = module_hash(workload)
    if ev.module_hash is not None and mine != ev.module_hash:
        raise ShadowError(f"evaluation {ev.eval_id} shadows module {ev.module_hash} "
                          f"({ev.workload_class}); --module hashes to {mine}")
    code = Code(workload, await read_modules(bootstrap))
    wanted = modules_run(live, 0, ev.from_seq - 1) if ev.from_seq > 0 else []
    if ev.module_hash is None:
        wanted += modules_run(live, ev.from_seq, to_seq)
    absent = [m for m in dict.fromkeys(wanted) if not code.has(m)]
    if absent:
        raise ShadowError(f"the steps the evaluation folds with the recorded code ran module "
                          f"{', '.join(absent)}, which is neither --module ({mine}) nor in the "
                          f"module store {topics.MODULES} (fx workload deploy stores code; or "
                          "pass that code as --module)")
    return code


async def _check_present(bootstrap: str, names: list[str], what: str) -> None:
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        present = await consumer.topics()
    finally:
        await consumer.stop()
    absent = [n for n in names if n not in present]
    if absent:
        raise ShadowError(f"no {what} on this broker: no topic {', '.join(absent)}")


async def _check_models_held(bootstrap: str, rebind: Mapping[str, str]) -> None:
    facts = await read_facts(bootstrap)
    held = {m for f in facts for m in f.models_present}
    absent = sorted(set(rebind.values()) - held)
    if absent:
        raise ShadowError(f"no executor on {topics.FACTS} holds {', '.join(absent)} (import it "
                          "with fx models import on an executor node, and let it publish its "
                          "facts)")


async def find_workload(bootstrap: str, eval_id: str) -> str:
    """The workload whose evaluation ``eval_id`` is (by its ``.eval`` topic)."""
    topics.check_eval_id(eval_id)
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        present = await consumer.topics()
    finally:
        await consumer.stop()
    found = []
    for name in present:
        try:
            wid, eid, stream = topics.parse_shadow(name)
        except ValueError:
            continue
        if eid == eval_id and stream == "eval":
            found.append(wid)
    if not found:
        raise ShadowError(f"no shadow evaluation {eval_id!r} on this broker")
    if len(found) > 1:
        raise ShadowError(f"evaluation {eval_id!r} exists for several workloads "
                          f"({', '.join(sorted(found))}): give --workload")
    return found[0]


async def _read_eval(bootstrap: str, wid: str, eval_id: str
                     ) -> tuple[ShadowEvalRecord | None, ShadowReportRecord | None]:
    view = await read_topic(bootstrap, topics.shadow_stream(wid, eval_id, "eval"))
    definition: ShadowEvalRecord | None = None
    report: ShadowReportRecord | None = None
    for rec in view:
        try:
            r = decode(rec.value)
        except DecodeError:
            continue
        if isinstance(r, ShadowEvalRecord) and definition is None:
            definition = r
        elif isinstance(r, ShadowReportRecord):
            report = r
    return definition, report


def _same_definition(a: ShadowEvalRecord, b: ShadowEvalRecord) -> bool:
    keep = {"created_ms", "created_by", "model_names"}  # names are for people
    return a.model_dump(exclude=keep) == b.model_dump(exclude=keep)


# ------------------------------------------------------------------------------------ issuing


@dataclass
class _Inflight:
    request: EffectRequest
    offset: int = -1
    sent_ms: int = 0
    accepted_until_ms: int | None = None
    resend_at: float | None = None
    backoff_s: float = 0.1


@dataclass
class _Issuer:
    """Writes shadow requests to the evaluation's ``.out`` with at most ``outstanding`` waiting
    for an answer, reads ``.resp``, sends a request again after ``backpressure`` (100 ms,
    doubling to 5 s), and writes ``timeout`` (``written_by`` ``fx-shadow``) for one that nobody
    accepted by its deadline or whose accept lapsed (the executor's lease renewals keep a long
    request alive)."""

    bootstrap: str
    wid: str
    eval_id: str
    outstanding: int
    progress: Progress
    queue: list[EffectRequest] = field(default_factory=list)
    inflight: dict[str, _Inflight] = field(default_factory=dict)
    answered: dict[str, str] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)
    total: int = 0
    _producer: Any = None
    _consumer: Any = None

    @property
    def out_topic(self) -> str:
        return topics.shadow_stream(self.wid, self.eval_id, "out")

    @property
    def resp_topic(self) -> str:
        return topics.shadow_stream(self.wid, self.eval_id, "resp")

    async def start(self) -> None:
        # what an earlier run of the same evaluation wrote: not written again
        out = await read_topic(self.bootstrap, self.out_topic)
        for rec in out:
            try:
                r = decode(rec.value)
            except DecodeError:
                continue
            if isinstance(r, EffectRequest):
                self.written.setdefault(r.effect_id, rec.offset)
        self._producer = make_producer(self.bootstrap)
        await self._producer.start()
        self._consumer = make_consumer(self.bootstrap, enable_auto_commit=False)
        await self._consumer.start()
        self._consumer.assign([TopicPartition(self.resp_topic, 0)])
        await self._consumer.seek_to_beginning(TopicPartition(self.resp_topic, 0))

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
        if self._consumer is not None:
            await self._consumer.stop()

    def add(self, requests: list[EffectRequest]) -> None:
        known = set(self.answered) | set(self.inflight) | {r.effect_id for r in self.queue}
        for r in requests:
            if r.effect_id not in known:
                known.add(r.effect_id)
                self.queue.append(r)
                self.total += 1

    async def _send(self, job: _Inflight) -> None:
        meta = await self._producer.send_and_wait(self.out_topic, encode(job.request),
                                                  key=job.request.effect_id.encode())
        job.offset, job.sent_ms = meta.offset, meta.timestamp
        self.written.setdefault(job.request.effect_id, meta.offset)
        job.resend_at = None

    async def _fill(self) -> None:
        while self.queue and len(self.inflight) < self.outstanding:
            req = self.queue.pop(0)
            job = _Inflight(req)
            self.inflight[req.effect_id] = job
            if req.effect_id in self.written:  # written by an earlier run: wait for its answer
                job.offset, job.sent_ms = self.written[req.effect_id], int(time.time() * 1000)
                continue
            await self._send(job)

    def _on(self, value: bytes) -> None:
        try:
            r = decode(value)
        except DecodeError:
            return
        job = self.inflight.get(getattr(r, "effect_id", ""))
        if isinstance(r, ResponseRecord) and r.effect_id not in self.answered:
            if r.outcome == "backpressure":
                if job is not None:
                    job.resend_at = time.monotonic() + job.backoff_s
                    job.backoff_s = min(5.0, job.backoff_s * 2)
                return
            self.answered[r.effect_id] = r.outcome
            self.inflight.pop(r.effect_id, None)
        elif job is not None and isinstance(r, AcceptedRecord):
            job.accepted_until_ms = int(time.time() * 1000) + r.lease_ms

    async def _timeouts(self) -> None:
        now = int(time.time() * 1000)
        for eid, job in list(self.inflight.items()):
            if job.resend_at is not None:
                if time.monotonic() >= job.resend_at:
                    await self._send(job)
                continue
            due = (job.accepted_until_ms if job.accepted_until_ms is not None
                   else job.sent_ms + job.request.deadline_ms)
            if job.sent_ms and now > due + 1000:
                rec = ResponseRecord(effect_id=eid, header=job.request.header,
                                     request_offset=max(job.offset, 0), outcome="timeout",
                                     written_by=SHADOW_WRITER)
                await self._producer.send_and_wait(self.resp_topic, encode(rec),
                                                   key=eid.encode())
                job.accepted_until_ms = now + 60_000  # its own record answers it when read

    async def step(self, timeout_ms: int = 200) -> None:
        """One round: write what there is room for, read answers (waiting up to
        ``timeout_ms``), send again after backpressure, write the timeouts due."""
        await self._fill()
        batch = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=1000)
        for msgs in batch.values():
            for m in msgs:
                self._on(m.value)
        await self._timeouts()

    async def run(self, *, timeout_s: float) -> None:
        """Issue and collect until nothing is queued or in flight, or ``timeout_s`` passed
        (``ShadowError``)."""
        give_up = time.monotonic() + timeout_s
        shown = 0.0
        while True:
            await self.step()
            if time.monotonic() - shown > 2.0:
                shown = time.monotonic()
                self.progress(f"{len(self.answered)}/{self.total} answered, "
                              f"{len(self.inflight)} in flight, {len(self.queue)} queued")
            if not self.queue and not self.inflight:
                self.progress(f"{len(self.answered)}/{self.total} answered")
                return
            if time.monotonic() > give_up:
                raise ShadowError(f"{len(self.inflight) + len(self.queue)} shadow requests "
                                  f"still unanswered after {timeout_s:.0f} s (run the same "
                                  "command again to resume)")


# ------------------------------------------------------------------------------- the commands


async def _define(bootstrap: str, ev: ShadowEvalRecord, progress: Progress) -> ShadowEvalRecord:
    """Create the evaluation's topics and write its definition, or resume an evaluation of the
    same id with the same definition; ``ShadowError`` for the same id with another one."""
    names = await ensure_shadow_topics(bootstrap, ev.workload_id, ev.eval_id)
    existing, _report = await _read_eval(bootstrap, ev.workload_id, ev.eval_id)
    if existing is not None:
        if not _same_definition(existing, ev):
            raise ShadowError(f"evaluation {ev.eval_id} exists with another definition "
                              f"({existing.model_dump(exclude={'kind', 'v'})}): pick another "
                              "--eval-id")
        progress(f"resuming evaluation {ev.eval_id} (defined {existing.created_ms} by "
                 f"{existing.created_by})")
        return existing
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(names[0], encode(ev), key=ev.eval_id.encode())
    finally:
        await producer.stop()
    progress(f"evaluation {ev.eval_id}: topics {', '.join(names)}")
    return ev


async def _finish(bootstrap: str, workload: Workload, ev: ShadowEvalRecord, to_seq: int,
                  progress: Progress, code: Code
                  ) -> tuple[dict[str, Any], ShadowReportRecord]:
    """Read everything again, compute the report from the records and append its summary."""
    wid = ev.workload_id
    live = await read_workload_log(bootstrap, wid, with_facts=False)
    out_view, resp_view = await asyncio.gather(
        read_topic(bootstrap, topics.shadow_stream(wid, ev.eval_id, "out")),
        read_topic(bootstrap, topics.shadow_stream(wid, ev.eval_id, "resp")))
    progress(f"folding steps {ev.from_seq}..{to_seq} under the shadow answers")
    report = evaluate(workload, live, ev, out_view=out_view, resp_view=resp_view, to_seq=to_seq,
                      topics_of=_topics_of(wid, ev.eval_id),
                      resp_resolved=await _answers_resolved(bootstrap, live, resp_view),
                      code=code)
    record = _report_record(report)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topics.shadow_stream(wid, ev.eval_id, "eval"),
                                     encode(record), key=ev.eval_id.encode())
    finally:
        await producer.stop()
    return report, record


async def _answers_resolved(bootstrap: str, live: WorkloadLog,
                            resp_view: TopicView) -> dict[int, bytes]:
    """What the shadow answers' output references name (``sys.chunks``), by ``.resp`` offset:
    the fold reads them as the holder reads a live answer's."""
    wants = answer_refs(resp_view)
    if not wants:
        return {}
    specs = [r for r in (_decoded_or_none(rec.value) for rec in live["spec"])
             if isinstance(r, SpecRecord)]
    async with RefResolver(bootstrap) as resolver:
        res = await resolver.resolve(wants, workload=live.workload_id, specs=specs)
    return {offset: data for (_s, offset), data in res.resolved.items()}


def _decoded_or_none(value: bytes) -> Any:
    try:
        return decode(value)
    except DecodeError:
        return None


def _topics_of(wid: str, eval_id: str) -> dict[str, str]:
    return {s: topics.shadow_stream(wid, eval_id, s) for s in topics.SHADOW_STREAMS}


def _report_record(report: dict[str, Any]) -> ShadowReportRecord:
    first = report["first_differing"]
    return ShadowReportRecord(
        eval_id=report["eval_id"], workload_id=report["workload_id"],
        from_seq=report["from_seq"], to_seq=report["to_seq"], requests=report["requests"],
        answered=report["answered"], steps=report["steps"], decisions=report["decisions"],
        decisions_differ=report["decisions_differ"],
        first_differing_seq=None if first is None else first["seq"],
        requests_diverged_at=report["requests_diverged_at"], ends=report["ends"],
        report_hash=report["report_hash"], written_ms=int(time.time() * 1000))


def _check_rebind(rebind: Mapping[str, str], module: tuple[str, str] | None = None) -> None:
    if not rebind and module is None:
        raise ShadowError("give at least one --model NAME=HASH, or --module with code other "
                          "than the steps ran (a module change)")
    for name, h in rebind.items():
        if not is_hash(h):
            raise ShadowError(f"--model {name}={h}: not a sha256:<64 hex> model hash")


async def run_history(bootstrap: str, workload: Workload, wid: str, rebind: Mapping[str, str], *,
                      names: Mapping[str, ModelName] | None = None,
                      from_seq: int | None = None, to_seq: int | None = None,
                      eval_id: str | None = None, deadline_ms: int = 300_000,
                      outstanding: int = 32, timeout_s: float = 3600.0,
                      progress: Progress = lambda _m: None
                      ) -> tuple[dict[str, Any], ShadowReportRecord]:
    """Shadow the recorded requests of steps ``from_seq``..``to_seq`` (default: every step)
    with the models ``rebind`` names; returns the report and its summary record."""
    await _check_present(bootstrap, topics.all_topics(wid), f"workload {wid!r}")
    live = await read_workload_log(bootstrap, wid, with_facts=False)
    last = _last_step(live)
    if last < 0:
        raise ShadowError(f"workload {wid} has no step on its merge log yet")
    lo = 0 if from_seq is None else from_seq
    hi = last if to_seq is None else to_seq
    if not 0 <= lo <= hi:
        raise ShadowError(f"--from {lo} --to {hi}: not a range of steps")
    if hi > last:
        raise ShadowError(f"--to {hi}: the log has steps 0..{last}")
    change = _module_change(workload, live, lo, hi)
    _check_rebind(rebind, change)
    ev = ShadowEvalRecord(
        eval_id=eval_id or default_eval_id(rebind, f"{lo}-{hi}", change and change[0]),
        workload_id=wid, models=dict(rebind), mode="history", from_seq=lo, to_seq=hi,
        deadline_ms=deadline_ms, created_ms=int(time.time() * 1000), created_by=_who(),
        module_hash=change and change[0], workload_class=change and change[1],
        model_names=dict(names or {}))
    code = await _code(bootstrap, workload, live, ev, hi)
    pairs = plan(live, ev)
    if not pairs and change is None:
        raise ShadowError(f"no recorded request of steps {lo}..{hi} names a model bound to "
                          f"{', '.join(sorted(rebind))} (or every one is bound to the new hash "
                          "already)")
    await _check_models_held(bootstrap, rebind)
    ev = await _define(bootstrap, ev, progress)
    progress(f"re-issuing {len(pairs)} recorded requests of steps {lo}..{hi}")
    issuer = _Issuer(bootstrap, wid, ev.eval_id, outstanding, progress)
    await issuer.start()
    try:
        issuer.add([p.shadow for p in pairs])
        await issuer.run(timeout_s=timeout_s)
    finally:
        await issuer.close()
    return await _finish(bootstrap, workload, ev, hi, progress, code)


async def run_live(bootstrap: str, workload: Workload, wid: str, rebind: Mapping[str, str], *,
                   names: Mapping[str, ModelName] | None = None,
                   window_s: float, eval_id: str | None = None, deadline_ms: int = 300_000,
                   outstanding: int = 32, timeout_s: float = 3600.0,
                   progress: Progress = lambda _m: None
                   ) -> tuple[dict[str, Any], ShadowReportRecord]:
    """Shadow the live requests of the next ``window_s`` seconds: each request the holder writes
    that names a rebound model is re-issued as it appears; after the window, the steps taken
    in it are folded and diffed. Acted on by nothing."""
    if window_s <= 0:
        raise ShadowError("--window must be positive")
    await _check_present(bootstrap, topics.all_topics(wid), f"workload {wid!r}")
    live = await read_workload_log(bootstrap, wid, with_facts=False)
    start_seq = _last_step(live) + 1
    now = int(time.time() * 1000)
    change = _module_change(workload, live, start_seq, None)
    _check_rebind(rebind, change)
    ev = ShadowEvalRecord(
        eval_id=eval_id or default_eval_id(rebind, f"live-{now}", change and change[0]),
        workload_id=wid, models=dict(rebind), mode="live", from_seq=start_seq,
        window_ms=int(window_s * 1000), deadline_ms=deadline_ms, created_ms=now,
        created_by=_who(), module_hash=change and change[0],
        workload_class=change and change[1], model_names=dict(names or {}))
    code = await _code(bootstrap, workload, live, ev, None)
    await _check_models_held(bootstrap, rebind)
    ev = await _define(bootstrap, ev, progress)
    issuer = _Issuer(bootstrap, wid, ev.eval_id, outstanding, progress)
    await issuer.start()
    tail = make_consumer(bootstrap, enable_auto_commit=False)
    await tail.start()
    try:
        tp = TopicPartition(topics.out(wid), 0)
        tail.assign([tp])
        tail.seek(tp, live["out"].end)
        meta = WorkloadLog(workload_id=wid, views={"spec": live["spec"],
                                                   "claims": live["claims"]})
        specs = _Specs(meta)
        window_end = time.monotonic() + window_s
        progress(f"shadowing live requests from step {start_seq} for {window_s:.0f} s")
        while time.monotonic() < window_end:
            batch = await tail.getmany(timeout_ms=500, max_records=500)
            fresh: list[EffectRequest] = []
            for msgs in batch.values():
                for m in msgs:
                    try:
                        r = decode(m.value)
                    except DecodeError:
                        continue
                    if (isinstance(r, EffectRequest) and r.header.shadow is None
                            and r.header.input_offset >= start_seq):
                        fresh.append(r)
            for r in fresh:
                try:
                    spec = specs(r.header.epoch, r.header.input_offset)
                except LogGap:  # a claim or spec written after they were read: read again
                    meta.views["spec"], meta.views["claims"] = await asyncio.gather(
                        read_topic(bootstrap, topics.spec(wid)),
                        read_topic(bootstrap, topics.claims(wid)))
                    specs = _Specs(meta)
                    spec = specs(r.header.epoch, r.header.input_offset)
                model = rebound_model(r, spec, ev.models)
                if model is not None:
                    issuer.add([shadow_request(r, ev, model)])
            await issuer.step(timeout_ms=0)
        live = await read_workload_log(bootstrap, wid, with_facts=False)
        to_seq = _last_step(live)
        if to_seq < start_seq:
            raise ShadowError(f"the workload took no step in the {window_s:.0f} s window")
        # requests of steps in the window the tail had not seen yet
        issuer.add([p.shadow for p in plan(live, ev, to_seq=to_seq)])
        progress(f"window over: steps {start_seq}..{to_seq}; collecting the last answers")
        await issuer.run(timeout_s=timeout_s)
    finally:
        await tail.stop()
        await issuer.close()
    return await _finish(bootstrap, workload, ev, to_seq, progress, code)


async def show(bootstrap: str, workload: Workload, eval_id: str, wid: str | None = None
               ) -> tuple[dict[str, Any], ShadowReportRecord, bool]:
    """Recompute evaluation ``eval_id``'s report from its records, cut where the report was
    computed; returns the report, the recorded summary and whether the hashes agree."""
    if wid is None:
        wid = await find_workload(bootstrap, eval_id)
    ev, recorded = await _read_eval(bootstrap, wid, eval_id)
    if ev is None:
        raise ShadowError(f"{topics.shadow_stream(wid, eval_id, 'eval')} holds no definition")
    if recorded is None:
        raise ShadowError(f"evaluation {eval_id} has no report yet (it did not finish: run it "
                          "again to resume)")
    live = await read_workload_log(bootstrap, wid, with_facts=False)
    code = await _code(bootstrap, workload, live, ev, recorded.to_seq)
    ends = recorded.ends
    live = cut_log(live, {k: v for k, v in ends.items() if not k.startswith("shadow.")})
    out_view, resp_view = await asyncio.gather(
        read_topic(bootstrap, topics.shadow_stream(wid, eval_id, "out")),
        read_topic(bootstrap, topics.shadow_stream(wid, eval_id, "resp")))
    out_view = cut_view(out_view, ends.get("shadow.out", out_view.end))
    resp_view = cut_view(resp_view, ends.get("shadow.resp", resp_view.end))
    report = evaluate(workload, live, ev, out_view=out_view, resp_view=resp_view,
                      to_seq=recorded.to_seq, topics_of=_topics_of(wid, eval_id),
                      resp_resolved=await _answers_resolved(bootstrap, live, resp_view),
                      code=code)
    return report, recorded, report["report_hash"] == recorded.report_hash
