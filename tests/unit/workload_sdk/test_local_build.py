"""Mode A's engine build (issue 28, part 4): recorded in the claim, checked on take-over. The
pure rules of workload_sdk._local_build."""

from __future__ import annotations

from broker_schema import ClaimRecord, LocalEngineBuild, SpecRecord, decode, encode
from broker_schema.records import record_dict
from workload_sdk._local_build import (
    engine_build_change,
    forced_note,
    isa_of,
    last_engine_build,
    this_engine_build,
)

H = "sha256:" + "1" * 64
LOCAL = SpecRecord(workload_id="w", module_hash=H, effect_kinds=(), local_models={"llm": H})
PLAIN = SpecRecord(workload_id="w", module_hash=H, effect_kinds=())
A = LocalEngineBuild(engine="ninelives-integer", version="0.1.0", backend="oracle",
                     isa="x86_64:avx,avx2,fma")
B = A.model_copy(update={"isa": "aarch64:asimd"})
V = A.model_copy(update={"version": "0.2.0"})


def _claim(epoch: int, build: LocalEngineBuild | None) -> ClaimRecord:
    return ClaimRecord(workload_id="w", epoch=epoch, holder_id=f"h{epoch}", spec_hash=H,
                       spec_offset=0, local_engine=build)


def test_the_isa_is_the_machine_and_the_simd_extensions_present() -> None:
    line = "flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx2 fma avx hypervisor"
    assert isa_of("x86_64", line) == "x86_64:avx,avx2,fma,sse4_1,sse4_2"
    assert isa_of("aarch64", "Features\t: fp asimd evtstrm crc32 asimddp") == \
        "aarch64:asimd,asimddp"
    assert isa_of("", "") == "unknown:"
    here = this_engine_build()
    assert here.backend == "oracle" and here.version and here.isa.count(":") == 1


def test_a_take_over_on_another_build_is_a_change_and_the_same_build_is_not() -> None:
    assert engine_build_change(LOCAL, A, A) is None
    assert engine_build_change(LOCAL, None, A) is None  # first claim, or an older one
    assert engine_build_change(PLAIN, A, B) is None  # no mode A models: nothing to check
    change = engine_build_change(LOCAL, A, B)
    assert change == ("ninelives-integer 0.1.0 oracle x86_64:avx,avx2,fma -> "
                      "ninelives-integer 0.1.0 oracle aarch64:asimd")
    assert "0.1.0" in (engine_build_change(LOCAL, A, V) or "") and "0.2.0" in (
        engine_build_change(LOCAL, A, V) or "")
    assert forced_note(change).startswith("local_engine ninelives-integer")
    assert len(forced_note(change * 10)) <= 300


def test_the_last_recorded_build_counts_and_claims_without_it_keep_their_bytes() -> None:
    assert last_engine_build([_claim(1, A), _claim(2, None), _claim(3, B), _claim(4, None)]) == B
    assert last_engine_build([_claim(1, None)]) is None
    assert "local_engine" not in record_dict(_claim(1, None))
    assert decode(encode(_claim(2, A))) == _claim(2, A)
