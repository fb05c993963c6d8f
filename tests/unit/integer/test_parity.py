"""Parity gates: every backend byte-identical to the oracle (never allclose).

One test body per property over every backend: the numpy oracle, the CPU build of the CUDA
kernels (1 and 2 threads per block), and CuPy when a device is present.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fx_integer import artifact
from fx_integer.generation import GenRequest, generate_batch, to_host
from fx_integer.oracle import KVCache, Ops, OracleOps, forward
from fx_integer.sampling import SamplingParams

Factory = Callable[[artifact.Artifact], Ops]


def _cpu(threads: int) -> Factory:
    def make(art: artifact.Artifact) -> Ops:
        from fx_integer.cpu_kernel import CpuKernelOps

        return CpuKernelOps(art, threads=threads)

    return make


def _cupy(art: artifact.Artifact) -> Ops:
    from fx_integer.cupy_backend import CupyOps, available

    if not available():
        pytest.skip("no CUDA device / CuPy")
    return CupyOps(art)


BACKENDS: dict[str, Factory] = {
    "oracle": OracleOps,
    "cpu-kernel-1": _cpu(1),
    "cpu-kernel-2": _cpu(2),
    "cupy": _cupy,
}
PROMPTS = [[1, 5, 77, 200, 3, 9, 100, 42, 260, 261], [1, 88, 99], [1, 7, 8, 9, 10, 11, 12]]


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request: pytest.FixtureRequest, synth: artifact.Artifact) -> Ops:
    return BACKENDS[request.param](synth)


def _bytes(a: Any) -> bytes:
    h = to_host(a)
    assert h.dtype == np.int64
    return h.tobytes()


def _prefill(ops: Ops, toks: list[int]) -> bytes:
    return _bytes(forward(ops, [(KVCache(ops), toks)], all_logits=True)[0])


def test_prefill_matches_oracle(backend: Ops, synth_oracle: OracleOps) -> None:
    for toks in PROMPTS:
        assert _prefill(backend, toks) == _prefill(synth_oracle, toks)


def test_prefill_all_equals_token_by_token(backend: Ops) -> None:
    toks = PROMPTS[0]
    whole = _prefill(backend, toks)
    cache = KVCache(backend)
    rows = [_bytes(forward(backend, [(cache, [t])])[0]) for t in toks]
    assert b"".join(rows) == whole
    # and a split prefill (4 tokens, then the rest) gives the same rows
    cache = KVCache(backend)
    a = _bytes(forward(backend, [(cache, toks[:4])], all_logits=True)[0])
    b = _bytes(forward(backend, [(cache, toks[4:])], all_logits=True)[0])
    assert a + b == whole


def test_batch_of_one_equals_inside_batch(backend: Ops) -> None:
    alone = [_prefill(backend, t) for t in PROMPTS]
    caches = [KVCache(backend) for _ in PROMPTS]
    together = forward(backend, list(zip(caches, PROMPTS, strict=True)), all_logits=True)
    assert [_bytes(x) for x in together] == alone
    # decode steps inside a batch vs alone
    nxt = [[3], [4], [5]]
    batch_rows = forward(backend, list(zip(caches, nxt, strict=True)))
    for toks, n, row in zip(PROMPTS, nxt, batch_rows, strict=True):
        c = KVCache(backend)
        forward(backend, [(c, toks)])
        assert _bytes(forward(backend, [(c, n)])[0]) == _bytes(row)


def test_generation_tokens_match_oracle(backend: Ops, synth_oracle: OracleOps) -> None:
    sp = [SamplingParams(), SamplingParams(temperature_q16=45875, top_k=50, top_p_q16=58982,
                                           seed=11)]
    reqs = [GenRequest(prompt_tokens=tuple(p), max_tokens=6, sampling=s, stop_token=None)
            for p in PROMPTS for s in sp]
    got = generate_batch(backend, reqs)
    want = generate_batch(synth_oracle, reqs)
    assert got == want
    alone = [generate_batch(backend, [r])[0] for r in reqs[:2]]
    assert alone == got[:2]


_SUB = """
import hashlib, sys
from fx_integer import artifact
from fx_integer.oracle import KVCache, OracleOps, forward
art = artifact.load(sys.argv[1])
ops = OracleOps(art)
h = hashlib.sha256()
for toks in {prompts!r}:
    h.update(forward(ops, [(KVCache(ops), toks)], all_logits=True)[0].tobytes())
print(h.hexdigest())
"""


@pytest.mark.parametrize("threads", ["1", "2"])
def test_oracle_bytes_independent_of_blas_threads(threads: str, synth_path: Path,
                                                  synth_oracle: OracleOps) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               MKL_NUM_THREADS=threads)
    out = subprocess.run([sys.executable, "-c", _SUB.format(prompts=PROMPTS), str(synth_path)],
                         env=env, capture_output=True, text=True, check=True)
    h = hashlib.sha256()
    for toks in PROMPTS:
        h.update(_prefill(synth_oracle, toks))
    assert out.stdout.strip() == h.hexdigest()


def test_full_model_cpu_kernel_matches_oracle(real: artifact.Artifact,
                                             real_oracle: OracleOps) -> None:
    from fx_integer.cpu_kernel import CpuKernelOps

    k = CpuKernelOps(real, threads=1)
    toks = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    c1, c2 = KVCache(real_oracle), KVCache(k)
    a = forward(real_oracle, [(c1, toks)])[0]
    b = forward(k, [(c2, toks)])[0]
    assert _bytes(a) == _bytes(b)
    nxt = int(np.argmax(a[0]))
    assert _bytes(forward(real_oracle, [(c1, [nxt])])[0]) == _bytes(forward(k, [(c2, [nxt])])[0])
