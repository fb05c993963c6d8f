"""Issue 30, item 8, on a real broker with the real executor: no ``/openapi.json``, and no
server path in an answer (``input_missing`` named the executor's ``chunk_dir``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from broker_schema import sha256_hex
from broker_schema.records import ChunkRef, ResponseRecord
from executor.models import ModelStore
from fx_node.admission import REDACTED_PATH
from tests.integration.executor.harness import by_effect, executor_config, running, workload
from tests.unit.executor.helpers import request

pytestmark = pytest.mark.integration


async def test_no_openapi_and_no_server_path_in_an_answer(
    kafka_bootstrap: str, tmp_path: Path, store: ModelStore, magika_hash: str,
) -> None:
    async with workload(kafka_bootstrap, "paths") as wl:
        await wl.setup({"magika": magika_hash})
        # the filesystem store: the one whose errors could name a server path
        cfg = executor_config(kafka_bootstrap, wl.workload_id, tmp_path, store.root,
                              http_port=0, chunk_backend="fs")
        async with running(cfg) as svc:
            missing = ChunkRef(hash=sha256_hex(b"never stored"), size=12)
            req = request(wl.workload_id, magika_hash, missing, index=0)
            await wl.send(req)
            recs = await wl.responses([req.effect_id])
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}") as http:
                paths = {p: (await http.get(p)).status_code
                         for p in ("/openapi.json", "/docs", "/redoc", "/v2/health/live")}
    (resp,) = [r for r in by_effect(recs)[req.effect_id] if isinstance(r, ResponseRecord)]
    assert resp.outcome == "error" and resp.error is not None
    assert resp.error.code == "input_missing", resp.error
    for private in (str(cfg.chunk_dir), str(cfg.model_dir), str(tmp_path)):
        assert private not in resp.error.message, resp.error.message
    assert "chunk store" in resp.error.message
    assert paths == {"/openapi.json": 404, "/docs": 404, "/redoc": 404,
                     "/v2/health/live": 200}, paths
    assert REDACTED_PATH == "<server path>"
