"""The actuator gateway on a real broker with a real Modbus TCP device: duplicates refused, the
fenced device's epochs, its memory across a restart, its facts; and placement (a holder refuses a
workload nobody serves, ``--force`` is recorded in the claim).

Requests here are written by hand (the test plays the lease holder), so each rule is seen alone;
``test_kill9.py`` runs the whole chain with a real holder."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from actuator.sim import SimulatedDevice
from broker_schema import (
    ActuatorMemoryRecord,
    ClaimRecord,
    EffectHeader,
    EffectRequest,
    ResponseRecord,
    SpecRecord,
    decode,
    encode,
    topics,
)
from fx_kafka.workload_log import read_facts, read_topic
from fx_node.identity import verify_response
from tests.integration.actuator.harness import VALVE_KIND, VALVE_REGISTER, Gateway, gateway_config
from tests.integration.executor.harness import by_effect, workload
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

H = "sha256:" + "1" * 64


def _req(wid: str, seq: int, set_point: int, *, epoch: int = 1,
         reissue_of: str | None = None) -> EffectRequest:
    return EffectRequest(header=EffectHeader(workload_id=wid, input_offset=seq, index=0,
                                             epoch=epoch),
                         effect_kind=VALVE_KIND, params={"set_point": set_point},
                         deadline_ms=60_000, reissue_of=reissue_of)


async def _setup(wl: object, guarantee: str) -> None:
    wid = wl.workload_id  # type: ignore[attr-defined]
    spec = SpecRecord(workload_id=wid, module_hash=H, effect_kinds=(VALVE_KIND,),
                      guarantees={VALVE_KIND: guarantee})
    await wl.write(topics.spec(wid), encode(spec))  # type: ignore[attr-defined]
    claim = ClaimRecord(workload_id=wid, epoch=1, holder_id="test", spec_hash=H, spec_offset=0)
    await wl.write(topics.claims(wid), encode(claim))  # type: ignore[attr-defined]


def _answer(recs: list[object], effect_id: str) -> ResponseRecord:
    (resp,) = by_effect(recs)[effect_id]  # type: ignore[arg-type]
    return resp


async def test_at_most_once_repeats_are_refused_across_a_restart(
        kafka_bootstrap: str, tmp_path: Path, gateways: Callable[..., Gateway]) -> None:
    with SimulatedDevice(registers=8) as device:
        async with workload(kafka_bootstrap, "amo") as wl:
            wid = wl.workload_id
            await _setup(wl, "at-most-once")
            config = gateway_config(kafka_bootstrap, wid, tmp_path, device.port,
                                    guarantee="at-most-once", telemetry=False)
            gateway = gateways(config)
            gateway.start()
            first = _req(wid, 1, 40)
            repeat = _req(wid, 2, 40, reissue_of=first.effect_id)
            for req in (first, repeat):
                await wl.send(req)
            recs = await wl.responses([first.effect_id, repeat.effect_id], timeout=60)
            ok, refused = _answer(recs, first.effect_id), _answer(recs, repeat.effect_id)
            assert ok.outcome == "ok" and ok.output is not None
            assert ok.output.data["read_back"] == 40  # type: ignore[index]
            assert refused.error is not None and refused.error.code == "duplicate_effect"
            facts = [f for f in await read_facts(kafka_bootstrap)
                     if f.node_id == config["node_id"]]
            assert facts[-1].kinds[0].guarantee == "at-most-once"
            assert verify_response(ok, facts[-1].public_key)
            # kill -9 and start again: the memory is read back from sys.actuator.<node>
            assert gateway.proc is not None
            gateway.proc.kill()
            await gateway.wait_exit()
            gateway.start()
            later = _req(wid, 3, 40, reissue_of=first.effect_id)
            fresh = _req(wid, 4, 10)
            for req in (later, fresh):
                await wl.send(req)
            recs = await wl.responses([later.effect_id, fresh.effect_id], timeout=60)
            gateway.stop()
            still = _answer(recs, later.effect_id)
            assert still.error is not None and still.error.code == "duplicate_effect"
            assert "was done" in still.error.message
            assert _answer(recs, fresh.effect_id).outcome == "ok"
            memory = [decode(r.value) for r in await read_topic(
                kafka_bootstrap, topics.actuator_memory(config["node_id"]))]
        writes = [w.values for w in device.writes_to(VALVE_REGISTER)]
    assert writes == [(40,), (10,)]  # the repeats never reached the device
    entries = [(m.entry, m.effect_id) for m in memory if isinstance(m, ActuatorMemoryRecord)]
    assert entries == [("attempt", first.effect_id), ("done", first.effect_id),
                       ("attempt", fresh.effect_id), ("done", fresh.effect_id)]


async def test_a_fenced_device_refuses_a_lower_epoch_across_a_restart(
        kafka_bootstrap: str, tmp_path: Path, gateways: Callable[..., Gateway]) -> None:
    """Epoch 2's command ran before any claim of epoch 2 was seen (so the claims alone cannot
    fence epoch 1): the device's own memory refuses epoch 1 from then on, after a restart too."""
    with SimulatedDevice(registers=8) as device:
        async with workload(kafka_bootstrap, "fenced") as wl:
            wid = wl.workload_id
            await _setup(wl, "fenced")
            gateway = gateways(gateway_config(kafka_bootstrap, wid, tmp_path, device.port,
                                             guarantee="fenced", telemetry=False))
            gateway.start()
            new = _req(wid, 5, 70, epoch=2)
            old = _req(wid, 4, 20, epoch=1)
            again = _req(wid, 5, 70, epoch=2)  # the same command twice: harmless, run again
            await wl.send(new)
            recs = await wl.responses([new.effect_id], timeout=60)
            assert _answer(recs, new.effect_id).outcome == "ok"
            await wl.send(old)
            recs = await wl.responses([old.effect_id], timeout=60)
            stale = _answer(recs, old.effect_id)
            assert stale.error is not None and stale.error.code == "stale_epoch"
            assert "device valve-1 executed epoch 2" in stale.error.message
            gateway.stop()
            gateway.start()
            older = _req(wid, 6, 30, epoch=1)
            await wl.send(older)
            await wl.send(again)
            recs = await wl.responses([older.effect_id], timeout=60, settle=2.0)
            gateway.stop()
            refused = _answer(recs, older.effect_id)
            assert refused.error is not None and refused.error.code == "stale_epoch"
            repeats = [r for r in by_effect(recs)[again.effect_id]]
        register = device.register(VALVE_REGISTER)
    assert register == 70
    assert len(repeats) == 2 and all(r.outcome == "ok" for r in repeats)


async def test_a_holder_refuses_a_workload_nobody_serves(
        kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path) -> None:
    module = "workload_sdk.examples.valve_readback:ValveReadBack"
    kind = f"acme:valve-{unique_workload_id[:8]}/set@1.0.0"  # served by nobody anywhere
    async with WorkloadHarness(kafka_bootstrap, unique_workload_id, module,
                               effect_kinds=(kind,), guarantees={kind: "at-most-once"},
                               log_dir=tmp_path) as h:
        refused = h.start_holder("h1", "--placement-wait-s", "1", elect=False, force=False)
        code = await asyncio.to_thread(refused.wait, 60)
        assert code == 4
        text = (tmp_path / "holder-h1.log").read_text()
        assert f"no live node on sys.facts serves kind {kind} as at-most-once" in text
        assert h.epochs(await h.read_log()) == []  # no claim was written
        forced = h.start_holder("h2", elect=False, force=True)
        log = await h.wait_for(lambda lg: len(h.epochs(lg)) == 1, what="the forced claim")
        h.stop(forced)
    (claim,) = [c for c in (decode(r.value) for r in log["claims"])
                if isinstance(c, ClaimRecord)]
    assert claim.forced == (f"kind {kind} as at-most-once",)


async def test_a_holder_claims_once_a_gateway_serves_the_kind(
        kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
        gateways: Callable[..., Gateway]) -> None:
    module = "workload_sdk.examples.valve_readback:ValveReadBack"
    wid = unique_workload_id
    kind = f"acme:valve-{wid[:8]}/set@1.0.0"
    with SimulatedDevice(registers=8) as device:
        async with WorkloadHarness(kafka_bootstrap, wid, module, effect_kinds=(kind,),
                                   guarantees={kind: "idempotent"}, log_dir=tmp_path) as h:
            holder = h.start_holder("h1", elect=False, force=False)  # waits for placement
            await asyncio.sleep(2.0)
            assert h.epochs(await h.read_log()) == [] and holder.poll() is None
            gateway = gateways(gateway_config(kafka_bootstrap, wid, tmp_path, device.port,
                                             guarantee="idempotent", kind=kind,
                                             telemetry=False))
            gateway.start()
            log = await h.wait_for(lambda lg: len(h.epochs(lg)) == 1, timeout=60,
                                   what="the claim")
            h.stop(holder)
            gateway.stop()
    (claim,) = [c for c in (decode(r.value) for r in log["claims"])
                if isinstance(c, ClaimRecord)]
    assert claim.forced == ()
