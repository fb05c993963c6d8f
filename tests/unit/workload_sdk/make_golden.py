"""Regenerate the golden logs: ``python -m tests.unit.workload_sdk.make_golden``.

Only when the merge rule or the record format changes on purpose: the golden tests exist to catch
any change that was not.
"""

from __future__ import annotations

import json
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.unit.workload_sdk.sim import Asker, Sim, facts_for, make_spec
from workload_sdk import replay
from workload_sdk._replay import out_slots

GOLDEN = Path(__file__).resolve().parent / "golden"
#: A fixed test key (never a real one): 32 bytes of 0x07.
TEST_KEY = Ed25519PrivateKey.from_private_bytes(bytes([7]) * 32)


def asker_failover() -> Sim:
    """Inputs, accept, an answer, a duplicate, an error, a timeout and its retry, a late answer
    after the timeout, a stray answer, and a fail-over to a second holder in the middle."""
    sim = Sim(spec=make_spec(limit=3, snapshot_every=4), key=TEST_KEY)
    sim.log.facts.append(facts_for(TEST_KEY))
    sim.start()
    holder = sim.holder
    assert holder is not None
    for v in (1, 2, 3):
        sim.input(v)
        sim.now += 1
    holder.pump()
    sim.accept(0)
    sim.now += 2
    sim.answer(0, "ok")
    sim.answer(0, "ok")  # a retried executor answers twice
    sim.answer(1, "error")
    sim.now += 1
    holder.pump()
    sim.input(5)
    sim.now += 1
    holder.pump()
    sim.start()  # fail-over: a new holder, epoch 2, resumes from the log
    holder = sim.holder
    assert holder is not None
    sim.now += 80  # request 2 (input 5) passes its deadline with no accept
    holder.pump()
    holder.pump()
    sim.now += 1
    holder.pump()
    sim.answer(2, "ok")  # late: after its timeout
    sim.stray()
    sim.input(7)
    sim.now += 1
    holder.pump()
    reqs = sim.requests()
    sim.answer(len(reqs) - 1, "ok")
    sim.answer(len(reqs) - 2, "ok")
    holder.drain()
    return sim


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    sim = asker_failover()
    path = GOLDEN / "asker_failover.jsonl"
    sim.log.to_jsonl(path)
    result = replay(Asker(), sim.log, use_snapshots=False)
    expected = {
        "seq": result.core.seq,
        "state_hash": result.core.state_hash,
        "outputs": len(out_slots(sim.log)),
    }
    (GOLDEN / "asker_failover.expected.json").write_text(
        json.dumps(expected, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path} ({sum(len(v) for v in sim.log.views.values())} records): {expected}")


if __name__ == "__main__":
    main()
