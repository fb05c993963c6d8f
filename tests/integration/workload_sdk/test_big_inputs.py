"""Inputs of any size from the command line and from Python (issue 26, part 3), on a real broker.

``fx workload input ID --file`` with a 5 MB file (it used to print a pydantic traceback, ``inline
body is 6771114 bytes, limit is 65536``) stores the file as a chunk of the workload and writes an
input that carries its reference; the public :class:`workload_sdk.InputWriter` does the same for a
large text. A lease holder process runs the workload, whose step reads each input's bytes through
the reference: what it emits is the sha256 and size of exactly the bytes that were fed, and
replay reads them the same way. Asked to keep a large input inline (``--inline``,
``chunk=False``), the CLI prints one line naming the limit and the remedy (non-zero exit, no
traceback) and Python raises :class:`workload_sdk.InputTooLarge`; nothing is appended.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from broker_schema import ChunkRef, InlineBody, InputRecord, decode, sha256_hex, topics
from broker_schema.limits import INLINE_MAX_BYTES
from fx_kafka.chunk_files import read_chunk_file
from fx_kafka.workload_log import read_topic
from fx_kafka.workloads import UnknownWorkload
from tests.integration.workload_sdk.test_refs import RefReader, _outputs
from workload_sdk import InputTooLarge, InputWriter, replay
from workload_sdk._kafka_io import read_workload_log
from workload_sdk._replay import compare_outputs
from workload_sdk.testing import WorkloadHarness, _env, fx_command

pytestmark = pytest.mark.integration

MODULE = "tests.integration.workload_sdk.test_refs:RefReader"
ROOT = Path(__file__).resolve().parents[3]


def _fx(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*fx_command(), *argv], env=_env(), cwd=str(ROOT), capture_output=True,
                          text=True, timeout=180, check=False)


async def _inputs(bootstrap: str, wid: str) -> list[InputRecord]:
    view = await read_topic(bootstrap, topics.inputs(wid))
    return [rec for rec in (decode(r.value) for r in view) if isinstance(rec, InputRecord)]


async def test_a_5_mb_file_and_a_large_text_are_fed_by_reference_and_read_by_the_step(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    wid = unique_workload_id
    data = os.urandom(5_000_000)
    big = tmp_path / "scan.bin"
    big.write_bytes(data)
    b = ("--bootstrap", kafka_bootstrap)
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(),
                               log_dir=tmp_path) as h:
        # asked to keep it inline: one line naming the limit and the remedy, nothing appended
        refused = await asyncio.to_thread(_fx, "workload", "input", wid, "--file", str(big),
                                          "--inline", *b)
        assert refused.returncode == 2, refused.stdout
        assert "Traceback" not in refused.stderr + refused.stdout
        lines = [ln for ln in refused.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, refused.stderr
        assert lines[0].startswith("fx workload input: the input is 6666670 bytes inline")
        assert f"inline limit of {INLINE_MAX_BYTES} bytes" in lines[0]
        assert "drop --inline to store it as a chunk" in lines[0]
        bad = await asyncio.to_thread(_fx, "workload", "input", wid, "--json", "{bad", *b)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
        assert bad.stderr.strip() == ("fx workload input: --json is not JSON: Expecting "
                                      "property name enclosed in double quotes: line 1 column 2 "
                                      "(char 1)"), bad.stderr
        assert await _inputs(kafka_bootstrap, wid) == []

        # the CLI: stored as a chunk of the workload, the input carries the reference
        fed = await asyncio.to_thread(_fx, "workload", "input", wid, "--file", str(big),
                                      "--media-type", "application/octet-stream",
                                      "--source", "cli", *b)
        assert fed.returncode == 0, fed.stderr
        assert f"input written to {topics.inputs(wid)}@0" in fed.stdout
        assert f"{sha256_hex(data)} (5000000 B) stored in {topics.CHUNKS}" in fed.stdout

        # Python: the public client, the same code path
        text = "quality gate log line é\n" * 150_000  # 3.6 MB of UTF-8
        async with InputWriter(kafka_bootstrap, wid) as writer:
            written = await writer.write(text, source="py")
            small = await writer.write({"note": 1})
        assert written.chunked and written.offset == 1 and written.chunk_store == topics.CHUNKS
        assert isinstance(written.body, ChunkRef)
        assert written.body.hash == sha256_hex(text.encode())
        assert not small.chunked and isinstance(small.body, InlineBody)
        with pytest.raises(UnknownWorkload, match=f"no workload '{wid}x' on this broker"):
            async with InputWriter(kafka_bootstrap, wid + "x") as writer:
                await writer.write(text)
        with pytest.raises(InputTooLarge, match=f"inline limit of {INLINE_MAX_BYTES} bytes"):
            async with InputWriter(kafka_bootstrap, wid, chunk=False) as writer:
                await writer.write(text)

        records = await _inputs(kafka_bootstrap, wid)
        assert [r.source for r in records] == ["cli", "py", None]
        cli_ref = records[0].body
        assert isinstance(cli_ref, ChunkRef)
        assert (cli_ref.hash, cli_ref.size, cli_ref.media_type) == (
            sha256_hex(data), len(data), "application/octet-stream")

        # the step reads both through their references, and emits what it read
        h.start_holder("big-a", elect=False)
        want = [{"read": sha256_hex(data), "size": len(data), "type": "chunk"},
                {"read": sha256_hex(text.encode()), "size": len(text.encode()),
                 "type": "chunk"},
                {"saw": {"note": 1}}]
        log = await h.wait_for(lambda log: all(w in _outputs(log) for w in want),
                               timeout=120, what="the step's reading of each input")
        assert _outputs(log)[:3] == want

    # replay reads the chunks through the references too, and agrees with the log
    log = await read_workload_log(kafka_bootstrap, wid, with_facts=False)
    result = replay(RefReader(), log)
    assert compare_outputs(result, log) == []


async def test_a_filesystem_chunk_store_and_a_reference_put_by_fx_chunk_put(
    kafka_bootstrap: str, unique_workload_id: str, tmp_path: Path
) -> None:
    """``--chunk-dir``: the input's chunk goes to the holder's filesystem store, where the
    holder reads it; a chunk put with ``fx chunk put`` is written as an input with ``--ref``."""
    wid = unique_workload_id
    store = tmp_path / "chunks"
    data = os.urandom(300_000)
    (tmp_path / "in.bin").write_bytes(data)
    # the spec names the filesystem store: a holder whose store is another refuses to start
    async with WorkloadHarness(kafka_bootstrap, wid, MODULE, effect_kinds=(),
                               log_dir=tmp_path, chunk_store="fs") as h:
        fed = await asyncio.to_thread(_fx, "workload", "input", wid, "--file",
                                      str(tmp_path / "in.bin"), "--chunk-dir", str(store),
                                      "--bootstrap", kafka_bootstrap)
        assert fed.returncode == 0, fed.stderr
        assert f"stored in the chunk directory {store}" in fed.stdout
        # the file holds the chunk sealed under the workload's tenant key (docs/security.md);
        # read through the store, it is the input's bytes
        path = store / "wl" / wid / "sha256" / sha256_hex(data).split(":")[1]
        assert path.read_bytes().startswith(b"\x00FXC1") and data[:64] not in path.read_bytes()
        assert read_chunk_file(store, ChunkRef(hash=sha256_hex(data), size=len(data)),
                               workload=wid) == data
        # a chunk put with the executor's fx chunk put, then written as an input with --ref
        other = os.urandom(90_000)
        (tmp_path / "other.bin").write_bytes(other)
        put = await asyncio.to_thread(_fx, "chunk", "put", str(tmp_path / "other.bin"),
                                      "--workload", wid, "--backend", "fs", "--dir", str(store))
        assert put.returncode == 0, put.stderr
        by_ref = await asyncio.to_thread(_fx, "workload", "input", wid, "--ref", put.stdout,
                                         "--bootstrap", kafka_bootstrap)
        assert by_ref.returncode == 0 and f"{topics.inputs(wid)}@1" in by_ref.stdout, by_ref
        bad = await asyncio.to_thread(_fx, "workload", "input", wid, "--ref", '{"hash": 1}',
                                      "--bootstrap", kafka_bootstrap)
        assert bad.returncode == 2 and bad.stderr.strip() == (
            'fx workload input: --ref: a reference is a JSON object with "type": "chunk" (as '
            'fx chunk put prints it) or "stream"'), bad.stderr
        h.start_holder("fs-a", "--chunk-dir", str(store), elect=False)
        want = [{"read": sha256_hex(data), "size": len(data), "type": "chunk"},
                {"read": sha256_hex(other), "size": len(other), "type": "chunk"}]
        log = await h.wait_for(lambda log: all(w in _outputs(log) for w in want), timeout=120,
                               what="the step's reading of the chunks")
        assert _outputs(log) == want
