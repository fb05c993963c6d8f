"""The GPU check must run on the device machine, which has numpy and CuPy but none of the
project's other dependencies (no registry there): its import closure is checked here."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: what the device machine lacks, and what the check must not need although the repository is there
#: (the engine is fx_integer alone, no service)
NOT_ON_THE_DEVICE = ["cryptography", "gguf", "pydantic", "aiokafka", "fastapi", "rfc8785",
                     "prometheus_client", "yaml", "broker_schema", "fx_kafka", "cupy",
                     "executor", "workload_sdk", "fx_cli", "onnxruntime"]


def test_gpu_check_imports_only_numpy_and_the_engine() -> None:
    check = str(ROOT / "bench" / "gpu_check.py")
    script = textwrap.dedent(f"""
        import importlib.abc, importlib.util, sys
        BLOCK = set({NOT_ON_THE_DEVICE!r})
        class Blocker(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in BLOCK:
                    raise ImportError("not on the device machine: " + name)
                return None
        sys.meta_path.insert(0, Blocker())
        spec = importlib.util.spec_from_file_location("gpu_check", {check!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.main() == 2  # no CUDA device here: it says so and exits 2
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no CUDA device" in proc.stderr
