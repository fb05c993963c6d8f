"""Facts records."""

from __future__ import annotations

from broker_schema import decode, encode
from broker_schema.records import INFERENCE_KIND, FactsRecord
from fx_node.facts import build_facts, facts_changed
from fx_node.identity import NodeIdentity


def test_facts_roundtrip_and_change_detection() -> None:
    ident = NodeIdentity.generate()
    kw = dict(node_id="n1", queue_limits={INFERENCE_KIND: 8}, models_present=["sha256:" + "a" * 64],
              models_loaded=[], engines={"onnxruntime": "1.2"}, accelerators=[],
              public_key_b64=ident.public_key_b64, key_id=ident.key_id)
    f1 = build_facts(now_us=1, **kw)  # type: ignore[arg-type]
    assert isinstance(decode(encode(f1)), FactsRecord)
    assert f1.kinds[0].queue_limit == 8 and f1.key_id == ident.key_id
    assert not facts_changed(f1, build_facts(now_us=2, **kw))  # type: ignore[arg-type]
    kw["models_loaded"] = ["sha256:" + "a" * 64]
    assert facts_changed(f1, build_facts(now_us=3, **kw))  # type: ignore[arg-type]
    assert facts_changed(None, f1)
