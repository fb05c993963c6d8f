"""The CUDA sources built for the CPU with g++ and ``cpu_shim/cuda_cpu.h``, run via ctypes.

The shared library is built once per source digest into ``<cache>/cpu_kernels/<digest>/``.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Final

import numpy as np

from ._paths import cache_dir
from .artifact import Artifact
from .kernel_ops import SIGNATURES, KernelOps

_HERE: Final = Path(__file__).resolve().parent
SOURCES: Final = (
    _HERE / "kernels" / "common.cuh",
    _HERE / "kernels" / "engine.cu",
    _HERE / "cpu_shim" / "cuda_cpu.h",
    _HERE / "cpu_shim" / "launch.cpp",
)
CXX_FLAGS: Final = ("-std=c++20", "-O2", "-shared", "-fPIC", "-pthread")

_lib: ctypes.CDLL | None = None
#: The shim keeps blockDim, gridDim, the block barrier and every ``__shared__`` array in
#: process-wide static storage (cpu_shim/cuda_cpu.h: "one launch at a time per process"), and
#: ctypes releases the GIL during a call: two engines (or an engine and a verifier) launching
#: from two threads would corrupt each other's blocks. Every launch holds this lock.
_LAUNCH_LOCK = threading.Lock()


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


def build() -> Path:
    """Compile (if needed) and return the path of the shared library."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) found to build the CPU kernels")
    h = hashlib.sha256()
    for p in SOURCES:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    h.update(" ".join((cxx, *CXX_FLAGS)).encode())
    out_dir = cache_dir() / "cpu_kernels" / h.hexdigest()[:16]
    lib = out_dir / "libnlkernels.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"libnlkernels.{os.getpid()}.so"
    cmd = [cxx, *CXX_FLAGS, "-include", str(_HERE / "cpu_shim" / "cuda_cpu.h"),
           str(_HERE / "cpu_shim" / "launch.cpp"), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"building the CPU kernels failed:\n{' '.join(cmd)}\n{res.stderr}")
    os.replace(tmp, lib)
    return lib


def library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(build()))
        kinds = {"p": ctypes.c_void_p, "i": ctypes.c_int, "l": ctypes.c_longlong}
        for name, sig in SIGNATURES.items():
            fn = getattr(lib, "nl_run_" + name.removeprefix("nl_"))
            ngrid = 2 if name in ("nl_q4_matmul", "nl_q8_matmul", "nl_rope", "nl_attention") \
                else 1
            fn.argtypes = [ctypes.c_uint] * (ngrid + 1) + [kinds[c] for c in sig]
            fn.restype = None
        _lib = lib
    return _lib


class CpuKernelOps(KernelOps):
    """Kernel ops on the CPU build; ``threads`` = CUDA threads per block (std::threads)."""

    def __init__(self, art: Artifact, *, threads: int = 1) -> None:
        # 0 threads would run no block at all (outputs left zero); over 256 would overflow the
        # kernels' shared reduction buffer (NL_RED in common.cuh).
        if not 1 <= threads <= 256:
            raise ValueError(f"threads per block must be in 1..256, not {threads}")
        self.lib = library()
        super().__init__(art, threads=threads)

    def launch(self, name: str, grid: tuple[int, ...], args: tuple[Any, ...]) -> None:
        fn = getattr(self.lib, "nl_run_" + name.removeprefix("nl_"))
        cargs: list[Any] = []
        for kind, a in zip(SIGNATURES[name], args, strict=True):
            if kind == "p":
                arr = a
                assert isinstance(arr, np.ndarray) and arr.flags.c_contiguous
                cargs.append(arr.ctypes.data)
            else:
                cargs.append(int(a))
        with _LAUNCH_LOCK:
            fn(*grid, self.threads, *cargs)
