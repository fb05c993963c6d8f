"""A numpy stand-in for the slice of CuPy that ``cupy_backend`` and ``bench/gpu_check.py`` use.

No GPU is needed: arrays are numpy arrays (a subclass with CuPy's ``.get()``), and
``RawModule(code=...).get_function(name)`` returns a kernel that first checks every argument the
way the CUDA driver would need it -- against the parameter list parsed from the *source text*
that CuPy would hand to NVRTC (not from ``kernel_ops.SIGNATURES``) -- and then runs the same
kernel from the g++ CPU build. What it catches: a Python int where the kernel takes ``int``
(CuPy would pass 8 bytes for it, the kernel reads 4, every later argument shifts), a numpy
scalar of the wrong width, a host (numpy) array where a device pointer belongs, a pointer to
the wrong element type, a non-contiguous array, a kernel name that is not in the source, grid
or block dimensions over CUDA's limits. What it cannot catch: anything of the GPU itself
(NVRTC/driver errors, memory-model or timing effects), which the device run covers.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from fx_integer import cpu_kernel

# C parameter type (after `const`/`__restrict__` are dropped) -> numpy dtype
_POINTEE = {"signed char": np.int8, "unsigned char": np.uint8, "int": np.int32,
            "i64": np.int64, "long long": np.int64}
_SCALAR: dict[str, type[Any]] = {"int": np.int32, "i64": np.int64, "long long": np.int64}
FAKE_THREADS = 1  # std::threads per block actually run by the fake (see FakeKernel.__call__)
_KERNEL_RE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


def parse_kernels(code: str) -> dict[str, list[tuple[str, bool]]]:
    """kernel name -> [(C base type, is_pointer)] from ``extern "C" __global__`` definitions."""
    out: dict[str, list[tuple[str, bool]]] = {}
    for name, params in _KERNEL_RE.findall(code):
        plist = []
        for p in params.split(","):
            toks = p.replace("*", " * ").split()
            is_ptr = "*" in toks
            base = [t for t in toks[:-1] if t not in ("const", "__restrict__", "*")]
            plist.append((" ".join(base), is_ptr))
        out[name] = plist
    return out


class FakeArray(np.ndarray):
    """A 'device' array: numpy memory, plus CuPy's ``get()`` (device -> host copy)."""

    def get(self) -> np.ndarray:
        return np.array(self)


def _dev(a: Any) -> Any:
    return a.view(FakeArray) if isinstance(a, np.ndarray) else a


class FakeKernel:
    def __init__(self, name: str, params: list[tuple[str, bool]], log: list[Any]) -> None:
        self.name = name
        self.params = params
        self.log = log

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                 *, shared_mem: int = 0, stream: Any = None) -> None:
        assert isinstance(grid, tuple) and 1 <= len(grid) <= 3, grid
        assert isinstance(block, tuple) and 1 <= len(block) <= 3, block
        assert all(isinstance(g, int) and g >= 1 for g in grid + block), (grid, block)
        assert grid[0] < 2**31 and all(g <= 65535 for g in grid[1:]), grid
        assert int(np.prod(block)) <= 1024 and block[0] <= 1024, block
        assert len(block) == 1 and block[0] <= 256, "the kernels use blockDim.x only, <= 256"
        assert isinstance(args, tuple), type(args)
        assert len(args) == len(self.params), (self.name, len(args), len(self.params))
        cargs: list[Any] = []
        for i, (a, (ctype, is_ptr)) in enumerate(zip(args, self.params, strict=True)):
            where = f"{self.name} argument {i} ({ctype}{' *' if is_ptr else ''})"
            if is_ptr:
                assert isinstance(a, FakeArray), f"{where}: not a device array: {type(a)}"
                assert a.dtype == np.dtype(_POINTEE[ctype]), f"{where}: dtype {a.dtype}"
                assert a.flags.c_contiguous, f"{where}: not C-contiguous"
                cargs.append(a.ctypes.data)
            else:
                want = _SCALAR[ctype]
                # CuPy passes a Python int as 8 bytes: only a numpy scalar of the exact width
                # matches an `int` parameter.
                assert type(a) is want, f"{where}: {type(a).__name__}, need {want.__name__}"
                cargs.append(int(a))
        self.log.append((self.name, grid, block, args))
        fn = getattr(cpu_kernel.library(), "nl_run_" + self.name.removeprefix("nl_"))
        # The bytes do not depend on the block size (tests/unit/integer/test_parity.py runs the
        # CPU build with 1 and 2 threads; the device run with up to 256). One std::thread per
        # CUDA thread, meeting at a barrier, is far too slow here for a 30-layer model.
        with cpu_kernel._LAUNCH_LOCK:
            fn(*grid, min(block[0], FAKE_THREADS), *cargs)


class FakeRawModule:
    def __init__(self, *, code: str, options: tuple[str, ...] = (), **kw: Any) -> None:
        assert isinstance(options, tuple) and all(isinstance(o, str) for o in options), options
        assert "#include" not in code, "NVRTC via cupy.RawModule(code=) gets no include path"
        self.code = code
        self.options = options
        self.kernels = parse_kernels(code)
        self.log: list[Any] = []

    def get_function(self, name: str) -> FakeKernel:
        if name not in self.kernels:
            raise KeyError(f"no extern \"C\" __global__ {name} in the module source")
        return FakeKernel(name, self.kernels[name], self.log)


def make_module() -> types.ModuleType:
    cp = types.ModuleType("cupy")
    cp.__dict__.update({k: getattr(np, k) for k in (
        "int8", "uint8", "int32", "int64", "float32", "float64", "ndarray")})
    cp.ndarray = FakeArray  # type: ignore[attr-defined]

    def asarray(a: Any, dtype: Any = None) -> Any:
        # host -> device copies (a numpy array that is not already "on the device") are copies
        if isinstance(a, FakeArray):
            return _dev(np.asarray(a, dtype=dtype))
        return _dev(np.array(a, dtype=dtype, copy=True))

    def wrap(fn: Any) -> Any:
        def inner(*args: Any, **kw: Any) -> Any:
            for a in list(args) + list(kw.values()):
                seq = a if isinstance(a, list | tuple) else [a]
                for x in seq:
                    assert not (isinstance(x, np.ndarray) and not isinstance(x, FakeArray)), \
                        f"cupy.{fn.__name__} given a host numpy array"
            return _dev(fn(*args, **kw))
        return inner

    cp.asarray = asarray  # type: ignore[attr-defined]
    for name in ("ascontiguousarray", "zeros", "empty", "stack", "concatenate", "abs", "argmax"):
        setattr(cp, name, wrap(getattr(np, name)))
    cp.RawModule = FakeRawModule  # type: ignore[attr-defined]

    class Device:
        def __init__(self, i: int = 0) -> None:
            self.id = i

        def synchronize(self) -> None:
            return None

    runtime = types.SimpleNamespace(
        getDeviceCount=lambda: 1,
        getDeviceProperties=lambda i: {"name": b"fake CuPy (numpy + the g++ kernel build)"},
    )
    cp.cuda = types.SimpleNamespace(runtime=runtime, Device=Device)  # type: ignore[attr-defined]
    return cp


@contextmanager
def installed() -> Iterator[types.ModuleType]:
    """``import cupy`` gives the fake inside the block (the real one, if any, is restored)."""
    old = sys.modules.get("cupy")
    cp = make_module()
    sys.modules["cupy"] = cp
    try:
        yield cp
    finally:
        if old is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = old
