"""Model hashes checked when a spec is written (``fx workload spec``, ``fx upgrade``,
``fx rollback``): a short or malformed hash is one clear line; a well-formed hash that no model
store given and no node on ``sys.facts`` holds is refused unless ``--force``, and the override is
recorded on the spec (``SpecRecord.unchecked_models``).

:func:`malformed` and :func:`unknown` decide (pure); :func:`known_models` reads what is known
(``sys.facts`` and a model store directory).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from broker_schema import is_hash
from broker_schema.canonical import HASH_PREFIX, HASH_RE

__all__ = ["ModelCheckError", "check_spec_models", "known_models", "malformed", "unknown"]


class ModelCheckError(ValueError):
    """A model hash that cannot go into a spec (the message is the one line to show)."""


def malformed(flag: str, bound: Mapping[str, str]) -> str | None:
    """Why a binding of ``bound`` (name -> hash, given with ``flag``) is not a full
    ``sha256:<64 hex>`` hash, or None. Pure."""
    for name, value in bound.items():
        if is_hash(value):
            continue
        digits = value[len(HASH_PREFIX):] if value.startswith(HASH_PREFIX) else value
        if digits and all(c in "0123456789abcdef" for c in digits) and len(digits) < 64:
            why = (f"a short hash ({len(digits)} of 64 hex digits): give the full hash "
                   "(fx models list prints it)")
        else:
            why = "not a sha256:<64 lowercase hex> hash"
        return f"{flag} {name}={value}: {why}"
    return None


def unknown(hashes: Iterable[str], known: set[str]) -> list[str]:
    """The hashes of ``hashes`` not in ``known``, sorted, each once. Pure."""
    return sorted(set(hashes) - known)


def _store_hashes(model_dir: str | Path | None) -> set[str]:
    if not model_dir:
        return set()
    folder = Path(model_dir) / "sha256"
    if not folder.is_dir():
        return set()
    return {HASH_PREFIX + p.name for p in folder.iterdir()
            if HASH_RE.fullmatch(HASH_PREFIX + p.name)}


async def known_models(bootstrap: str, model_dir: str | Path | None = None) -> set[str]:
    """Every model hash a node's latest facts on ``sys.facts`` say it holds, and every one in the
    model store at ``model_dir`` (if given)."""
    from fx_kafka.workload_log import read_facts

    latest = {f.node_id: f for f in await read_facts(bootstrap)}
    held = {m for f in latest.values() for m in f.models_present}
    return held | _store_hashes(model_dir)


async def check_spec_models(bootstrap: str, bound: Mapping[str, Mapping[str, str]], *,
                            force: bool, model_dir: str | Path | None = None) -> list[str]:
    """Check each binding of ``bound`` (flag -> name -> hash): :class:`ModelCheckError` for a
    malformed hash, or for an unknown one without ``force``; with ``force``, the unknown hashes
    (to record on the spec)."""
    for flag, models in bound.items():
        problem = malformed(flag, models)
        if problem is not None:
            raise ModelCheckError(problem)
    hashes = [h for models in bound.values() for h in models.values()]
    if not hashes:
        return []
    missing = unknown(hashes, await known_models(bootstrap, model_dir))
    if missing and not force:
        names = [f"{name}={h}" for models in bound.values() for name, h in models.items()
                 if h in missing]
        raise ModelCheckError(
            f"no node on sys.facts holds {', '.join(names)}"
            + (f" and it is not in the model store {model_dir}" if model_dir else "")
            + ": import it on an executor (fx models import ... --store DIR), or pass --force "
            "to write it anyway (recorded on the spec as unchecked_models)")
    return missing
