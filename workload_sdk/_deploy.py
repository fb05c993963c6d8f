"""``fx workload deploy``: new workload code from a step on, on the record.

A deploy stores the module's source in the module store (``sys.modules``, keyed by its hash:
:mod:`workload_sdk._module_store`) and appends a spec to ``wl.<id>.spec``: the latest spec plus
one module switch (``SpecRecord.module_switches``: step, module hash, workload class). The
running lease holder adopts it from its next step like a binding switch (a claim of its epoch
with ``from_seq``, once it has loaded the code; :mod:`broker_schema.binding`), or a new holder
claims with it; steps before the switch keep the code they ran. Replay, diff, audit, ``fx why``
and shadow evaluations run each range of steps with the module its spec names for it
(:meth:`broker_schema.SpecRecord.module_at`), loaded by hash from the store. :func:`plan_deploy`
is pure; :func:`deploy` is the I/O.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass

from broker_schema import EncodeError, ModuleSwitch, SpecRecord, encode, topics
from fx_kafka.client import make_producer
from fx_kafka.workload_log import LogGap, read_topic
from fx_kafka.workloads import needs_workload
from workload_sdk._bindings import BindingChangeError, current_state
from workload_sdk._holder_start import read_claims
from workload_sdk._loader import load_workload
from workload_sdk._module_store import module_record, store_module

__all__ = ["DeployError", "Deployed", "deploy", "plan_deploy", "register"]


class DeployError(ValueError):
    """A deploy that cannot be made (a clear message for the operator)."""


@dataclass(frozen=True)
class Deployed:
    """What a deploy wrote: the module (hash, class, its offset on ``sys.modules``), the step
    it runs from, and the spec (its offset on ``.spec``); ``next_seq``: the workload's next
    step when the deploy read the log."""

    module_hash: str
    workload_class: str
    module_offset: int
    at_step: int
    spec_offset: int
    next_seq: int


def plan_deploy(spec: SpecRecord, module: str, workload_class: str, at_step: int,
                next_seq: int, in_force: SpecRecord | None = None) -> SpecRecord:
    """The spec that runs ``module`` (class ``workload_class``) from step ``at_step`` on: ``spec``
    (the latest on ``.spec``) plus one module switch. :class:`DeployError` when the step is
    passed (``next_seq``: the workload's next step), not after the latest switch, or the code
    already runs there.

    ``in_force``: the spec the latest claim names. The code of the steps taken is its code
    (its ``module_hash`` and its switches before ``next_seq``), whatever a later spec that was
    never adopted says of them (one refused because its step was passed when the holder saw it,
    or one naming another module): the new spec keeps that history, so the running holder can
    adopt it. Everything else comes from ``spec``."""
    if in_force is not None:
        spec = spec.model_copy(update={
            "module_hash": in_force.module_hash,
            "module_switches": tuple(s for s in in_force.module_switches if s.at_step < next_seq)
            + tuple(s for s in spec.module_switches if s.at_step >= next_seq)})
    if at_step < next_seq:
        raise DeployError(f"step {at_step} is already passed: the workload's next step is "
                          f"{next_seq} (new code runs from {next_seq} or later; steps taken "
                          "keep the code they ran)")
    last = max((s.at_step for s in spec.module_switches), default=-1)
    if at_step <= last:
        raise DeployError(f"the spec already switches code at step {last}: deploy at a later "
                          "step")
    if spec.module_at(at_step) in ((module, workload_class), (module, None)):
        raise DeployError(f"step {at_step} already runs module {module} ({workload_class})")
    switch = ModuleSwitch(at_step=at_step, module_hash=module, workload_class=workload_class)
    return spec.model_copy(update={"module_switches": (*spec.module_switches, switch)})


async def deploy(bootstrap: str, workload_id: str, ref: str, at_step: int | None) -> Deployed:
    """Store the code ``ref`` (``file.py:Class`` or ``pkg.module:Class``) in the module store and
    append the spec that runs it from ``at_step`` (None: the workload's next step)."""
    try:
        workload = load_workload(ref)
        record = module_record(workload)
    except (ImportError, AttributeError, TypeError, ValueError, OSError, SyntaxError) as exc:
        raise DeployError(f"--module {ref}: {type(exc).__name__}: {exc}") from None
    try:
        _, spec, next_seq = await current_state(bootstrap, workload_id)
    except BindingChangeError as exc:
        raise DeployError(str(exc)) from None
    step = next_seq if at_step is None else at_step
    new_spec = plan_deploy(spec, record.module_hash, record.workload_class, step, next_seq,
                           await _in_force(bootstrap, workload_id))
    try:
        value = encode(new_spec)
        module_offset = await store_module(bootstrap, record)
    except EncodeError as exc:
        raise DeployError(f"the module or spec cannot be written: {exc}") from None
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.spec(workload_id), value, partition=0)
    finally:
        await producer.stop()
    return Deployed(record.module_hash, record.workload_class, module_offset, step,
                    int(meta.offset), next_seq)


async def _in_force(bootstrap: str, workload_id: str) -> SpecRecord | None:
    """The spec the latest claim on ``.claims`` names (None: no claim, or it cannot be read)."""
    claims = await read_claims(bootstrap, workload_id)
    if not claims:
        return None
    view = await read_topic(bootstrap, topics.spec(workload_id))
    try:
        spec = view.get(claims[-1].spec_offset)
    except LogGap:
        return None
    return spec if isinstance(spec, SpecRecord) else None


def _deploy(args: argparse.Namespace) -> int:
    from fx_kafka.client import bootstrap_of

    try:
        done = asyncio.run(deploy(bootstrap_of(args.bootstrap), args.id, args.module,
                                  args.at_step))
    except DeployError as exc:
        print(f"fx workload deploy: {exc}", file=sys.stderr)
        return 2
    print(f"fx workload deploy: module {done.module_hash} ({done.workload_class}) stored on "
          f"{topics.MODULES}@{done.module_offset}; it runs steps {done.at_step} and later: spec "
          f"written to {topics.spec(args.id)}@{done.spec_offset} (the next step was "
          f"{done.next_seq}); the running holder adopts it from its next step, or says why not")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx workload deploy`` (``sub``: the ``fx workload`` subcommands)."""
    dp = sub.add_parser("deploy", help="run new workload code from a step on (stores the "
                        "module by hash; the running holder adopts it)")
    dp.add_argument("id", help="workload id")
    dp.add_argument("--module", required=True, metavar="FILE.py:Class",
                    help="the new code (file.py:Class or package.module:Class)")
    dp.add_argument("--at-step", type=int, default=None, metavar="STEP",
                    help="the first step (merge seq, as fx replay --to and fx why show it) the "
                    "new code runs; default: the workload's next step")
    dp.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")
    dp.set_defaults(func=needs_workload(_deploy, exit_code=2))
