"""The producer on a CUDA GPU: kernels/engine.cu through ``cupy.RawModule``, weights resident.

Bound checks are evaluated on the device and accumulated into flags that are read once per
forward (in ``finish``), so a decode step costs a single host synchronisation.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from . import oracle
from .artifact import Artifact
from .kernel_ops import SIGNATURES, KernelOps, kernel_source

# CUDA threads per block for each kernel (any value <= 256 gives the same bytes).
BLOCK: Final = {"nl_q4_matmul": 32, "nl_qmatmul_s32": 32, "nl_qmatmul_s64": 32,
                "nl_attention": 128, "nl_rmsnorm": 128, "nl_rope": 32, "nl_embed_s32": 128,
                "nl_embed_s64": 128, "nl_swiglu": 256, "nl_geglu": 256, "nl_scale": 256}


def available() -> bool:
    try:
        import cupy

        return bool(cupy.cuda.runtime.getDeviceCount() > 0)
    except Exception:
        return False


class CupyOps(KernelOps):
    def __init__(self, art: Artifact, *, threads: int = 0) -> None:
        if not 0 <= threads <= 256:  # 0: BLOCK per kernel; > 256 overflows NL_RED
            raise ValueError(f"threads per block must be in 0..256, not {threads}")
        import cupy

        self.cp = cupy
        self.xp = cupy
        self.module = cupy.RawModule(code=kernel_source(), options=("--std=c++17",))
        self.kernels = {name: self.module.get_function(name) for name in SIGNATURES}
        self._flags: list[tuple[str, Any, int]] = []
        super().__init__(art, threads=threads)

    def put(self, a: Any) -> Any:
        return self.cp.asarray(np.ascontiguousarray(a))

    def host(self, a: Any) -> Any:
        return np.asarray(a.get() if hasattr(a, "get") else a, dtype=np.int64)

    def check(self, what: str, maxabs: Any, limit: int) -> None:
        self._flags.append((what, maxabs, limit))

    def embed(self, tokens: Any) -> Any:
        # the first op of every forward: drop the flags of a forward that ended in an exception
        # before its finish(), so that they are never reported against a later forward
        self._flags.clear()
        return super().embed(tokens)

    def finish(self) -> None:
        if not self._flags:
            return
        vals = self.cp.stack([self.cp.asarray(m, dtype=self.cp.int64) for _, m, _ in self._flags])
        host = vals.get()
        flags, self._flags = self._flags, []
        for (what, _, limit), v in zip(flags, host, strict=True):
            oracle.check_bound(what, int(v), limit)

    def launch(self, name: str, grid: tuple[int, ...], args: tuple[Any, ...]) -> None:
        # CuPy passes a Python int as an 8-byte value: every scalar is a numpy scalar of the
        # kernel parameter's exact width (int -> int32, i64 -> int64), or later ones shift.
        conv: list[Any] = []
        for kind, a in zip(SIGNATURES[name], args, strict=True):
            if kind == "p":
                conv.append(a)
            elif kind == "i":
                conv.append(np.int32(a))
            else:
                conv.append(np.int64(a))
        block = self.threads or BLOCK[name]
        self.kernels[name](tuple(grid), (block,), tuple(conv))
