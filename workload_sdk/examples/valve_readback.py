"""A valve set-point workload with the read-back pattern (docs/actuation.md, "Re-asking").

Inputs on ``wl.<id>.in``: ``{"set": N}`` (an operator's or a controller's absolute set-point,
0..100) and the gateway's telemetry of the valve (``{"telemetry": {"device": "valve-1",
"value": ...}}``). For each ``set`` the step asks the valve kind for the set-point. The answer:

- ``ok``: confirmed (the gateway wrote it and read it back);
- ``timeout`` or ``backpressure``: nothing was done: asked again (:func:`workload_sdk.reask`);
- ``unknown``: the gateway accepted it and was lost; the valve may have moved. The step does not
  re-ask blindly: it waits for the valve's next telemetry appended after the ``unknown``
  (:func:`workload_sdk.await_read_back`), and then either finds the set-point there (done) or
  re-asks under the original effect id (:func:`workload_sdk.read_back`, ``reissue_of``);
- ``error``: said and left (``duplicate_effect``: the gateway had already attempted it).

Every decision is an output on ``.out``, so ``fx why`` and replay show the chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workload_sdk import (
    EffectResult,
    InputEvent,
    Output,
    State,
    Workload,
    actuate,
    await_read_back,
    emit,
    read_back,
    reask,
    remember,
    telemetry_of,
)

VALVE_KIND = "acme:valve/set@1.0.0"
VALVE = "valve-1"
#: How long a command waits for a gateway to accept it (from its append time): long enough for
#: a gateway restarted after a crash to take it (docs/actuation.md).
DEADLINE_MS = 30_000


class ValveReadBack(Workload):
    """Sets the valve; after ``unknown``, decides from the valve's own telemetry."""

    def initial_state(self) -> State:
        return {"asked": {}, "waiting": None, "confirmed": None}

    def _ask(self, state: dict[str, Any], seq: int, want: int, remembered: dict[str, Any]
             ) -> None:
        state["asked"][f"{seq}/0"] = {"want": want, "request": remembered}

    def step(self, state: State, event: InputEvent | EffectResult
             ) -> tuple[State, Sequence[Output]]:
        new: dict[str, Any] = dict(state, asked=dict(state["asked"]))
        if isinstance(event, InputEvent):
            telemetry = telemetry_of(event)
            if telemetry is None:
                body = event.json()
                want = int(body["set"])
                req = actuate(VALVE_KIND, set_point=want, device=VALVE, deadline_ms=DEADLINE_MS)
                self._ask(new, event.seq, want, remember(req))
                return new, [req]
            waiting = state["waiting"]
            if waiting is None:
                return new, []
            seen = read_back(event, waiting)
            if seen.decision == "wait":
                return new, []
            new["waiting"] = None
            if seen.decision == "done":
                new["confirmed"] = waiting["want"]
                return new, [emit({"valve": "confirmed by read-back", "want": waiting["want"],
                                   "original": waiting["original"]})]
            if seen.decision == "give_up":
                return new, [emit({"valve": "not at the set-point, attempts used up",
                                   "want": waiting["want"], "shows": seen.value})]
            assert seen.request is not None and seen.remembered is not None
            self._ask(new, event.seq, waiting["want"], seen.remembered)  # slot seq/0
            return new, [seen.request,
                         emit({"valve": "reissue after read-back", "want": waiting["want"],
                               "shows": seen.value, "original": waiting["original"]})]
        asked = new["asked"].pop(f"{event.input_offset}/{event.index}", None)
        if asked is None:
            return new, []
        if (again := reask(event, asked["request"])) is not None:
            req, remembered = again
            self._ask(new, event.seq, asked["want"], remembered)
            return new, [req]
        if event.outcome == "unknown":
            new["waiting"] = await_read_back(event, asked["request"], device=VALVE,
                                             want=asked["want"])
            return new, [emit({"valve": "unknown: waiting for the read-back",
                               "effect": event.effect_id, "want": asked["want"]})]
        if event.ok:
            new["confirmed"] = asked["want"]
            return new, [emit({"valve": "confirmed", "want": asked["want"],
                               "read_back": event.json().get("read_back")})]
        return new, [emit({"valve": event.outcome, "want": asked["want"],
                           "error": None if event.error is None else event.error.code})]
