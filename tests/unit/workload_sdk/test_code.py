"""Which code runs a step (issue 26, part 1): ``SpecRecord.module_at``, the module store's record,
:class:`workload_sdk._code.Code` loading stored source by hash, :func:`plan_deploy`, and a fold
across a module switch that replay reproduces with each range's code (a simulated log: the live
holder's round, the same core replay runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_schema import ModuleRecord, ModuleSwitch, SpecRecord, encode, record_hash
from broker_schema.canonical import sha256_hex
from workload_sdk import load_workload, module_hash
from workload_sdk._code import Code, ModuleUnavailable, load_module_source
from workload_sdk._deploy import DeployError, plan_deploy
from workload_sdk._module_store import module_record

SOURCE = '''from workload_sdk import Workload, emit


class Gate(Workload):
    def initial_state(self):
        return {{"n": 0}}

    def step(self, state, event):
        n = state["n"] + 1
        return {{"n": n}}, [emit({{"version": {v}, "n": n}})]
'''
A = "sha256:" + "a" * 64


def _record(v: int) -> ModuleRecord:
    src = SOURCE.format(v=v)
    return ModuleRecord(module_hash=sha256_hex(src.encode()), workload_class="Gate",
                        filename=f"gate_v{v}.py", source=src, written_by="t", written_us=1)


def _spec(**kw: object) -> SpecRecord:
    return SpecRecord(workload_id="w", module_hash=A, effect_kinds=(), **kw)  # type: ignore[arg-type]


def test_module_at_is_the_base_module_then_each_switch_from_its_step() -> None:
    v2, v3 = _record(2), _record(3)
    spec = _spec(module_switches=(
        ModuleSwitch(at_step=4, module_hash=v2.module_hash, workload_class="Gate"),
        ModuleSwitch(at_step=9, module_hash=v3.module_hash, workload_class="Gate")))
    assert spec.module_at(0) == (A, None) and spec.module_at(3) == (A, None)
    assert spec.module_at(4) == (v2.module_hash, "Gate") == spec.module_at(8)
    assert spec.module_at(9) == (v3.module_hash, "Gate") == spec.module_at(10**6)
    assert spec.module_hashes() == (A, v2.module_hash, v3.module_hash)
    # a spec without switches keeps its canonical bytes (and hash): the field is left out
    plain = _spec()
    assert b"module_switches" not in encode(plain)
    assert record_hash(plain) == record_hash(SpecRecord.model_validate_json(encode(plain)))
    with pytest.raises(ValueError, match="strictly increasing"):
        _spec(module_switches=(ModuleSwitch(at_step=4, module_hash=A, workload_class="G"),
                               ModuleSwitch(at_step=4, module_hash=A, workload_class="G")))


def test_a_module_record_must_hash_to_its_source() -> None:
    good = _record(1)
    with pytest.raises(ValueError, match="hashes to"):
        ModuleRecord(**{**good.model_dump(), "source": good.source + "# changed\n"})


def test_code_loads_stored_source_by_hash_and_says_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "gate_v1.py"
    path.write_text(SOURCE.format(v=1))
    given = load_workload(f"{path}:Gate")
    v2 = _record(2)
    code = Code(given, {v2.module_hash: v2})
    assert code.given_hash == module_hash(given) == _record(1).module_hash
    spec = _spec(module_switches=(ModuleSwitch(at_step=2, module_hash=v2.module_hash,
                                               workload_class="Gate"),))
    spec = spec.model_copy(update={"module_hash": code.given_hash})
    assert code.at(spec, 1) is given
    loaded = code.at(spec, 2)
    assert loaded is code.at(spec, 5)  # loaded once
    assert loaded.step({"n": 1}, None)[1][0].body.data["version"] == 2  # type: ignore
    assert code.missing(spec) == []
    other = _record(3).module_hash
    with pytest.raises(ModuleUnavailable, match=r"not in the module store sys\.modules"):
        code.workload(other)
    assert code.missing(spec.model_copy(update={"module_hash": other})) == [other]
    # from step 2 on, the base module is no longer needed
    assert code.missing(spec.model_copy(update={"module_hash": other}), 2) == []
    with pytest.raises(ModuleUnavailable, match="no workload class Nope"):
        load_module_source(v2, "Nope")
    forged = ModuleRecord.model_construct(**{**v2.model_dump(), "source": "x = 1\n"})
    with pytest.raises(ModuleUnavailable, match="hashes to"):
        load_module_source(forged)
    # the store's record of a workload at hand: its source file, hashed as module_hash does
    assert module_record(given).module_hash == code.given_hash


def test_plan_deploy_adds_one_switch_from_a_step_not_taken() -> None:
    v2 = _record(2)
    spec = _spec()
    planned = plan_deploy(spec, v2.module_hash, "Gate", 7, 5)
    assert planned.module_switches == (ModuleSwitch(at_step=7, module_hash=v2.module_hash,
                                                    workload_class="Gate"),)
    assert planned.module_at(6) == (A, None) and planned.module_at(7)[0] == v2.module_hash
    with pytest.raises(DeployError, match="step 4 is already passed"):
        plan_deploy(spec, v2.module_hash, "Gate", 4, 5)
    with pytest.raises(DeployError, match="already switches code at step 7"):
        plan_deploy(planned, _record(3).module_hash, "Gate", 7, 5)
    with pytest.raises(DeployError, match="already runs"):
        plan_deploy(planned, v2.module_hash, "Gate", 9, 5)


def test_plan_deploy_keeps_the_code_history_of_the_spec_in_force() -> None:
    v2, v3 = _record(2), _record(3)
    in_force = _spec()
    # a later spec the holder refused: its switch at step 4 was passed when it was seen
    refused = plan_deploy(in_force, v3.module_hash, "Gate", 4, 4)
    planned = plan_deploy(refused, v2.module_hash, "Gate", 9, 8, in_force)
    assert planned.module_switches == (ModuleSwitch(at_step=9, module_hash=v2.module_hash,
                                                    workload_class="Gate"),)
    # a spec naming another module that no step ran does not become the code of steps taken
    stray = in_force.model_copy(update={"module_hash": v3.module_hash})
    assert plan_deploy(stray, v2.module_hash, "Gate", 9, 8, in_force).module_at(0) == (A, None)
    # switches not reached yet stay
    later = plan_deploy(in_force, v3.module_hash, "Gate", 20, 8)
    assert plan_deploy(later, v2.module_hash, "Gate", 30, 8, in_force).module_at(25)[0] \
        == v3.module_hash


def test_the_console_names_a_spec_s_module_switches() -> None:
    from console.views import row_of

    v2 = _record(2)
    spec = plan_deploy(_spec(), v2.module_hash, "Gate", 12, 3)
    row = row_of("spec", 1, 0, encode(spec))
    assert f"code {v2.module_hash[:19]}… (Gate) from step 12" in row.summary, row.summary
    assert "code " not in row_of("spec", 0, 0, encode(_spec())).summary


def test_the_simulated_holder_and_replay_run_each_range_with_its_code() -> None:
    from broker_schema import OutputRecord, decode
    from tests.unit.workload_sdk.sim import WID, Sim
    from workload_sdk._replay import compare_outputs, replay

    source = ('from workload_sdk import Workload, emit\n\n\nclass Gate(Workload):\n'
              '    def initial_state(self):\n        return 0\n\n'
              '    def step(self, state, event):\n'
              '        return state + 1, [emit({{"v": {v}, "n": state + 1}})]\n')
    recs = {}
    for v in (1, 2):
        src = source.format(v=v)
        recs[v] = ModuleRecord(module_hash=sha256_hex(src.encode()), workload_class="Gate",
                               filename=f"g{v}.py", source=src, written_by="t", written_us=1)
    store = {r.module_hash: r for r in recs.values()}
    spec = plan_deploy(SpecRecord(workload_id=WID, module_hash=recs[1].module_hash,
                                  effect_kinds=(), snapshot_every=2),
                       recs[2].module_hash, "Gate", 3, 0)
    sim = Sim(spec=spec, workload=load_module_source(recs[1]), code=Code(None, store))
    sim.start()
    for i in range(3):
        sim.input(i)
    assert sim.holder is not None
    sim.holder.drain()
    sim.start()  # a new holder resumes: the first range replayed with the first code
    for i in range(3, 6):
        sim.input(i)
    sim.holder.drain()
    outs = sorted((o.header.input_offset, o.body.data) for o in
                  (decode(r.value) for r in sim.log["out"]) if isinstance(o, OutputRecord))
    assert [d for _s, d in outs] == [{"v": 1, "n": 1}, {"v": 1, "n": 2}, {"v": 1, "n": 3},
                                     {"v": 2, "n": 4}, {"v": 2, "n": 5}, {"v": 2, "n": 6}]
    for snapshots in (True, False):
        result = replay(None, sim.log, use_snapshots=snapshots, code=Code(None, store))
        assert compare_outputs(result, sim.log) == [] and result.core.state == 6
    # with one module for every step (as before the store), the second range differs
    alone = replay(load_module_source(recs[1]), sim.log, use_snapshots=False)
    assert len(compare_outputs(alone, sim.log)) == 3
