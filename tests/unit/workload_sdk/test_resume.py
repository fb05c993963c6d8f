"""Resume and audit checks that need no broker: the live state is the snapshot-restored state,
a resuming holder refuses outputs it cannot reproduce, resume positions are sound, and ``fx why``
checks a signature only against the key of the response's own executor."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from broker_schema import (
    InlineBody,
    InputRecord,
    ResponseRecord,
    Signature,
    SnapshotRecord,
    decode,
    sha256_hex,
)
from tests.unit.workload_sdk.sim import WID, Asker, make_spec
from tests.unit.workload_sdk.test_golden import AskerNewWording
from workload_sdk import (
    Core,
    EffectResult,
    InputEvent,
    Item,
    Output,
    ReplayError,
    State,
    Workload,
    WorkloadLog,
    emit,
    replay,
)
from workload_sdk._kafka_io import resume_positions
from workload_sdk._replay import compare_outputs, resume_outputs
from workload_sdk._why import verify_signature

GOLDEN = Path(__file__).resolve().parent / "golden"


@pytest.fixture
def log() -> WorkloadLog:
    return WorkloadLog.from_jsonl(GOLDEN / "asker_failover.jsonl")


# ------------------------------------------------------------- live state == restored state


class TypeSensitive(Workload):
    """Keeps a float and a tuple in its state and emits what it sees of them."""

    def initial_state(self) -> State:
        return {"x": 1.0, "pair": (1, 2)}

    def step(self, state: State, event: InputEvent | EffectResult) -> tuple[State,
                                                                            Sequence[Output]]:
        seen = f"{state['x']!r} {type(state['pair']).__name__}"
        return {"x": state["x"] * 2, "pair": state["pair"]}, [emit(seen)]


def test_the_live_fold_sees_the_state_a_snapshot_restores() -> None:
    spec = make_spec(limit=4, snapshot_every=1)
    live = Core.initial(TypeSensitive(), WID)
    first = live.apply(Item("in", 0, 10, InputRecord(workload_id=WID,
                                                     body=InlineBody.of_json(1))),
                       epoch=1, spec=spec)
    assert first.outputs[0].body.data == "1 list"  # type: ignore[union-attr]
    restored = Core.from_snapshot(TypeSensitive(), live.snapshot(1))
    item = Item("in", 1, 11, InputRecord(workload_id=WID, body=InlineBody.of_json(2)))
    a = live.apply(item, epoch=1, spec=spec).outputs
    b = restored.apply(item, epoch=1, spec=spec).outputs
    assert a == b and live.state_hash == restored.state_hash


# ------------------------------------------------------------------ resume_outputs


def test_resume_writes_only_missing_slots(log: WorkloadLog) -> None:
    result = replay(Asker(), log)
    assert resume_outputs(result, log) == []
    last = max(log["out"].records)
    gone = decode(log["out"].records.pop(last).value)
    missing = resume_outputs(result, log)
    assert [m.header.slot for m in missing] == [gone.header.slot]  # type: ignore[union-attr]


def test_resume_refuses_recorded_outputs_it_computes_differently(log: WorkloadLog) -> None:
    # same merge decisions, different output bytes: a holder must not carry on from this state
    result = replay(AskerNewWording(), log, use_snapshots=False)
    assert compare_outputs(result, log)
    with pytest.raises(ReplayError, match="differs from what replay computes"):
        resume_outputs(result, log)


# ------------------------------------------------------------------ resume positions


def test_resume_positions_come_from_the_latest_snapshot(log: WorkloadLog) -> None:
    snaps = [decode(r.value) for r in log["merge"]]
    latest = [s for s in snaps if isinstance(s, SnapshotRecord)][-1]
    positions = resume_positions(log["merge"])
    assert positions["in"] == latest.positions["in"] and positions["resp"] == latest.positions[
        "resp"]
    assert positions["out"] == latest.positions.get("out", 0)
    assert resume_positions(WorkloadLog.empty(WID)["merge"]) == {"in": 0, "resp": 0, "out": 0}


def test_replay_from_the_resume_positions_needs_nothing_below_them(log: WorkloadLog) -> None:
    full = replay(Asker(), log)
    positions = resume_positions(log["merge"])
    assert positions["in"] > 0 and positions["resp"] > 0
    for stream in ("in", "resp", "out"):
        view = log[stream]
        view.records = {o: r for o, r in view.records.items() if o >= positions[stream]}
    tail = replay(Asker(), log)
    assert tail.core.state_hash == full.core.state_hash and tail.outputs == full.outputs
    assert resume_outputs(tail, log) == []


# ------------------------------------------------------------------ fx why signatures


def _signed(log: WorkloadLog) -> ResponseRecord:
    for rec in log["resp"]:
        r = decode(rec.value)
        if isinstance(r, ResponseRecord) and r.signature is not None:
            return r
    raise AssertionError("no signed response in the golden log")


def test_a_key_published_by_another_node_does_not_validate(log: WorkloadLog) -> None:
    good = _signed(log)
    assert verify_signature(good, log.facts)["valid"] is True
    moved = [f.model_copy(update={"node_id": "someone-else"}) for f in log.facts]
    verdict = verify_signature(good, moved)
    assert verdict["valid"] is False and "someone-else" in verdict["reason"]


def test_a_facts_key_that_does_not_hash_to_its_key_id_does_not_validate(
    log: WorkloadLog,
) -> None:
    good = _signed(log)
    assert good.signature is not None and good.executor is not None
    forger = Ed25519PrivateKey.generate()
    raw = forger.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert sha256_hex(raw) != good.signature.key_id
    forged = good.model_copy(update={"model_hash": "sha256:" + "00" * 32, "signature": None})
    forged = forged.model_copy(update={"signature": Signature(
        key_id=good.signature.key_id,
        value=base64.b64encode(forger.sign(forged.signing_bytes())).decode())})
    # a facts record of the same node claims the real key id with the forger's key
    fake = [f.model_copy(update={"public_key": base64.b64encode(raw).decode()})
            for f in log.facts if f.node_id == good.executor.node_id]
    assert fake
    verdict = verify_signature(forged, [*log.facts, *fake])
    assert verdict["valid"] is False and "key_id" in verdict["reason"]
    # the genuine record still verifies with the genuine key among them
    assert verify_signature(good, [*log.facts, *fake])["valid"] is True
