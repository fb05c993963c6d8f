"""Registry names carried by records (issue 28): an upgrade keeps the names of earlier bindings
and adds its own; fx log's rows show the name a spec recorded beside the hash it joins."""

from __future__ import annotations

from broker_schema import (
    INFERENCE_KIND,
    EffectHeader,
    EffectRequest,
    ModelName,
    SpecRecord,
    encode,
)
from workload_sdk._bindings import plan_rollback, plan_upgrade, with_names
from workload_sdk.log_rows import LogIndex, row_of

OLD = "sha256:" + "1" * 64
NEW = "sha256:" + "2" * 64
SPEC = SpecRecord(workload_id="w", module_hash="sha256:" + "3" * 64,
                  effect_kinds=(INFERENCE_KIND,), models={"m": OLD},
                  model_names={OLD: ModelName(name="gate", version="1", alias="prod")})


def test_an_upgrade_by_name_keeps_earlier_names_and_adds_its_own() -> None:
    change = with_names(plan_upgrade(SPEC, "m", NEW, 5, 0),
                        {NEW: ModelName(name="gate", version="2")})
    assert change.spec.model_names == {OLD: SPEC.model_names[OLD],
                                       NEW: ModelName(name="gate", version="2")}
    assert with_names(plan_upgrade(SPEC, "m", NEW, 5, 0), {}).spec.model_names == \
        SPEC.model_names  # a raw hash: no name added, none lost
    back = plan_rollback(change.spec, "m", 6, 0)
    assert back.new_hash == OLD and back.spec.model_names[OLD].alias == "prod"


def test_log_rows_show_the_recorded_name_beside_the_hash() -> None:
    header = EffectHeader(workload_id="w", input_offset=0, index=0, epoch=1)
    req = EffectRequest(header=header, effect_kind=INFERENCE_KIND, model=OLD, params={},
                        input=None, deadline_ms=1000)
    index = LogIndex()
    spec_row = row_of("spec", 0, 1, encode(SPEC))
    assert "gate@prod=1" in spec_row.summary
    index.add(spec_row)
    request_row = row_of("out", 0, 2, encode(req))
    index.add(request_row)
    joined = index.joined(request_row)
    assert (joined.model, joined.model_name) == (OLD, "gate@prod=1")
    plain = LogIndex()
    plain.add(request_row)
    assert plain.joined(request_row).model_name is None


def test_a_shadow_definition_keeps_names_and_resumes_whatever_names_were_given() -> None:
    import pytest

    from broker_schema import ShadowEvalRecord
    from workload_sdk._shadow_io import _same_definition

    ev = ShadowEvalRecord(eval_id="e1", workload_id="w", models={"m": NEW}, mode="history",
                          from_seq=0, to_seq=3, deadline_ms=1000, created_ms=1,
                          created_by="ops", model_names={NEW: ModelName(name="g", version="2")})
    assert ev.model_names[NEW].text() == "g@2"
    # the same evaluation given by hash the second time: the same definition (names are for
    # people), so it resumes
    assert _same_definition(ev, ev.model_copy(update={"model_names": {}, "created_ms": 2}))
    with pytest.raises(ValueError, match="does not bind"):
        ShadowEvalRecord(eval_id="e1", workload_id="w", models={"m": NEW}, mode="history",
                         from_seq=0, to_seq=3, deadline_ms=1000, created_ms=1, created_by="o",
                         model_names={OLD: ModelName(name="g", version="1")})


def test_the_console_names_rows_by_what_the_specs_recorded() -> None:
    from workload_sdk.log_rows import named

    header = EffectHeader(workload_id="w", input_offset=0, index=0, epoch=1)
    req = EffectRequest(header=header, effect_kind=INFERENCE_KIND, model=OLD, params={},
                        input=None, deadline_ms=1000)
    row = row_of("out", 3, 2, encode(req))
    names = dict(row_of("spec", 0, 1, encode(SPEC)).names)
    assert named(row, names).model_name == "gate@prod=1"
    assert named(row, {}).model_name is None
