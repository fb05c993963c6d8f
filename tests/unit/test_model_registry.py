"""The model registry's pure rules (broker_schema.registry): resolution and registration."""

from __future__ import annotations

import pytest

from broker_schema import (
    DecodeError,
    ModelAliasRecord,
    ModelName,
    ModelRecord,
    SpecRecord,
    canonical_json,
    decode,
    encode,
)
from broker_schema.records import record_dict
from broker_schema.registry import (
    AmbiguousModel,
    BadModelRef,
    UnknownAlias,
    UnknownModel,
    UnknownVersion,
    alias_problem,
    fold_registry,
    record_key,
    register_problem,
    resolve,
)

H1 = "sha256:" + "1" * 64
H2 = "sha256:" + "2" * 64
H3 = "sha256:" + "3" * 64


def _model(name: str, version: str, h: str, *aliases: str) -> ModelRecord:
    return ModelRecord(name=name, version=version, model_hash=h, aliases=aliases,
                       licence="Apache-2.0", registered_by="ops", registered_us=1)


def _alias(name: str, alias: str, version: str) -> ModelAliasRecord:
    return ModelAliasRecord(name=name, alias=alias, version=version, set_by="ops", set_us=2)


REG = fold_registry([_model("smollm2", "1.0", H1, "prod"), _model("smollm2", "1.1", H2),
                     _alias("smollm2", "canary", "1.1")])


def test_a_version_resolves_to_its_hash_and_name() -> None:
    got = resolve(REG, "smollm2@1.0")
    assert got.model_hash == H1
    assert got.name == ModelName(name="smollm2", version="1.0")
    assert got.name.text() == "smollm2@1.0"


def test_an_alias_resolves_to_the_version_it_names_now() -> None:
    assert resolve(REG, "smollm2@prod").model_hash == H1
    canary = resolve(REG, "smollm2@canary")
    assert (canary.model_hash, canary.name) == (
        H2, ModelName(name="smollm2", version="1.1", alias="canary"))
    moved = fold_registry([_model("smollm2", "1.0", H1, "prod"), _model("smollm2", "1.1", H2),
                           _alias("smollm2", "prod", "1.1")])
    assert resolve(moved, "smollm2@prod").model_hash == H2
    assert moved.names_of(H2) == ["smollm2@1.1"]


def test_a_raw_hash_is_itself_with_no_name() -> None:
    got = resolve(REG, H3)
    assert (got.model_hash, got.name) == (H3, None)


@pytest.mark.parametrize(("ref", "error"), [
    ("nosuch@1.0", UnknownModel),
    ("smollm2@2.0", UnknownVersion),
    ("smollm2@staging", UnknownAlias),
    ("smollm2", BadModelRef),
    ("SmolLM2@1.0", BadModelRef),
    ("smollm2@", BadModelRef),
    ("sha256:abc", BadModelRef),
    ("sha256:" + "A" * 64, BadModelRef),
])
def test_mistakes_are_typed_errors_with_one_line(ref: str, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        resolve(REG, ref)
    assert "\n" not in str(info.value) and str(info.value)


def test_an_alias_naming_an_unregistered_version_is_unknown() -> None:
    reg = fold_registry([_model("m", "1", H1), _alias("m", "prod", "9")])
    with pytest.raises(UnknownAlias, match="version 9"):
        resolve(reg, "m@prod")


def test_a_tag_that_is_a_version_and_an_alias_of_another_is_ambiguous() -> None:
    reg = fold_registry([_model("m", "prod", H1), _model("m", "2", H2, "prod")])
    with pytest.raises(AmbiguousModel, match="both version prod"):
        resolve(reg, "m@prod")
    same = fold_registry([_model("m", "prod", H1), _model("m", "2", H1, "prod")])
    assert resolve(same, "m@prod").model_hash == H1  # the same hash either way: no choice


def test_a_version_written_twice_with_different_hashes_is_ambiguous() -> None:
    reg = fold_registry([_model("m", "1", H1), _model("m", "1", H2), _alias("m", "prod", "1")])
    with pytest.raises(AmbiguousModel):
        resolve(reg, "m@1")
    with pytest.raises(AmbiguousModel):
        resolve(reg, "m@prod")


def test_a_version_is_registered_once() -> None:
    assert register_problem(REG, _model("smollm2", "1.0", H1, "canary")) is None
    assert "already registered" in (register_problem(REG, _model("smollm2", "1.0", H3)) or "")
    assert register_problem(REG, _model("other", "1.0", H3)) is None
    assert alias_problem(REG, _alias("smollm2", "prod", "1.1")) is None
    assert "no version" in (alias_problem(REG, _alias("smollm2", "prod", "7")) or "")
    assert "no model" in (alias_problem(REG, _alias("x", "prod", "1")) or "")


def test_keys_compact_a_version_and_an_alias_apart() -> None:
    assert record_key(_model("m", "1", H1)) == b"m@1"
    assert record_key(_alias("m", "prod", "1")) == b"m#prod"


def test_names_on_a_spec_keep_old_bytes_and_must_name_bound_hashes() -> None:
    base = SpecRecord(workload_id="w", module_hash=H3, effect_kinds=(), models={"llm": H1})
    named = base.model_copy(update={"model_names": {H1: ModelName(name="m", version="1")}})
    assert "model_names" not in record_dict(base)
    assert canonical_json(record_dict(base)) != canonical_json(record_dict(named))
    assert decode(encode(named)) == named
    stray = {**record_dict(base), "model_names": {H2: {"name": "m", "version": "1"}}}
    with pytest.raises(DecodeError, match="does not bind"):
        decode(canonical_json(stray))


def test_with_fleet_keys_only_records_signed_by_one_count() -> None:
    import base64

    from broker_schema import Signature
    from broker_schema.registry import signature_problem
    from broker_schema.signatures import SigningKey

    fleet, other = SigningKey.generate(), SigningKey.generate()

    def signed(rec: ModelRecord | ModelAliasRecord, key: SigningKey
               ) -> ModelRecord | ModelAliasRecord:
        value = base64.b64encode(key.sign(rec.signing_bytes())).decode()
        return rec.model_copy(update={"signature": Signature(alg=key.key_type,
                                                             key_id=key.key_id, value=value)})

    good = signed(_model("m", "1", H1, "prod"), fleet)
    forged = signed(_model("m", "2", H2), other)
    moved = signed(_alias("m", "prod", "2"), other)
    assert signature_problem(good, [fleet.public_key]) is None
    assert "not a fleet key" in (signature_problem(forged, [fleet.public_key]) or "")
    assert signature_problem(_model("m", "1", H1), [fleet.public_key]) == "unsigned"
    tampered = good.model_copy(update={"model_hash": H3})
    assert "does not verify" in (signature_problem(tampered, [fleet.public_key]) or "")
    reg = fold_registry([good, forged, moved], [fleet.public_key])
    assert resolve(reg, "m@prod").model_hash == H1  # the forged alias move is not counted
    with pytest.raises(UnknownVersion):
        resolve(reg, "m@2")
    assert len(reg.refused) == 2 and reg.refused[0].startswith("m@2:")
    assert resolve(fold_registry([good, forged, moved]), "m@prod").model_hash == H2
    assert "signature" not in record_dict(_model("m", "1", H1))  # unsigned: the old bytes
    assert decode(encode(good)) == good
