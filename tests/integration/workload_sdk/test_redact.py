"""Redaction with per-tenant chunk keys, on a real broker (docs/security.md, "Chunk encryption
and redaction").

A workload reads two chunk inputs (one put by the executor's ``fx chunk put``, one by the
holder's own writer); what ``sys.chunks`` holds is sealed (a broker admin reading the topic sees
no plaintext). Then, as processes: ``fx redact`` one input (operator) -> ``fx replay`` stops with
``Redacted`` (exit 5), naming who and why, no traceback; ``fx why`` walks the output and marks
the input REDACTED; ``fx audit`` still holds (exit 0) and notes the redaction; the console's
why page marks it; the other input still reads. ``fx tenant-keys rotate --destroy-old`` wraps
the data keys again under a new key (the chunks untouched, the other input still reads);
``fx tenant-keys destroy`` redacts the whole tenant.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from aiokafka import TopicPartition

from broker_schema import ChunkRef, OutputRecord, decode, sha256_hex, topics
from broker_schema.chunks import parse_part_key
from console.app import create_app
from fx_kafka.client import make_consumer
from workload_sdk._kafka_io import read_workload_log
from workload_sdk._refs_io import KafkaChunks
from workload_sdk.cli import EXIT_REDACTED
from workload_sdk.testing import WorkloadHarness, _env, fx_command

pytestmark = pytest.mark.integration

MODULE = "tests.integration.workload_sdk.test_refs:RefReader"
ROOT = Path(__file__).resolve().parents[3]


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=_env(), cwd=str(ROOT), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _fx(*argv: str) -> subprocess.CompletedProcess[str]:
    return _run(*fx_command(), *argv)


async def _stored_parts(bootstrap: str, wid: str) -> dict[str, bytes]:
    """What a broker admin reads of the workload's chunks on sys.chunks: hash -> part 0."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    out: dict[str, bytes] = {}
    try:
        tp = TopicPartition(topics.CHUNKS, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        while await consumer.position(tp) < end:
            for msg in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                parsed = parse_part_key(msg.key)
                if parsed and parsed[0] == wid and parsed[2] == 0 and msg.value is not None:
                    out[parsed[1]] = msg.value
    finally:
        await consumer.stop()
    return out


async def test_redact_replay_why_audit_rotate_and_destroy_the_tenant(
        kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path) -> None:
    wid = unique_workload_id
    secret = b"name: Jane Roe; born 1980-02-03; " * 3000  # ~100 KB: a chunk
    other = bytes(range(256)) * 400
    (tmp_path / "secret.bin").write_bytes(secret)
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(), log_dir=tmp_path
                               ) as h:
        put = _fx("chunk", "put", str(tmp_path / "secret.bin"), "--workload", wid,
                  "--backend", "kafka", "--bootstrap", kafka_bootstrap,
                  "--dir", str(tmp_path / "cache"))
        assert put.returncode == 0, put.stderr[-2000:]
        secret_ref = ChunkRef.model_validate(json.loads(put.stdout))
        store = KafkaChunks(kafka_bootstrap)
        try:
            other_ref = await store.write(other, workload=wid)
        finally:
            await store.close()
        assert secret_ref.hash == sha256_hex(secret) and other_ref.hash == sha256_hex(other)
        holder = h.start_holder("redact-a", elect=False, force=True)
        secret_in = await h.send_input(secret_ref)
        other_in = await h.send_input(other_ref)
        log = await h.wait_for(lambda lg: len(lg["out"]) >= 2, what="both inputs read")
        assert h.stop(holder) == 0
    outs = [(r.offset, decode(r.value)) for r in log["out"]]
    (secret_out,) = [o for o, rec in outs if isinstance(rec, OutputRecord)
                     and rec.body.data == {"read": secret_ref.hash, "size": len(secret),
                                           "type": "chunk"}]

    # a broker admin reading sys.chunks sees sealed bytes, never the plaintext
    stored = await _stored_parts(kafka_bootstrap, wid)
    assert set(stored) == {secret_ref.hash, other_ref.hash}
    assert all(b"Jane Roe" not in v and v.startswith(b"\x00FXC1") for v in stored.values())

    # redact the secret input (operator): replay stops clearly, why says so, audit holds
    red = _fx("redact", wid, "--input", str(secret_in), "--reason", "erasure request 114",
              "--by", "ops-alice", "--bootstrap", kafka_bootstrap)
    assert red.returncode == 0, red.stderr[-2000:]
    assert "redacted" in red.stdout
    inline = _fx("redact", wid, "--input", "99", "--reason", "x", "--bootstrap",
                 kafka_bootstrap)
    assert inline.returncode == 2 and "no input 99" in inline.stderr
    assert "Traceback" not in inline.stderr

    replayed = _run(sys.executable, "-m", "workload_sdk", "replay", wid, "--module", MODULE,
                    "--from-start", "--bootstrap", kafka_bootstrap)
    assert replayed.returncode == EXIT_REDACTED, replayed.stdout + replayed.stderr[-2000:]
    assert f"{topics.inputs(wid)} offset {secret_in} is redacted" in replayed.stderr
    assert "ops-alice" in replayed.stderr and "erasure request 114" in replayed.stderr
    assert "Traceback" not in replayed.stderr

    why = _fx("why", wid, "--output", str(secret_out), "--bootstrap", kafka_bootstrap)
    assert why.returncode == 0, why.stderr[-2000:]
    assert "REDACTED" in why.stdout and "erasure request 114" in why.stdout
    why_json = _fx("why", wid, "--output", str(secret_out), "--json", "--bootstrap",
                   kafka_bootstrap)
    tree = json.loads(why_json.stdout)
    assert tree["step"]["input"]["body"]["hash"] == secret_ref.hash  # the address verifies
    assert "erasure request 114" in tree["step"]["input"]["redacted"]

    audit = _fx("audit", wid, "--module", MODULE, "--bootstrap", kafka_bootstrap)
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-2000:]
    assert "redacted" in audit.stdout
    assert "Traceback" not in audit.stderr

    # the console's why page says so on the input's box
    transport = httpx.ASGITransport(app=create_app(kafka_bootstrap))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        page = await client.get(f"/w/{wid}/why/{secret_out}")
    assert page.status_code == 200 and "REDACTED" in page.text
    assert "erasure request 114" in page.text

    log = await read_workload_log(kafka_bootstrap, wid)
    assert ("in", secret_in) in log.redacted
    assert log.resolved[("in", other_in)] == other  # the other input is untouched

    # rotation: the data keys wrapped again under a new tenant key, the old one destroyed;
    # the chunk parts on the topic are the same bytes
    rot = _fx("tenant-keys", "rotate", wid, "--destroy-old", "--bootstrap", kafka_bootstrap)
    assert rot.returncode == 0, rot.stdout + rot.stderr[-2000:]
    assert "1 data key(s) wrapped again" in rot.stdout and "destroyed the older" in rot.stdout
    assert (await _stored_parts(kafka_bootstrap, wid)) == stored
    log = await read_workload_log(kafka_bootstrap, wid)
    assert log.resolved[("in", other_in)] == other

    # destroying the tenant key redacts the whole tenant
    gone = _fx("tenant-keys", "destroy", wid, "--reason", "tenant left", "--bootstrap",
               kafka_bootstrap)
    assert gone.returncode == 0, gone.stderr[-2000:]
    log = await read_workload_log(kafka_bootstrap, wid)
    assert {("in", secret_in), ("in", other_in)} <= log.redacted
    assert "tenant key" in log.unresolved[("in", other_in)]
    await asyncio.sleep(0)
