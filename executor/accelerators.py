"""The node's accelerators as ``sys.facts`` states them (``FactsRecord.accelerator_devices``).

:func:`probe_cuda` asks CuPy's runtime API (the CUDA driver and runtime through CuPy; no
``nvidia-smi``) what devices there are and returns plain dicts; :func:`accelerator_devices`, a
pure function, builds the records from such a probe result. A machine without CuPy, or without
a device, reports none.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from broker_schema.records import AcceleratorDevice

__all__ = ["accelerator_devices", "cuda_version_text", "node_devices", "probe_cuda"]

log = logging.getLogger(__name__)


def cuda_version_text(v: Any) -> str | None:
    """CUDA's integer version (1000 * major + 10 * minor, e.g. 12040) as ``"12.4"``."""
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        v = v.split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(v)[:200]


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def accelerator_devices(probe: Mapping[str, Any] | None) -> tuple[AcceleratorDevice, ...]:
    """Pure: the device records from a probe result (:func:`probe_cuda`'s shape)::

        {"driver_version": int | None, "runtime_version": int | None,
         "devices": [{"index", "name", "total_memory", "major", "minor",
                      "multi_processor_count"}, ...]}

    None (no CuPy, no device) gives none. Values the probe lacks are null."""
    if not probe:
        return ()
    driver = cuda_version_text(probe.get("driver_version"))
    runtime = cuda_version_text(probe.get("runtime_version"))
    devices: Iterable[Mapping[str, Any]] = probe.get("devices") or ()
    out = []
    for i, d in enumerate(devices):
        major, minor = _int(d.get("major")), _int(d.get("minor"))
        index = _int(d.get("index"))
        out.append(AcceleratorDevice(
            kind="cuda",
            index=i if index is None else index,
            name=_text(d.get("name", "")),
            memory_bytes=_int(d.get("total_memory")),
            compute_capability=None if major is None or minor is None else f"{major}.{minor}",
            multiprocessors=_int(d.get("multi_processor_count")),
            driver_version=driver,
            runtime_version=runtime,
        ))
    return tuple(sorted(out, key=lambda a: a.index))


def probe_cuda() -> dict[str, Any] | None:
    """What CuPy's runtime API reports (None without CuPy or without a device)."""
    try:
        import cupy
    except ImportError:
        return None
    try:
        rt = cupy.cuda.runtime
        n = int(rt.getDeviceCount())
        if n <= 0:
            return None
        devices = []
        for i in range(n):
            p = rt.getDeviceProperties(i)
            devices.append({"index": i, "name": p.get("name", b""),
                            "total_memory": p.get("totalGlobalMem"),
                            "major": p.get("major"), "minor": p.get("minor"),
                            "multi_processor_count": p.get("multiProcessorCount")})
        return {"driver_version": rt.driverGetVersion(),
                "runtime_version": rt.runtimeGetVersion(), "devices": devices}
    except Exception as exc:  # a driver fault must not stop the node: it reports no device
        log.warning("CUDA probe failed: %s: %s", type(exc).__name__, exc)
        return None


@functools.cache
def node_devices(device: str) -> tuple[AcceleratorDevice, ...]:
    """This node's devices, probed once per process; none when the executor's ``device`` is
    ``cpu`` (it will use none)."""
    if device == "cpu":
        return ()
    return accelerator_devices(probe_cuda())
