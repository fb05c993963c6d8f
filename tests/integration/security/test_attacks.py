"""Issue 30: the attacks an outside security test got through, each reproduced against the
secured local broker (SASL/SCRAM over TLS, the standard authorizer, the ACLs of ``fx acl
apply``) and refused.

One broker for the module, in its own data dir, with two workloads (``atka``, ``atkb``), each with
its own holder and producer user.
"""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.errors import TopicAuthorizationFailedError
from aiokafka.protocol.admin import DeleteRecordsRequest, DeleteTopicsRequest

from broker_schema import (
    INFERENCE_KIND,
    EffectRequest,
    ExecutorInfo,
    MergeEntry,
    OutputRecord,
    ResponseRecord,
    Signature,
    SpecRecord,
    decode,
    encode,
    encode_signed,
    request_hash,
    topics,
)
from broker_schema.records import InlineBody, InputRecord
from broker_schema.signatures import SigningKey
from fx_kafka.acl import Operation, PatternType, ResourceType, Roles, apply_acls, plan_acls
from fx_kafka.client import create_topics, make_admin, make_producer
from fx_kafka.local import LocalKafka
from fx_kafka.security import ClientSecurity, use_security
from fx_kafka.workload import (
    WORKLOAD_TOPIC_CONFIGS,
    ensure_system_topics,
    ensure_workload_topics,
)
from fx_kafka.workload_log import read_topic
from fx_node.admission import input_problem
from workload_sdk import WorkloadLog, compare_outputs, replay
from workload_sdk.examples.filetype_gate import GATE_KIND, FiletypeGate
from workload_sdk.testing import WorkloadHarness, fx_command

pytestmark = pytest.mark.integration

WA, WB, WC = "atka", "atkb", "atkc"
USERS = ("holder-a", "holder-b", "producer-a", "producer-b", "holder-c", "producer-c",
         "node-a", "node-b")
#: issue 31: executor nodes with users of their own, each the only writer of its ledger
LEDGER_NODES = (("atk-node-a", "node-a"), ("atk-node-b", "node-b"))
ROLES = {WA: Roles(holder="holder-a", producer="producer-a"),
         WB: Roles(holder="holder-b", producer="producer-b"),
         WC: Roles(holder="holder-c", producer="producer-c")}
MODULE = "workload_sdk.examples.filetype_gate:FiletypeGate"
FAKE_MODEL = "sha256:" + "f" * 64
MODULE_HASH = "sha256:" + "0" * 64
_TOPIC_AUTHORIZATION_FAILED = 29
_TOPIC_DELETION_DISABLED = 73


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    data_dir = tmp_path_factory.mktemp("attack-broker")
    in_main = threading.current_thread() is threading.main_thread()
    broker = LocalKafka(data_dir=data_dir, secure=True, users=USERS, die_with_parent=in_main)
    broker.start(timeout=120)
    try:
        admin = broker.admin_security

        async def setup() -> None:
            with use_security(admin):
                for wid in (WA, WB, WC):
                    await ensure_workload_topics(broker.bootstrap, wid)
                await ensure_system_topics(broker.bootstrap)
            for wid, roles in ROLES.items():
                await apply_acls(broker.bootstrap, plan_acls(roles, [wid]), security=admin)
            await apply_acls(broker.bootstrap, plan_acls(Roles(
                executor=None, holder=None, producer=None, operator=None,
                ledger_nodes=LEDGER_NODES)), security=admin)
            with use_security(admin):
                await create_topics(broker.bootstrap, [topics.ledger(n) for n, _ in LEDGER_NODES],
                                    configs=WORKLOAD_TOPIC_CONFIGS)
            operator = broker.security_for("operator")
            for wid in (WA, WB):
                spec = SpecRecord(workload_id=wid, module_hash=MODULE_HASH,
                                  effect_kinds=("ninelives:inference/run@0.1.0",))
                await _send(broker.bootstrap, operator, topics.spec(wid), encode(spec))
            record = InputRecord(workload_id=WB, body=InlineBody.of_json({"private": "B"}))
            await _send(broker.bootstrap, broker.security_for("producer-b"), topics.inputs(WB),
                        encode(record))

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


# -- 1. grants checked against their writer ---------------------------------------------------
async def test_a_holder_cannot_grant_itself_another_workloads_inputs(kafka: LocalKafka) -> None:
    """Attack 1: holder-a, who cannot read wl.atkb.in, wrote a spec for its own workload
    granting ``input_topics=[wl.atkb.in]`` and ``chunks_from=[atkb]``, then requests naming
    them; the executor read them for it. Only the operator, who reads every topic, may write
    ``.spec`` now: the grant's writer must be able to read what it grants."""
    bootstrap = kafka.bootstrap
    holder_a = kafka.security_for("holder-a")
    with use_security(holder_a), pytest.raises(TopicAuthorizationFailedError):
        await read_topic(bootstrap, topics.inputs(WB), timeout=10)  # it cannot read B's input
    grant = SpecRecord(workload_id=WA, module_hash=MODULE_HASH,
                       effect_kinds=("ninelives:inference/run@0.1.0",),
                       input_topics=(topics.inputs(WB),), chunks_from=(WB,))
    with pytest.raises(TopicAuthorizationFailedError):
        await _send(bootstrap, holder_a, topics.spec(WA), encode(grant))
    # the spec in force is still the operator's, and under it a request of atka naming
    # wl.atkb.in (or atkb's chunks) is input_forbidden before any read
    with use_security(kafka.security_for("operator")):
        view = await read_topic(bootstrap, topics.spec(WA), timeout=10)
    specs = [SpecRecord.model_validate_json(r.value) for r in view]
    assert len(specs) == 1 and specs[0].input_topics == () and specs[0].chunks_from == ()
    from broker_schema.records import ChunkRef, EffectHeader, EffectRequest, StreamRef
    header = EffectHeader(workload_id=WA, input_offset=0, index=0, epoch=1)
    for ref in (StreamRef(topic=topics.inputs(WB), partition=0, offset=0),
                ChunkRef(hash="sha256:" + "1" * 64, size=1, workload=WB)):
        request = EffectRequest(header=header, effect_kind="ninelives:inference/run@0.1.0",
                                input=ref, deadline_ms=1000)
        assert input_problem(request, specs[0]) is not None
    # the operator may still grant (it reads everything it grants)
    assert await _send(bootstrap, kafka.security_for("operator"), topics.spec(WA),
                       encode(grant)) >= 1


# -- issue 31: nobody appends to another node's ledger ----------------------------------------
async def test_a_node_writes_only_its_own_ledger(kafka: LocalKafka) -> None:
    """With per-node users (``fx acl apply --ledger-node NODE=USER``) a foreign leaf cannot be
    appended to another node's ledger at all: the broker refuses the write."""
    bootstrap = kafka.bootstrap
    (node_a, user_a), (node_b, _) = LEDGER_NODES
    leaf = b'{"format":"fx-ledger/1","index":0,"receipt":{},"type":"leaf"}'
    assert await _send(bootstrap, kafka.security_for(user_a), topics.ledger(node_a), leaf,
                       key=node_a.encode()) >= 0
    with pytest.raises(TopicAuthorizationFailedError):
        await _send(bootstrap, kafka.security_for(user_a), topics.ledger(node_b), leaf,
                    key=node_b.encode())
    # node b's own user still writes it
    assert await _send(bootstrap, kafka.security_for(LEDGER_NODES[1][1]), topics.ledger(node_b),
                       leaf, key=node_b.encode()) >= 0


# -- 6. ACLs as narrow as documented ----------------------------------------------------------
async def test_every_delete_cell_no_topic_is_deleted_and_records_only_where_planned(
    kafka: LocalKafka,
) -> None:
    """Attack 6: holder-a deleted the topic wl.atka.claims, the operator wl.atkb.merge. Every
    principal against every topic of both workloads and the system topics: DeleteTopics is
    refused to all (the super user included: ``delete.topic.enable=false``), and DeleteRecords
    succeeds exactly where the plan grants DELETE (fx trim's streams, holder and operator)."""
    bootstrap = kafka.bootstrap
    principals = ("executor", "operator", "holder-a", "producer-a", "holder-b", "producer-b")
    plan = {b for wid, roles in ROLES.items() for b in plan_acls(roles, [wid])}
    names = [topics.stream(w, s) for w in (WA, WB) for s in topics.STREAMS]
    names += [topics.FACTS, topics.REJECTS, topics.CHUNKS, topics.ALARMS]

    def planned(user: str, topic: str) -> bool:
        for b in plan:
            if (b.principal == f"User:{user}" and b.operation == Operation.DELETE
                    and b.resource_type == ResourceType.TOPIC
                    and (b.name == topic if b.pattern == PatternType.LITERAL
                         else topic.startswith(b.name))):
                return True
        return False

    cells = 0
    for user in (*principals, "admin"):
        security = kafka.admin_security if user == "admin" else kafka.security_for(user)
        admin = make_admin(bootstrap, security=security)
        await admin.start()
        try:
            for topic in names:
                cells += 1
                # DeleteTopics, straight to the controller: refused to every principal
                response = await admin._send_to_controller(DeleteTopicsRequest([topic], 10_000))
                (name, code, *_), = response.topic_error_codes
                assert name == topic and code in (_TOPIC_AUTHORIZATION_FAILED,
                                                  _TOPIC_DELETION_DISABLED), (user, topic, code)
                if user == "admin":
                    assert code == _TOPIC_DELETION_DISABLED
                    continue
                # DeleteRecords below offset 0 (deletes nothing), straight to the one broker
                # (no metadata first: a topic the user may not describe is asked about too)
                request = DeleteRecordsRequest([(topic, [(0, 0)])], 10_000)
                node = next(iter(admin._client.cluster.brokers())).nodeId
                reply = await admin._client.send(node, request)
                (_, ((_, _, code, *_),), *_), = reply.topics
                expected = 0 if planned(user, topic) else _TOPIC_AUTHORIZATION_FAILED
                assert code == expected, (user, topic, code)
        finally:
            await admin.close()
    assert cells == (len(principals) + 1) * len(names)
    # every topic is still there
    admin = make_admin(bootstrap, security=kafka.admin_security)
    await admin.start()
    try:
        assert set(names) <= set(await admin.list_topics())
    finally:
        await admin.close()


# -- 3. signed or refused ---------------------------------------------------------------------
def _answer(req: EffectRequest, node: str, label: str, key: SigningKey | None) -> bytes:
    response = ResponseRecord(
        effect_id=req.effect_id, header=req.header, request_offset=0, outcome="ok",
        output=InlineBody.of_json({"label": label}), model_hash=req.model,
        executor=ExecutorInfo(node_id=node, engine="forged", engine_version="0",
                              device_class="cpu"),
        written_by=node, request_hash=request_hash(encode(req)))
    if key is None:
        return encode(response)
    return encode_signed(response, lambda data: Signature(
        alg=key.key_type, key_id=key.key_id, value=base64.b64encode(key.sign(data)).decode()))[1]


async def test_unsigned_and_untrusted_answers_are_passed_over(
    kafka: LocalKafka, tmp_path: Path,
) -> None:
    """Attack 3: with an executor credential (any executor may write every workload's
    ``.resp``), 5 of 5 forged unsigned answers reached the step. On a secured broker the spec
    now says ``unsigned = "refuse"`` by default, and its ``signers`` name the key trusted for
    each node: an unsigned answer, and one signed by another key, are passed over with their
    reasons; the answer signed by the trusted node's key is the one the step sees."""
    bootstrap = kafka.bootstrap
    trusted, rogue = SigningKey.generate(), SigningKey.generate()
    operator = kafka.security_for("operator")
    with use_security(operator):
        async with WorkloadHarness(bootstrap, WC, MODULE, effect_kinds=(INFERENCE_KIND,
                                                                         GATE_KIND),
                                   models={"filetype": FAKE_MODEL}, log_dir=tmp_path,
                                   signers={"exec-trusted": (trusted.public_key_b64,)}) as h:
            assert h.spec.unsigned == "refuse"  # the default on a secured broker
            with use_security(kafka.security_for("holder-c")):
                holder = h.start_holder("holder-c")
            record = InputRecord(workload_id=WC, body=InlineBody.of_json({"file": 1}))
            await _send(bootstrap, kafka.security_for("producer-c"), topics.inputs(WC),
                        encode(record))
            log = await h.wait_for(lambda lg: bool(h.requests(lg, INFERENCE_KIND)), timeout=60,
                                   what="the holder's request")
            (_, req), = h.requests(log, INFERENCE_KIND)
            executor = kafka.security_for("executor")
            forged = [_answer(req, "mallory", "pdf", None),
                      _answer(req, "exec-trusted", "pdf", None),
                      _answer(req, "exec-trusted", "pdf", rogue),
                      _answer(req, "mallory", "pdf", trusted)]
            offsets = [await _send(bootstrap, executor, topics.resp(WC), v) for v in forged]
            genuine = await _send(bootstrap, executor, topics.resp(WC),
                                  _answer(req, "exec-trusted", "txt", trusted))

            def merged(lg: WorkloadLog) -> bool:
                return any(isinstance(e, MergeEntry) and e.source_offset == genuine
                           and e.source == "resp" for e in (decode(r.value) for r in lg["merge"]))

            log = await h.wait_for(merged, timeout=60, what="the genuine answer merged")
            assert holder.poll() is None, (tmp_path / "holder-holder-c.log").read_text()[-3000:]
            assert h.stop(holder) == 0
    entries = {e.source_offset: e for e in (decode(r.value) for r in log["merge"])
               if isinstance(e, MergeEntry) and e.source == "resp"}
    assert [entries[o].reason for o in offsets] == [
        "unsigned", "unsigned", "untrusted_key", "untrusted_key"]
    assert entries[genuine].action == "deliver"
    labels = [o.body.data["label"] for o in (decode(r.value) for r in log["out"])
              if isinstance(o, OutputRecord) and isinstance(o.body, InlineBody)
              and isinstance(o.body.data, dict) and "label" in o.body.data]
    assert labels == ["txt"], labels
    # replay (from the log alone) decides the same
    assert compare_outputs(replay(FiletypeGate(), log, use_snapshots=False), log) == []


# -- 7. config mistakes refused --------------------------------------------------------------
def test_a_misplaced_security_table_stops_the_executor_at_start(
    kafka: LocalKafka, tmp_path: Path,
) -> None:
    """Attack 7: a top-level ``[kafka_security]`` beside ``[executor]`` was ignored (logged as
    ``{}``); the executor connected to the secured broker in plaintext and exited after 30 s.
    It is refused at start now, naming where the table belongs."""
    executor = kafka.security_for("executor")
    assert executor.ca_file is not None and executor.password is not None
    password_file = tmp_path / "password"
    password_file.write_text(executor.password)
    config = tmp_path / "executor.toml"
    config.write_text(
        f'[executor]\nnode_id = "exec-misplaced"\nbootstrap = "{kafka.bootstrap}"\n'
        f'key_file = "{tmp_path / "node.key"}"\nchunk_dir = "{tmp_path / "chunks"}"\n'
        'http_port = 0\n\n'
        '[kafka_security]\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\n'
        f'sasl_username = "executor"\nsasl_password_file = "{password_file}"\n'
        f'ca_file = "{executor.ca_file}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FX_KAFKA_")}
    t0 = time.monotonic()
    done = subprocess.run([*fx_command(), "executor", "run", "--config", str(config)],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    took = time.monotonic() - t0
    assert done.returncode != 0, done.stdout[-2000:]
    said = done.stdout + done.stderr
    assert "belongs in [executor] (write it as [executor.kafka_security])" in said, said[-2000:]
    assert took < 25, took
