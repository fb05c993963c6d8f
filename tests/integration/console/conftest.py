"""Recorded workloads on the real broker, ``fx console`` as a process, and a real Chromium.

* ``magika_run``: the file-type gate with the real executor serving magika and a lease holder
  (both processes); nobody serves the gate kind, so its requests end in recorded timeouts; then
  an actuator gateway (a process, in front of a simulated Modbus gate) publishes its facts;
* ``llm_run``: the integer engine (SmolLM2-135M, CPU oracle) behind the executor answering a
  question with a signed, hash-chained receipt; then a tampered copy of that response (its
  answer text changed, its signature kept) appended to the same ``.resp``;
* ``console_url``: ``fx console`` serving that broker;
* ``browser``: Debian's chromium, headless, driven through chromium-driver by Selenium (the
  driver's path given, so Selenium Manager downloads nothing). Without chromium the browser tests
  skip, except with ``CI=true``, where that is a failure.

Screenshots go to the test's tmp dir, and also to ``$FX_CONSOLE_SCREENSHOTS`` when set (``make
console-screenshots`` sets it to ``docs/console``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import broker_schema as bs
from actuator.sim import SimulatedDevice
from broker_schema import topics
from fx_kafka.workload_log import read_facts
from tests.integration.harness import FILETYPE_GATE, FILETYPE_GATE_KINDS, ExecutorHarness
from workload_sdk.examples.filetype_gate import GATE_KIND

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = os.environ.get("FX_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("FX_CHROMEDRIVER", "/usr/bin/chromedriver")

FILES = {
    "report.pdf": b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n" * 20,
    "tool.py": b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20,
}
QUESTION = "What is the capital of France?"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@dataclass
class Run:
    """A recorded workload: its id, the input offsets and bytes, and what the test needs."""

    workload_id: str
    inputs: dict[int, bytes] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def _harness(work: Path, bootstrap: str, wid: str, store: Path, node_id: str, module: str, *,
             effect_kinds: tuple[str, ...], models: dict[str, str],
             **executor: Any) -> ExecutorHarness:
    """``wid`` served by the executor ``node_id`` (config ``work/executor.json``, key
    ``work/executor.key``, group prefix ``fx-console-<wid>``, ``executor`` overrides)."""
    return ExecutorHarness(bootstrap, wid, store, work=work, module=module,
                           effect_kinds=effect_kinds, models=models,
                           executor={"node_id": node_id, "group_prefix": f"fx-console-{wid}",
                                     "key_file": str(work / "executor.key"), **executor})


def _outputs(log: Any, key: str) -> list[dict[str, Any]]:
    return [o.body.data for o in (bs.decode(r.value) for r in log["out"])
            if isinstance(o, bs.OutputRecord) and isinstance(o.body, bs.InlineBody)
            and isinstance(o.body.data, dict) and key in o.body.data]


@pytest.fixture(scope="module")
async def magika_run(kafka_bootstrap: str, magika_store: tuple[Path, str],
                     tmp_path_factory: pytest.TempPathFactory) -> Run:
    store, model_hash = magika_store
    work = tmp_path_factory.mktemp("console-magika")
    wid = f"console-gate-{uuid.uuid4().hex[:8]}"
    run = Run(wid)
    async with _harness(work, kafka_bootstrap, wid, store, f"exec-{wid[-8:]}", FILETYPE_GATE,
                        effect_kinds=FILETYPE_GATE_KINDS, models={"filetype": model_hash}) as h:
        executor, holder = h.start_nodes("console-holder")
        for name, data in FILES.items():
            run.inputs[await h.send_input(data, source=name)] = data
        deadline = time.monotonic() + 180
        while True:
            log = await h.read_log()
            if len(_outputs(log, "gate")) >= len(FILES):  # each gate request timed out
                break
            assert executor.poll() is None, h.tail()
            assert holder.poll() is None, h.tail("holder-console-holder")
            assert time.monotonic() < deadline, h.tail("holder-console-holder")
            await asyncio.sleep(0.5)
        h.stop(holder)
        h.stop(executor)
        # an actuator gateway (a simulated Modbus gate) that publishes its facts: it serves the
        # gate kind at-most-once, for another workload id, so this run's log stays as recorded
        gateway_id = f"gw-{wid[-8:]}"
        with SimulatedDevice(registers=4) as gate:
            gw_cfg = work / "gateway.json"
            gw_cfg.write_text(json.dumps({
                "node_id": gateway_id, "bootstrap": kafka_bootstrap,
                "topic_pattern": topics.out_pattern(f"{wid}-gw"),
                "group_prefix": f"fx-console-gw-{wid}", "key_file": str(work / "gateway.key"),
                "http_port": None, "metadata_max_age_ms": 500, "session_timeout_ms": 2000,
                "heartbeat_interval_ms": 500, "facts_interval_s": 0,
                "devices": {"gate-a": {"port": gate.port, "address": 0,
                                       "values": {"closed": 0, "open": 1}}},
                "kinds": {GATE_KIND: {"guarantee": "at-most-once", "devices": ["gate-a"]}},
            }))
            gateway = h.start_gateway("--config", str(gw_cfg))
            deadline = time.monotonic() + 120
            while not any(f.node_id == gateway_id for f in await read_facts(kafka_bootstrap)):
                assert gateway.poll() is None, (work / "gateway.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (work / "gateway.log").read_text()[-3000:]
                await asyncio.sleep(0.5)
            h.stop(gateway)
    run.extra.update(model_hash=model_hash, gateway=gateway_id)
    return run


@pytest.fixture(scope="module")
def int_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    from executor.engines.integer import import_artifact
    from tests.unit.integer.real_model import real_artifact

    art = real_artifact()  # skipped without the model wheel, a failure in CI
    root = tmp_path_factory.mktemp("console-int-models")
    manifest = import_artifact(root, art)
    return root, manifest.hash


@pytest.fixture(scope="module")
async def llm_run(kafka_bootstrap: str, int_store: tuple[Path, str],
                  tmp_path_factory: pytest.TempPathFactory) -> Run:
    store, model_hash = int_store
    work = tmp_path_factory.mktemp("console-llm")
    wid = f"console-llm-{uuid.uuid4().hex[:8]}"
    run = Run(wid)
    async with _harness(work, kafka_bootstrap, wid, store, f"int-{wid[-8:]}",
                        "workload_sdk.examples.ask_llm:AskLLM", effect_kinds=(bs.INFERENCE_KIND,),
                        models={"llm": model_hash}, session_timeout_ms=10000,
                        integer_backend="oracle") as h:
        executor, holder = h.start_nodes("console-llm-holder")
        run.inputs[await h.send_input(QUESTION, source="operator")] = QUESTION.encode()
        deadline = time.monotonic() + 300
        while True:
            log = await h.read_log()
            if _outputs(log, "answer"):
                break
            assert executor.poll() is None, h.tail()
            assert time.monotonic() < deadline, h.tail()
            await asyncio.sleep(0.5)
        h.stop(holder)
        h.stop(executor)
        log = await h.read_log()
        genuine = [(r.offset, bs.decode(r.value)) for r in log["resp"]]
        (offset, resp), = [(o, r) for o, r in genuine if isinstance(r, bs.ResponseRecord)
                           and r.outcome == "ok"]
        assert isinstance(resp.output, bs.InlineBody) and isinstance(resp.output.data, dict)
        # a tampered copy: the answer text changed, everything else (signature, receipt) kept
        data = dict(resp.output.data, text="Berlin")
        tampered = resp.model_copy(update={"output": bs.InlineBody(encoding="json", data=data)})
        run.extra["tampered"] = await h.append(topics.resp(wid), bs.encode(tampered))
    run.extra.update(genuine=offset, store=store, model_hash=model_hash)
    return run


@pytest.fixture(scope="module")
def console_url(kafka_bootstrap: str, int_store: tuple[Path, str],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``fx console`` as a process, serving the test broker."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path_factory.mktemp("console") / "console.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fx_cli.main", "console", "--bootstrap", kafka_bootstrap,
             "--port", str(port), "--store", str(int_store[0]), "--refresh", "0.2"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Debian chromium through chromium-driver (Selenium), 1400x1000."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        message = f"no {' and no '.join(missing)}: `make system-deps` installs chromium"
        if _in_ci():
            pytest.fail(f"CI=true and {message}", pytrace=False)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1000", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(600)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shoot(browser: Any, tmp_path: Path) -> Any:
    """``shoot(name)``: a full-page screenshot of the current page, to the test's tmp dir and to
    ``$FX_CONSOLE_SCREENSHOTS`` when set; returns the tmp path."""
    def take(name: str) -> Path:
        import base64

        # the whole page, not only the window: DevTools' screenshot beyond the viewport
        size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
        shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": min(size["width"], 1600),
                     "height": min(size["height"], 4000), "scale": 1}})
        path = tmp_path / f"{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        target = os.environ.get("FX_CONSOLE_SCREENSHOTS")
        if target:
            Path(target).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(target) / f"{name}.png")
        assert path.stat().st_size > 10_000, "an empty screenshot"
        return path

    return take
