"""Loading a workload from ``MODULE:Class`` or ``path/to/file.py:Class``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from workload_sdk._api import Workload


def load_workload(ref: str) -> Workload:
    """Instantiate the workload class named by ``ref`` (``pkg.module:Class`` or
    ``file.py:Class``; the current directory is importable). The class takes no arguments."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not attr:
        raise ValueError(f"expected MODULE:Class, got {ref!r}")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        module = importlib.import_module(module_name)
    cls = getattr(module, attr)
    workload = cls()
    if not isinstance(workload, Workload):
        raise TypeError(f"{ref} is not a workload_sdk.Workload subclass")
    return workload
