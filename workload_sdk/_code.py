"""Which code runs a step: the workload at hand and the module store, by hash.

A spec names the module each step runs (:meth:`broker_schema.SpecRecord.module_at`: the spec's
``module_hash`` until its first module switch, then each switch's module from its step on;
``fx workload deploy`` appends the switches). :class:`Code` hands the fold the workload for a
step under the spec in force: the workload the process was started with when its module's hash
is the one named, else the module loaded from its source in the module store (``sys.modules``,
:class:`broker_schema.ModuleRecord`, read by :mod:`workload_sdk._module_store`), hash-checked.
The holder, replay, diff, audit and shadow evaluations fold with it, so each range of steps runs
the code recorded for it. Loading executes the stored source (the same trust as ``--module``:
whoever may write ``sys.modules`` may run code in the holder, so the ACLs give it to operators).
No I/O here beyond importing the stored source.
"""

from __future__ import annotations

import linecache
import sys
import types
from collections.abc import Iterable, Mapping

from broker_schema import ModuleRecord, SpecRecord, topics
from broker_schema.canonical import hex_of_hash, sha256_hex
from workload_sdk._api import Workload, module_hash

__all__ = ["Code", "ModuleUnavailable", "load_module_source"]


class ModuleUnavailable(Exception):
    """The code a step runs cannot be had: its module is not in the module store (or the
    store's source does not hash to it, or it has no such workload class)."""


def load_module_source(record: ModuleRecord, workload_class: str | None = None) -> Workload:
    """Instantiate ``workload_class`` (default: the record's) from the stored source. The source
    is checked against ``record.module_hash`` again (the record's own validation does, but a
    record built without validation must not run unchecked)."""
    data = record.source.encode("utf-8")
    if sha256_hex(data) != record.module_hash:
        raise ModuleUnavailable(f"the source stored for {record.module_hash} hashes to "
                                f"{sha256_hex(data)}")
    name = f"fx_module_{hex_of_hash(record.module_hash)[:16]}"
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        filename = f"<{topics.MODULES} {record.module_hash[:19]}... {record.filename}>"
        linecache.cache[filename] = (len(record.source), None,
                                     record.source.splitlines(keepends=True), filename)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            exec(compile(record.source, filename, "exec"), module.__dict__)
        except Exception as exc:
            del sys.modules[name]
            raise ModuleUnavailable(f"module {record.module_hash} ({record.filename}) does not "
                                    f"import: {type(exc).__name__}: {exc}") from exc
    cls_name = workload_class or record.workload_class
    cls = getattr(module, cls_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Workload)):
        raise ModuleUnavailable(f"module {record.module_hash} ({record.filename}) has no "
                                f"workload class {cls_name}")
    return cls()


class Code:
    """The workload for each step (see the module docstring).

    ``given``: the workload the process was started with (``--module``), or None; ``store``:
    module records by hash (the module store as read). A module is loaded once, when a step
    first needs it, so a spec that names a module no step runs never needs its code."""

    def __init__(self, given: Workload | None,
                 store: Mapping[str, ModuleRecord] | None = None, *,
                 fallback: bool = False) -> None:
        self.given = given
        self.given_hash = None if given is None else module_hash(given)
        self._store: dict[str, ModuleRecord] = dict(store or {})
        self._loaded: dict[tuple[str, str | None], Workload] = {}
        #: run ``given`` for a module the store lacks, as replay did before the module store
        #: (``fx replay``/``fx audit --module``: they say so, from :attr:`stood_in`); never the
        #: holder's choice
        self.fallback = fallback
        #: the modules ``given`` stood in for
        self.stood_in: set[str] = set()

    def add(self, records: Iterable[ModuleRecord]) -> None:
        """Module records read from the store since (the latest per hash wins)."""
        for record in records:
            self._store[record.module_hash] = record

    def has(self, module: str) -> bool:
        """Whether the code of ``module`` can be had (at hand or in the store as read)."""
        return module == self.given_hash or module in self._store

    def workload(self, module: str, workload_class: str | None = None) -> Workload:
        """The workload ``workload_class`` of ``module`` (None: the class at hand, or the one
        the store records); :class:`ModuleUnavailable` when it cannot be had."""
        key = (module, workload_class)
        found = self._loaded.get(key)
        if found is not None:
            return found
        given = self.given
        if given is not None and module == self.given_hash:
            if workload_class is None or workload_class == type(given).__name__:
                found = given
            else:
                cls = getattr(sys.modules[type(given).__module__], workload_class, None)
                if not (isinstance(cls, type) and issubclass(cls, Workload)):
                    raise ModuleUnavailable(f"module {module} has no workload class "
                                            f"{workload_class}")
                found = cls()
        else:
            record = self._store.get(module)
            if record is None and self.fallback and given is not None:
                self.stood_in.add(module)
                self._loaded[key] = given
                return given
            if record is None:
                raise ModuleUnavailable(
                    f"module {module} is not in the module store {topics.MODULES}" +
                    ("" if self.given_hash is None else
                     f" (the code at hand hashes to {self.given_hash})") +
                    ": fx workload deploy stores the file whose sha256 it is; or pass that "
                    "code as --module")
            found = load_module_source(record, workload_class)
        self._loaded[key] = found
        return found

    def at(self, spec: SpecRecord, seq: int) -> Workload:
        """The workload that runs step ``seq`` under ``spec`` (the spec in force for it)."""
        module, workload_class = spec.module_at(seq)
        return self.workload(module, workload_class)

    def missing(self, spec: SpecRecord, from_seq: int = 0) -> list[str]:
        """The modules ``spec`` runs at step ``from_seq`` or later whose code cannot be had."""
        wanted = [spec.module_at(from_seq)[0]] + [s.module_hash for s in spec.module_switches
                                                  if s.at_step > from_seq]
        return [m for m in dict.fromkeys(wanted) if not self.has(m)]

    def problem(self, spec: SpecRecord, from_seq: int = 0) -> str | None:
        """Why ``spec`` cannot run from step ``from_seq`` on (:meth:`missing`), or None."""
        absent = self.missing(spec, from_seq)
        if not absent:
            return None
        return (f"runs module {', '.join(absent)} from step {from_seq} on, which is neither the "
                f"code at hand nor in the module store {topics.MODULES} (fx workload deploy "
                "stores it)")
