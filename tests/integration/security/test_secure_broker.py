"""The secured local broker (``LocalKafka(secure=True)``: SASL/SCRAM-SHA-512 over TLS, the
standard authorizer, nothing allowed without an ACL) with the ACLs of ``fx acl apply``.

One broker for the module, in its own data dir. Every client here takes its credentials the way
a service does: from ``fx_kafka.security`` (``use_security`` in this process, and the
``FX_KAFKA_*`` environment it hands to the executor and holder processes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)

from broker_schema import INFERENCE_KIND, OutputRecord, decode, encode, topics
from broker_schema.records import InlineBody, InputRecord
from fx_kafka.acl import Roles, apply_acls, describe_acls, plan_acls
from fx_kafka.client import make_admin, make_consumer, make_producer, wait_ready
from fx_kafka.errors import BrokerAuthError, BrokerNotReadyError
from fx_kafka.local import LocalKafka
from fx_kafka.security import ClientSecurity, use_security
from fx_kafka.workload import ensure_system_topics, ensure_workload_topics
from fx_kafka.workload_log import read_topic
from tests.integration.harness import ExecutorHarness
from workload_sdk import body_of
from workload_sdk.testing import fx_command

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"
WA, WB = "seca", "secb"
USERS = ("holder-a", "holder-b", "producer-a", "producer-b")


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    data_dir = tmp_path_factory.mktemp("secure-broker")
    in_main = threading.current_thread() is threading.main_thread()
    broker = LocalKafka(data_dir=data_dir, secure=True, users=USERS, die_with_parent=in_main)
    broker.start(timeout=120)
    try:
        admin = broker.admin_security

        async def setup() -> None:
            with use_security(admin):
                for wid in (WA, WB):
                    await ensure_workload_topics(broker.bootstrap, wid)
                await ensure_system_topics(broker.bootstrap)
            for wid, who in ((WA, "a"), (WB, "b")):
                await apply_acls(broker.bootstrap, plan_acls(
                    Roles(holder=f"holder-{who}", producer=f"producer-{who}"), [wid]),
                    security=admin)

        asyncio.run(setup())
        yield broker
    finally:
        broker.stop()


async def _send(bootstrap: str, security: ClientSecurity, topic: str, value: bytes = b"x",
                key: bytes | None = None) -> int:
    producer = make_producer(bootstrap, security=security, request_timeout_ms=10_000)
    await producer.start()
    try:
        return int((await producer.send_and_wait(topic, value, key=key, partition=0)).offset)
    finally:
        await producer.stop()


def test_secrets_are_private_and_the_config_is_secured(kafka: LocalKafka) -> None:
    sec = kafka.secrets
    assert stat.S_IMODE(sec.root.stat().st_mode) == 0o700
    assert stat.S_IMODE(kafka.data_dir.stat().st_mode) == 0o700
    for path in (sec.ca_key, sec.keystore, kafka.properties_file, sec.password_file("admin"),
                 sec.env_file("executor"), sec.client_properties("admin")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert set(sec.users()) >= {"admin", "executor", "operator", *USERS}
    props = dict(line.split("=", 1) for line in kafka.properties_file.read_text().splitlines()
                 if line and not line.startswith("#"))
    assert props["authorizer.class.name"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer")
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_SSL"
    assert "PLAINTEXT://" not in props["listeners"]
    # the env file names the password by its file, never inline
    env = sec.env_file("executor").read_text()
    assert "FX_KAFKA_SASL_PASSWORD_FILE=" in env and sec.password("executor") not in env


async def test_a_client_without_credentials_gets_nothing(kafka: LocalKafka) -> None:
    bootstrap = kafka.bootstrap
    with pytest.raises(BrokerNotReadyError, match="FX_KAFKA_SECURITY_PROTOCOL=SASL_SSL"):
        await wait_ready(bootstrap, 3.0, security=ClientSecurity())
    wrong = dataclasses.replace(kafka.security_for("executor"), password="not-the-password")
    t0 = time.monotonic()
    with pytest.raises(BrokerAuthError, match="refused the credentials of User:executor"):
        await wait_ready(bootstrap, 20.0, security=wrong)
    assert time.monotonic() - t0 < 10, "a wrong password is said at once, not waited out"
    untrusted = dataclasses.replace(kafka.security_for("executor"), ca_file=None)
    with pytest.raises(BrokerAuthError, match="FX_KAFKA_CA_FILE"):
        await wait_ready(bootstrap, 20.0, security=untrusted)
    # a user with credentials but no ACL reads and writes nothing either
    nobody = kafka.security_for("producer-b")  # its ACLs name workload secb only
    with pytest.raises(TopicAuthorizationFailedError):
        await _send(bootstrap, nobody, topics.inputs(WA))


async def test_the_executor_cannot_write_out_or_merge(kafka: LocalKafka) -> None:
    bootstrap, ex = kafka.bootstrap, kafka.security_for("executor")
    for topic in (topics.out(WA), topics.merge(WA), topics.claims(WA), topics.spec(WA),
                  topics.inputs(WA)):
        with pytest.raises(TopicAuthorizationFailedError):
            await _send(bootstrap, ex, topic)
    # what it may write, it can
    assert await _send(bootstrap, ex, topics.resp(WA)) >= 0
    assert await _send(bootstrap, ex, topics.REJECTS) >= 0
    assert await _send(bootstrap, ex, topics.FACTS, key=b"test") >= 0  # compacted: keyed
    # it reads .out, but only in its own consumer groups
    with use_security(ex):
        await read_topic(bootstrap, topics.out(WA), timeout=10)
        consumer = make_consumer(bootstrap, group_id="not-an-executor-group")
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topics.out(WA), 0)])
            with pytest.raises(GroupAuthorizationFailedError):
                await consumer.committed(TopicPartition(topics.out(WA), 0))
        finally:
            await consumer.stop()


async def test_one_workloads_holder_cannot_touch_anothers_streams(kafka: LocalKafka) -> None:
    bootstrap = kafka.bootstrap
    holder_a = kafka.security_for("holder-a")
    with use_security(holder_a):
        await read_topic(bootstrap, topics.merge(WA), timeout=10)  # its own: fine
        for stream in ("in", "out", "resp", "merge", "claims", "spec"):
            with pytest.raises(TopicAuthorizationFailedError):
                await read_topic(bootstrap, f"wl.{WB}.{stream}", timeout=10)
    with pytest.raises(TopicAuthorizationFailedError):
        await _send(bootstrap, holder_a, topics.out(WB))
    # nor take over the other's transactional id
    producer = make_producer(bootstrap, security=holder_a, transactional_id=f"fx-holder.{WB}",
                             request_timeout_ms=10_000)
    with pytest.raises(TransactionalIdAuthorizationFailed):
        await producer.start()
    await producer.stop()
    # the producer of inputs writes .in and nothing else
    producer_a = kafka.security_for("producer-a")
    assert await _send(bootstrap, producer_a, topics.inputs(WA)) >= 0
    for topic in (topics.out(WA), topics.spec(WA), topics.inputs(WB)):
        with pytest.raises(TopicAuthorizationFailedError):
            await _send(bootstrap, producer_a, topic)
    # the operator reads everything, and the ACLs on the broker are exactly the plan's
    operator = kafka.security_for("operator")
    with use_security(operator):
        await read_topic(bootstrap, topics.merge(WB), timeout=10)
    found = await describe_acls(bootstrap, principal="holder-a", security=kafka.admin_security)
    assert set(found) == {b for b in plan_acls(Roles(holder="holder-a", producer=None,
                                                     executor=None, operator=None), [WA])}


def test_fx_acl_apply_dry_run_prints_the_plan() -> None:
    proc = subprocess.run([*fx_command(), "acl", "apply", "--workload", "w1", "--holder",
                           "holder-w1", "--dry-run"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "ALLOW User:executor READ TOPIC wl.w1.out (LITERAL)" in lines
    assert "ALLOW User:holder-w1 READ TOPIC wl.w1. (PREFIXED)" in lines
    assert "ALLOW User:holder-w1 WRITE TOPIC wl.w1.out (LITERAL)" in lines
    assert "ALLOW User:holder-w1 WRITE TOPIC wl.w1.spec (LITERAL)" not in lines  # issue 30
    assert "ALLOW User:holder-w1 WRITE TRANSACTIONAL_ID fx-holder.w1 (LITERAL)" in lines
    assert not any("User:executor WRITE TOPIC wl.w1.out" in line for line in lines)


def _decisions(view: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for rec in view:
        record = decode(rec.value)
        if isinstance(record, OutputRecord) and isinstance(record.body, InlineBody):
            data = record.body.data
            if isinstance(data, dict) and "decision" in data:
                out.append(data)
    return out


async def _holder_sees_the_executor_commit(bootstrap: str, security: ClientSecurity) -> None:
    group = f"fx-executor.{INFERENCE_KIND}"
    tp = TopicPartition(topics.out(WA), 0)
    admin = make_admin(bootstrap, security=security)
    await admin.start()
    try:
        deadline = time.monotonic() + 30
        while True:
            groups = {g[0] for g in await admin.list_consumer_groups()}
            offsets = (await admin.list_consumer_group_offsets(group, partitions=[tp])
                       if group in groups else {})
            if tp in offsets and offsets[tp].offset > 0:
                break
            assert time.monotonic() < deadline, (groups, offsets)
            await asyncio.sleep(0.5)
        # and no more than that: another workload's holder group stays hidden
        assert not [g for g in groups if g.startswith("fx-holder-elect.") and WB in g], groups
    finally:
        await admin.close()


async def test_the_normal_flow_works_with_each_role_its_own_user(
    kafka: LocalKafka, tmp_path: Path, magika_store: tuple[Path, str],
    executor_harness: Callable[..., ExecutorHarness],
) -> None:
    """Operator writes the spec, producer-a the inputs, the real executor (user executor) runs
    magika, holder-a holds the lease: every process with its own credentials from its env."""
    store, model_hash = magika_store
    bootstrap = kafka.bootstrap
    # the executor's consumer groups: the prefix its ACLs grant (fx_kafka.acl), the default
    settings = {"node_id": "exec-secure", "topic_pattern": rf"^wl\.{re.escape(WA)}\.out$",
                "group_prefix": "fx-executor"}
    files = [b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog >>\nendobj\n" * 20,
             b"import os\n\ndef main() -> None:\n    print(os.getcwd())\n\n" * 20]
    with use_security(kafka.security_for("operator")):
        async with executor_harness(bootstrap, WA, store, models={"filetype": model_hash},
                                    executor=settings) as h:
            with use_security(kafka.security_for("executor")):
                executor = h.start_configured_executor()
            with use_security(kafka.security_for("holder-a")):
                holder = h.start_holder("secure-holder")
            producer = kafka.security_for("producer-a")
            for data in files:
                record = InputRecord(workload_id=WA, body=body_of(data), source="upload")
                await _send(bootstrap, producer, topics.inputs(WA), encode(record))
            deadline = time.monotonic() + 60
            while True:
                log = await h.read_log()
                decisions = _decisions(log["out"])
                if len(decisions) >= len(files):
                    break
                for name, proc in (("executor", executor), ("holder-secure-holder", holder)):
                    assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "".join(
                    (tmp_path / f"{n}.log").read_text()[-2000:]
                    for n in ("executor", "holder-secure-holder"))
                await asyncio.sleep(0.3)
            # the holder's metrics read the executor group's committed offset on .out (list
            # groups, fetch offsets): its ACLs allow that, as holder-a
            await _holder_sees_the_executor_commit(bootstrap, kafka.security_for("holder-a"))
            assert h.stop(holder) == 0
            h.stop(executor)
    labels = {d["label"] for d in decisions}
    assert {"pdf", "python"} <= labels, labels
    assert all(d["model"] == model_hash for d in decisions)
    # the executor's log shows no authorisation refusal along the way
    text = (tmp_path / "executor.log").read_text()
    assert "AuthorizationFailed" not in text, text[-3000:]
    # replay and why, as the operator (who reads everything), in a process of their own
    env = kafka.security_for("operator").apply_env(dict(os.environ))
    argv = [sys.executable, "-m", "workload_sdk", "replay", WA, "--module", MODULE,
            "--bootstrap", bootstrap]
    done = await asyncio.to_thread(lambda: subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False, env=env))
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]


async def test_a_restart_reuses_certificates_and_credentials_and_adds_new_users(
    kafka: LocalKafka,
) -> None:
    """Last in the module: it restarts the module's broker."""
    ca = kafka.secrets.ca_cert.read_bytes()
    password = kafka.secrets.password("executor")
    port = kafka.bootstrap
    await kafka.astop()
    again = LocalKafka(data_dir=kafka.data_dir, users=("late-user",))  # secured by its data
    bootstrap = await again.astart(timeout=120)
    try:
        assert again.secure and bootstrap == port
        assert kafka.secrets.ca_cert.read_bytes() == ca
        assert kafka.secrets.password("executor") == password
        await wait_ready(bootstrap, 20.0, security=again.security_for("executor"))
        await wait_ready(bootstrap, 20.0, security=again.security_for("late-user"))
        # the ACLs survived the restart too
        with pytest.raises(TopicAuthorizationFailedError):
            await _send(bootstrap, again.security_for("executor"), topics.out(WA))
    finally:
        await again.astop()
