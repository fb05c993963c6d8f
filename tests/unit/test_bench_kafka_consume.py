"""bench/kafka_consume.py measures the records the executor and the holder really read: the
requests and responses it builds are valid on their topics (strict decode, canonical form), the
requests carry a holder signature that verifies, the responses an executor signature that
verifies and the request hash of what they answer. (The timings are a benchmark, not tested.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from broker_schema import decode, decode_trusted, request_hash, topics
from broker_schema.records import EffectRequest, InlineBody, ResponseRecord
from broker_schema.signatures import (
    HOLDER_SIG_HEADER,
    SigningKey,
    holder_signature_problem,
    response_signature_problem,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    pytest.importorskip("confluent_kafka", reason="the bench extra (confluent-kafka)")
    spec = importlib.util.spec_from_file_location("bench_kafka_consume",
                                                  ROOT / "bench" / "kafka_consume.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("model", ["trivial", "magika"])
def test_bench_records_are_the_executors(bench: ModuleType, model: str) -> None:
    holder, node = SigningKey.generate(), SigningKey.generate()
    wid = f"bench-consume-test-{model}"
    data, output = ((bench.trivial_input(), bench.trivial_output()) if model == "trivial" else
                    ((ROOT / "fx_node" / "admission.py").read_bytes()[:13_500],
                     bench.magika_output()))
    reqs = bench.requests(wid, "sha256:" + "cd" * 32, data, 3, holder)
    resps = bench.responses(reqs, output, node)
    assert len(reqs) == len(resps) == 3
    for offset, ((value, headers), (answer, _)) in enumerate(zip(reqs, resps, strict=True)):
        req = decode(value, topic=topics.out(wid))
        assert isinstance(req, EffectRequest) and isinstance(req.input, InlineBody)
        assert req.input.raw() == data
        assert decode_trusted(value, topic=topics.out(wid)) == req
        assert dict(headers).keys() == {HOLDER_SIG_HEADER}
        assert holder_signature_problem(value, dict(headers)[HOLDER_SIG_HEADER],
                                        holder.public_key_b64) is None
        resp = decode(answer, topic=topics.resp(wid))
        assert isinstance(resp, ResponseRecord)
        assert resp.outcome == "ok" and resp.request_offset == offset
        assert resp.effect_id == req.effect_id and resp.request_hash == request_hash(value)
        assert isinstance(resp.output, InlineBody) and resp.output.data == output
        assert response_signature_problem(resp, node.public_key) is None
    if model == "magika":  # the ~18 KB request the docs name
        assert 17_000 < len(reqs[0][0]) < 20_000
