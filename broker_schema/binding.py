"""Which spec binds a step: one rule for the lease holder, replay, ``fx why`` and the executor.

A workload's spec can change while it runs (``fx upgrade`` / ``fx rollback`` append a spec with
a new binding switch). The holder of epoch E *adopts* a newer spec by writing a claim of the same
epoch naming it, with ``from_seq`` = the first step it binds. So the claims of an epoch, in log
order, say which spec was in force at every step:

    spec in force for step ``seq`` of epoch ``E`` = the spec named by the **last** claim of epoch
    ``E`` on ``.claims`` whose ``from_seq`` (None counts as 0) is ``<= seq``;

and the models a request of that step may name are that spec's ``models_at(seq)``. The holder
issues under it, replay folds under it, ``fx why`` shows it, and the executor checks a request's
model against it (``model_unbound``), so the four never disagree. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker_schema.records import ClaimRecord, SpecRecord

__all__ = [
    "MAX_EPOCH",
    "MAX_EPOCH_STEP",
    "accepted_claims",
    "claim_in_force",
    "claim_problem",
    "epoch_after",
    "epoch_refused",
    "module_in_force",
    "next_epoch",
    "shadow_models",
    "shadow_spec",
    "spec_in_force",
    "switch_problem",
]

#: The highest epoch a claim may name (the wire's bound on ``Epoch``).
MAX_EPOCH = 2**53 - 1
#: How far a claim may raise a workload's epoch above the highest claim accepted before it on
#: ``.claims``. A holder claims the highest epoch + 1 (or keeps its own), so an honest claim is
#: never more than one above; the bound leaves room and stops one forged claim (epoch 2^53 - 1,
#: issue 30) from fencing every holder for good: a claim above it is refused (the executor
#: writes it to ``sys.rejects`` as ``epoch_jump``), by every reader alike.
MAX_EPOCH_STEP = 1_000


def claim_problem(claim: ClaimRecord, highest: int) -> str | None:
    """Why ``claim`` is refused after claims up to epoch ``highest`` (0: none) were accepted,
    or None. Pure."""
    if epoch_refused(claim.epoch, highest):
        return (f"claim of epoch {claim.epoch} by {claim.holder_id!r} is more than "
                f"{MAX_EPOCH_STEP} above the highest claim accepted before it ({highest})")
    return None


def epoch_refused(epoch: int, highest: int) -> bool:
    """Whether a claim of ``epoch`` is refused after claims up to ``highest`` were accepted
    (the rule of :func:`claim_problem`, for readers that hold only the epoch)."""
    return epoch > highest + MAX_EPOCH_STEP


def accepted_claims(claims: Iterable[ClaimRecord]) -> list[ClaimRecord]:
    """The claims of ``claims`` (in log order) that :func:`claim_problem` accepts, in order:
    what every reader of ``.claims`` (executor, holder, replay, audit, console) goes by."""
    out: list[ClaimRecord] = []
    highest = 0
    for claim in claims:
        if claim_problem(claim, highest) is None:
            out.append(claim)
            highest = max(highest, claim.epoch)
    return out


def next_epoch(claims: Iterable[ClaimRecord]) -> int | None:
    """The epoch a new holder claims after ``claims`` (the accepted ones' highest + 1), or None
    when none is left (the highest is :data:`MAX_EPOCH`): that holder cannot win an epoch."""
    return epoch_after(max((c.epoch for c in accepted_claims(claims)), default=0))


def epoch_after(highest: int) -> int | None:
    """``highest + 1``, or None when ``highest`` is :data:`MAX_EPOCH` (no epoch is left)."""
    return highest + 1 if highest < MAX_EPOCH else None


def claim_in_force(claims: Iterable[ClaimRecord], epoch: int, seq: int) -> ClaimRecord | None:
    """The claim whose spec binds step ``seq`` of ``epoch`` (claims in log order), or None when
    the epoch has no claim."""
    found: ClaimRecord | None = None
    for claim in claims:
        if claim.epoch == epoch and (claim.from_seq or 0) <= seq:
            found = claim
    return found


def spec_in_force(claims: Iterable[ClaimRecord], specs: Mapping[int, SpecRecord], epoch: int,
                  seq: int) -> tuple[ClaimRecord, SpecRecord] | None:
    """The claim and the spec (``specs``: spec records by offset on ``.spec``) binding step
    ``seq`` of ``epoch``; None when the claim or its spec is not known."""
    claim = claim_in_force(claims, epoch, seq)
    if claim is None:
        return None
    spec = specs.get(claim.spec_offset)
    return None if spec is None else (claim, spec)


def switch_problem(current: SpecRecord, new: SpecRecord, next_seq: int) -> str | None:
    """Why ``new`` may not be adopted in place of ``current`` from step ``next_seq`` on, or
    None: it must be the same workload, and it must bind every step before ``next_seq`` as
    ``current`` does, models and code alike (a step already taken is never rebound: outputs
    already written stay what they are). Bindings and modules are constant between switches,
    so they are compared at 0 and at every switch of either below ``next_seq``. New code from
    a later step is a module switch (``fx workload deploy``), adopted like a binding switch."""
    if new.workload_id != current.workload_id:
        return f"the spec is for workload {new.workload_id}, not {current.workload_id}"
    steps = {0} | {s.at_step for s in new.module_switches} \
        | {s.at_step for s in current.module_switches}
    for step in sorted(p for p in steps if p < next_seq):
        if new.module_at(step)[0] != current.module_at(step)[0]:
            return (f"the spec runs other code at step {step}, which is passed (the next step "
                    f"is {next_seq}): new code takes effect at {next_seq} or later "
                    "(fx workload deploy records new code at a step)")
    if (new.local_models != current.local_models
            or new.local_max_tokens_per_step != current.local_max_tokens_per_step):
        return ("the spec changes its mode A models or limits: a running holder does not "
                "switch them (a new holder claims with the new spec, from its epoch's first "
                "step)")
    points = {0} | {s.at_input_offset for s in new.binding_switches} \
        | {s.at_input_offset for s in current.binding_switches}
    for offset in sorted(p for p in points if p < next_seq):
        if new.models_at(offset) != current.models_at(offset):
            return (f"the binding changes at input offset {offset}, which is passed (the next "
                    f"step is {next_seq}): a change takes effect at {next_seq} or later")
    return None


def shadow_models(bound: Mapping[str, str], rebind: Mapping[str, str]) -> dict[str, str]:
    """The models a shadow evaluation's request of a step may name: the step's binding
    (``bound``: the spec's ``models_at(seq)``) with the evaluation's ``rebind`` applied to the
    names it binds (a name the step does not bind stays unbound). One rule for the executor and
    the evaluation's fold."""
    return {name: rebind.get(name, model) for name, model in bound.items()}


def shadow_spec(spec: SpecRecord, rebind: Mapping[str, str]) -> SpecRecord:
    """``spec`` with :func:`shadow_models` applied at every step: its base models and every
    binding switch rebound, so ``shadow_spec(spec, r).models_at(seq) ==
    shadow_models(spec.models_at(seq), r)`` for every ``seq``. For the evaluation's fold only;
    never written."""
    switches = tuple(sw.model_copy(update={"models": shadow_models(sw.models, rebind)})
                     for sw in spec.binding_switches)
    return spec.model_copy(update={"models": shadow_models(spec.models, rebind),
                                   "binding_switches": switches})


def module_in_force(claims: Iterable[ClaimRecord], specs: Mapping[int, SpecRecord], epoch: int,
                    seq: int) -> tuple[str, str | None] | None:
    """Which code ran (or runs) step ``seq`` of ``epoch``: the ``(module hash, class)`` of
    :meth:`SpecRecord.module_at` on the spec in force (:func:`spec_in_force`); None when that
    spec is not known."""
    found = spec_in_force(claims, specs, epoch, seq)
    return None if found is None else found[1].module_at(seq)
