"""Inputs and outputs by reference: the Kafka chunk store (parts over the frame cap, output
chunks), stream references, and the ``input_missing`` / ``input_hash_mismatch`` outcomes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from broker_schema import encode, topics
from broker_schema.canonical import sha256_hex
from broker_schema.records import ChunkRef, InlineBody, InputRecord, StreamRef
from executor.chunks import PART_BYTES, FsChunkStore, KafkaChunkStore
from executor.models import ModelStore
from fx_kafka.client import make_producer
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.unit.executor.helpers import request, wav_bytes

pytestmark = pytest.mark.integration


async def test_kafka_chunks_and_stream_refs(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str, silero_hash: str
) -> None:
    async with workload(kafka_bootstrap, "chunks") as wl:
        wid = wl.workload_id
        await wl.setup({"magika": magika_hash, "vad": silero_hash})
        # 4.5 minutes of low noise: 8.6 MB in (9 parts on sys.chunks), ~85 KB of output (a chunk)
        rng = np.random.default_rng(7)
        audio = wav_bytes(0.01 * rng.standard_normal(16000 * 270))
        producer = make_producer(kafka_bootstrap)
        await producer.start()
        try:
            writer = KafkaChunkStore(kafka_bootstrap, producer, FsChunkStore(tmp_path / "w"))
            audio_ref = await writer.put(audio, workload=wid, media_type="audio/wav")
            text = b"#!/usr/bin/env python3\nimport sys\nprint(sys.argv)\n" * 3
            in_offset = await wl.write(
                topics.inputs(wid), encode(InputRecord(workload_id=wid,
                                                       body=InlineBody.of_bytes(text))))
            in_value = encode(InputRecord(workload_id=wid, body=InlineBody.of_bytes(text)))
            reqs = {
                "chunk": request(wid, silero_hash, audio_ref, index=0, deadline_ms=120_000),
                "stream": request(wid, magika_hash, StreamRef(
                    topic=topics.inputs(wid), offset=in_offset, hash=sha256_hex(in_value)),
                    index=1),
                "stream_bad_hash": request(wid, magika_hash, StreamRef(
                    topic=topics.inputs(wid), offset=in_offset, hash="sha256:" + "0" * 64),
                    index=2),
                "stream_missing": request(wid, magika_hash, StreamRef(
                    topic=topics.inputs(wid), offset=in_offset + 50), index=3),
                "chunk_missing": request(wid, magika_hash, ChunkRef(
                    hash=sha256_hex(b"never stored"), size=12), index=4),
            }
            for r in reqs.values():
                await wl.send(r)
            cfg = executor_config(kafka_bootstrap, wid, tmp_path / "exec", store.root,
                                  chunk_backend="kafka")
            async with running(cfg):
                recs = await wl.responses([r.effect_id for r in reqs.values()], timeout=90)
            # a reader elsewhere (an empty cache) gets the output chunk from sys.chunks
            reader = KafkaChunkStore(kafka_bootstrap, producer, FsChunkStore(tmp_path / "r"))
            await reader.start()
            try:
                answers = by_effect(recs)
                out = answers[reqs["chunk"].effect_id][0]
                assert out.outcome == "ok", out.error
                assert isinstance(out.output, ChunkRef)
                result = json.loads(await reader.get(out.output, workload=wid))
            finally:
                await reader.stop()
        finally:
            await producer.stop()
    assert audio_ref.size > 8 * PART_BYTES
    assert len(result["probabilities"]) == -(-(16000 * 270) // 512)
    assert result["mean_probability"] < 0.2
    assert out.output.size > 64 * 1024
    stream = answers[reqs["stream"].effect_id][0]
    assert stream.outcome == "ok" and stream.output is not None
    assert isinstance(stream.output, InlineBody)
    assert stream.output.data["label"] == "python"  # type: ignore[index,call-overload]
    codes = {name: answers[r.effect_id][0].error.code  # type: ignore[union-attr]
             for name, r in reqs.items() if name not in ("chunk", "stream")}
    assert codes == {"stream_bad_hash": "input_hash_mismatch", "stream_missing": "input_missing",
                     "chunk_missing": "input_missing"}


async def test_fs_chunk_hash_mismatch(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    async with workload(kafka_bootstrap, "fschunk") as wl:
        await wl.setup({"magika": magika_hash})
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              chunk_backend="fs")
        chunks = FsChunkStore(cfg.chunk_dir)
        data = os.urandom(100_000)
        ref = await chunks.put(data, workload=wl.workload_id)
        # flip a bit (a constant byte would equal the original 1 time in 256)
        chunks.path(ref.hash, wl.workload_id).write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))
        req = request(wl.workload_id, magika_hash, ref)
        await wl.send(req)
        async with running(cfg):
            recs = await wl.responses([req.effect_id])
    (resp,) = by_effect(recs)[req.effect_id]
    assert resp.error is not None and resp.error.code == "input_hash_mismatch", (
        resp.outcome, resp.error, resp.output)
