"""The compiled exact-integer path of the oracle: backend ``oracle-native``.

:class:`NativeOps` is :class:`~fx_integer.oracle.OracleOps` with its costly operations (the
quantized matmuls, RMSNorm, SwiGLU and attention) done by ``int_kernel/int_kernel.c``, built with
g++ at first use, cached by source digest under ``<cache>/int_kernel/<digest>/``, called through
ctypes. Every value there is an integer and every sum exact (see the C file), so threads and
SIMD cannot change a bit: the parity tests (tests/unit/integer/test_int_kernel.py) compare its
logits and digests byte for byte with the numpy oracle's on the real model. The numpy oracle
stays the canonical reference: where the numpy op would raise
:class:`~fx_integer.oracle.FixedPointOverflow` (or an input is outside the range the C code
handles), the C function returns a status and the numpy op runs instead, so errors are the
oracle's own.

Naming, for honest receipts: ``oracle`` is the numpy oracle and nothing else; an engine built
with ``backend="oracle-native"`` writes ``oracle-native`` into its receipts. The verifier
re-executes with the numpy oracle by default (:func:`verifier_backend`); ``--native`` (or
``FX_INTEGER_ORACLE=native``) uses this machine's build of this file only after the parity
gate's canaries passed on it for the receipt's model, and says which ran.

Threads: ``FX_INT_KERNEL_THREADS`` (default: ``OMP_NUM_THREADS``, else the CPU count).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from .artifact import Artifact, QWeight
from .forward import build_matrices
from .model_paths import cache_dir
from .oracle import (
    OracleOps,
    attention,
    check_matmul_input,
    exactness_weights,
    piece_split,
    qk_limit,
    rmsnorm,
    split_pieces,
    swiglu,
)

I64 = npt.NDArray[np.int64]

BACKEND: Final = "oracle-native"
SOURCE: Final = Path(__file__).resolve().parent / "int_kernel" / "int_kernel.c"
CXX_FLAGS: Final = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
#: ``FX_INTEGER_ORACLE=native`` lets the verifier re-execute on the compiled path (gated).
FORCE_ENV: Final = "FX_INTEGER_ORACLE"

_lib: ctypes.CDLL | None = None
_lib_error: str | None = None
_build_lock = threading.Lock()


class NativeBuildError(RuntimeError):
    """The compiled integer kernel could not be built (no compiler, or the build failed)."""


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU's flags (the cache is per machine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build() -> Path:
    """Compile (if needed) and return the path of the shared library."""
    cxx = os.environ.get("CXX") or shutil.which("g++")
    if cxx is None:
        raise NativeBuildError("no C++ compiler (g++) found to build the integer kernel")
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    h.update(" ".join((cxx, *CXX_FLAGS)).encode() + b"\0" + _cpu_id().encode())
    out_dir = cache_dir() / "int_kernel" / h.hexdigest()[:16]
    lib = out_dir / "libnlint.so"
    if lib.is_file():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f"libnlint.{os.getpid()}.so"
    cmd = [cxx, *CXX_FLAGS, str(SOURCE), "-o", str(tmp)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise NativeBuildError(f"building the integer kernel failed:\n{' '.join(cmd)}\n"
                               f"{res.stderr}")
    os.replace(tmp, lib)
    return lib


def library() -> ctypes.CDLL:
    """The loaded kernel library (built at first use); :class:`NativeBuildError` if it cannot."""
    global _lib, _lib_error
    with _build_lock:
        if _lib is not None:
            return _lib
        if _lib_error is not None:
            raise NativeBuildError(_lib_error)
        try:
            lib = ctypes.CDLL(str(build()))
        except (NativeBuildError, OSError) as exc:
            _lib_error = str(exc)
            raise NativeBuildError(_lib_error) from exc
        p, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        lib.nl_qmatmul.argtypes = [p, i, i, p, i, p, p, p, i, i, p, i, i, i]
        lib.nl_qmatmul.restype = i
        lib.nl_rmsnorm.argtypes = [p, i, i, p, ll, p]
        lib.nl_rmsnorm.restype = i
        lib.nl_swiglu.argtypes = [p, p, i, i, ll, p]
        lib.nl_swiglu.restype = i
        lib.nl_attention.argtypes = [p, p, p, p, i, i, i, i, i, ll, p, p, ll, ll]
        lib.nl_attention.restype = i
        _lib = lib
        return lib


def available() -> bool:
    """Whether the compiled path builds and loads here."""
    try:
        library()
    except NativeBuildError:
        return False
    return True


def verifier_backend() -> str:
    """The backend re-execution uses by default: the numpy oracle (``oracle``), the canonical
    reference, always. ``FX_INTEGER_ORACLE=native`` asks for ``oracle-native`` instead; the
    verifier then trusts this machine's build only after it reproduced the parity canaries
    byte for byte on the receipt's model (:func:`fx_integer.verifier.gated_native`)."""
    if os.environ.get(FORCE_ENV, "").strip().lower() == "native" and available():
        return BACKEND
    return "oracle"


def default_threads() -> int:
    for var in ("FX_INT_KERNEL_THREADS", "OMP_NUM_THREADS"):
        v = os.environ.get(var, "").strip()
        if v.isdigit() and int(v) > 0:
            return int(v)
    return os.cpu_count() or 1


#: nl_qmatmul's layout flags (int_kernel.c): codes packed two to a byte, int32 scales.
QF_NIBBLES: Final = 1
QF_S32: Final = 2
_I32 = np.iinfo(np.int32)


def _fits_int32(a: I64 | None) -> bool:
    return a is None or a.size == 0 or (int(a.min()) >= _I32.min and int(a.max()) <= _I32.max)


class NativeMatrix:
    """A quantized matrix laid out for the C kernel: codes [O, K] int8 (the artifact's own
    bytes where they are already contiguous int8), or, where every code is 0..15 (Q4_1, Q4_K)
    and K a multiple of 32, two to a byte (per 32 codes, byte j = code j | code 16 + j << 4);
    Q.24 scales/offsets [O, nb], int32 where every value fits, else int64. The same integers
    in fewer bytes: decode streams every weight once per step, so the bytes set its speed."""

    def __init__(self, w: QWeight) -> None:
        codes = np.ascontiguousarray(w.codes, dtype=np.int8)
        scale = np.ascontiguousarray(w.scale, dtype=np.int64)
        offset = None if w.offset is None else np.ascontiguousarray(w.offset, dtype=np.int64)
        self.group = w.group
        self.wq = exactness_weights(np.ascontiguousarray(scale.T),
                                    None if offset is None else np.ascontiguousarray(offset.T),
                                    w.qmax)
        self.out_features, self.in_features = codes.shape
        self.piece_bits, self.n_pieces = piece_split(w.qmax, w.group)
        self.flags = 0
        o, k = codes.shape
        self.codes: npt.NDArray[np.int8] | npt.NDArray[np.uint8] = codes
        if k % 32 == 0 and codes.size and int(codes.min()) >= 0 and int(codes.max()) <= 15:
            c = codes.view(np.uint8).reshape(o, k // 32, 2, 16)
            self.codes = np.ascontiguousarray(c[:, :, 0] | (c[:, :, 1] << 4)).reshape(o, k // 2)
            self.flags |= QF_NIBBLES
        self.scale: npt.NDArray[np.int32] | I64 = scale
        self.offset: npt.NDArray[np.int32] | I64 | None = offset
        if _fits_int32(scale) and _fits_int32(offset):
            self.scale = scale.astype(np.int32)
            self.offset = None if offset is None else offset.astype(np.int32)
            self.flags |= QF_S32


def qmatmul(w: NativeMatrix, x: I64, what: str = "matmul", *, threads: int = 1) -> I64:
    """[T, K] Q.16 x ``w`` -> [T, O] Q.16 on the C kernel: the bytes of
    :func:`fx_integer.oracle.qmatmul`, and its FixedPointOverflow where it raises."""
    lib = _lib if _lib is not None else library()
    x = np.ascontiguousarray(x, dtype=np.int64)
    t, k = x.shape
    if k != w.in_features:
        raise ValueError(f"{what}: input has {k} features, the matrix {w.in_features}")
    out = np.empty((t, w.out_features), dtype=np.int64)
    if t == 0:
        return out
    off = w.offset.ctypes.data if w.offset is not None else None
    st = lib.nl_qmatmul(x.ctypes.data, t, k, w.codes.ctypes.data, w.out_features,
                        w.scale.ctypes.data, off, w.wq.ctypes.data, w.piece_bits, w.n_pieces,
                        out.ctypes.data, threads, w.group, w.flags)
    if st == 2:
        raise MemoryError(f"{what}: the integer kernel could not allocate its buffers")
    if st != 0:
        # the numpy oracle's own checks, which raise its own FixedPointOverflow
        check_matmul_input(x, w.wq, what, w.group)
        split_pieces(x, w.piece_bits, w.n_pieces)
        raise RuntimeError(f"{what}: the integer kernel refused an input the numpy oracle "
                           "accepts (a bug: please report it)")
    return out


class NativeOps(OracleOps):
    """The oracle's operations with matmuls, RMSNorm, SwiGLU, attention compiled (same bytes)."""

    def __init__(self, art: Artifact, *, threads: int | None = None) -> None:
        self.lib = library()
        self.threads = default_threads() if threads is None else int(threads)
        if self.threads < 1:
            raise ValueError("threads must be >= 1")
        self._load_common(art)
        self.native: dict[str, NativeMatrix]
        self.native, self.plan = build_matrices(art, NativeMatrix)
        self.mats = {}  # the float32 layout of the numpy path is not kept

    def matmul(self, x: I64, mat: str) -> I64:
        return qmatmul(self.native[mat], x, mat, threads=self.threads)

    def rmsnorm(self, x: I64, gain: str) -> I64:
        g = self.gains[gain]
        x = np.ascontiguousarray(x, dtype=np.int64)
        if x.ndim != 2 or x.shape[1] != g.shape[0]:
            return rmsnorm(x, g, self.config.norm_eps_q32)
        out = np.empty_like(x)
        st = self.lib.nl_rmsnorm(x.ctypes.data, x.shape[0], x.shape[1], g.ctypes.data,
                                 int(self.config.norm_eps_q32), out.ctypes.data)
        if st != 0:  # outside the range the C code handles: the canonical op answers
            return rmsnorm(x, g, self.config.norm_eps_q32)
        return out

    def swiglu(self, g: I64, u: I64) -> I64:
        """silu(g) * u; ``g`` and ``u`` may be column slices of one array (the forward pass's)."""
        if g.shape != u.shape or g.ndim != 2:
            return swiglu(g, u)
        if not (g.dtype == u.dtype == np.int64 and g.strides[1] == u.strides[1] == 8
                and g.strides[0] == u.strides[0] and g.strides[0] % 8 == 0
                and g.strides[0] >= 8 * g.shape[1]):
            g, u = np.ascontiguousarray(g, dtype=np.int64), np.ascontiguousarray(u, np.int64)
        out = np.empty(g.shape, dtype=np.int64)
        if g.size == 0:
            return out
        st = self.lib.nl_swiglu(g.ctypes.data, u.ctypes.data, g.shape[0], g.shape[1],
                                g.strides[0] // 8, out.ctypes.data)
        if st != 0:
            return swiglu(g, u)  # raises the oracle's FixedPointOverflow
        return out

    def attention(self, q: I64, k: I64, v: I64, qpos: I64, window: int = 0) -> I64:
        n, h, hd = q.shape
        m, kvh, _ = k.shape
        scale = self.config.attn_scale_q30
        if n == 0 or m == 0 or v.shape != k.shape or k.shape[2] != hd:
            return attention(q, k, v, qpos, scale, window)
        q, k, v = (np.ascontiguousarray(a, dtype=np.int64) for a in (q, k, v))
        pos = np.ascontiguousarray(qpos, dtype=np.int64)
        out = np.empty((n, h * hd), dtype=np.int64)
        work = np.empty(m, dtype=np.int64)
        st = self.lib.nl_attention(q.ctypes.data, k.ctypes.data, v.ctypes.data, pos.ctypes.data,
                                   n, h, kvh, hd, m, int(scale), out.ctypes.data,
                                   work.ctypes.data, qk_limit(hd), int(window))
        if st != 0:  # the oracle's own bound errors, or a case the C code leaves to numpy
            return attention(q, k, v, qpos, scale, window)
        return out
