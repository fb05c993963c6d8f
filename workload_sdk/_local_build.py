"""Mode A's engine build, recorded in the claim and checked when a holder takes over.

Mode A runs the integer engine inside the step (:mod:`workload_sdk._local`); its answers are
exact by construction, and replay is the guard. What ran them is recorded too: the holder's
claim carries the engine, its version, the backend and the CPU's instruction set
(:class:`broker_schema.LocalEngineBuild`). A holder that would take over a workload with mode A
models on another build than the last claim recorded refuses, unless it is started with
``--force``; the override is recorded in the claim (``forced``: ``local_engine OLD -> NEW``).

:func:`isa_of`, :func:`last_engine_build` and :func:`engine_build_change` decide (pure);
:func:`this_engine_build` reads the machine.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from pathlib import Path

from broker_schema import ClaimRecord, LocalEngineBuild, SpecRecord

__all__ = ["ISA_EXTENSIONS", "engine_build_change", "forced_note", "isa_of",
           "last_engine_build", "this_engine_build"]

#: The CPU extensions that can change how the engine's float32 block dot products are computed
#: (x86 and Arm SIMD): the instruction set recorded is the machine and those of them present.
ISA_EXTENSIONS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_int8", "amx_bf16",
    "asimd", "asimddp", "sve", "sve2", "i8mm", "bf16",
})


def isa_of(machine: str, cpu_flags: str) -> str:
    """``<machine>:<the ISA_EXTENSIONS in cpu_flags, sorted, comma-separated>`` (the flags as
    ``/proc/cpuinfo`` spells them: ``flags : fpu sse ...`` or ``Features : asimd ...``). Pure."""
    words = cpu_flags.split(":", 1)[-1].split()
    found = sorted(ISA_EXTENSIONS.intersection(words))
    return f"{machine or 'unknown'}:{','.join(found)}"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return ""


def this_engine_build() -> LocalEngineBuild:
    """The integer engine build this process runs mode A on."""
    from fx_integer.engine import ENGINE_NAME, ENGINE_VERSION
    from workload_sdk._local import BACKEND

    return LocalEngineBuild(engine=ENGINE_NAME, version=ENGINE_VERSION, backend=BACKEND,
                            isa=isa_of(platform.machine(), _cpu_flags()))


def last_engine_build(claims: Iterable[ClaimRecord]) -> LocalEngineBuild | None:
    """The engine build the latest claim that recorded one names (claims in log order). Pure."""
    found = None
    for claim in claims:
        if claim.local_engine is not None:
            found = claim.local_engine
    return found


def engine_build_change(spec: SpecRecord, previous: LocalEngineBuild | None,
                        current: LocalEngineBuild) -> str | None:
    """What differs between the build that last ran ``spec``'s mode A models and this one
    (``OLD -> NEW``), or None: no mode A models, no build recorded before, or the same one.
    Pure."""
    if not spec.local_models or previous is None or previous == current:
        return None
    return f"{previous.text()} -> {current.text()}"


def forced_note(change: str) -> str:
    """The ``ClaimRecord.forced`` entry of a take-over on another engine build."""
    return f"local_engine {change}"[:300]
