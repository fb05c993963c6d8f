"""Bindings that move: the one rule for which spec binds a step (broker_schema.binding), the
adoption check, and the plans of fx upgrade / fx rollback."""

from __future__ import annotations

import pytest

from broker_schema import BindingSwitch, ClaimRecord, ModuleSwitch, SpecRecord, encode, record_hash
from broker_schema.binding import claim_in_force, spec_in_force, switch_problem
from tests.unit.workload_sdk.sim import WID, make_spec
from workload_sdk._bindings import BindingChangeError, plan_rollback, plan_upgrade

A, B, C = ("sha256:" + c * 64 for c in "abc")


def _claim(epoch: int, spec_offset: int, from_seq: int | None = None) -> ClaimRecord:
    return ClaimRecord(workload_id=WID, epoch=epoch, holder_id="h", spec_hash="sha256:" + "0" * 64,
                       spec_offset=spec_offset, from_seq=from_seq)


def test_the_last_claim_of_the_epoch_from_a_step_at_or_before_binds_it() -> None:
    claims = [_claim(1, 0), _claim(1, 1, from_seq=5), _claim(2, 1), _claim(2, 2, from_seq=9)]
    assert claim_in_force(claims, 1, 4) == claims[0]
    assert claim_in_force(claims, 1, 5) == claims[1]
    assert claim_in_force(claims, 1, 100) == claims[1]
    assert claim_in_force(claims, 2, 8) == claims[2] and claim_in_force(claims, 2, 9) == claims[3]
    assert claim_in_force(claims, 3, 0) is None
    specs = {0: make_spec(), 1: make_spec(limit=7)}
    found = spec_in_force(claims, specs, 1, 6)
    assert found is not None and found[1].outstanding_limit == 7
    assert spec_in_force(claims, specs, 2, 9) is None  # spec 2 not known


def test_a_claim_without_from_seq_keeps_its_bytes() -> None:
    plain = _claim(1, 0)
    assert b"from_seq" not in encode(plain)
    assert b'"from_seq":5' in encode(_claim(1, 0, from_seq=5))
    assert record_hash(plain) == record_hash(_claim(1, 0, None))


def test_a_spec_is_adopted_only_when_it_rebinds_nothing_passed() -> None:
    spec = make_spec()
    later = spec.model_copy(update={"binding_switches": (
        BindingSwitch(at_input_offset=10, models={"m": B, "m2": spec.models["m2"]}),)})
    assert switch_problem(spec, later, 10) is None
    assert switch_problem(spec, later, 3) is None
    passed = switch_problem(spec, later, 11)
    assert passed is not None and "input offset 10, which is passed" in passed
    # a changed base binding is a change at 0
    base = spec.model_copy(update={"models": {**spec.models, "m": B}})
    assert switch_problem(spec, base, 0) is None
    assert "input offset 0" in (switch_problem(spec, base, 1) or "")
    # other code for a step already taken is refused; from a later step it is a module switch
    other_module = spec.model_copy(update={"module_hash": C})
    assert switch_problem(spec, other_module, 0) is None
    assert "other code at step 0" in (switch_problem(spec, other_module, 1) or "")
    deployed = spec.model_copy(update={"module_switches": (
        ModuleSwitch(at_step=7, module_hash=C, workload_class="W"),)})
    assert switch_problem(spec, deployed, 7) is None
    assert "other code at step 7" in (switch_problem(spec, deployed, 8) or "")
    assert switch_problem(deployed, deployed, 50) is None
    # limits and deadlines may change from the next step
    assert switch_problem(spec, spec.model_copy(update={"outstanding_limit": 9}), 50) is None


def test_upgrade_and_rollback_plans() -> None:
    spec = make_spec()
    up = plan_upgrade(spec, "m", B, at_offset=12, next_seq=10)
    assert (up.old_hash, up.new_hash, up.at_offset) == (spec.models["m"], B, 12)
    assert up.spec.models_at(11)["m"] == spec.models["m"] and up.spec.models_at(12)["m"] == B
    assert up.spec.models_at(12)["m2"] == spec.models["m2"]  # the other names are kept
    SpecRecord.model_validate(up.spec.model_dump())
    with pytest.raises(BindingChangeError, match="already passed"):
        plan_upgrade(spec, "m", B, at_offset=9, next_seq=10)
    with pytest.raises(BindingChangeError, match="must come after"):
        plan_upgrade(up.spec, "m", C, at_offset=12, next_seq=10)
    back = plan_rollback(up.spec, "m", at_offset=20, next_seq=15)
    assert back.new_hash == spec.models["m"] and back.old_hash == B
    assert back.spec.models_at(19)["m"] == B and back.spec.models_at(20)["m"] == spec.models["m"]
    assert back.spec.models_at(11)["m"] == spec.models["m"]  # nothing before rewritten
    with pytest.raises(BindingChangeError, match="nothing to roll back to"):
        plan_rollback(spec, "m", at_offset=20, next_seq=0)
    assert plan_rollback(spec, "m", at_offset=20, next_seq=0, to_hash=C).new_hash == C
    with pytest.raises(BindingChangeError, match="binds no model"):
        plan_rollback(spec, "nope", at_offset=20, next_seq=0)
