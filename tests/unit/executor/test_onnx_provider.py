"""ONNX Runtime's execution provider (issue 27, part 6): the choice (pure), and the CUDA request
falling back to the CPU provider, on the real onnxruntime with the real magika model."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from executor.engines import EngineOptions
from executor.engines.onnx import CPU_PROVIDER, CUDA_PROVIDER, OnnxEngine, choose_providers
from executor.models import ModelManifest, ModelStore
from fx_node.errors import EngineError

REPO = Path(__file__).resolve().parents[3]
HAS_CUDA = CUDA_PROVIDER in ort.get_available_providers()


def test_the_choice() -> None:
    both = [CUDA_PROVIDER, CPU_PROVIDER]
    assert choose_providers("cpu", "auto", both) == ([CPU_PROVIDER], None)
    assert choose_providers("auto", "auto", both) == ([CUDA_PROVIDER, CPU_PROVIDER], None)
    assert choose_providers("cuda", "auto", both) == ([CUDA_PROVIDER, CPU_PROVIDER], None)
    providers, why = choose_providers("cuda", "auto", [CPU_PROVIDER])
    assert providers == [CPU_PROVIDER] and why and "onnxruntime-gpu" in why
    providers, why = choose_providers("auto", "auto", ["AzureExecutionProvider", CPU_PROVIDER])
    assert providers == [CPU_PROVIDER] and why and "AzureExecutionProvider" in why
    providers, why = choose_providers("cuda", "cpu", both)
    assert providers == [CPU_PROVIDER] and why == "device = cpu overrides onnx_provider = cuda"


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA: no fallback to see")
def test_cuda_asked_without_it_runs_magika_on_the_cpu_and_says_why(
        model_store: ModelStore, magika: ModelManifest, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="executor.engines.onnx"):
        engine = OnnxEngine(EngineOptions(onnx_provider="cuda"))
    assert any("onnx_provider = cuda asked, running CPUExecutionProvider" in r.getMessage()
               and "onnxruntime-gpu" in r.getMessage() for r in caplog.records), caplog.text
    engine.load(magika, model_store.read_verified(magika.hash))
    result = engine.run(magika.hash, {}, (REPO / "fx_node" / "admission.py").read_bytes())
    assert result.output["label"] == "python"  # type: ignore[index,call-overload]
    assert engine.provider_of(magika.hash) == CPU_PROVIDER == engine.provider
    assert engine.device_class_of(magika.hash) == "cpu" == engine.device_class
    fact = engine.provider_fact()
    assert (fact.asked, fact.running) == ("cuda", CPU_PROVIDER)
    assert fact.reason and "has no CUDAExecutionProvider" in fact.reason


def test_cpu_asked_runs_on_the_cpu_with_no_reason(model_store: ModelStore,
                                                  magika: ModelManifest) -> None:
    engine = OnnxEngine(EngineOptions(onnx_provider="cpu"))
    engine.load(magika, model_store.read_verified(magika.hash))
    assert engine.provider_of(magika.hash) == CPU_PROVIDER
    assert engine.provider_fact().reason is None
    engine.unload(magika.hash)
    with pytest.raises(EngineError):
        engine.run(magika.hash, {}, b"x" * 100)


def test_the_cli_flag_sets_the_option(tmp_path: Path) -> None:
    def config(*flag: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "fx_cli.main", "executor", "run", "--print-config", *flag],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HOME": str(tmp_path)})
        return proc.stdout + proc.stderr
    assert 'onnx_provider = "cuda"' in config("--onnx-provider", "cuda")
    assert 'onnx_provider = "auto"' in config()
    bad = config("--onnx-provider", "tpu")
    assert "invalid choice: 'tpu'" in bad and "Traceback" not in bad
