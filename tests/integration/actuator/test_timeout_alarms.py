"""Actuations that time out raise an alarm (issue 26, part 7), end to end on a real broker with
a real lease holder (``fx workload run``), a real gateway process (``fx actuator run``) and a
real Modbus TCP device (a pymodbus server on loopback):

- the device hangs on the write (it never answers nor applies it): the gateway's write times
  out in doubt, it reads the register back and raises a ``device_timeout`` alarm showing what
  the device reads (``fx alarms`` prints it); the lease then ends ``unknown``, and the alarm
  stays one per effect;
- no gateway takes a command by its deadline: the holder writes ``timeout`` and, in the same
  transaction, a ``timeout`` alarm.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from actuator.alarms import AlarmState, read_alarms
from actuator.sim import SimulatedDevice
from broker_schema import ResponseRecord, decode
from tests.integration.actuator.harness import (
    REPO,
    VALVE_KIND,
    VALVE_REGISTER,
    Gateway,
    gateway_config,
)
from workload_sdk.testing import WorkloadHarness

pytestmark = pytest.mark.integration

MODULE = "workload_sdk.examples.valve_readback:ValveReadBack"
WANT = 40


async def _alarms_of(bootstrap: str, wid: str, *, timeout: float) -> list[AlarmState]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        mine = [a for a in await read_alarms(bootstrap) if a.alarm.workload_id == wid]
        if mine or loop.time() > deadline:
            return mine
        await asyncio.sleep(0.5)


def _fx(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fx_cli.main", *args, "--bootstrap", bootstrap],
                          capture_output=True, text=True, cwd=REPO, timeout=60, check=False)


@pytest.mark.parametrize("guarantee", ["idempotent", "at-most-once"])
async def test_a_write_the_device_never_confirms_alarms_with_the_read_back(
        kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path,
        gateways: Callable[..., Gateway], guarantee: str) -> None:
    wid = unique_workload_id
    with SimulatedDevice(registers=8) as device:
        device.stall_writes = True
        async with WorkloadHarness(
            kafka_bootstrap, wid, MODULE, effect_kinds=(VALVE_KIND,),
            guarantees={VALVE_KIND: guarantee}, executor_lease_ms=8_000, log_dir=tmp_path,
        ) as h:
            gateway = gateways(gateway_config(kafka_bootstrap, wid, tmp_path, device.port,
                                             guarantee=guarantee, telemetry=False))
            gateway.start()
            await gateway.wait_log("partitions assigned")
            holder = h.start_holder("h1", elect=False)
            await h.send_input({"set": WANT})
            alarms = await _alarms_of(kafka_bootstrap, wid, timeout=60)
            # the lease lapses after the alarm: the holder's unknown (for at-most-once, its own
            # alarm of the same id, which the gateway's stands for)
            log = await h.wait_for(lambda lg: any(
                isinstance(r := decode(x.value), ResponseRecord) and r.outcome == "unknown"
                for x in lg["resp"]), timeout=60, what="the unknown outcome")
            (command_offset, command), *_ = h.requests(log, VALVE_KIND)
            await asyncio.sleep(1.0)  # the holder's alarm, if any, is in its unknown's txn
            after = [a for a in await read_alarms(kafka_bootstrap) if a.alarm.workload_id == wid]
            assert h.stop(holder) == 0
            gateway.stop()
        register, writes = device.register(VALVE_REGISTER), device.writes_to(VALVE_REGISTER)

    assert register == 0 and writes == []  # the valve never moved
    (alarm,) = alarms
    a = alarm.alarm
    assert a.alarm_id == command.effect_id and a.request_offset == command_offset
    assert a.cause == "device_timeout" and a.guarantee == guarantee and alarm.open
    assert a.raised_by == gateway.config["node_id"]
    assert a.read_back is not None
    assert (a.read_back.device, a.read_back.address) == ("valve-1", VALVE_REGISTER)
    assert a.read_back.wanted == WANT and a.read_back.value == 0
    assert f"not the set-point {WANT}" in a.reason
    # one alarm per effect: the first written (the gateway's, with the read-back) stands
    assert [s.alarm.cause for s in after] == ["device_timeout"]
    assert "ALARM " + command.effect_id in gateway.log()

    listed = _fx(kafka_bootstrap, "alarms")
    assert listed.returncode == 1, listed.stderr
    mine = listed.stdout[listed.stdout.index(command.effect_id):]
    assert f"read back: valve-1 register {VALVE_REGISTER} = 0 (wanted {WANT})" in mine
    rows = json.loads(_fx(kafka_bootstrap, "alarms", "--json").stdout)
    (row,) = [r for r in rows if r["alarm"]["alarm_id"] == command.effect_id]
    assert row["alarm"]["read_back"] == {"device": "valve-1", "address": VALVE_REGISTER,
                                         "wanted": WANT, "value": 0}


async def test_a_command_no_gateway_takes_by_its_deadline_alarms(
        kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path) -> None:
    wid = unique_workload_id
    async with WorkloadHarness(
        kafka_bootstrap, wid, MODULE, effect_kinds=(VALVE_KIND,),
        guarantees={VALVE_KIND: "idempotent"}, log_dir=tmp_path,
    ) as h:
        holder = h.start_holder("h1", elect=False)  # no gateway serves the kind
        await h.send_input({"set": WANT})
        log = await h.wait_for(lambda lg: any(
            isinstance(r := decode(x.value), ResponseRecord) and r.outcome == "timeout"
            for x in lg["resp"]), timeout=90, what="the timeout outcome")
        (command_offset, command), *_ = h.requests(log, VALVE_KIND)
        alarms = await _alarms_of(kafka_bootstrap, wid, timeout=30)
        assert h.stop(holder) == 0
    (alarm,) = alarms
    a = alarm.alarm
    assert a.alarm_id == command.effect_id and a.request_offset == command_offset
    assert a.cause == "timeout" and a.guarantee == "idempotent" and a.read_back is None
    assert a.raised_by == "h1" and "deadline (30000 ms" in a.reason
    listed = _fx(kafka_bootstrap, "alarms")
    assert listed.returncode == 1 and f"{command.effect_id}  {VALVE_KIND} (idempotent) timeout" \
        in listed.stdout
