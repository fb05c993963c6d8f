"""A test engine: the ONNX engine plus a ``delay_s`` parameter, so a test can kill an executor
while a request is accepted and still running. Registered through ``ExecutorConfig.engines``
(``{"slow-onnx": "tests.integration.executor.slow_engine:SlowEngine"}``), the same way a real
plugin engine would be."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import JsonValue

from executor.engines import EngineOptions, EngineResult
from executor.engines.onnx import OnnxEngine
from executor.models import ModelManifest, ModelStore, ParamDoc, locate_package_model
from fx_node.errors import EngineError


class SlowEngine(OnnxEngine):
    """Sleeps ``params["delay_s"]`` (default 0) before running the batch."""

    name = "slow-onnx"

    def __init__(self, options: EngineOptions | None = None) -> None:
        super().__init__(options)
        self.max_batch = 1

    def run_batch(
        self, model_hash: str, items: Sequence[tuple[Mapping[str, JsonValue], bytes]]
    ) -> list[EngineResult | EngineError]:
        delay = max(float(p.get("delay_s", 0) or 0) for p, _ in items)  # type: ignore[arg-type]
        time.sleep(delay)
        stripped = [({k: v for k, v in p.items() if k != "delay_s"}, d) for p, d in items]
        return super().run_batch(model_hash, stripped)


def import_slow_model(store: ModelStore) -> ModelManifest:
    """silero-vad's opset-15 file (other bytes, so another hash) under the slow engine."""
    src: Path = locate_package_model("silero_vad", "data/silero_vad_16k_op15.onnx")
    base = store.import_package("silero-vad").model_dump(mode="json")
    base.pop("hash")
    base.pop("size")
    base.update(name="silero-vad-slow", engine="slow-onnx", source=str(src))
    base["params"]["delay_s"] = ParamDoc(default=0, doc="seconds to sleep first").model_dump()
    return store.add(src, base)
