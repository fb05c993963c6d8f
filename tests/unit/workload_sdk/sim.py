"""A broker-free simulation of a workload's log, its lease holder and a misbehaving executor.

The simulated holder drives the same pure functions as the real one (``choose_next``,
``Core.apply``, ``due_outcomes``, ``holder_outcome``, ``replay`` on resume) over an in-memory
:class:`WorkloadLog` whose records get offsets (with a gap after each transaction, like Kafka's
commit markers) and append times from a simulated clock. The executor side writes ``accepted``
and responses by hand: late, twice, for effects that never existed.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from broker_schema import (
    INFERENCE_KIND,
    AcceptedRecord,
    Body,
    ChunkRef,
    ClaimRecord,
    EffectHeader,
    EffectRequest,
    ErrorInfo,
    ExecutorInfo,
    FactsRecord,
    InlineBody,
    InputRecord,
    KindServed,
    ResponseRecord,
    Signature,
    SnapshotRecord,
    SpecRecord,
    TickRecord,
    decode,
    encode,
    record_hash,
    sha256_hex,
)
from broker_schema.chunks import chunk_ref_of
from broker_schema.streams import SourceRecord
from fx_kafka.workload_log import LogRecord
from workload_sdk import (
    EffectResult,
    InputEvent,
    Output,
    State,
    Workload,
    WorkloadLog,
    emit,
    infer,
)
from workload_sdk._core import Core, Item
from workload_sdk._replay import missing_outputs, replay
from workload_sdk._round import merge_batch, outcomes_due, tick_due

MODEL = "sha256:" + "ab" * 32
MODEL2 = "sha256:" + "cd" * 32
WID = "sim-1"


class Asker(Workload):
    """Asks the model once per input whose value is odd; retries a timeout once; records every
    answer it sees (so a test can check it saw exactly one per effect id)."""

    def initial_state(self) -> State:
        return {"sum": 0, "seen": [], "retried": []}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        if isinstance(event, InputEvent):
            value = int(event.json())
            new = dict(state, sum=state["sum"] + value)
            outs: list[Output] = [emit({"sum": new["sum"], "t": event.time_ms})]
            if value % 2:
                outs.append(infer(model="m", params={"v": value}, input=value, deadline_ms=50))
            return new, outs
        new = dict(state, seen=[*state["seen"], [event.effect_id, event.outcome]])
        outs = [emit({"answer": event.effect_id, "outcome": event.outcome,
                      "out": event.json() if event.ok else None})]
        if event.outcome == "timeout" and f"{event.input_offset}/{event.index}" not in state[
                "retried"]:
            new["retried"] = [*state["retried"], f"{event.seq}/1"]
            outs.append(infer(model="m", params={"retry_of": event.effect_id}, deadline_ms=50))
        return new, outs


def make_spec(*, limit: int = 4, snapshot_every: int = 3) -> SpecRecord:
    """The simulated workload's spec."""
    from workload_sdk import module_hash

    return SpecRecord(workload_id=WID, module_hash=module_hash(Asker), effect_kinds=(
        INFERENCE_KIND,), models={"m": MODEL, "m2": MODEL2}, outstanding_limit=limit,
        deadline_default_ms=50, executor_lease_ms=100, snapshot_every=snapshot_every)


@dataclass
class Sim:
    """The log, the clock, and the current holder."""

    spec: SpecRecord
    workload: Workload = field(default_factory=Asker)
    log: WorkloadLog = field(default_factory=lambda: WorkloadLog.empty(WID))
    now: int = 1_000
    holder: SimHolder | None = None
    epochs: int = 0
    #: Signs ``ok`` responses when set (Ed25519, as an executor does).
    key: Ed25519PrivateKey | None = None
    #: The workload's chunk store (hash -> bytes): what the holder stored (big snapshots) and
    #: what :meth:`put_chunk` put.
    chunks: dict[str, bytes] = field(default_factory=dict)
    #: Which code runs each step (``workload_sdk._code.Code``, for a spec with module
    #: switches); None: ``workload`` runs every step.
    code: Any = None

    def append(self, stream: str, record: Any, *, txn_gap: bool = False) -> int:
        view = self.log[stream]
        offset = view.end
        view.add(LogRecord(offset, self.now, encode(record)))
        if txn_gap:
            view.end += 1  # the commit marker takes an offset
        return offset

    def write_txn(self, items: list[tuple[str, Any]]) -> list[int]:
        offsets = [self.append(stream, rec) for stream, rec in items]
        for stream in {s for s, _ in items}:
            self.log[stream].end += 1
        return offsets

    def start(self) -> None:
        if not len(self.log["spec"]):
            self.append("spec", self.spec)
        self.epochs += 1
        claim = ClaimRecord(workload_id=WID, epoch=self.epochs, holder_id=f"h{self.epochs}",
                            spec_hash=record_hash(self.spec), spec_offset=0)
        self.write_txn([("claims", claim)])
        self.holder = SimHolder(self, self.epochs)

    # -- the outside world -------------------------------------------------------------------
    def input(self, value: int) -> None:
        self.append("in", InputRecord(workload_id=WID, body=InlineBody.of_json(value)))

    def put_chunk(self, data: bytes) -> ChunkRef:
        """Store ``data`` in the workload's chunk store; its reference."""
        ref = chunk_ref_of(data)
        self.chunks[ref.hash] = data
        return ref

    def input_body(self, body: Body) -> int:
        """An input with ``body``; a chunk reference to a stored chunk comes with its bytes, as
        the log readers resolve it (``log.resolved``)."""
        offset = self.append("in", InputRecord(workload_id=WID, body=body))
        if isinstance(body, ChunkRef) and body.hash in self.chunks:
            self.log.resolved[("in", offset)] = self.chunks[body.hash]
        return offset

    def requests(self) -> list[tuple[int, EffectRequest]]:
        out = []
        for rec in self.log["out"]:
            record = decode(rec.value)
            if isinstance(record, EffectRequest):
                out.append((rec.offset, record))
        return out

    def accept(self, pick: int, lease_ms: int = 100) -> None:
        reqs = self.requests()
        if not reqs:
            return
        offset, req = reqs[pick % len(reqs)]
        self.append("resp", AcceptedRecord(effect_id=req.effect_id, header=req.header,
                                           request_offset=offset, node_id="exec-1",
                                           lease_ms=lease_ms, accepted_us=self.now * 1000))

    def answer(self, pick: int, outcome: str) -> None:
        reqs = self.requests()
        if not reqs:
            return
        offset, req = reqs[pick % len(reqs)]
        kw: dict[str, Any] = {}
        if outcome == "ok":
            kw = {"output": InlineBody.of_json({"echo": req.params}), "model_hash": req.model}
        elif outcome == "error":
            kw = {"error": ErrorInfo(code="engine_error", message="boom")}
        resp = ResponseRecord(effect_id=req.effect_id, header=req.header,
                              request_offset=offset, outcome=outcome,  # type: ignore[arg-type]
                              written_by="exec-1", **kw)
        if self.key is not None and outcome == "ok":
            resp = sign(resp, self.key)
        self.append("resp", resp)

    def stray(self) -> None:
        header = EffectHeader(workload_id=WID, input_offset=10**6, index=0, epoch=1)
        self.append("resp", ResponseRecord(effect_id=header.effect_id, header=header,
                                           request_offset=0, outcome="ok",
                                           output=InlineBody.of_json(None), written_by="x"))


def key_id(key: Ed25519PrivateKey) -> str:
    """The key id of ``key``: the sha256 of its raw public key."""
    return sha256_hex(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def sign(resp: ResponseRecord, key: Ed25519PrivateKey) -> ResponseRecord:
    """``resp`` with an executor block and an Ed25519 signature over its signing bytes."""
    resp = resp.model_copy(update={"executor": ExecutorInfo(
        node_id="exec-1", engine="sim", engine_version="0", device_class="cpu")})
    sig = key.sign(resp.signing_bytes())
    return resp.model_copy(update={"signature": Signature(
        key_id=key_id(key), value=base64.b64encode(sig).decode())})


def facts_for(key: Ed25519PrivateKey) -> FactsRecord:
    """The facts record an executor publishes with ``key``'s public half (DER, base64)."""
    der = key.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return FactsRecord(node_id="exec-1", kinds=(KindServed(kind=INFERENCE_KIND, queue_limit=8),),
                       public_key=base64.b64encode(der).decode(), key_id=key_id(key),
                       updated_us=1)


class SimHolder:
    """The lease holder's loop over the simulated log (same pure functions as the real one)."""

    def __init__(self, sim: Sim, epoch: int) -> None:
        self.sim = sim
        self.epoch = epoch
        result = replay(sim.workload, sim.log, code=sim.code)
        self.core: Core = result.core
        missing = missing_outputs(result, sim.log)
        if missing:
            sim.write_txn([("out", o) for o in missing])
        self.fetch = dict(self.core.positions)
        self.bufs: dict[str, deque[Item]] = {"in": deque(), "resp": deque()}
        self.now_resp: int | None = None
        self.written: set[str] = set()
        self.tick_pending = False
        self.requests: dict[str, tuple[int, int]] = {}
        for offset, req in sim.requests():
            self.requests[req.effect_id] = (offset, sim.log["out"].records[offset].time_ms)

    def _fetch(self) -> None:
        for source in ("in", "resp"):
            view = self.sim.log[source]
            for offset in range(self.fetch[source], view.end):
                rec = view.records.get(offset)
                if rec is not None:
                    record = decode(rec.value)
                    assert isinstance(record, SourceRecord)
                    # the real holder reads what a reference names here (workload_sdk._refs_io);
                    # the simulated log holds those bytes already (Sim.input_body)
                    self.bufs[source].append(Item(source, offset, rec.time_ms,  # type: ignore[arg-type]
                                                  record, self.sim.log.resolved.get(
                                                      (source, offset))))
            self.fetch[source] = view.end

    def pump(self) -> None:
        """Fetch what is on the log, merge it, judge deadlines, tick when needed: the live
        holder's decisions (:mod:`workload_sdk._round`), over the simulated log."""
        sim, core, spec = self.sim, self.core, self.sim.spec
        self._fetch()
        batch = merge_batch(core, spec, self.bufs, epoch=self.epoch, now_resp_ms=self.now_resp,
                            max_batch=10**9)
        self.now_resp = batch.now_resp_ms
        if batch.tick_merged:
            self.tick_pending = False
        if batch.failure is not None:
            raise batch.failure
        chunks = {ref.hash: data for ref, data in batch.chunks}
        sim.chunks.update(chunks)  # stored before the transaction, as the holder does
        if batch.records:
            offsets = sim.write_txn(batch.records)
            for (stream, rec), offset in zip(batch.records, offsets, strict=True):
                if stream == "out" and isinstance(rec, EffectRequest):
                    self.requests[rec.effect_id] = (offset, sim.now)
                if isinstance(rec, SnapshotRecord) and isinstance(rec.state, ChunkRef):
                    sim.log.resolved[("merge", offset)] = chunks[rec.state.hash]
        times = {eid: t for eid, (_, t) in self.requests.items()}
        records = outcomes_due(core, times, {eid: o for eid, (o, _) in self.requests.items()},
                               already_written=self.written, now_resp_ms=self.now_resp,
                               holder_id=f"h{self.epoch}", workload_id=WID)
        if records:
            self.written.update(r.effect_id for r in records)
            sim.write_txn([("resp", r) for r in records])
        if tick_due(core, times, already_written=self.written,
                    inputs_waiting=bool(self.bufs["in"]), now_resp_ms=self.now_resp,
                    broker_now_ms=sim.now, tick_in_flight=self.tick_pending):
            sim.write_txn([("resp", TickRecord(workload_id=WID, epoch=self.epoch,
                                               holder_id=f"h{self.epoch}"))])
            self.tick_pending = True

    def drain(self, rounds: int = 50) -> None:
        """Let time pass until nothing is pending and every record is merged."""
        for _ in range(rounds):
            self.pump()
            if not self.core.pending and not self.bufs["in"] and not self.bufs["resp"] and (
                    self.fetch["in"] >= self.sim.log["in"].end):
                self.pump()
                if not self.core.pending:
                    return
            self.sim.now += 60
        raise AssertionError(f"did not drain: pending {list(self.core.pending)}")
