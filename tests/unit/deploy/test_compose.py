"""docker-compose.yml: valid for Compose (``docker-compose config`` needs no engine), with and
without the ``gpu`` profile; the services the deployment needs; and every ``fx`` command a
service runs is one the ``fx`` parser accepts (no engine here: no image is built, no container
started)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
import yaml

from tests.unit.deploy.helpers import DEPLOY, ROOT, need_tool
from tests.unit.deploy.test_fx_commands import assert_fx_command

COMPOSE_HOW = "Debian package docker-compose: make system-deps"


def _config(*profile: str) -> dict[str, Any]:
    compose = need_tool("docker-compose", COMPOSE_HOW)
    args = [compose, *(a for p in profile for a in ("--profile", p)), "config"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    # Compose warns on stderr about what it ignores or guesses: nothing of the sort is allowed
    assert "WARNING" not in done.stderr.upper(), done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return _config()


def test_config_is_valid_with_and_without_gpu(config: dict[str, Any]) -> None:
    gpu = _config("gpu")
    assert set(config["services"]) == set(gpu["services"])
    for name, svc in gpu["services"].items():
        profiles = svc.get("profiles", [])
        assert profiles == (["gpu"] if name == "executor-gpu" else []), (name, profiles)


def test_the_services(config: dict[str, Any]) -> None:
    services = config["services"]
    assert {"redpanda", "executor-cpu", "executor-gpu", "holder", "prometheus",
            "grafana"} <= set(services)
    # the broker users point tests at is unchanged: 127.0.0.1:19092 outside, redpanda:9092 inside
    rp = services["redpanda"]
    assert "--advertise-kafka-addr=internal://redpanda:9092,external://127.0.0.1:19092" in rp[
        "command"]
    assert any(str(p.get("published")) == "19092" or "19092:19092" in str(p)
               for p in rp["ports"])


def test_gpu_executor_reserves_nvidia_devices(config: dict[str, Any]) -> None:
    gpu = config["services"]["executor-gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert gpu["build"]["target"] == "cuda"
    assert gpu["image"] == "ninelives-fx:cuda"
    assert gpu["environment"]["FX_EXECUTOR_INTEGER_BACKEND"] == "cupy"
    cpu = config["services"]["executor-cpu"]
    assert cpu["build"]["target"] == "cpu" and "deploy" not in cpu


def test_images_come_from_the_dockerfile_targets(config: dict[str, Any]) -> None:
    targets = {line.split()[-1] for line in (ROOT / "Dockerfile").read_text().splitlines()
               if line.upper().startswith("FROM ") and " AS " in line.upper()}
    for name, svc in config["services"].items():
        if "build" in svc:
            assert svc["build"]["target"] in targets, name
            assert svc["image"] == f"ninelives-fx:{svc['build']['target']}", name


def test_executors_serve_http_to_prometheus(config: dict[str, Any]) -> None:
    for name in ("executor-cpu", "executor-gpu"):
        env = config["services"][name]["environment"]
        assert env["FX_EXECUTOR_HTTP_HOST"] == "0.0.0.0", name
        assert env["FX_EXECUTOR_BOOTSTRAP"] == "redpanda:9092", name


def test_executors_scale(config: dict[str, Any]) -> None:
    """`--scale executor-cpu=3` (issue 27): no fixed host port, no fixed node id, no shared
    named state volume (each replica gets the image's anonymous volume and makes its node id in
    it: deploy/docker/fx-entrypoint.sh); the health check reads the port from the environment."""
    for name in ("executor-cpu", "executor-gpu"):
        svc = config["services"][name]
        assert "ports" not in svc, name
        assert "FX_EXECUTOR_NODE_ID" not in svc["environment"], name
        assert not svc.get("volumes"), name
        assert svc["healthcheck"]["test"] == ["CMD", "python3", "/opt/ninelives-fx/healthcheck.py",
                                              "ready"], name
    entry = (DEPLOY / "docker" / "fx-entrypoint.sh").read_text()
    assert 'exec fx "$@"' in entry and "node-id" in entry


def _host_config(**env: str) -> dict[str, Any]:
    compose = need_tool("docker-compose", COMPOSE_HOW)
    done = subprocess.run([compose, "-f", "docker-compose.yml", "-f", "docker-compose.host.yml",
                           "config"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr.upper(), done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


def test_host_override() -> None:
    """docker-compose.host.yml: every started service on the host network, no published port
    (the engine refuses both), ports from the environment, local images, no network created."""
    config = _host_config(FX_KAFKA_PORT="29092", FX_EXECUTOR_HTTP_PORT="0",
                          FX_HOLDER_HTTP_PORT="29108", FX_PROMETHEUS_PORT="29090")
    services = config["services"]
    for name, svc in services.items():
        if "grafana" in svc.get("profiles", []) or "gpu" in svc.get("profiles", []):
            continue
        assert svc.get("network_mode") == "host", name
        assert "ports" not in svc, name
    assert config.get("networks", {}) in ({}, None)
    assert services["redpanda"]["image"].startswith("ninelives-fx-kafka:")
    assert services["redpanda"]["environment"]["KAFKA_PORT"] == "29092"
    assert services["executor-cpu"]["environment"]["FX_EXECUTOR_BOOTSTRAP"] == "127.0.0.1:29092"
    assert services["executor-cpu"]["environment"]["FX_EXECUTOR_HTTP_PORT"] == "0"
    assert services["holder"]["environment"]["FX_KAFKA_BOOTSTRAP"] == "127.0.0.1:29092"
    assert "29108" in services["holder"]["command"]
    assert "127.0.0.1:29090" in services["prometheus"]["command"][0]
    assert services["prometheus"]["image"].startswith("ninelives-fx-prometheus:")
    for name in ("executor-cpu", "holder", "workload-spec", "questions"):
        assert services[name]["build"]["args"]["PYTHON_IMAGE"] == "fx-debian-base:bookworm"
    # the Prometheus config the container renders names the same ports, and is valid
    template = (DEPLOY / "prometheus" / "prometheus.host.yml.in").read_text()
    command = services["prometheus"]["command"][0]
    for placeholder, port in (("@EXECUTOR_PORT@", "0"), ("@HOLDER_PORT@", "29108"),
                              ("@PROMETHEUS_PORT@", "29090")):
        assert placeholder in template and f"s/{placeholder}/{port}/" in command


def test_mounted_files_exist(config: dict[str, Any]) -> None:
    raw = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    for name, svc in raw["services"].items():
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), (name, source)
    assert (DEPLOY / "prometheus" / "prometheus.yml").is_file()


def test_the_demo_workload_binds_the_pinned_model(config: dict[str, Any]) -> None:
    pins = (DEPLOY / "docker" / "models.sha256").read_text()
    spec = config["services"]["workload-spec"]["command"]
    model = spec[spec.index("--model") + 1].split("=", 1)[1]
    assert model in pins
    module = spec[spec.index("--module") + 1]
    assert module in config["services"]["holder"]["command"]


def test_fx_commands_parse(config: dict[str, Any]) -> None:
    """Each service's command (the image's entrypoint is ``fx``) is one ``fx`` accepts."""
    checked = 0
    for name, svc in config["services"].items():
        if not svc.get("image", "").startswith("ninelives-fx:"):
            continue
        if svc.get("entrypoint") == ["sh", "-c"]:
            for part in svc["command"][0].split("&&"):
                words = part.split('"')  # fx workload input ID --text "...": keep the text whole
                argv = [*words[0].split()[1:], *(w for w in words[1:2])]
                assert_fx_command(argv, f"{name}: {part.strip()}")
                checked += 1
            continue
        command = svc.get("command") or ["executor", "run"]  # the image's CMD
        assert_fx_command([str(a) for a in command], name)
        checked += 1
    assert checked >= 5
