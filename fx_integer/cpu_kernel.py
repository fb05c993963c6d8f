"""The CUDA sources built for the CPU with g++ and ``cpu_shim/cuda_cpu.h``, run via ctypes.

The shared library is built once per source digest (and set of ``-D`` defines) into
``<cache>/cpu_kernels/<digest>/``. ``defines`` selects another build of the same source: the
only one the kernels honour is ``NL_PARITY_FAULT=1``, a deliberately broken build (one
accumulation off by one) that the parity gate (:mod:`fx_integer.parity_gate`) must refuse.
``FX_INTEGER_CPU_KERNEL_DEFINES`` (comma-separated, e.g. ``NL_PARITY_FAULT=1``) gives the defines
of the ``cpu-kernel`` backend that :func:`fx_integer.engine.make_ops` builds: a test hook, empty
in production.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, Final

import numpy as np

from .artifact import Artifact
from .kernel_ops import GRID2, SIGNATURES, KernelOps
from .model_paths import cache_dir

_HERE: Final = Path(__file__).resolve().parent
SOURCES: Final = (
    _HERE / "kernels" / "common.cuh",
    _HERE / "kernels" / "engine.cu",
    _HERE / "cpu_shim" / "cuda_cpu.h",
    _HERE / "cpu_shim" / "launch.cpp",
)
CXX_FLAGS: Final = ("-std=c++20", "-O2", "-shared", "-fPIC", "-pthread")

DEFINES_ENV: Final = "FX_INTEGER_CPU_KERNEL_DEFINES"
_DEFINE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}(=[0-9]{1,9})?$")

_libs: dict[tuple[str, ...], ctypes.CDLL] = {}
#: The shim keeps blockDim, gridDim, the block barrier and every ``__shared__`` array in
#: process-wide static storage (cpu_shim/cuda_cpu.h: "one launch at a time per process"), and
#: ctypes releases the GIL during a call: two engines (or an engine and a verifier) launching
#: from two threads would corrupt each other's blocks. Every launch holds this lock.
_LAUNCH_LOCK = threading.Lock()


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


def env_defines() -> tuple[str, ...]:
    """The defines named by ``FX_INTEGER_CPU_KERNEL_DEFINES`` (validated), else none."""
    raw = os.environ.get(DEFINES_ENV, "")
    return check_defines(tuple(d.strip() for d in raw.split(",") if d.strip()))


def check_defines(defines: tuple[str, ...]) -> tuple[str, ...]:
    """``NAME`` or ``NAME=<digits>`` only (they become g++ ``-D`` arguments), sorted."""
    for d in defines:
        if not _DEFINE.match(d):
            raise ValueError(f"bad kernel define {d!r}: NAME or NAME=<digits>")
    return tuple(sorted(set(defines)))


def build(defines: tuple[str, ...] = ()) -> Path:
    """Compile (if needed) and return the path of the shared library for ``defines``."""
    defines = check_defines(defines)
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++) found to build the CPU kernels")
    flags = (*CXX_FLAGS, *(f"-D{d}" for d in defines))
    h = hashlib.sha256()
    for p in SOURCES:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    h.update(" ".join((cxx, *flags)).encode())
    out_dir = cache_dir() / "cpu_kernels" / h.hexdigest()[:16]
    lib = out_dir / "libnlkernels.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"libnlkernels.{os.getpid()}.so"
    cmd = [cxx, *flags, "-include", str(_HERE / "cpu_shim" / "cuda_cpu.h"),
           str(_HERE / "cpu_shim" / "launch.cpp"), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"building the CPU kernels failed:\n{' '.join(cmd)}\n{res.stderr}")
    os.replace(tmp, lib)
    return lib


def library(defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The loaded shared library of ``defines``' build (each build loaded once per process)."""
    key = check_defines(defines)
    lib = _libs.get(key)
    if lib is None:
        lib = ctypes.CDLL(str(build(key)))
        kinds = {"p": ctypes.c_void_p, "i": ctypes.c_int, "l": ctypes.c_longlong}
        for name, sig in SIGNATURES.items():
            fn = getattr(lib, "nl_run_" + name.removeprefix("nl_"))
            ngrid = 2 if name in GRID2 else 1
            fn.argtypes = [ctypes.c_uint] * (ngrid + 1) + [kinds[c] for c in sig]
            fn.restype = None
        _libs[key] = lib
    return lib


class CpuKernelOps(KernelOps):
    """Kernel ops on the CPU build; ``threads`` = CUDA threads per block (std::threads);
    ``defines``: which build (see the module docstring; none = the build that must match)."""

    def __init__(self, art: Artifact, *, threads: int = 1,
                 defines: tuple[str, ...] = ()) -> None:
        # 0 threads would run no block at all (outputs left zero); over 256 would overflow the
        # kernels' shared reduction buffer (NL_RED in common.cuh).
        if not 1 <= threads <= 256:
            raise ValueError(f"threads per block must be in 1..256, not {threads}")
        self.defines = check_defines(defines)
        self.lib = library(self.defines)
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
