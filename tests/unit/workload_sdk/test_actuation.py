"""Re-asking under the original id, the read-back pattern, placement and alarms: the SDK's pure
parts of actuation (docs/actuation.md)."""

from __future__ import annotations

from typing import Any

import pytest

from broker_schema import (
    EffectHeader,
    EffectRequest,
    FactsRecord,
    InlineBody,
    InputRecord,
    KindServed,
    ResponseRecord,
    SpecRecord,
)
from workload_sdk import (
    EffectResult,
    InputEvent,
    Request,
    WorkloadError,
    actuate,
    await_read_back,
    read_back,
    reissue,
    remember,
)
from workload_sdk._core import Core, Item, Pending
from workload_sdk._placement import placement_missing
from workload_sdk._round import alarms_for

KIND = "acme:valve/set@1.0.0"
H = "sha256:" + "1" * 64
M = "sha256:" + "2" * 64
N = "sha256:" + "3" * 64


def _result(outcome: str, *, seq: int = 5, effect_id: str = "w/2/0@1") -> EffectResult:
    return EffectResult(seq=seq, time_ms=1_000, effect_id=effect_id, input_offset=2, index=0,
                        outcome=outcome)  # type: ignore[arg-type]


def test_reissue_names_the_original_id_through_a_chain() -> None:
    kept = remember(actuate(KIND, set_point=40, device="valve-1", deadline_ms=500))
    assert reissue(_result("ok"), kept) is None and reissue(_result("unknown"), None) is None
    first = reissue(_result("unknown"), kept)
    assert first is not None
    req, kept2 = first
    assert req == Request(effect_kind=KIND, params={"set_point": 40, "device": "valve-1"},
                          deadline_ms=500, reissue_of="w/2/0@1")
    # the reissue itself ended unknown: the next one still names the first id
    second = reissue(_result("unknown", effect_id="w/5/0@1"), kept2)
    assert second is not None and second[0].reissue_of == "w/2/0@1"
    assert reissue(_result("unknown", effect_id="w/9/0@1"), second[1]) is None  # 3 attempts


def _telemetry(value: int, *, time_ms: int, device: str = "valve-1") -> InputEvent:
    body = InlineBody.of_json({"telemetry": {"device": device, "register": 3, "value": value,
                                             "set_point": value}})
    return InputEvent(seq=9, time_ms=time_ms, offset=4, body=body)


def test_read_back_decides_from_telemetry_after_the_unknown() -> None:
    kept = remember(actuate(KIND, set_point=40))
    waiting = await_read_back(_result("unknown"), kept, device="valve-1", want=40)
    assert read_back(_telemetry(40, time_ms=999), waiting).decision == "wait"  # before it
    assert read_back(_telemetry(40, time_ms=1_001, device="valve-2"), waiting).decision == "wait"
    plain = InputEvent(seq=9, time_ms=2_000, offset=4, body=InlineBody.of_json({"set": 1}))
    assert read_back(plain, waiting).decision == "wait"
    assert read_back(_telemetry(40, time_ms=1_001), waiting).decision == "done"
    again = read_back(_telemetry(0, time_ms=1_001), waiting)
    assert again.decision == "reissue" and again.value == 0
    assert again.request is not None and again.request.reissue_of == "w/2/0@1"
    assert again.remembered is not None and again.remembered["attempt"] == 2
    used = dict(waiting, request=dict(kept, attempt=3))
    assert read_back(_telemetry(0, time_ms=1_001), used).decision == "give_up"


class _Reissuer:
    """Issues one request per input; the second names the first as its original."""

    def __init__(self, original: str) -> None:
        self.original = original

    def initial_state(self) -> Any:
        return 0

    def step(self, state: Any, event: Any) -> Any:
        return state + 1, [Request(effect_kind=KIND, params={"set_point": 1}, deadline_ms=9,
                                   reissue_of=self.original)]


@pytest.mark.parametrize("original", ["w/9/0@1", "other/0/0@1", "not an id"])
def test_a_reissue_must_name_an_earlier_effect_of_the_workload(original: str) -> None:
    spec = SpecRecord(workload_id="w", module_hash=H, effect_kinds=(KIND,))
    core = Core.initial(_Reissuer(original), "w")  # type: ignore[arg-type]
    item = Item("in", 0, 1, InputRecord(workload_id="w", body=InlineBody.of_json(1)))
    with pytest.raises(WorkloadError, match="reissue_of"):
        core.apply(item, epoch=1, spec=spec)


def test_a_reissue_is_an_effect_of_its_own() -> None:
    spec = SpecRecord(workload_id="w", module_hash=H, effect_kinds=(KIND,))
    core = Core.initial(_Reissuer("w/0/0@1"), "w")  # type: ignore[arg-type]
    core.seq = 3
    item = Item("in", 0, 1, InputRecord(workload_id="w", body=InlineBody.of_json(1)))
    (req,) = core.apply(item, epoch=1, spec=spec).outputs
    assert isinstance(req, EffectRequest) and req.effect_id == "w/3/0@1"
    assert req.reissue_of == "w/0/0@1" and req.original_id == "w/0/0@1"
    assert "w/3/0@1" in core.pending


def _facts(node: str, kinds: list[KindServed], *, models: tuple[str, ...] = (),
           updated_us: int = 1_000_000_000) -> FactsRecord:
    return FactsRecord(node_id=node, kinds=tuple(kinds), models_present=models,
                       public_key="MCowBQYDK2VwAyEA", key_id=H, updated_us=updated_us)


def test_placement_names_what_no_live_node_serves() -> None:
    spec = SpecRecord(workload_id="w", module_hash=H,
                      effect_kinds=("ninelives:inference/run@0.1.0", KIND), models={"m": M},
                      guarantees={KIND: "at-most-once"})
    now = 1_000_000_000
    infer = KindServed(kind="ninelives:inference/run@0.1.0", queue_limit=4)
    valve_idem = KindServed(kind=KIND, queue_limit=4, guarantee="idempotent")
    valve_amo = KindServed(kind=KIND, queue_limit=4, guarantee="at-most-once")
    assert placement_missing(spec, [], now_us=now, max_age_s=60) == [
        "kind ninelives:inference/run@0.1.0", f"kind {KIND} as at-most-once", f"model {M}"]
    served = [_facts("exec", [infer], models=(M,)), _facts("gw", [valve_idem])]
    assert placement_missing(spec, served, now_us=now, max_age_s=60) == [
        f"kind {KIND} as at-most-once"]
    served.append(_facts("gw", [valve_amo]))  # the gateway's latest facts win
    assert placement_missing(spec, served, now_us=now, max_age_s=60) == []
    stale = [_facts("exec", [infer], models=(M,), updated_us=now - 61_000_000),
             _facts("gw", [valve_amo])]
    assert placement_missing(spec, stale, now_us=now, max_age_s=60) == [
        "kind ninelives:inference/run@0.1.0", f"model {M}"]


class _Idle:
    def initial_state(self) -> Any:
        return None

    def step(self, state: Any, event: Any) -> Any:
        return state, []


def test_an_alarm_goes_with_each_at_most_once_unknown() -> None:
    spec = SpecRecord(workload_id="w", module_hash=H, effect_kinds=(KIND, "acme:x/y@1.0.0"),
                      guarantees={KIND: "at-most-once", "acme:x/y@1.0.0": "idempotent"})
    core = Core.initial(_Idle(), "w")  # type: ignore[arg-type]
    for index, kind in enumerate((KIND, "acme:x/y@1.0.0", KIND)):
        eid = f"w/1/{index}@2"
        core.pending[eid] = Pending(effect_id=eid, input_offset=1, index=index, epoch=2,
                                    effect_kind=kind, deadline_ms=10, accepted_ms=5,
                                    lease_ms=3_000)

    def outcome(index: int, what: str) -> ResponseRecord:
        header = EffectHeader(workload_id="w", input_offset=1, index=index, epoch=2)
        return ResponseRecord(effect_id=header.effect_id, header=header,
                              request_offset=10 + index, outcome=what,  # type: ignore[arg-type]
                              written_by="h")

    alarms = alarms_for([outcome(0, "unknown"), outcome(1, "unknown"), outcome(2, "timeout")],
                        core, spec, reissues={"w/1/0@2": "w/0/0@2"},
                        accepted_by={"w/1/0@2": "gw-1"}, holder_id="h", now_us=7)
    # the at-most-once unknown and the timeout alarm; the idempotent unknown does not
    alarm, late = alarms
    assert alarm.alarm_id == "w/1/0@2" and alarm.request_offset == 10
    assert alarm.reissue_of == "w/0/0@2" and alarm.accepted_by == "gw-1"
    assert alarm.guarantee == "at-most-once" and "3000 ms" in alarm.reason
    assert alarm.cause == "unknown" and alarm.read_back is None
    assert late.alarm_id == "w/1/2@2" and late.cause == "timeout"
    assert "deadline (10 ms" in late.reason and late.request_offset == 12


def test_a_timeout_alarms_for_actuation_kinds_only() -> None:
    """A ``timeout`` of a kind the spec declares a guarantee for alarms (idempotent too); a
    timeout of an inference kind (no guarantee) does not."""
    spec = SpecRecord(workload_id="w", module_hash=H, effect_kinds=(KIND, "acme:m/n@1.0.0"),
                      guarantees={KIND: "idempotent"})
    core = Core.initial(_Idle(), "w")  # type: ignore[arg-type]
    for index, kind in enumerate((KIND, "acme:m/n@1.0.0")):
        eid = f"w/1/{index}@2"
        core.pending[eid] = Pending(effect_id=eid, input_offset=1, index=index, epoch=2,
                                    effect_kind=kind, deadline_ms=500)
    outcomes = []
    for index in (0, 1):
        header = EffectHeader(workload_id="w", input_offset=1, index=index, epoch=2)
        outcomes.append(ResponseRecord(effect_id=header.effect_id, header=header,
                                       request_offset=3 + index, outcome="timeout",
                                       written_by="h"))
    (alarm,) = alarms_for(outcomes, core, spec, reissues={}, accepted_by={}, holder_id="h",
                          now_us=1)
    assert alarm.alarm_id == "w/1/0@2" and alarm.guarantee == "idempotent"
    assert alarm.cause == "timeout" and alarm.accepted_by is None


def test_placement_wants_one_node_holding_every_model_of_the_binding() -> None:
    # executors route by model: a workload's requests all go to one member, so two models
    # held by two different nodes serve nothing (broker_schema.routing)
    spec = SpecRecord(workload_id="w", module_hash=H,
                      effect_kinds=("ninelives:inference/run@0.1.0",), models={"a": M, "b": N})
    now = 1_000_000_000
    infer = KindServed(kind="ninelives:inference/run@0.1.0", queue_limit=4)
    apart = [_facts("e1", [infer], models=(M,)), _facts("e2", [infer], models=(N,))]
    assert placement_missing(spec, apart, now_us=now, max_age_s=60) == [
        f"models {' + '.join(sorted((M, N)))} together"]
    # a model missing everywhere is named alone (not also "together")
    assert placement_missing(spec, apart[:1], now_us=now, max_age_s=60) == [f"model {N}"]
    both = [*apart, _facts("e3", [infer], models=(N, M))]
    assert placement_missing(spec, both, now_us=now, max_age_s=60) == []
    # a node holding both but serving no kind the spec binds does not count
    other = KindServed(kind="acme:other/run@1.0.0", queue_limit=4)
    assert placement_missing(spec, [*apart, _facts("e3", [other], models=(M, N))], now_us=now,
                             max_age_s=60) == [f"models {' + '.join(sorted((M, N)))} together"]
