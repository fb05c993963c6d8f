"""The compose stack, run (issue 27, part 2): docker-compose.yml with docker-compose.host.yml on a
real engine without bridge networking. Apache Kafka (the image built from the Maven-fetched jars),
the CPU executor, the demo workload's lease holder (AskLLM on the integer SmolLM2-135M) and
Prometheus (Debian's package) come up on the host network at ports from the environment; the
demo's questions and more are answered end to end; the executor's container is restarted while
requests are in flight and every request is still answered ``ok`` and merged exactly once;
Prometheus scraped queue depth from the executor and merge lag from the holder; three executor
replicas get three node ids and three state volumes; ``down -v`` leaves no container, network
or volume of the project."""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import TopicPartition

from broker_schema import decode, topics
from broker_schema.records import EffectRequest, MergeEntry, ResponseRecord
from fx_kafka import run_sync
from fx_kafka.client import make_consumer
from tests.deploy.images import CONTAINER_PREFIX, ROOT
from tests.deploy.test_image import free_port

pytestmark = [pytest.mark.integration, pytest.mark.deploy, pytest.mark.slow]

WORKLOAD = "demo-llm"
FILES = ["-f", "docker-compose.yml", "-f", "docker-compose.host.yml"]
MORE_QUESTIONS = ["What is two plus two?", "Name a primary color.", "What do bees make?"]


class Stack:
    """``docker-compose`` with the host override, for one project, with its environment."""

    def __init__(self, docker: str, env: dict[str, str], project: str) -> None:
        self.docker = docker
        self.env = env
        self.project = project

    def compose(self, *args: str, timeout: float = 600, env: dict[str, str] | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(["docker-compose", "-p", self.project, *FILES, *args], cwd=ROOT,
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: {done.stderr[-4000:]}\n"
                                 f"{self.logs()}")
        return done

    def logs(self) -> str:
        done = subprocess.run(["docker-compose", "-p", self.project, *FILES, "logs", "--tail",
                               "15", "--no-color"], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=120, check=False)
        return done.stdout[-6000:]

    def container(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).stdout.split()
        assert len(ids) == 1, (service, ids)
        return ids[0]

    def labelled(self, kind: str) -> list[str]:
        args = {"container": ["ps", "-a", "-q"], "volume": ["volume", "ls", "-q"],
                "network": ["network", "ls", "-q"]}[kind]
        done = subprocess.run([self.docker, *args, "--filter",
                               f"label=com.docker.compose.project={self.project}"],
                              capture_output=True, text=True, check=True, timeout=60)
        return done.stdout.split()


@pytest.fixture(scope="module")
def stack(docker_engine: str, cpu_image: str, kafka_image: str,
          prometheus_image: str) -> Iterator[Stack]:
    ports = {name: str(free_port()) for name in ("FX_KAFKA_PORT", "FX_KAFKA_CONTROLLER_PORT",
                                                 "FX_EXECUTOR_HTTP_PORT", "FX_HOLDER_HTTP_PORT",
                                                 "FX_PROMETHEUS_PORT")}
    env = {**os.environ, **ports, "FX_IMAGE": cpu_image, "FX_KAFKA_IMAGE": kafka_image,
           "FX_PROMETHEUS_IMAGE": prometheus_image, "FX_SCRAPE_INTERVAL": "2s",
           "DOCKER_HOST": os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")}
    s = Stack(docker_engine, env, f"{CONTAINER_PREFIX}-stack")
    s.compose("down", "-v", "--remove-orphans", check=False)
    t0 = time.monotonic()
    s.compose("up", "-d", "--no-build")
    print(f"compose up (until the holder started): {time.monotonic() - t0:.1f} s")
    try:
        yield s
    finally:
        s.compose("down", "-v", "--remove-orphans", "-t", "20", check=False)


def bootstrap(s: Stack) -> str:
    return f"127.0.0.1:{s.env['FX_KAFKA_PORT']}"


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    async def read() -> list[Any]:
        consumer = make_consumer(bootstrap, isolation_level="read_uncommitted")
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            out: list[Any] = []
            while await consumer.position(tp) < end:
                batch = await consumer.getmany(tp, timeout_ms=1000)
                out += [decode(m.value) for m in batch.get(tp, []) if m.value is not None]
            return out
        finally:
            await consumer.stop()
    return run_sync(read)


def answers(s: Stack) -> tuple[list[EffectRequest], dict[str, list[ResponseRecord]]]:
    """The requests on ``.out`` and the responses on ``.resp`` by effect id."""
    reqs = [r for r in read_topic(bootstrap(s), topics.out(WORKLOAD))
            if isinstance(r, EffectRequest)]
    by: dict[str, list[ResponseRecord]] = {}
    for r in read_topic(bootstrap(s), topics.resp(WORKLOAD)):
        if isinstance(r, ResponseRecord):
            by.setdefault(r.effect_id, []).append(r)
    return reqs, by


def wait_answered(s: Stack, n: int, timeout: float) -> tuple[list[EffectRequest],
                                                               dict[str, list[ResponseRecord]]]:
    deadline = time.monotonic() + timeout
    while True:
        reqs, by = answers(s)
        if len(reqs) >= n and all(r.effect_id in by for r in reqs):
            return reqs, by
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(reqs)} requests, {len(by)} answered after {timeout} s\n"
                                 f"{s.logs()}")
        time.sleep(3)


def prometheus(s: Stack, query: str) -> list[dict[str, Any]]:
    url = (f"http://127.0.0.1:{s.env['FX_PROMETHEUS_PORT']}/api/v1/query?"
           + urllib.parse.urlencode({"query": query}))
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.loads(resp.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_stack_answers_survives_a_restart_and_is_scraped(stack: Stack) -> None:
    s = stack
    # the demo's two questions (the `questions` service), answered through the containers
    reqs, by = wait_answered(s, 2, timeout=420)
    holder = s.container("holder")
    for question in MORE_QUESTIONS:
        subprocess.run([s.docker, "exec", holder, "fx", "workload", "input", WORKLOAD,
                        "--text", question], check=True, capture_output=True, timeout=120)
    # restarted while the new questions are in flight: none is lost, none answered twice
    executor = s.container("executor-cpu")
    s.compose("restart", "-t", "10", "executor-cpu")
    assert s.container("executor-cpu") == executor
    reqs, by = wait_answered(s, 2 + len(MORE_QUESTIONS), timeout=600)
    assert len(reqs) == 2 + len(MORE_QUESTIONS), [r.effect_id for r in reqs]
    for r in reqs:
        # a request in flight when the executor stopped may be answered again after the restart
        # (its offset was not yet committed): the same answer, never a different one
        oks = [x for x in by[r.effect_id] if x.outcome == "ok"]
        assert oks, (r.effect_id, [(x.outcome, x.error) for x in by[r.effect_id]])
        assert len({json.dumps(x.output.model_dump(mode="json") if x.output else None,
                               sort_keys=True)
                    for x in oks}) == 1, r.effect_id
    # and the holder merged exactly one answer per request (a second one is passed over)
    deadline = time.monotonic() + 120
    while True:
        merged = [m for m in read_topic(bootstrap(s), topics.merge(WORKLOAD))
                  if isinstance(m, MergeEntry) and m.source == "resp" and m.action == "deliver"]
        delivered = sorted(str(m.effect_id) for m in merged)
        if len(delivered) >= len(reqs) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert delivered == sorted(r.effect_id for r in reqs), delivered

    # Prometheus scraped both services: queue depth (executor), merge lag (holder)
    deadline = time.monotonic() + 60
    while True:
        up = {x["metric"]["job"]: x["value"][1] for x in prometheus(s, "up")}
        depth = prometheus(s, 'fx_executor_queue_depth{job="fx-executor"}')
        lag = prometheus(s, 'fx_holder_merge_lag_records{job="fx-holder"}')
        if up.get("fx-executor") == "1" and up.get("fx-holder") == "1" and depth and lag:
            break
        assert time.monotonic() < deadline, (up, depth, lag)
        time.sleep(2)
    assert {x["metric"]["workload"] for x in lag} >= {WORKLOAD}, lag


def test_executor_scales_with_its_own_node_id_and_state(stack: Stack) -> None:
    s = stack
    s.compose("up", "-d", "--no-build", "--no-deps", "--scale", "executor-cpu=3", "executor-cpu",
              env={"FX_EXECUTOR_HTTP_PORT": "0"})
    ids = s.compose("ps", "-q", "executor-cpu").stdout.split()
    assert len(ids) == 3, ids
    node_ids: dict[str, str] = {}
    deadline = time.monotonic() + 120
    while len(node_ids) < 3:
        for cid in ids:
            done = subprocess.run([s.docker, "exec", cid, "cat", "/var/lib/ninelives-fx/node-id"],
                                  capture_output=True, text=True, check=False)
            if done.returncode == 0 and done.stdout.strip():
                node_ids[cid] = done.stdout.strip()
        assert time.monotonic() < deadline, node_ids
        time.sleep(2)
    assert len(set(node_ids.values())) == 3, node_ids
    volumes = set()
    for cid in ids:
        mounts = json.loads(subprocess.run([s.docker, "inspect", "-f", "{{json .Mounts}}", cid],
                                           capture_output=True, text=True, check=True).stdout)
        (state,) = [m["Name"] for m in mounts if m["Destination"] == "/var/lib/ninelives-fx"]
        volumes.add(state)
    assert len(volumes) == 3, volumes
    # every replica serves: healthy by the image's check, which finds its ephemeral port
    deadline = time.monotonic() + 240
    while True:
        health = [subprocess.run([s.docker, "inspect", "-f", "{{.State.Health.Status}}", cid],
                                 capture_output=True, text=True, check=True).stdout.strip()
                  for cid in ids]
        if health == ["healthy"] * 3:
            break
        assert time.monotonic() < deadline, (health, s.logs())
        time.sleep(3)


def test_down_leaves_nothing(stack: Stack) -> None:
    s = stack
    containers = s.labelled("container")
    assert containers
    # the anonymous volumes (executor and broker state) carry no compose label: named here
    inspected = json.loads(subprocess.run([s.docker, "inspect", *containers], capture_output=True,
                                          text=True, check=True).stdout)
    volumes = {m["Name"] for c in inspected for m in c["Mounts"] if m["Type"] == "volume"}
    assert volumes
    s.compose("down", "-v", "--remove-orphans", "-t", "20")
    assert s.labelled("container") == []
    assert s.labelled("volume") == []
    assert s.labelled("network") == []
    left = subprocess.run([s.docker, "volume", "ls", "-q"], capture_output=True, text=True,
                          check=True).stdout.split()
    assert volumes.isdisjoint(left), volumes & set(left)
