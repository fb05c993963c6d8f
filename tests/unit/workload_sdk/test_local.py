"""Mode A in the pure core with the real integer model: the step runs it, the budget is charged
before each call, unbound names and an over-budget step fail the same way everywhere, and a
second core over the same events computes the same bytes."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from broker_schema import INFERENCE_KIND, InlineBody, InputRecord, SpecRecord, canonical_json
from tests.unit.integer.real_model import real_artifact
from workload_sdk import (
    Core,
    InputEvent,
    Item,
    Output,
    State,
    Workload,
    WorkloadError,
    emit,
    local_generate,
    local_logits,
    local_tokenize,
    module_hash,
)
from workload_sdk._local import LocalModelUnavailable, LocalRuntime

WID = "local-1"


class Asks(Workload):
    def initial_state(self) -> State:
        return {"n": 0}

    def step(self, state: State, event: InputEvent) -> tuple[State,  # type: ignore[override]
                                                               Sequence[Output]]:
        q = event.text()
        ids = local_tokenize("tiny", q)
        rows = local_logits("tiny", ids)
        ans = local_generate("tiny", token_ids=ids, max_tokens=3)
        return {"n": state["n"] + 1}, [emit({"q": q, "tokens": list(ans.tokens),
                                            "text": ans.text, "top": max(rows[-1]),
                                            "charged": ans.charged})]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    import hashlib

    path = real_artifact()
    hexd = hashlib.sha256(path.read_bytes()).hexdigest()
    root = tmp_path_factory.mktemp("store")
    (root / "sha256").mkdir()
    shutil.copyfile(path, root / "sha256" / hexd)
    from broker_schema import hash_from_hex

    return root, hash_from_hex(hexd)


def _spec(model_hash: str, budget: int = 128, name: str = "tiny") -> SpecRecord:
    return SpecRecord(workload_id=WID, module_hash=module_hash(Asks), effect_kinds=(
        INFERENCE_KIND,), local_models={name: model_hash}, local_max_tokens_per_step=budget)


def _item(i: int, text: str) -> Item:
    return Item("in", i, 1000 + i, InputRecord(workload_id=WID, body=InlineBody.of_text(text)))


def test_the_step_runs_the_local_model_and_a_second_core_computes_the_same_bytes(
        store: tuple[Path, str]) -> None:
    root, h = store
    spec = _spec(h)
    outs = []
    for _ in range(2):
        core = Core.initial(Asks(), WID)
        core.local = LocalRuntime(root)
        applied = core.apply(_item(0, "The capital of France is"), epoch=1, spec=spec)
        outs.append(canonical_json(applied.outputs[0].body.data))  # type: ignore[union-attr]
    assert outs[0] == outs[1]
    import json

    body = json.loads(outs[0])
    ids_len = body["charged"] - 3
    assert ids_len > 0 and len(body["tokens"]) <= 3 and isinstance(body["top"], int)


def test_the_budget_is_charged_before_the_call_and_fails_at_the_same_input(
        store: tuple[Path, str]) -> None:
    root, h = store
    core = Core.initial(Asks(), WID)
    core.local = LocalRuntime(root)
    with pytest.raises(WorkloadError, match="local_limit") as exc:
        core.apply(_item(0, "The capital of France is"), epoch=1, spec=_spec(h, budget=5))
    assert exc.value.seq == 0 and core.seq == 0  # nothing applied


def test_an_unbound_name_and_a_missing_store(store: tuple[Path, str]) -> None:
    root, h = store
    core = Core.initial(Asks(), WID)
    core.local = LocalRuntime(root)
    with pytest.raises(WorkloadError, match="local_unbound"):
        core.apply(_item(0, "hi"), epoch=1, spec=_spec(h, name="other"))
    bare = Core.initial(Asks(), WID)
    bare.local = LocalRuntime(None)
    with pytest.raises(LocalModelUnavailable, match=h):
        bare.apply(_item(0, "hi"), epoch=1, spec=_spec(h))
    wrong = Core.initial(Asks(), WID)
    wrong.local = LocalRuntime(root)
    missing = "sha256:" + "0" * 64
    with pytest.raises(LocalModelUnavailable, match="cannot load"):
        wrong.apply(_item(0, "hi"), epoch=1, spec=_spec(missing))


def test_outside_a_step_the_calls_are_refused() -> None:
    with pytest.raises(RuntimeError, match="inside a workload's step"):
        local_generate("tiny", "hi")
