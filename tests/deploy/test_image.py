"""The ``cpu`` image runs ``fx executor run`` (container on the host network) against the session's
broker and answers a real workload: magika from the image's own model store, signed responses
written by the node id the entrypoint keeps in the state volume, kept across a restart."""
from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest

from broker_schema import topics
from broker_schema.records import InlineBody
from tests.deploy.images import CONTAINER_PREFIX, ROOT, remove_containers
from tests.integration.executor.harness import by_effect, workload
from tests.unit.executor.helpers import request

pytestmark = [pytest.mark.integration, pytest.mark.deploy]

STORE = "/opt/ninelives-fx/models"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def image_models(docker: str, image: str) -> dict[str, str]:
    """Interface -> hash of the image's model store (``fx models list`` in the image)."""
    out = subprocess.run([docker, "run", "--rm", "--network", "host", image, "models", "list",
                          "--store", STORE, "--json"], capture_output=True, text=True,
                         timeout=180, check=True)
    return {m["interface"]: str(m["hash"]) for m in json.loads(out.stdout)}


def wait_http(url: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    status = 0
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return int(resp.status)
        except OSError:
            time.sleep(1)
    return status


async def test_cpu_image_answers_magika(docker_engine: str, cpu_image: str,
                                        kafka_bootstrap: str) -> None:
    docker = docker_engine
    models = image_models(docker, cpu_image)
    assert {"magika", "silero-vad"} <= set(models), models
    name = f"{CONTAINER_PREFIX}-exec-{uuid.uuid4().hex[:8]}"
    port = free_port()
    async with workload(kafka_bootstrap, "image") as wl:
        await wl.setup({"magika": models["magika"]})
        env = {
            "FX_EXECUTOR_BOOTSTRAP": kafka_bootstrap,
            "FX_EXECUTOR_TOPIC_PATTERN": topics.out_pattern(wl.workload_id),
            "FX_EXECUTOR_GROUP_PREFIX": f"fx-test-{wl.workload_id}",
            "FX_EXECUTOR_HTTP_HOST": "127.0.0.1",
            "FX_EXECUTOR_HTTP_PORT": str(port),
            "FX_EXECUTOR_METADATA_MAX_AGE_MS": "500",
            "FX_EXECUTOR_FACTS_INTERVAL_S": "0",
        }
        argv = [docker, "run", "-d", "--name", name, "--network", "host"]
        for key, value in env.items():
            argv += ["-e", f"{key}={value}"]
        subprocess.run([*argv, cpu_image], check=True, capture_output=True, timeout=60)
        try:
            assert wait_http(f"http://127.0.0.1:{port}/v2/health/ready", 120) == 200, \
                _logs(docker, name)
            node_id = subprocess.run([docker, "exec", name, "cat", "/var/lib/ninelives-fx/node-id"],
                                     capture_output=True, text=True, check=True).stdout.strip()
            first = request(wl.workload_id, models["magika"],
                            (ROOT / "fx_node" / "admission.py").read_bytes(), index=0)
            await wl.send(first)
            recs = await wl.responses([first.effect_id], timeout=120)
            # a restarted container keeps its node id (the state volume) and answers again
            subprocess.run([docker, "restart", name], check=True, capture_output=True,
                           timeout=120)
            assert wait_http(f"http://127.0.0.1:{port}/v2/health/ready", 120) == 200, \
                _logs(docker, name)
            second = request(wl.workload_id, models["magika"], b"%PDF-1.4\n%\xe2\xe3\n1 0 obj\n",
                             index=1)
            await wl.send(second)
            recs = await wl.responses([first.effect_id, second.effect_id], timeout=120)
            logs = _logs(docker, name)
        finally:
            remove_containers(docker, name)
    answers = by_effect(recs)
    for req in (first, second):
        (resp,) = answers[req.effect_id]
        assert resp.outcome == "ok", (resp.error, logs)
        assert resp.written_by == node_id
        assert resp.executor is not None and resp.executor.engine == "onnxruntime"
        assert isinstance(resp.output, InlineBody)
    assert node_id.startswith("exec-")
    assert answers[first.effect_id][0].output.data["label"] == "python"  # type: ignore[index,union-attr]


def _logs(docker: str, name: str) -> str:
    out = subprocess.run([docker, "logs", "--tail", "40", name], capture_output=True, text=True,
                         check=False)
    return (out.stdout + out.stderr)[-3000:]
