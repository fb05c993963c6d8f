"""Each guarantee kind under a gateway ``kill -9`` at every point of a command, end to end.

Real processes on a real broker: the lease holder (``fx workload run``, the example
:class:`~workload_sdk.examples.valve_readback.ValveReadBack`), the actuator gateway (``fx
actuator run``) and a real Modbus TCP device (a pymodbus server on loopback) whose register and
writes are read directly. The gateway SIGKILLs itself at the point under test (``crash_at``: the
process dies there, nothing is flushed or answered) and is started again without it. Then:

- the device register holds what it must, and was written exactly as often as the guarantee
  allows (at-most-once: never twice; idempotent and fenced: a repeat of the set-point);
- the step saw what the log supports: ``ok``, or ``unknown`` (lease lapsed after an accept), and
  for at-most-once an ``unknown`` raised exactly one alarm on ``sys.alarms`` (``fx alarms``);
- after ``unknown`` the workload waits for the valve's telemetry (read-back) and either finds
  the set-point (done) or reissues under the original id, which the at-most-once gateway refuses
  (``duplicate_effect``);
- replay from the log reproduces every output byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from actuator.alarms import read_alarms
from actuator.sim import SimulatedDevice
from broker_schema import MergeEntry, OutputRecord, ResponseRecord, decode
from tests.integration.actuator.harness import (
    REPO,
    VALVE_KIND,
    VALVE_REGISTER,
    Gateway,
    gateway_config,
)
from workload_sdk import WorkloadLog, compare_outputs, replay
from workload_sdk.examples.valve_readback import ValveReadBack
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

MODULE = "workload_sdk.examples.valve_readback:ValveReadBack"
WANT = 40
#: the lease when the test waits for ``unknown``; long enough otherwise for a gateway restarted
#: after a kill (process start, memory read back, consumer group re-join) to answer within it
SHORT_LEASE_MS, LONG_LEASE_MS = 4_000, 25_000
FINAL = ("confirmed", "confirmed by read-back", "error", "not at the set-point, attempts used up")


@dataclass(frozen=True)
class Expect:
    """What a case must end with."""

    seen: str  # the outcome the step saw for the command
    writes: int  # writes the device's register received
    register: int
    final: str  # the workload's last decision
    duplicate_passed_over: bool = False


def _expect(guarantee: str, point: str) -> Expect:
    if guarantee == "at-most-once":
        return {
            "before_accept": Expect("ok", 1, WANT, "confirmed"),
            "after_accept": Expect("ok", 1, WANT, "confirmed"),
            # remembered as attempted, never written: unknown, alarm, the read-back shows 0,
            # the reissue under the original id is refused as a repeat
            "after_attempt": Expect("unknown", 0, 0, "error"),
            # written, then lost: unknown, alarm, the read-back shows the set-point
            "after_write": Expect("unknown", 1, WANT, "confirmed by read-back"),
            # done remembered, not answered: answered from memory, device untouched
            "after_remember": Expect("ok", 1, WANT, "confirmed"),
            # answered, offset not committed: answered again from memory, device untouched
            "after_response": Expect("ok", 1, WANT, "confirmed", duplicate_passed_over=True),
        }[point]
    # idempotent: written again only when killed between the write and its ``recent`` entry;
    # once remembered, the very request read again is answered from memory, device untouched
    # fenced: a restarted gateway writes the set-point again (the epoch check still applies)
    again = 1 if guarantee == "idempotent" else 2
    return {
        "before_accept": Expect("ok", 1, WANT, "confirmed"),
        "after_accept": Expect("ok", 1, WANT, "confirmed"),
        "after_attempt": Expect("ok", 1, WANT, "confirmed"),
        "after_write": Expect("ok", 2, WANT, "confirmed"),
        "after_remember": Expect("ok", again, WANT, "confirmed"),
        "after_response": Expect("ok", again, WANT, "confirmed", duplicate_passed_over=True),
    }[point]


def _decisions(log: WorkloadLog) -> list[dict[str, object]]:
    out = []
    for rec in log["out"]:
        record = decode(rec.value)
        if isinstance(record, OutputRecord) and isinstance(record.body.data, dict):
            out.append(record.body.data)
    return out


def _final(log: WorkloadLog) -> dict[str, object] | None:
    finals = [d for d in _decisions(log) if d.get("valve") in FINAL]
    return finals[-1] if finals else None


POINTS = ("before_accept", "after_accept", "after_attempt", "after_write", "after_remember",
          "after_response")


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("guarantee", ["at-most-once", "idempotent", "fenced"])
async def test_gateway_killed_at_every_point(kafka_bootstrap: str, unique_workload_id: str,
                                             tmp_path: Path, gateways: Callable[..., Gateway],
                                             guarantee: str, point: str) -> None:
    expect = _expect(guarantee, point)
    wid = unique_workload_id
    lease = SHORT_LEASE_MS if expect.seen == "unknown" else LONG_LEASE_MS
    with SimulatedDevice(registers=8) as device:
        async with WorkloadHarness(
            kafka_bootstrap, wid, MODULE, effect_kinds=(VALVE_KIND,),
            guarantees={VALVE_KIND: guarantee}, executor_lease_ms=lease, log_dir=tmp_path,
        ) as h:
            gateway = gateways(gateway_config(kafka_bootstrap, wid, tmp_path, device.port,
                                             guarantee=guarantee, crash_at=point))
            gateway.start()
            await gateway.wait_log("partitions assigned")
            holder = h.start_holder("h1", elect=False, force=False)  # placement is checked
            await h.send_input({"set": WANT})
            assert await gateway.wait_exit() == -9, gateway.log()[-3000:]
            killed_with = device.register(VALVE_REGISTER)
            gateway.start(crash_at=None)
            log = await h.wait_for(lambda lg: _final(lg) is not None, timeout=90,
                                   what="a final decision")
            (command_offset, command), *later = h.requests(log, VALVE_KIND)
            if expect.duplicate_passed_over:
                log = await h.wait_for(lambda lg: any(
                    isinstance(m := decode(r.value), MergeEntry) and m.reason == "duplicate"
                    and m.effect_id == command.effect_id for r in lg["merge"]),
                    timeout=60, what="the duplicate answer passed over")
            assert h.stop(holder) == 0
            gateway.stop()
            log = await h.read_log()
        register, writes = device.register(VALVE_REGISTER), device.writes_to(VALVE_REGISTER)

    # the device, read directly
    assert register == expect.register, (killed_with, gateway.log()[-3000:])
    assert len(writes) == expect.writes, writes
    # what the step saw, on the log
    answers = [r for r in (decode(x.value) for x in log["resp"])
               if isinstance(r, ResponseRecord) and r.effect_id == command.effect_id]
    merged = [m for m in (decode(x.value) for x in log["merge"])
              if isinstance(m, MergeEntry) and m.effect_id == command.effect_id
              and m.action == "deliver"]
    assert len(merged) == 1
    seen = decode(log["resp"].records[merged[0].source_offset].value)
    assert isinstance(seen, ResponseRecord) and seen.outcome == expect.seen, answers
    final = _final(log)
    assert final is not None and final["valve"] == expect.final, _decisions(log)
    alarms = [a for a in await read_alarms(kafka_bootstrap) if a.alarm.workload_id == wid]
    if expect.seen == "unknown" and guarantee == "at-most-once":
        (alarm,) = alarms
        assert alarm.alarm.alarm_id == command.effect_id and alarm.open
        assert alarm.alarm.request_offset == command_offset
        assert alarm.alarm.guarantee == "at-most-once" and alarm.alarm.effect_kind == VALVE_KIND
    else:
        assert alarms == []
    if point == "after_attempt" and guarantee == "at-most-once":
        # the read-back showed 0: reissued under the original id, refused as a repeat
        ((_, again),) = later
        assert again.reissue_of == command.effect_id
        (refusal,) = [r for r in (decode(x.value) for x in log["resp"])
                      if isinstance(r, ResponseRecord) and r.effect_id == again.effect_id]
        assert refusal.error is not None and refusal.error.code == "duplicate_effect"
    else:
        assert later == []
    if point == "after_write" and guarantee == "at-most-once":
        assert "attempted before a restart" in gateway.log()
    # replay from the log alone: every output, byte for byte
    full = replay(ValveReadBack(), log, use_snapshots=False)
    assert compare_outputs(full, log) == []


async def test_fx_alarms_lists_and_acknowledges(kafka_bootstrap: str, unique_workload_id: str,
                                                tmp_path: Path,
                                                gateways: Callable[..., Gateway]) -> None:
    """An at-most-once command lost after the device write: ``fx alarms`` shows it (exit 1),
    ``fx alarms ack`` acknowledges it, and it is no longer open."""
    wid = unique_workload_id
    with SimulatedDevice(registers=8) as device:
        async with WorkloadHarness(
            kafka_bootstrap, wid, MODULE, effect_kinds=(VALVE_KIND,),
            guarantees={VALVE_KIND: "at-most-once"}, executor_lease_ms=SHORT_LEASE_MS,
            log_dir=tmp_path,
        ) as h:
            gateway = gateways(gateway_config(kafka_bootstrap, wid, tmp_path, device.port,
                                             guarantee="at-most-once", telemetry=False,
                                             crash_at="after_write"))
            gateway.start()
            await gateway.wait_log("partitions assigned")
            holder = h.start_holder("h1", elect=False, force=False)
            await h.send_input({"set": WANT})
            assert await gateway.wait_exit() == -9
            await h.wait_for(lambda lg: any(d.get("valve") == "unknown: waiting for the "
                                            "read-back" for d in _decisions(lg)),
                             timeout=60, what="the unknown")
            h.stop(holder)
            ((_, command),) = h.requests(await h.read_log(), VALVE_KIND)
            register = device.register(VALVE_REGISTER)

    def fx(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fx_cli.main", *args, "--bootstrap",
                               kafka_bootstrap], capture_output=True, text=True, cwd=REPO,
                              timeout=60, check=False)

    listed = fx("alarms", "--json")
    assert listed.returncode == 1, listed.stderr
    mine = [a for a in json.loads(listed.stdout) if a["alarm"]["workload_id"] == wid]
    assert [a["alarm"]["alarm_id"] for a in mine] == [command.effect_id]
    text = fx("alarms")
    assert command.effect_id in text.stdout and "OPEN" in text.stdout
    acked = fx("alarms", "ack", command.effect_id, "--by", "test-operator", "--note",
               "valve found at 40")
    assert acked.returncode == 0, acked.stderr
    after = json.loads(fx("alarms", "--json", "--all").stdout)
    (state,) = [a for a in after if a["alarm"]["alarm_id"] == command.effect_id]
    assert state["ack"]["acked_by"] == "test-operator"
    assert command.effect_id not in fx("alarms").stdout
    assert register == WANT
