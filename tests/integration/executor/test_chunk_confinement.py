"""Chunks confined to their workload, on a real broker and a real executor with the Kafka chunk
store (``sys.chunks``), the chunk stored by ``fx chunk put`` as a user would:

- the owner's request reads its chunk;
- another workload naming the same hash reads nothing (``input_missing``: its namespace has no such
  chunk), and naming it as the owner's is ``input_forbidden`` before any read (no ``accepted``);
- a spec's ``chunks_from`` grants another workload's chunks; a stream record granted by
  ``input_topics`` brings its own workload's chunks; a chunk inside a record naming a workload not
  granted is ``input_forbidden``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker_schema import encode, topics
from broker_schema.records import AcceptedRecord, ChunkRef, InputRecord, StreamRef
from executor.models import ModelStore
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.unit.executor.helpers import claim, request, spec

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _fx_chunk_put(bootstrap: str, tmp: Path, workload_id: str, data: bytes) -> ChunkRef:
    src = tmp / "body.py"
    src.write_bytes(data)
    out = subprocess.run(
        [sys.executable, "-m", "fx_cli.main", "chunk", "put", "--workload", workload_id,
         "--backend", "kafka", "--bootstrap", bootstrap, "--dir", str(tmp / "cli-cache"),
         "--media-type", "text/x-python", str(src)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "FX_EXECUTOR_BOOTSTRAP": bootstrap})
    assert out.returncode == 0, out.stderr
    return ChunkRef.model_validate(json.loads(out.stdout))


async def test_chunks_are_read_only_by_their_workload_and_its_grants(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str
) -> None:
    # a Python source over the 64 KiB inline limit, so it can only go by chunk reference
    data = (b"#!/usr/bin/env python3\nimport sys\n\n\ndef main():\n    print(sys.argv)\n\n\n"
            + b"".join(b"x_%d = %d\n" % (i, i * 7) for i in range(7000)))
    assert len(data) > 64 * 1024
    models = {"magika": magika_hash}
    async with workload(kafka_bootstrap, "owner") as a, \
            workload(kafka_bootstrap, "thief") as b, \
            workload(kafka_bootstrap, "granted") as c, \
            workload(kafka_bootstrap, "reader") as d:
        await a.setup(models)
        await b.setup(models)
        # c may read a's chunks; d may read a's inputs (and so the chunks those records name
        # as a's), with no chunks_from
        for wl, grant in ((c, {"chunks_from": (a.workload_id,)}),
                          (d, {"input_topics": (topics.inputs(a.workload_id),)})):
            await wl.write(topics.spec(wl.workload_id), encode(
                spec(wl.workload_id, models).model_copy(update=grant)))
            await wl.write(topics.claims(wl.workload_id), encode(claim(wl.workload_id, 1)))

        ref = _fx_chunk_put(kafka_bootstrap, tmp_path, a.workload_id, data)
        assert ref.workload is None and ref.size == len(data)
        as_a = ref.model_copy(update={"workload": a.workload_id})
        # a's input record holding its own chunk; b's holding a chunk named as a's
        a_in = await a.write(topics.inputs(a.workload_id), encode(
            InputRecord(workload_id=a.workload_id, body=ref)))
        b_in = await b.write(topics.inputs(b.workload_id), encode(
            InputRecord(workload_id=b.workload_id, body=as_a)))

        reqs = {
            "owner": (a, request(a.workload_id, magika_hash, ref)),
            "thief_same_hash": (b, request(b.workload_id, magika_hash, ref)),
            "thief_names_owner": (b, request(b.workload_id, magika_hash, as_a, index=1)),
            "thief_via_own_record": (b, request(b.workload_id, magika_hash, StreamRef(
                topic=topics.inputs(b.workload_id), offset=b_in), index=2)),
            "granted": (c, request(c.workload_id, magika_hash, as_a)),
            "granted_own_namespace": (c, request(c.workload_id, magika_hash, ref, index=1)),
            "via_granted_record": (d, request(d.workload_id, magika_hash, StreamRef(
                topic=topics.inputs(a.workload_id), offset=a_in))),
        }
        for wl, r in reqs.values():
            await wl.send(r)
        ids = "|".join(re.escape(w.workload_id) for w in (a, b, c, d))
        cfg = executor_config(kafka_bootstrap, a.workload_id, tmp_path / "exec", store.root,
                              chunk_backend="kafka", topic_pattern=rf"^wl\.({ids})\.out$")
        async with running(cfg):
            answers = {}
            accepted: set[str] = set()
            for wl in (a, b, c, d):
                mine = [r.effect_id for w, r in reqs.values() if w is wl]
                recs = await wl.responses(mine, timeout=60)
                answers.update({k: v[0] for k, v in by_effect(recs).items()})
                accepted |= {r.effect_id for r in recs if isinstance(r, AcceptedRecord)}

    def outcome(name: str) -> str:
        resp = answers[reqs[name][1].effect_id]
        return resp.outcome if resp.error is None else resp.error.code

    got = {name: outcome(name) for name in reqs}
    assert got == {
        "owner": "ok",
        "thief_same_hash": "input_missing",
        "thief_names_owner": "input_forbidden",
        "thief_via_own_record": "input_forbidden",
        "granted": "ok",
        "granted_own_namespace": "input_missing",
        "via_granted_record": "ok",
    }, {n: answers[r.effect_id].error for n, (_, r) in reqs.items()}
    for name in ("owner", "granted", "via_granted_record"):
        out = answers[reqs[name][1].effect_id].output
        assert out is not None and out.data["label"] == "python", (name, out)  # type: ignore[union-attr]
    # refused by the pure rule before any read: never accepted; the nested one is found only
    # once the record is read, so it was accepted first
    assert reqs["thief_names_owner"][1].effect_id not in accepted
    assert reqs["thief_via_own_record"][1].effect_id in accepted
    forbidden = answers[reqs["thief_names_owner"][1].effect_id].error
    assert forbidden is not None and a.workload_id in forbidden.message
    assert "chunks_from" in forbidden.message
