"""The proven-exact bounds are asserted where docs/integer-engine.md says, with the same check at
the same op on every backend; inside the bounds (at their very edge) the bytes are identical."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fx_integer import artifact
from fx_integer.generation import to_host
from fx_integer.oracle import (
    QK_LIMIT,
    RESID_LIMIT,
    ROPE_X_LIMIT,
    SWIGLU_LIMIT,
    V_LIMIT,
    FixedPointOverflow,
    Ops,
    OracleOps,
)


@pytest.fixture(scope="module")
def backends(synth: artifact.Artifact) -> dict[str, Ops]:
    from fx_integer.cpu_kernel import CpuKernelOps

    return {"oracle": OracleOps(synth), "cpu-kernel": CpuKernelOps(synth, threads=2)}


def _arr(shape: tuple[int, ...], hi: int, seed: int) -> np.ndarray[Any, np.dtype[np.int64]]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-hi, hi, size=shape, dtype=np.int64, endpoint=True)
    a.flat[0] = hi  # the edge itself
    a.flat[-1] = -hi
    return a


def _cases(cfg: artifact.Config) -> dict[str, tuple[Callable[[Ops, int], Any], int, str]]:
    """name -> (op over an input whose largest |value| is the argument, limit, check label)."""
    n, h, kv, hd, d = 3, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
    pos = np.arange(n, dtype=np.int64)
    small = _arr((n, kv, hd), 1 << 20, 9)
    return {
        "rope": (lambda o, m: o.rope(_arr((n, h, hd), m, 1), pos), ROPE_X_LIMIT, "rope input"),
        "attention q": (lambda o, m: o.attention(_arr((n, h, hd), m, 2), small, small, pos),
                        QK_LIMIT, "attention q"),
        "attention k": (lambda o, m: o.attention(_arr((n, h, hd), 1 << 20, 3),
                                                 _arr((n, kv, hd), m, 4), small, pos),
                        QK_LIMIT, "attention k"),
        "attention v": (lambda o, m: o.attention(_arr((n, h, hd), 1 << 20, 5), small,
                                                 _arr((n, kv, hd), m, 6), pos),
                        V_LIMIT, "attention v"),
        "ffn gate": (lambda o, m: o.swiglu(_arr((n, cfg.d_ff), m, 7),
                                           _arr((n, cfg.d_ff), 1 << 20, 8)),
                     SWIGLU_LIMIT, "ffn gate"),
        "ffn up": (lambda o, m: o.swiglu(_arr((n, cfg.d_ff), 1 << 20, 10),
                                         _arr((n, cfg.d_ff), m, 11)),
                   SWIGLU_LIMIT, "ffn up"),
        "residual": (lambda o, m: o.add(_arr((n, d), m - (1 << 20), 12),
                                        np.full((n, d), 1 << 20, dtype=np.int64)),
                     RESID_LIMIT, "residual"),
        # |x| <= 2**31 + 2**15 - 1 is the top piece's edge (2**15) for the float32 split
        "matmul": (lambda o, m: o.matmul(_arr((1, d), m, 13), "blk.0.qkv"),
                   (1 << 31) + (1 << 15) - 1, "matmul input (top piece)"),
    }


@pytest.mark.parametrize("case", ["rope", "attention q", "attention k", "attention v",
                                  "ffn gate", "ffn up", "residual", "matmul"])
def test_bound_is_checked_identically_and_exact_up_to_it(
        case: str, backends: dict[str, Ops], synth: artifact.Artifact) -> None:
    op, limit, label = _cases(synth.config)[case]
    # at the limit: no check fires, and every backend gives the oracle's bytes
    at = {name: to_host(op(ops, limit)).tobytes() for name, ops in backends.items()}
    assert len(set(at.values())) == 1, case
    # one past it: the same FixedPointOverflow, with the same message, on every backend
    msgs = {}
    for name, ops in backends.items():
        with pytest.raises(FixedPointOverflow) as exc:
            op(ops, limit + 1)
            getattr(ops, "finish", lambda: None)()
        msgs[name] = str(exc.value)
    assert len(set(msgs.values())) == 1, msgs
    assert msgs["oracle"].startswith(label + ":"), msgs


def test_accumulation_bound_fires_before_any_wrong_sum(backends: dict[str, Ops],
                                                       synth: artifact.Artifact) -> None:
    # a whole row at 2**40 passes the 2**41 input check but not the int64 accumulation bound
    x = np.full((1, synth.config.d_model), 1 << 40, dtype=np.int64)
    for ops in backends.values():
        with pytest.raises(FixedPointOverflow, match=r"\(accumulation bound\)"):
            ops.matmul(x, "blk.0.qkv")
        with pytest.raises(FixedPointOverflow, match="exceeds proven-exact bound 2199023255552"):
            ops.matmul(x * 4, "blk.0.qkv")


def test_cpu_kernel_threads_are_validated(synth: artifact.Artifact) -> None:
    from fx_integer.cpu_kernel import CpuKernelOps

    for bad in (0, 257):  # 0 ran no block (outputs silently zero); 257 overflowed NL_RED
        with pytest.raises(ValueError, match="threads per block"):
            CpuKernelOps(synth, threads=bad)


def test_cpu_kernel_launches_are_serialised(backends: dict[str, Ops],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the shim's blockDim, barrier and __shared__ arrays are process-wide: one launch at a time
    from fx_integer import cpu_kernel

    ops = backends["cpu-kernel"]
    held: list[bool] = []
    real = ops.lib  # type: ignore[attr-defined]

    class Spy:
        def __getattr__(self, name: str) -> Any:
            fn = getattr(real, name)

            def call(*args: Any) -> Any:
                held.append(cpu_kernel._LAUNCH_LOCK.locked())
                return fn(*args)

            return call

    monkeypatch.setattr(ops, "lib", Spy())
    ops.swiglu(np.ones((2, 8), dtype=np.int64), np.ones((2, 8), dtype=np.int64))
    assert held == [True]
