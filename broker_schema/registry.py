"""The model registry's rules (``sys.models``): what a registry holds after its records, what a
``NAME@VERSION`` or ``NAME@ALIAS`` resolves to, and whether a registration may be written.

Pure functions over records: the CLI reads ``sys.models`` and hands the records here. A name is
resolved once, when a spec, upgrade, rollback or shadow is written; the record then carries the
hash and the name (:class:`broker_schema.ModelName`), and replay reads the hash, never the
registry. Every mistake is a :class:`RegistryError` subclass with one line for the operator.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from broker_schema.canonical import HASH_PREFIX, is_hash
from broker_schema.key_history import fleet_signature_problem
from broker_schema.records import ModelAliasRecord, ModelName, ModelRecord

__all__ = ["AmbiguousModel", "BadModelRef", "Registry", "RegistryError", "Resolved",
           "UnknownAlias", "UnknownModel", "UnknownVersion", "alias_problem", "fold_registry",
           "parse_ref", "record_key", "register_problem", "resolve", "signature_problem"]

_REF_RE = re.compile(r"^([a-z0-9][a-z0-9._-]{0,99})[@]([A-Za-z0-9][A-Za-z0-9._+-]{0,63})$")
_ALIAS_RE = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")


class RegistryError(ValueError):
    """A model reference or registration the registry cannot honour (one line)."""

    code = "registry_error"


class BadModelRef(RegistryError):
    """Not ``sha256:<64 hex>``, ``NAME@VERSION`` nor ``NAME@ALIAS``."""

    code = "bad_model_ref"


class UnknownModel(RegistryError):
    """No version of that name is registered."""

    code = "unknown_model"


class UnknownVersion(RegistryError):
    """The name is registered, but neither a version nor an alias of it is spelled so."""

    code = "unknown_version"


class UnknownAlias(UnknownVersion):
    """An alias that names a version never registered (or was never set)."""

    code = "unknown_alias"


class AmbiguousModel(RegistryError):
    """The tag is both a version and an alias of the name, and they name different hashes."""

    code = "ambiguous_model"


@dataclass(frozen=True)
class Registry:
    """The registry after its records: ``versions[name][version]`` and
    ``aliases[name][alias] -> version`` (the latest move of each alias wins)."""

    versions: dict[str, dict[str, ModelRecord]] = field(default_factory=dict)
    aliases: dict[str, dict[str, str]] = field(default_factory=dict)
    #: ``name -> versions`` registered more than once with different hashes (never by
    #: ``fx models register``, which refuses; kept so :func:`resolve` refuses them)
    conflicts: dict[str, set[str]] = field(default_factory=dict)
    #: records left out because fleet keys were given and they are not signed by one (why)
    refused: list[str] = field(default_factory=list)

    def names_of(self, model_hash: str) -> list[str]:
        """Every ``name@version`` registered for ``model_hash``, sorted."""
        return sorted(f"{n}@{v}" for n, vs in self.versions.items()
                      for v, r in vs.items() if r.model_hash == model_hash)


@dataclass(frozen=True)
class Resolved:
    """A reference resolved: the hash to bind, and the name it was given by (None: a raw
    hash was given)."""

    model_hash: str
    name: ModelName | None


def record_key(record: ModelRecord | ModelAliasRecord) -> bytes:
    """The compaction key: ``name@version`` for a version, ``name#alias`` for an alias."""
    if isinstance(record, ModelRecord):
        return f"{record.name}@{record.version}".encode()
    return f"{record.name}#{record.alias}".encode()


def signature_problem(record: ModelRecord | ModelAliasRecord,
                      fleet_keys: Sequence[bytes]) -> str | None:
    """Why ``record`` is not signed by one of ``fleet_keys`` (the operator's fleet key,
    ``fx models register --fleet-key``), or None when it is."""
    return fleet_signature_problem(record.signature, record.signing_bytes(), fleet_keys)


def fold_registry(records: Iterable[ModelRecord | ModelAliasRecord],
                  fleet_keys: Sequence[bytes] | None = None) -> Registry:
    """The registry after ``records`` in log order. A second record for a ``name@version``
    with another hash (a writer that skipped :func:`register_problem`) is remembered
    (:attr:`Registry.conflicts`) for :func:`resolve` to refuse as ambiguous. The aliases a
    version was registered with are set then, and moved by later alias records."""
    versions: dict[str, dict[str, ModelRecord]] = {}
    aliases: dict[str, dict[str, str]] = {}
    conflicts: dict[str, set[str]] = {}
    refused: list[str] = []
    for rec in records:
        if fleet_keys:
            problem = signature_problem(rec, fleet_keys)
            if problem is not None:
                refused.append(f"{record_key(rec).decode()}: {problem}")
                continue
        if isinstance(rec, ModelRecord):
            known = versions.setdefault(rec.name, {})
            prior = known.get(rec.version)
            if prior is not None and prior.model_hash != rec.model_hash:
                conflicts.setdefault(rec.name, set()).add(rec.version)
            known[rec.version] = rec
            for alias in rec.aliases:
                aliases.setdefault(rec.name, {})[alias] = rec.version
        else:
            aliases.setdefault(rec.name, {})[rec.alias] = rec.version
    return Registry(versions, aliases, conflicts, refused)


def parse_ref(text: str) -> tuple[str, str]:
    """``NAME@TAG`` -> ``(name, tag)``; :class:`BadModelRef` otherwise."""
    match = _REF_RE.fullmatch(text)
    if match is None:
        raise BadModelRef(
            f"{text[:120]!r} is not a model reference: give sha256:<64 hex>, NAME@VERSION or "
            "NAME@ALIAS (names: lowercase letters, digits, '.', '_', '-')")
    return match.group(1), match.group(2)


def resolve(registry: Registry, ref: str) -> Resolved:
    """What ``ref`` binds: a raw ``sha256:`` hash is itself (no name); ``NAME@VERSION`` the
    version's hash; ``NAME@ALIAS`` the hash of the version the alias names now. Typed errors
    (:class:`RegistryError`) for a bad spelling, an unknown name, version or alias, and a tag
    that is both a version and an alias naming different hashes (ambiguous)."""
    if ref.startswith(HASH_PREFIX):
        if not is_hash(ref):
            raise BadModelRef(f"{ref[:120]!r} is not a {HASH_PREFIX}<64 lowercase hex> model "
                              "hash")
        return Resolved(ref, None)
    name, tag = parse_ref(ref)
    versions = registry.versions.get(name)
    if not versions:
        raise UnknownModel(f"no model named {name!r} in the registry (fx models list "
                           "--registry shows what is; fx models register adds one)")
    conflicts = registry.conflicts
    by_version = versions.get(tag)
    alias_to = registry.aliases.get(name, {}).get(tag)
    by_alias = None if alias_to is None else versions.get(alias_to)
    if by_version is not None and tag in conflicts.get(name, set()):
        raise AmbiguousModel(f"{name}@{tag} was registered with more than one hash: refusing "
                             "to choose (register a new version)")
    if by_version is not None and by_alias is not None and \
            by_version.model_hash != by_alias.model_hash:
        raise AmbiguousModel(
            f"{name}@{tag} is both version {tag} ({by_version.model_hash}) and the alias "
            f"{tag} of version {alias_to} ({by_alias.model_hash}): give the hash, or move "
            "the alias")
    if by_version is not None:
        return Resolved(by_version.model_hash, ModelName(name=name, version=tag))
    if alias_to is not None:
        if by_alias is None:
            raise UnknownAlias(f"the alias {name}@{tag} names version {alias_to}, which is "
                               "not registered")
        if alias_to in conflicts.get(name, set()):
            raise AmbiguousModel(f"{name}@{tag} names {name}@{alias_to}, which was registered "
                                 "with more than one hash")
        return Resolved(by_alias.model_hash, ModelName(name=name, version=alias_to, alias=tag))
    known = sorted(versions) + sorted(registry.aliases.get(name, {}))
    cls = UnknownAlias if _ALIAS_RE.fullmatch(tag) else UnknownVersion
    raise cls(f"{name} has no version or alias {tag!r} (it has: {', '.join(known[:20])})")


def register_problem(registry: Registry, record: ModelRecord) -> str | None:
    """Why ``record`` may not be written (None: it may). A version is registered once: the
    same ``name@version`` again with the same hash is allowed (aliases may be added), with
    another hash refused."""
    prior = registry.versions.get(record.name, {}).get(record.version)
    if prior is not None and prior.model_hash != record.model_hash:
        return (f"{record.name}@{record.version} is already registered as {prior.model_hash}: "
                "a version names one model forever (register a new version)")
    return None


def alias_problem(registry: Registry, record: ModelAliasRecord) -> str | None:
    """Why an alias move may not be written: the version it names must be registered."""
    if record.version not in registry.versions.get(record.name, {}):
        if record.name not in registry.versions:
            return f"no model named {record.name!r} in the registry"
        return f"{record.name} has no version {record.version!r} registered"
    return None
