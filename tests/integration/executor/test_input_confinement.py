"""Input references confined, on a real broker and a real executor:

- a request naming ``sys.facts``, another workload's ``.in``, its own ``.out`` or a malformed
  topic is refused ``input_forbidden`` (signed, no ``accepted``) and nothing of that topic is read;
- a request naming a topic that does not exist gets a prompt ``input_missing`` and creates no
  topic, on a broker with ``auto.create.topics.enable`` off (the project's default) and on (a
  second local Kafka rendered from the template with it switched on);
- a slow input holds only its own request: one admitted after it is answered first, and the slow
  one ends ``input_missing`` when its executor lease lapses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from broker_schema import encode, topics
from broker_schema.records import AcceptedRecord, InlineBody, InputRecord, StreamRef
from executor import inputs as executor_inputs
from executor.models import ModelStore
from fx_kafka.client import make_admin
from fx_kafka.errors import FetchError, JavaNotFoundError
from fx_kafka.local import LocalKafka, deploy_dir
from fx_node.identity import verify_response
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.unit.executor.helpers import claim, request, spec

pytestmark = pytest.mark.integration

TEXT = b"#!/usr/bin/env python3\nimport sys\nprint(sys.argv)\n" * 3


async def _topic_names(bootstrap: str) -> set[str]:
    admin = make_admin(bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _auto_create(bootstrap: str) -> str:
    """The broker's ``auto.create.topics.enable`` (by DescribeConfigs on its first node)."""
    admin = make_admin(bootstrap)
    await admin.start()
    try:
        node = (await admin.describe_cluster())["brokers"][0]["node_id"]
        (resp,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(node), None)])
        for _code, _msg, _type, _name, entries in resp.resources:
            for entry in entries:
                if entry[0] == "auto.create.topics.enable":
                    return str(entry[1])
    finally:
        await admin.close()
    raise AssertionError("the broker does not report auto.create.topics.enable")


@contextlib.contextmanager
def _local_kafka(tmp: Path, auto_create: bool) -> Iterator[str]:
    """A second local Kafka whose template has ``auto.create.topics.enable`` set as asked."""
    deploy = tmp / "deploy"
    shutil.copytree(deploy_dir(), deploy)
    template = deploy / "server.properties.template"
    text = template.read_text()
    assert "auto.create.topics.enable=false" in text
    template.write_text(text.replace("auto.create.topics.enable=false",
                                     f"auto.create.topics.enable={str(auto_create).lower()}"))
    kafka = LocalKafka(data_dir=tmp / "data", deploy=deploy, die_with_parent=True)
    try:
        bootstrap = kafka.start(timeout=120)
    except (JavaNotFoundError, FetchError) as exc:
        # integration tests are never silently skipped in CI
        if os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}:
            pytest.fail(f"CI=true and no local Apache Kafka for a second broker: {exc}")
        pytest.skip(f"no local Apache Kafka for a second broker: {exc}")
    try:
        yield bootstrap
    finally:
        kafka.stop()


@pytest.fixture(params=["off", "on"])
def any_broker(request: pytest.FixtureRequest, kafka_bootstrap: str,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(bootstrap, auto-create setting)``: the session broker for ``off`` when it is off, else
    a local Kafka of this test's own."""
    wanted: str = request.param
    if wanted == "off" and asyncio.run(_auto_create(kafka_bootstrap)) == "false":
        yield kafka_bootstrap, "false"
        return
    with _local_kafka(tmp_path_factory.mktemp(f"kafka-auto-{wanted}"), wanted == "on") as b:
        yield b, asyncio.run(_auto_create(b))


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Topics the executors of this test go to the broker for while reading stream inputs.
    Installed on the class before an executor starts: one may answer its first requests before
    ``running`` hands it over."""
    seen: list[str] = []
    real = executor_inputs.read_record_at

    async def read_record_at(fetch: Any, topic: str, *args: Any, **kw: Any) -> bytes:
        seen.append(topic)
        return await real(fetch, topic, *args, **kw)

    monkeypatch.setattr(executor_inputs, "read_record_at", read_record_at)
    return seen


async def test_forbidden_references_are_refused_before_any_read(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with workload(kafka_bootstrap, "confine") as wl, \
            workload(kafka_bootstrap, "other") as other:
        wid = wl.workload_id
        await wl.setup({"magika": magika_hash})
        mine = await wl.write(topics.inputs(wid), encode(
            InputRecord(workload_id=wid, body=InlineBody.of_bytes(TEXT))))
        theirs = await other.write(topics.inputs(other.workload_id), encode(
            InputRecord(workload_id=other.workload_id, body=InlineBody.of_bytes(TEXT))))
        malformed = f"wl.{wid}.in.x"
        forbidden = {
            "sys.facts": StreamRef(topic=topics.FACTS, offset=0),
            "other_in": StreamRef(topic=topics.inputs(other.workload_id), offset=theirs),
            "own_out": StreamRef(topic=topics.out(wid), offset=0),
            "malformed": StreamRef(topic=malformed, offset=0),
        }
        reqs = {name: request(wid, magika_hash, ref, index=i)
                for i, (name, ref) in enumerate(forbidden.items())}
        fine = request(wid, magika_hash, StreamRef(topic=topics.inputs(wid), offset=mine),
                       index=len(reqs))
        for r in [*reqs.values(), fine]:
            await wl.send(r)
        cfg = executor_config(kafka_bootstrap, wid, tmp_path, store.root)
        seen = _spy_reads(monkeypatch)
        async with running(cfg) as svc:
            recs = await wl.responses([r.effect_id for r in [*reqs.values(), fine]], settle=0.5)
            public_key = svc.identity.public_key_b64
            metrics = svc.metrics_text().decode()
            tracked = set(svc.node.probe._client._topics)  # type: ignore[union-attr]
    answers = by_effect(recs)
    accepted = {r.effect_id for r in recs if isinstance(r, AcceptedRecord)}
    for name, req in reqs.items():
        (resp,) = answers[req.effect_id]
        assert resp.outcome == "error" and resp.error is not None, name
        assert resp.error.code == "input_forbidden", (name, resp.error)
        assert forbidden[name].topic[:60] in resp.error.message
        assert verify_response(resp, public_key)
        assert req.effect_id not in accepted
    (ok,) = answers[fine.effect_id]
    assert ok.outcome == "ok", ok.error
    assert isinstance(ok.output, InlineBody) and ok.output.data["label"] == "python"  # type: ignore[index,call-overload]
    # the broker was asked about the workload's own .in only
    assert seen == [topics.inputs(wid)]
    assert not {ref.topic for ref in forbidden.values()} & tracked
    assert malformed not in await _topic_names(kafka_bootstrap)
    assert 'code="input_forbidden"' in metrics


async def test_missing_topic_is_prompt_input_missing_and_creates_nothing(
    any_broker: tuple[str, str], tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    bootstrap, auto_create = any_broker
    async with workload(bootstrap, "ghost") as wl:
        wid = wl.workload_id
        ghost = topics.inputs(f"{wid}-ghost")  # granted by the spec, never created
        granting = spec(wid, {"magika": magika_hash}).model_copy(
            update={"input_topics": (ghost,)})
        await wl.write(topics.spec(wid), encode(granting))
        await wl.write(topics.claims(wid), encode(claim(wid, 1)))
        mine = await wl.write(topics.inputs(wid), encode(
            InputRecord(workload_id=wid, body=InlineBody.of_bytes(TEXT))))
        reqs = {
            "no_topic": request(wid, magika_hash, StreamRef(topic=ghost, offset=0), index=0),
            "no_partition": request(wid, magika_hash, StreamRef(
                topic=topics.inputs(wid), partition=3, offset=0), index=1),
            "no_offset": request(wid, magika_hash, StreamRef(
                topic=topics.inputs(wid), offset=mine + 10), index=2),
        }
        fine = request(wid, magika_hash, StreamRef(topic=topics.inputs(wid), offset=mine),
                       index=3)
        cfg = executor_config(bootstrap, wid, tmp_path, store.root)
        async with running(cfg):
            t0 = time.monotonic()
            for r in [*reqs.values(), fine]:
                await wl.send(r)
            recs = await wl.responses([r.effect_id for r in [*reqs.values(), fine]], timeout=30)
            elapsed = time.monotonic() - t0
        names = await _topic_names(bootstrap)
        if auto_create == "true":
            # the broker really creates a topic a client merely names (a producer's metadata
            # look-up, as a consumer's would): the executor's look-up must not, and did not
            witness = topics.inputs(f"{wid}-witness")
            await asyncio.wait_for(wl.producer.send_and_wait(witness, b"w"), 30)
            assert witness in await _topic_names(bootstrap), "auto-creation is not on"
    answers = by_effect(recs)
    for name, req in reqs.items():
        (resp,) = answers[req.effect_id]
        assert resp.error is not None and resp.error.code == "input_missing", (name, resp.error)
    assert "no topic" in answers[reqs["no_topic"].effect_id][0].error.message  # type: ignore[union-attr]
    assert answers[fine.effect_id][0].outcome == "ok"
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert ghost not in names, f"a topic was created (auto.create.topics.enable={auto_create})"
    assert auto_create in ("true", "false")


async def test_a_slow_input_holds_only_its_own_request(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    async with workload(kafka_bootstrap, "slow") as wl:
        wid = wl.workload_id
        await wl.setup({"magika": magika_hash}, lease_ms=4000)
        slow_off = await wl.write(topics.inputs(wid), encode(
            InputRecord(workload_id=wid, body=InlineBody.of_bytes(TEXT))))
        fast_off = await wl.write(topics.inputs(wid), encode(
            InputRecord(workload_id=wid, body=InlineBody.of_bytes(TEXT))))
        slow = request(wid, magika_hash, StreamRef(topic=topics.inputs(wid), offset=slow_off),
                       index=0)
        inline = request(wid, magika_hash, TEXT, index=1)
        stream = request(wid, magika_hash, StreamRef(topic=topics.inputs(wid), offset=fast_off),
                         index=2)
        cfg = executor_config(kafka_bootstrap, wid, tmp_path, store.root, workers=1,
                              input_fetchers=2, input_attempt_s=0.5)
        async with running(cfg) as svc:
            real = svc.runner.inputs._read_on

            async def read_on(consumer: Any, ref: StreamRef) -> bytes:
                if ref.offset == slow_off:
                    await asyncio.sleep(3600)  # a fetch that never returns
                return await real(consumer, ref)

            svc.runner.inputs._read_on = read_on  # type: ignore[method-assign,assignment]
            t0 = time.monotonic()
            await wl.send(slow)
            await asyncio.sleep(0.3)  # admitted and reading before the others arrive
            await wl.send(inline)
            await wl.send(stream)
            quick = await wl.responses([inline.effect_id, stream.effect_id], timeout=20)
            quick_s = time.monotonic() - t0
            assert slow.effect_id not in by_effect(quick), "the slow one was answered early"
            recs = await wl.responses([slow.effect_id], timeout=30)
            slow_s = time.monotonic() - t0
            metrics = svc.metrics_text().decode()
    answers = by_effect(recs)
    assert answers[inline.effect_id][0].outcome == "ok"
    assert answers[stream.effect_id][0].outcome == "ok"
    (late,) = answers[slow.effect_id]
    assert late.error is not None and late.error.code == "input_missing", late.error
    assert "executor lease" in late.error.message
    # the quick ones are answered while the slow read still holds; the slow one gives up within
    # the 4 s lease, before the next (jittered) retry would pass it, so from about 2.5 s on
    assert quick_s < 3.0 and quick_s < slow_s, (quick_s, slow_s)
    assert slow_s >= 2.0, (quick_s, slow_s)
    assert slow_s < 15
    assert 'op="stream"' in metrics  # the over-long attempts were counted as retries
