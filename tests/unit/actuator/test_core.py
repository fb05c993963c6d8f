"""The gateway's pure core: admission on top of the executor's rules, the guarantee memory, what
is remembered before and after a device write. No broker, no device."""

from __future__ import annotations

from typing import Any

import pytest

from actuator.config import load_gateway_config
from actuator.core import (
    Execute,
    GatewayState,
    Leave,
    Memory,
    Reanswer,
    command_of,
    decide,
    memory_verdict,
    remember_after,
    remember_before,
    written_response,
)
from broker_schema import (
    ActuatorMemoryRecord,
    ClaimRecord,
    EffectHeader,
    EffectRequest,
    InlineBody,
    ShadowEvalRecord,
    SpecRecord,
)
from fx_node.admission import Ignore, Refuse

KIND = "acme:valve/set@1.0.0"
WL = "tank-1"
H = "sha256:" + "1" * 64


def _state(guarantee: str = "at-most-once", declared: str | None = None) -> GatewayState:
    cfg = load_gateway_config(environ={}, node_id="gw-1", bootstrap="127.0.0.1:1",
                              devices={"valve-1": {"port": 5020, "address": 3, "maximum": 100,
                                                   "values": {"closed": 0, "open": 100}},
                                       "valve-2": {"port": 5021}},
                              kinds={KIND: {"guarantee": guarantee,
                                            "devices": ["valve-1", "valve-2"]}})
    state = GatewayState(cfg)
    state.base.observe_spec(SpecRecord(workload_id=WL, module_hash=H, effect_kinds=(KIND,),
                                       guarantees={KIND: declared or guarantee}), 0)
    state.base.observe_claim(ClaimRecord(workload_id=WL, epoch=2, holder_id="h", spec_hash=H,
                                         spec_offset=0))
    return state


def _req(seq: int = 4, epoch: int = 2, reissue_of: str | None = None, **params: Any
         ) -> EffectRequest:
    return EffectRequest(header=EffectHeader(workload_id=WL, input_offset=seq, index=0,
                                             epoch=epoch),
                         effect_kind=KIND, params=params or {"set_point": 40},
                         deadline_ms=10_000, reissue_of=reissue_of)


def _decide(state: GatewayState, req: EffectRequest, **kw: Any) -> Any:
    args = {"topic": f"wl.{WL}.out", "partition": 0, "offset": 9, "append_ms": 1_000,
            "now_ms": 1_010, "now_us": 1_010_000, **kw}
    return decide(state, req, **args)


def test_a_set_point_is_admitted_with_its_command() -> None:
    state = _state()
    decision = _decide(state, _req())
    assert isinstance(decision, Execute) and decision.guarantee == "at-most-once"
    assert decision.command.device == "valve-1" and decision.command.register == 3
    assert decision.command.value == 40 and decision.job.effect_id in state.base.in_flight
    named = _decide(state, _req(seq=5, set_point="open", device="valve-1"))
    assert isinstance(named, Execute) and named.command.value == 100


@pytest.mark.parametrize(("params", "needle"), [
    ({"set_point": 101}, "outside"),
    ({"set_point": "half"}, "not one of"),
    ({"set_point": True}, "name or an integer"),
    ({"delta": 5}, "unknown params"),
    ({"device": "valve-1"}, "no set_point"),
    ({"set_point": 1, "device": "valve-9"}, "not one this kind sets"),
])
def test_only_absolute_set_points_of_known_devices(params: dict[str, Any], needle: str) -> None:
    state = _state()
    decision = _decide(state, _req(**params))
    assert isinstance(decision, Refuse) and decision.response.error is not None
    assert decision.response.error.code == "params_invalid"
    assert needle in decision.response.error.message and not state.base.in_flight


def test_the_spec_must_declare_the_guarantee_served() -> None:
    state = _state("idempotent", declared="at-most-once")
    decision = _decide(state, _req())
    assert isinstance(decision, Refuse) and decision.response.error is not None
    assert decision.response.error.code == "guarantee_mismatch" and not state.base.in_flight


def test_the_executor_rules_come_first() -> None:
    state = _state()
    stale = _decide(state, _req(epoch=1))
    assert isinstance(stale, Refuse) and stale.response.error is not None
    assert stale.response.error.code == "stale_epoch"
    late = _decide(state, _req(), now_ms=20_000)
    assert isinstance(late, Refuse) and late.response.error is not None
    assert late.response.error.code == "deadline_passed"
    other = _req().model_copy(update={"effect_kind": "acme:other/set@1.0.0"})
    assert isinstance(_decide(state, other), Ignore)


def test_a_shadow_request_never_acts() -> None:
    state = _state()
    header = EffectHeader(workload_id=WL, input_offset=4, index=0, epoch=2, shadow="ev")
    shadow = _req().model_copy(update={"header": header})
    state.base.observe_shadow(ShadowEvalRecord(
        eval_id="ev", workload_id=WL, models={"m": H}, mode="history", from_seq=0, to_seq=9,
        deadline_ms=1000, created_ms=0, created_by="x"))
    decision = _decide(state, shadow, topic=f"wl.{WL}.shadow.ev.out")
    assert isinstance(decision, Refuse) and decision.response.error is not None
    assert decision.response.error.code == "kind_unsupported"


def _attempt(state: GatewayState, req: EffectRequest, entry: str = "attempt",
             original: str | None = None) -> ActuatorMemoryRecord:
    record = ActuatorMemoryRecord(
        node_id="gw-1", entry=entry, device="valve-1", workload_id=WL,  # type: ignore[arg-type]
        epoch=2, effect_id=original or req.original_id, request_effect_id=req.effect_id,
        output=InlineBody.of_json({"read_back": 40}) if entry == "done" else None,
        written_us=5)
    state.memory.observe(record)
    return record


def test_at_most_once_memory() -> None:
    state = _state()
    first = _req()
    # the same request read again after a restart: done is answered from memory ...
    _attempt(state, first, "done")
    again = _decide(state, first)
    assert isinstance(again, Reanswer) and again.response.outcome == "ok"
    assert again.response.output == InlineBody.of_json({"read_back": 40})
    # ... an attempt without done is left to its lease
    _attempt(state, first, "attempt")
    assert isinstance(_decide(state, first), Leave)
    # a reissue of it (another id naming the original) is a repeat: refused
    reissue = _req(seq=7, reissue_of=first.effect_id)
    refused = _decide(state, reissue)
    assert isinstance(refused, Refuse) and refused.response.error is not None
    assert refused.response.error.code == "duplicate_effect"
    assert "not known" in refused.response.error.message and not state.base.in_flight
    # cleared (it never reached the device): the reissue runs
    _attempt(state, first, "cleared")
    assert isinstance(_decide(state, reissue), Execute)


def test_fenced_memory_refuses_lower_epochs_per_device_and_workload() -> None:
    state = _state("fenced")
    state.memory.observe(ActuatorMemoryRecord(node_id="gw-1", entry="epoch", device="valve-1",
                                              workload_id=WL, epoch=3, written_us=1))
    low = _decide(state, _req(epoch=2))
    assert isinstance(low, Refuse) and low.response.error is not None
    assert low.response.error.code == "stale_epoch" and "device valve-1" in \
        low.response.error.message
    # another device of the same workload has no such memory
    assert isinstance(_decide(state, _req(epoch=2, set_point=1, device="valve-2")), Execute)


def test_idempotent_remembers_recent_ids_and_refuses_repeats() -> None:
    state = _state("idempotent")
    first = _req()
    # an at-most-once kind's entries mean nothing to an idempotent kind
    _attempt(state, first, "done")
    decision = _decide(state, first)
    assert isinstance(decision, Execute)
    assert remember_before(state, decision.job, decision.command, "idempotent", 1) == []
    ok = written_response(state, decision.job, decision.command, read_back=40, started_us=1,
                          finished_us=2)
    assert remember_after(state, decision.job, decision.command, "idempotent", ok,
                          changed=False, now_us=3) == []  # never reached the device
    (recent,) = remember_after(state, decision.job, decision.command, "idempotent", ok,
                               changed=True, now_us=3)
    assert recent.entry == "recent" and recent.output == ok.output
    assert recent.key() == f"effect/{first.effect_id}" and recent.device == "valve-1"
    state.base.finish(first.effect_id)
    state.memory.observe(recent)
    # the very request read again after a restart: answered from memory, device untouched,
    # before the executor's rules (past its deadline, after a newer claim)
    state.base.observe_claim(ClaimRecord(workload_id=WL, epoch=3, holder_id="h2", spec_hash=H,
                                         spec_offset=0))
    again = _decide(state, first, now_ms=99_000)
    assert isinstance(again, Reanswer) and again.response.output == ok.output
    # a reissue naming it (or any other copy under its id): refused, typed, nothing in flight
    repeat = _decide(state, _req(seq=6, epoch=3, reissue_of=first.effect_id))
    assert isinstance(repeat, Refuse) and repeat.response.error is not None
    assert repeat.response.error.code == "duplicate_effect"
    assert "recent idempotent" in repeat.response.error.message and not state.base.in_flight


def test_the_idempotent_window_is_bounded_per_device() -> None:
    state = _state("idempotent")
    state.memory.window = 2
    remembered = []
    for seq in (10, 11, 12):
        decision = _decide(state, _req(seq=seq))
        assert isinstance(decision, Execute)
        ok = written_response(state, decision.job, decision.command, read_back=40,
                              started_us=1, finished_us=2)
        records = remember_after(state, decision.job, decision.command, "idempotent", ok,
                                 changed=True, now_us=seq)
        state.base.finish(decision.job.effect_id)
        for record in records:
            state.memory.observe(record)
        remembered.append(records)
    assert [len(r) for r in remembered] == [1, 1, 2]
    evicted = remembered[2][1]
    assert evicted.entry == "cleared" and evicted.effect_id == _req(seq=10).effect_id
    assert list(state.memory.recent["valve-1"]) == [_req(seq=11).effect_id,
                                                    _req(seq=12).effect_id]
    # forgotten: its repeat is written again (harmless for a set-point); a kept one is refused
    assert isinstance(_decide(state, _req(seq=10)), Execute)
    kept = _decide(state, _req(seq=13, reissue_of=_req(seq=12).effect_id))
    assert isinstance(kept, Refuse)
    # the memory rebuilt from the records, in order, is the same (what a restart reads back)
    rebuilt = Memory(window=2)
    for records in remembered:
        for record in records:
            rebuilt.observe(record)
    assert rebuilt.recent == state.memory.recent
    assert set(rebuilt.attempts) == set(state.memory.attempts) - {_req().effect_id}


def test_what_is_remembered_around_the_write() -> None:
    state = _state()
    decision = _decide(state, _req(seq=8, reissue_of=_req().effect_id))
    assert isinstance(decision, Execute)
    (before,) = remember_before(state, decision.job, decision.command, "at-most-once", 11)
    assert before.entry == "attempt" and before.effect_id == _req().effect_id
    assert before.request_effect_id == decision.job.effect_id
    assert before.key() == f"effect/{_req().effect_id}"
    ok = written_response(state, decision.job, decision.command, read_back=40, started_us=1,
                          finished_us=2)
    assert ok.outcome == "ok" and ok.output is not None
    assert ok.output.data == {"device": "valve-1", "register": 3, "value": 40,
                              "set_point": 40, "read_back": 40,
                              "reissue_of": _req().effect_id}
    (done,) = remember_after(state, decision.job, decision.command, "at-most-once", ok,
                             changed=True, now_us=12)
    assert done.entry == "done" and done.output == ok.output
    (cleared,) = remember_after(state, decision.job, decision.command, "at-most-once", ok,
                                changed=False, now_us=12)
    assert cleared.entry == "cleared" and cleared.output is None
    mismatch = written_response(state, decision.job, decision.command, read_back=39,
                                started_us=1, finished_us=2)
    assert mismatch.error is not None and mismatch.error.code == "readback_mismatch"


def test_fenced_remembers_only_a_raised_epoch() -> None:
    state = _state("fenced")
    decision = _decide(state, _req())
    assert isinstance(decision, Execute)
    (epoch,) = remember_before(state, decision.job, decision.command, "fenced", 1)
    assert epoch.entry == "epoch" and epoch.epoch == 2 and epoch.key() == f"epoch/valve-1/{WL}"
    state.memory.observe(epoch)
    assert remember_before(state, decision.job, decision.command, "fenced", 2) == []


def test_memory_verdict_is_what_decide_and_the_last_check_share() -> None:
    memory = Memory()
    req = _req()
    cmd = command_of(req, _state().kinds[KIND], _state().devices)
    assert not isinstance(cmd, str)
    assert memory_verdict(memory, req, cmd, "at-most-once") == ("run",)
    assert memory_verdict(memory, req, cmd, "fenced") == ("run",)


def test_a_request_in_doubt_is_never_refused_as_if_nothing_was_done() -> None:
    """Read again after a restart, past its deadline and after a newer claim: the at-most-once
    memory still decides (left to its lease, or answered from memory), never deadline_passed
    or stale_epoch, which would say nothing was done."""
    state = _state()
    first = _req()
    _attempt(state, first, "attempt")
    state.base.observe_claim(ClaimRecord(workload_id=WL, epoch=3, holder_id="h2", spec_hash=H,
                                         spec_offset=0))
    assert isinstance(_decide(state, first, now_ms=99_000), Leave)
    _attempt(state, first, "done")
    answer = _decide(state, first, now_ms=99_000)
    assert isinstance(answer, Reanswer) and answer.response.outcome == "ok"
    # a reissue is refused by the ordinary rules first: it did nothing
    late = _decide(state, _req(seq=7, epoch=3, reissue_of=first.effect_id), now_ms=99_000)
    assert isinstance(late, Refuse) and late.response.error is not None
    assert late.response.error.code == "deadline_passed"
