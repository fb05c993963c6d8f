"""``fx upgrade`` and ``fx rollback``: binding changes at a step, as spec records.

A change is a new spec on ``wl.<id>.spec``: the latest spec plus one binding switch
(``SpecRecord.binding_switches``) at step N (a merge seq: the wire field ``at_input_offset``
counts steps). The running lease holder adopts it from its
next step (a claim of its epoch with ``from_seq``; :mod:`broker_schema.binding`), or a new holder
claims with it; either way the switch binds steps N and later, and nothing before N is rebound:
outputs already written stay as they are. The plans are pure (:func:`plan_upgrade`,
:func:`plan_rollback`); :func:`write_change` is the I/O.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace

from broker_schema import (
    BindingSwitch,
    DecodeError,
    MergeEntry,
    ModelName,
    SpecRecord,
    decode,
    encode,
    is_hash,
    topics,
)
from fx_kafka.client import make_producer
from fx_kafka.workload_log import read_topic
from fx_kafka.workloads import needs_workload
from workload_sdk._holder_start import NoSpec, latest_spec

__all__ = ["BindingChangeError", "Change", "plan_rollback", "plan_upgrade", "register",
           "with_names", "write_change"]


class BindingChangeError(ValueError):
    """A binding change that cannot be made (a clear message for the operator)."""


@dataclass(frozen=True)
class Change:
    """A planned change: the new spec, and what it changes (for the report)."""

    spec: SpecRecord
    name: str
    old_hash: str | None
    new_hash: str
    at_offset: int


def _check_offset(spec: SpecRecord, at_offset: int, next_seq: int) -> None:
    if at_offset < next_seq:
        raise BindingChangeError(
            f"step {at_offset} is already passed: the workload's next step is "
            f"{next_seq} (a change takes effect at {next_seq} or later; outputs already "
            "written are never rebound)")
    last = max((s.at_input_offset for s in spec.binding_switches), default=-1)
    if at_offset <= last:
        raise BindingChangeError(
            f"the spec already switches bindings at step {last}: a new switch must "
            f"come after it (at {last + 1} or later)")


def _with_switch(spec: SpecRecord, name: str, new_hash: str, at_offset: int) -> SpecRecord:
    models = dict(spec.models_at(at_offset))
    models[name] = new_hash
    switches = (*spec.binding_switches, BindingSwitch(at_input_offset=at_offset, models=models))
    return spec.model_copy(update={"binding_switches": switches})


def plan_upgrade(spec: SpecRecord, name: str, new_hash: str, at_offset: int,
                 next_seq: int) -> Change:
    """Bind ``name`` to ``new_hash`` from step ``at_offset``. Pure."""
    _check_offset(spec, at_offset, next_seq)
    old = spec.models_at(at_offset).get(name)
    if old == new_hash:
        raise BindingChangeError(f"{name} is already bound to {new_hash} at {at_offset}")
    new = _with_switch(spec, name, new_hash, at_offset)
    SpecRecord.model_validate(new.model_dump())  # every hash and offset valid
    return Change(new, name, old, new_hash, at_offset)


def plan_rollback(spec: SpecRecord, name: str, at_offset: int, next_seq: int,
                  to_hash: str | None = None) -> Change:
    """Bind ``name`` back, from step ``at_offset``, to ``to_hash`` or, by default, to
    the hash it had before the latest switch that changed it ("roll back forward": a new
    switch, nothing before it rewritten). Pure."""
    _check_offset(spec, at_offset, next_seq)
    current = spec.models_at(at_offset).get(name)
    if current is None:
        raise BindingChangeError(f"the spec binds no model named {name!r}")
    target = to_hash
    if target is None:
        history = [spec.models.get(name)] + [s.models.get(name) for s in spec.binding_switches]
        earlier = [h for h in history if h is not None]
        while earlier and earlier[-1] == current:
            earlier.pop()
        if not earlier:
            raise BindingChangeError(f"{name} was never bound to another model: nothing to "
                                     "roll back to (give --to HASH)")
        target = earlier[-1]
    if target == current:
        raise BindingChangeError(f"{name} is already bound to {target} at {at_offset}")
    return Change(_with_switch(spec, name, target, at_offset), name, current, target, at_offset)


async def current_state(bootstrap: str, workload_id: str) -> tuple[int, SpecRecord, int]:
    """(offset of the latest spec, the spec, the workload's next step) from the log."""
    try:
        latest = await latest_spec(bootstrap, workload_id)
    except NoSpec:
        raise BindingChangeError(f"no spec on {topics.spec(workload_id)}") from None
    merge_view = await read_topic(bootstrap, topics.merge(workload_id))
    next_seq = 0
    for rec in merge_view:
        try:
            entry = decode(rec.value)
        except DecodeError:
            continue
        if isinstance(entry, MergeEntry) and entry.action == "deliver":
            next_seq = max(next_seq, entry.seq + 1)
    return latest[0], latest[1], next_seq


async def write_change(bootstrap: str, workload_id: str, change: Change) -> int:
    """Append the change's spec to ``wl.<id>.spec``; its offset."""
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.spec(workload_id), encode(change.spec),
                                            partition=0)
        return int(meta.offset)
    finally:
        await producer.stop()


# ------------------------------------------------------------------------------ the commands
def _bootstrap(args: argparse.Namespace) -> str:
    from fx_kafka.client import bootstrap_of

    return bootstrap_of(args.bootstrap)


def with_names(change: Change, names: Mapping[str, ModelName]) -> Change:
    """``change`` with the registry names its hashes were given by on its spec
    (``SpecRecord.model_names``; the names of earlier bindings kept). Pure."""
    if not names:
        return change
    merged = {**change.spec.model_names, **names}
    return replace(change, spec=change.spec.model_copy(update={"model_names": merged}))


def _label(spec: SpecRecord, model_hash: str | None) -> str:
    named = spec.model_names.get(model_hash) if model_hash else None
    return f"{named.text()} ({model_hash})" if named else str(model_hash)


def _resolve(args: argparse.Namespace, ref: str) -> tuple[str, dict[str, ModelName]]:
    """A ``--model``/``--to`` value resolved now (hash, or ``NAME@VERSION``/``NAME@ALIAS``
    through ``sys.models``): the hash and its name; ``RegistryError`` (one line) otherwise."""
    from fx_kafka.model_registry import resolve_refs

    hashes, names = asyncio.run(resolve_refs(_bootstrap(args), {"": ref}))
    return hashes[""], names


def _run_change(args: argparse.Namespace, plan: object,
                names: Mapping[str, ModelName] | None = None) -> int:
    from workload_sdk._model_check import check_spec_models

    name = f"fx {args.command}"
    try:
        _, spec, next_seq = asyncio.run(current_state(_bootstrap(args), args.id))
        change = with_names(plan(spec, next_seq), names or {})  # type: ignore[operator]
        unchecked = asyncio.run(check_spec_models(
            _bootstrap(args), {"--model": {change.name: change.new_hash}}, force=args.force))
    except (BindingChangeError, ValueError) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    if unchecked:  # the --force override, on the record
        recorded = tuple(sorted({*change.spec.unchecked_models, *unchecked}))
        change = replace(change, spec=change.spec.model_copy(
            update={"unchecked_models": recorded}))
    offset = asyncio.run(write_change(_bootstrap(args), args.id, change))
    print(f"{name}: {change.name} {_label(change.spec, change.old_hash)} -> "
          f"{_label(change.spec, change.new_hash)} from step "
          f"{change.at_offset}: spec written to {topics.spec(args.id)}@{offset} (the next step "
          f"was {next_seq}); the running holder adopts it from its next step, or says why not")
    return 0


def _upgrade(args: argparse.Namespace) -> int:
    from broker_schema.registry import RegistryError

    name, sep, ref = args.model.partition("=")
    try:
        new_hash, names = _resolve(args, ref) if sep else (ref, {})
    except RegistryError as exc:
        print(f"fx upgrade: --model {args.model}: {exc}", file=sys.stderr)
        return 2
    if not sep or not is_hash(new_hash):
        print(f"fx upgrade: --model takes NAME=sha256:HEX or NAME=MODEL@VERSION|ALIAS, got "
              f"{args.model!r}", file=sys.stderr)
        return 2
    return _run_change(args, lambda spec, nxt: plan_upgrade(spec, name, new_hash,
                                                            args.at_offset, nxt), names)


def _rollback(args: argparse.Namespace) -> int:
    from broker_schema.registry import RegistryError

    to: str | None = args.to
    names: dict[str, ModelName] = {}
    try:
        if to is not None:
            to, names = _resolve(args, to)
    except RegistryError as exc:
        print(f"fx rollback: --to {args.to}: {exc}", file=sys.stderr)
        return 2
    if to is not None and not is_hash(to):
        print(f"fx rollback: --to takes sha256:HEX or MODEL@VERSION|ALIAS, got {args.to!r}",
              file=sys.stderr)
        return 2
    return _run_change(args, lambda spec, nxt: plan_rollback(spec, args.model, args.at_offset,
                                                             nxt, to), names)


class _OldAtOffset(argparse.Action):
    """``--at-offset``, the old spelling of ``--at-step``: still accepted, with a warning."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print("warning: --at-offset is deprecated: it is a step number (the merge seq the "
              "workload's next step will have, as fx replay --to and fx why show it), not an "
              "input offset; say --at-step", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _at_step_arg(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--at-step", type=int, dest="at_offset", metavar="STEP",
                       help="the first step (merge seq, as fx replay --to and fx why show it) "
                       "the change binds; the workload's next step or later. Recorded as the "
                       "switch's at_input_offset, which counts steps")
    group.add_argument("--at-offset", type=int, dest="at_offset", metavar="STEP",
                       action=_OldAtOffset, help="deprecated spelling of --at-step (it was "
                       "always a step number, not an input offset)")


def _force_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true",
                   help="bind a hash no node on sys.facts holds; recorded on the spec as "
                   "unchecked_models")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx upgrade`` and ``fx rollback``."""
    up = subparsers.add_parser("upgrade", help="bind a model name to a new hash from a step "
                               "on (a new spec; the running holder adopts it)")
    up.add_argument("id", help="workload id")
    up.add_argument("--model", required=True, metavar="NAME=HASH",
                    help="NAME=sha256:HEX, or NAME=MODEL@VERSION / NAME=MODEL@ALIAS from the "
                    "registry (resolved now; the spec records the name beside the hash)")
    _at_step_arg(up)
    _force_arg(up)
    up.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")
    up.set_defaults(func=needs_workload(_upgrade, exit_code=2))
    rb = subparsers.add_parser("rollback", help="bind a model name back to its previous hash "
                               "from a later step on (outputs already written stay)")
    rb.add_argument("id", help="workload id")
    rb.add_argument("--model", required=True, metavar="NAME")
    _at_step_arg(rb)
    _force_arg(rb)
    rb.add_argument("--to", metavar="HASH", help="bind to this hash, or MODEL@VERSION / "
                    "MODEL@ALIAS from the registry (default: the one before the latest change "
                    "of NAME)")
    rb.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")
    rb.set_defaults(func=needs_workload(_rollback, exit_code=2))
