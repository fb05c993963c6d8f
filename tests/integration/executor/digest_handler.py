"""A test kind handler: a kind without a model whose answer is the sha256 of its input and the
params it was given. Registered through ``ExecutorConfig.handlers``
(``{"acme:digest/run@1.0.0": "tests.integration.executor.digest_handler:DigestHandler"}``), the
way a real plugin would be."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import JsonValue

from broker_schema import sha256_hex
from executor.engines import EngineOptions, EngineResult
from fx_node.errors import EngineError

DIGEST_KIND = "acme:digest/run@1.0.0"


class DigestHandler:
    """``{"digest": sha256 of the input, "kind": ..., "params": ...}``; ``params["fail"]``
    answers ``params_invalid``."""

    name = "digest"
    version = "1"
    device_class = "cpu"
    max_batch = 4

    def __init__(self, options: EngineOptions | None = None) -> None:
        self.options = options

    def run_batch(self, kind: str, items: Sequence[tuple[Mapping[str, JsonValue], bytes]]
                  ) -> list[EngineResult | EngineError]:
        out: list[EngineResult | EngineError] = []
        for params, data in items:
            if params.get("fail"):
                out.append(EngineError("params_invalid", "asked to fail"))
            else:
                out.append(EngineResult({"digest": sha256_hex(data), "kind": kind,
                                         "params": dict(params)}))
        return out
