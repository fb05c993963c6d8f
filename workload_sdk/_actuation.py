"""Re-asking an actuation under its original id, and the read-back pattern (docs/actuation.md).

``unknown`` means the gateway accepted a command and was lost: the device may have acted. The
runtime never decides what comes next; the workload does, with these pure helpers (state in,
outputs out, nothing read from a clock):

- :func:`reissue`: ask again *under the original effect id*. The new request is an effect of its
  own (its own slot, id and answer: the merge rule is untouched), and names the original in
  ``reissue_of``, so a deduplicating gateway can tell it is the same command: an ``at-most-once``
  gateway refuses it as ``duplicate_effect`` if the original was attempted, a ``fenced`` one
  judges its epoch, an ``idempotent`` one simply sets the set-point again.
- :func:`await_read_back` and :func:`read_back`: instead of re-asking at once, wait for the
  device's next telemetry input (the gateway appends one to ``wl.<id>.in`` every so often:
  ``{"telemetry": {"device", "register", "value", "set_point"}}``) that arrived *after* the
  ``unknown``, and decide from it: the device already shows the set-point (``done``), or it
  does not (``reissue``, under the original id).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from workload_sdk._api import EffectResult, InputEvent, Request, recall

__all__ = ["ReadBack", "await_read_back", "read_back", "reissue", "telemetry_of"]


def _original(remembered: Mapping[str, Any], effect_id: str) -> str:
    """The first id of a chain of reissues: what every reissue of it names."""
    return str(remembered.get("reissue_of") or effect_id)


def reissue(event: EffectResult, remembered: Mapping[str, Any] | None, *,
            max_attempts: int = 3, on: tuple[str, ...] = ("unknown",)
            ) -> tuple[Request, dict[str, Any]] | None:
    """Ask again, under the original id, for the request ``event`` answers::

        if (again := reissue(event, asked.get(slot))) is not None:
            request, asked[f"{event.seq}/0"] = again
            return new, [request]

    ``remembered``: what :func:`workload_sdk.remember` made of that request. Returns the same
    request with ``reissue_of`` = the original effect id (the first of the chain), and what to
    remember of it (attempt count one higher), when ``event.outcome`` is in ``on`` (default:
    ``unknown`` only) and fewer than ``max_attempts`` attempts were made; else None."""
    if remembered is None or event.outcome not in on:
        return None
    attempt = int(remembered.get("attempt", 1))
    if attempt >= max_attempts:
        return None
    original = _original(remembered, event.effect_id)
    return (recall(remembered, reissue_of=original),
            dict(remembered, attempt=attempt + 1, reissue_of=original))


def await_read_back(event: EffectResult, remembered: Mapping[str, Any], *, device: str,
                    want: Any) -> dict[str, Any]:
    """What to keep in the state after ``event`` (an ``unknown``) while waiting for the
    device's next telemetry: the device, the set-point wanted, the broker time of the
    ``unknown`` (only telemetry appended after it counts), the original id and the request."""
    return {"device": device, "want": want, "since_ms": event.time_ms,
            "original": _original(remembered, event.effect_id), "request": dict(remembered)}


def telemetry_of(event: InputEvent) -> dict[str, Any] | None:
    """The ``telemetry`` object of a gateway's telemetry input, or None for any other input."""
    try:
        body = event.json()
    except (TypeError, ValueError):
        return None
    if isinstance(body, dict) and isinstance(body.get("telemetry"), dict):
        return dict(body["telemetry"])
    return None


@dataclass(frozen=True)
class ReadBack:
    """What :func:`read_back` decided. ``wait``: not the telemetry waited for (another device,
    or appended before the ``unknown``); ``done``: the device shows the set-point wanted, nothing
    to re-ask; ``reissue``: it does not, ``request`` re-asks under the original id (and
    ``remembered`` is what to keep of it); ``give_up``: it does not and the attempts are used
    up."""

    decision: Literal["wait", "done", "reissue", "give_up"]
    value: Any = None
    request: Request | None = None
    remembered: dict[str, Any] | None = None


def read_back(event: InputEvent, waiting: Mapping[str, Any], *,
              max_attempts: int = 3) -> ReadBack:
    """Decide from ``event`` while ``waiting`` (:func:`await_read_back`). Pure."""
    telemetry = telemetry_of(event)
    if (telemetry is None or telemetry.get("device") != waiting["device"]
            or event.time_ms <= int(waiting["since_ms"])):
        return ReadBack("wait")
    shown = telemetry.get("set_point", telemetry.get("value"))
    want = waiting["want"]
    if shown == want or telemetry.get("value") == want:
        return ReadBack("done", value=shown)
    remembered = dict(waiting["request"])
    attempt = int(remembered.get("attempt", 1))
    if attempt >= max_attempts:
        return ReadBack("give_up", value=shown)
    original = str(waiting["original"])
    return ReadBack("reissue", value=shown, request=recall(remembered, reissue_of=original),
                    remembered=dict(remembered, attempt=attempt + 1, reissue_of=original))
