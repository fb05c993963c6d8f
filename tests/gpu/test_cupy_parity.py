"""CuPy backend byte-identical to the numpy oracle (skipped without a CUDA device).

On the device machine (no pytest-asyncio, no aiokafka there), from the repository root:

    FX_ARTIFACT=/tmp/art python3 -m pytest -c /dev/null --rootdir . --confcutdir tests/gpu \\
        -p no:cacheprovider -q tests/gpu

(``-c /dev/null``: the project's pytest settings name pytest-asyncio options, which with its
``filterwarnings = error`` stop pytest where the plugin is absent; ``--confcutdir``: the
top-level tests/conftest.py imports the Kafka helpers.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fx_integer import artifact, model_paths
from fx_integer.generation import GenRequest, generate_batch, to_host
from fx_integer.oracle import KVCache, OracleOps, forward
from fx_integer.sampling import SamplingParams

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cupy_ops_factory():  # type: ignore[no-untyped-def]
    from fx_integer.cupy_backend import CupyOps, available

    if not available():
        pytest.skip("no CUDA device / CuPy")
    return CupyOps


@pytest.mark.parametrize("threads", [0, 1, 7, 256])
def test_synthetic_parity(cupy_ops_factory, threads: int) -> None:  # type: ignore[no-untyped-def]
    art = artifact.parse(artifact.synthetic(seed=7))
    ora, gpu = OracleOps(art), cupy_ops_factory(art, threads=threads)
    for toks in ([1, 5, 77, 200, 3], [1, 2], list(range(3, 40))):
        a = forward(ora, [(KVCache(ora), toks)], all_logits=True)[0]
        b = to_host(forward(gpu, [(KVCache(gpu), toks)], all_logits=True)[0])
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("arch", ["gemma3", "qwen3", "cohere2-moe"])
def test_format2_archs_parity(cupy_ops_factory, arch: str) -> None:  # type: ignore[no-untyped-def]
    """The synthetic format 2 architectures (fx_integer.synthetic_archs): every scenario of
    tests/unit/integer/arch_scenarios.py byte-identical to the oracle's."""
    from tests.unit.integer import arch_scenarios

    art = arch_scenarios.arts()[arch]
    got = arch_scenarios.scenarios(cupy_ops_factory(art))
    assert got == arch_scenarios.scenarios(OracleOps(art))


def _real_artifact() -> Path:
    env = os.environ.get("FX_ARTIFACT")
    if env:
        return Path(env)
    try:
        return model_paths.ensure_artifact()
    except FileNotFoundError as exc:  # the device machine has no gguf wheel: set FX_ARTIFACT
        pytest.skip(f"no artifact (set FX_ARTIFACT): {exc}")


def test_full_model_generation_parity(cupy_ops_factory) -> None:  # type: ignore[no-untyped-def]
    art = artifact.load(_real_artifact())
    ora, gpu = OracleOps(art), cupy_ops_factory(art)
    reqs = [GenRequest(prompt_tokens=(1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198,
                                      1, 520, 9531, 198), max_tokens=8,
                       sampling=SamplingParams(), stop_token=2),
            GenRequest(prompt_tokens=(1, 22, 33, 44), max_tokens=8,
                       sampling=SamplingParams(temperature_q16=45875, seed=5), stop_token=None)]
    got, want = generate_batch(gpu, reqs), generate_batch(ora, reqs)
    assert got == want
    assert all(r.output_tokens for r in want)  # a real generation, not two empty lists
