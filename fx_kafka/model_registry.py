"""The model registry on the log (``sys.models``): read, written, and its commands.

``fx models register NAME@VERSION HASH [--alias prod] [--licence-file F]``, ``fx models alias
NAME ALIAS VERSION`` and ``fx models list --registry``. Only the operator may write the topic
(``fx acl apply``). The rules (what a reference resolves to, whether a version may be
registered) are :mod:`broker_schema.registry`'s; this module is the I/O around them, and the one
place the spec, upgrade, rollback and shadow commands resolve a reference
(:func:`resolve_refs`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import getpass
import json
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from broker_schema import (
    DecodeError,
    ModelAliasRecord,
    ModelName,
    ModelRecord,
    decode,
    encode,
    is_hash,
    topics,
)
from broker_schema.canonical import HASH_PREFIX
from broker_schema.registry import (
    Registry,
    RegistryError,
    alias_problem,
    fold_registry,
    record_key,
    register_problem,
    resolve,
)
from fx_kafka.client import bootstrap_of, create_topics, make_consumer, make_producer
from fx_kafka.security import ClientSecurity
from fx_kafka.workload_log import read_topic

_R = TypeVar("_R", ModelRecord, ModelAliasRecord)

__all__ = ["add_registry_commands", "list_registry", "print_registry", "read_registry",
           "resolve_refs", "write_registry_record"]

#: Exit code of a registry mistake (unknown name, bad spelling, a version registered twice).
EXIT_REGISTRY = 2


def registrant() -> str:
    """Who writes: the SASL user on a secured broker, else ``user@host``."""
    security = ClientSecurity.from_env()
    if security.sasl and security.username:
        return security.username
    return f"{getpass.getuser()}@{socket.gethostname()}"


async def read_registry(bootstrap: str, *, timeout: float = 30.0,
                        fleet_keys: Sequence[bytes] | None = None) -> Registry:
    """The registry as ``sys.models`` holds it now (empty when the topic does not exist);
    records that do not decode are passed over; given ``fleet_keys``, so are those not signed
    by one of them (:attr:`Registry.refused`)."""
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        present = topics.MODELS in await consumer.topics()
    finally:
        await consumer.stop()
    if not present:
        return fold_registry([], fleet_keys)
    found: list[ModelRecord | ModelAliasRecord] = []
    for rec in await read_topic(bootstrap, topics.MODELS, timeout=timeout):
        try:
            record = decode(rec.value, topic=topics.MODELS)
        except DecodeError:
            continue
        if isinstance(record, ModelRecord | ModelAliasRecord):
            found.append(record)
    return fold_registry(found, fleet_keys)


def _sign(record: _R, fleet_key: str | None) -> _R:
    """``record`` signed with the fleet key in the PEM file ``fleet_key`` (None: unsigned)."""
    if fleet_key is None:
        return record
    from broker_schema import Signature
    from broker_schema.signatures import SigningKey

    try:
        key = SigningKey.from_pem(Path(fleet_key).read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read the fleet key {fleet_key}: {exc}") from None
    value = base64.b64encode(key.sign(record.signing_bytes())).decode("ascii")
    return record.model_copy(update={"signature": Signature(alg=key.key_type,
                                                            key_id=key.key_id, value=value)})


async def write_registry_record(bootstrap: str, record: ModelRecord | ModelAliasRecord) -> int:
    """Append ``record`` to ``sys.models`` (made compacted if missing); its offset."""
    await create_topics(bootstrap, [topics.MODELS], compacted=True)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.MODELS, value=encode(record),
                                            key=record_key(record), partition=0)
        return int(meta.offset)
    finally:
        await producer.stop()


async def resolve_refs(bootstrap: str, refs: Mapping[str, str]
                       ) -> tuple[dict[str, str], dict[str, ModelName]]:
    """Binding name -> reference (a hash, ``NAME@VERSION`` or ``NAME@ALIAS``) resolved now:
    ``(binding name -> hash, hash -> registry name)``. The registry is read only when a
    reference names a model (has an ``@``); anything else is passed through as given, for the
    caller's hash check (:mod:`workload_sdk._model_check` says what is wrong with a short
    hash). With ``$FX_FLEET_PUBLIC_KEY`` set, only registry records signed by one of those
    fleet keys count. :class:`RegistryError` (one line) on a naming mistake."""
    from fx_kafka.keys import fleet_public_keys

    registry = None
    fleet = fleet_public_keys(None)  # $FX_FLEET_PUBLIC_KEY: only records signed by one count
    hashes: dict[str, str] = {}
    names: dict[str, ModelName] = {}
    for binding, ref in refs.items():
        if ref.startswith(HASH_PREFIX) or "@" not in ref:
            hashes[binding] = ref  # a hash (or no name): the caller's hash check judges it
            continue
        if registry is None:
            registry = await read_registry(bootstrap, fleet_keys=fleet or None)
        got = resolve(registry, ref)
        hashes[binding] = got.model_hash
        if got.name is not None:
            names[got.model_hash] = got.name
    return hashes, names


def list_registry(registry: Registry) -> list[dict[str, object]]:
    """One row per registered version: name, version, hash, the aliases naming it now,
    licence notice and who registered it (sorted by name, then registration time)."""
    rows: list[dict[str, object]] = []
    for name in sorted(registry.versions):
        aliases = registry.aliases.get(name, {})
        for version, rec in sorted(registry.versions[name].items(),
                                   key=lambda kv: kv[1].registered_us):
            rows.append({"name": name, "version": version, "hash": rec.model_hash,
                         "aliases": sorted(a for a, v in aliases.items() if v == version),
                         "licence": rec.licence, "registered_by": rec.registered_by,
                         "registered_us": rec.registered_us,
                         "signed_by": None if rec.signature is None else rec.signature.key_id})
    return rows


# --------------------------------------------------------------------------------- commands
def _fail(command: str, message: str) -> int:
    print(f"fx models {command}: {message}", file=sys.stderr, flush=True)
    return EXIT_REGISTRY


def _register(args: argparse.Namespace) -> int:
    from broker_schema.registry import parse_ref

    try:
        name, version = parse_ref(args.ref)
    except RegistryError as exc:
        return _fail("register", str(exc))
    if not is_hash(args.hash):
        return _fail("register", f"{args.hash[:120]!r} is not a {HASH_PREFIX}<64 lowercase "
                     "hex> model hash (fx models list prints the store's)")
    licence = None
    if args.licence_file:
        try:
            licence = Path(args.licence_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return _fail("register", f"cannot read the licence file {args.licence_file}: {exc}")
    try:
        record = _sign(ModelRecord(
            name=name, version=version, model_hash=args.hash,
            aliases=tuple(dict.fromkeys(args.alias or ())), licence=licence,
            registered_by=registrant(), registered_us=time.time_ns() // 1000), args.fleet_key)
    except ValueError as exc:
        from fx_kafka.cli_errors import one_line

        return _fail("register", one_line(exc))
    bootstrap = bootstrap_of(args.bootstrap)
    problem = register_problem(asyncio.run(read_registry(bootstrap)), record)
    if problem:
        return _fail("register", problem)
    offset = asyncio.run(write_registry_record(bootstrap, record))
    also = f" (aliases: {', '.join(record.aliases)})" if record.aliases else ""
    also += f", signed by {record.signature.key_id}" if record.signature else ""
    print(f"registered {name}@{version} = {record.model_hash}{also} on "
          f"{topics.MODELS}@{offset}")
    return 0


def _alias(args: argparse.Namespace) -> int:
    try:
        record = _sign(ModelAliasRecord(name=args.name, alias=args.alias, version=args.version,
                                        set_by=registrant(), set_us=time.time_ns() // 1000),
                       args.fleet_key)
    except ValueError as exc:
        from fx_kafka.cli_errors import one_line

        return _fail("alias", one_line(exc))
    bootstrap = bootstrap_of(args.bootstrap)
    registry = asyncio.run(read_registry(bootstrap))
    problem = alias_problem(registry, record)
    if problem:
        return _fail("alias", problem)
    before = registry.aliases.get(record.name, {}).get(record.alias)
    offset = asyncio.run(write_registry_record(bootstrap, record))
    was = f" (was {before})" if before and before != record.version else ""
    print(f"{record.name}@{record.alias} -> {record.name}@{record.version}{was} = "
          f"{registry.versions[record.name][record.version].model_hash} on "
          f"{topics.MODELS}@{offset}")
    return 0


def print_registry(bootstrap: str, as_json: bool, fleet_key: list[str] | None = None) -> int:
    """``fx models list --registry``: the registered names, versions, aliases and hashes (with
    ``fleet_key``: only those signed by one of them, the others said on stderr)."""
    from fx_kafka.keys import fleet_public_keys

    try:
        fleet = fleet_public_keys(fleet_key)
    except ValueError as exc:
        return _fail("list", f"--fleet-key: {exc}")
    registry = asyncio.run(read_registry(bootstrap, fleet_keys=fleet or None))
    for why in registry.refused:
        print(f"not counted: {why}", file=sys.stderr)
    rows = list_registry(registry)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no model registered on {topics.MODELS} (fx models register NAME@VERSION HASH)")
    for r in rows:
        aliases = r["aliases"]
        tags = f"  [{', '.join(aliases)}]" if isinstance(aliases, list) and aliases else ""
        signed = f", signed {str(r['signed_by'])[:19]}…" if r["signed_by"] else ", unsigned"
        print(f"{r['name']}@{r['version']:<12} {r['hash']}{tags}  by {r['registered_by']}"
              f"{signed}")
        if r["licence"]:
            first = str(r["licence"]).strip().splitlines()
            print(f"    licence: {first[0][:100] if first else ''}")
    return 0


def add_registry_commands(models_sub: argparse._SubParsersAction[argparse.ArgumentParser]
                          ) -> None:
    """Add ``fx models register`` and ``fx models alias`` to the ``fx models`` group."""
    reg = models_sub.add_parser(
        "register", help=f"register NAME@VERSION as a model hash on {topics.MODELS} "
        "(operator only)")
    reg.add_argument("ref", metavar="NAME@VERSION")
    reg.add_argument("hash", metavar="HASH", help="the model's content hash (sha256:HEX)")
    reg.add_argument("--alias", action="append", metavar="ALIAS",
                     help="an alias naming this version from now on (prod, canary; repeatable)")
    reg.add_argument("--licence-file", "--license-file", dest="licence_file", metavar="FILE",
                     help="the licence notice kept with the model (UTF-8 text)")
    reg.add_argument("--fleet-key", metavar="FILE", help="sign the record with this fleet key "
                     "(PKCS#8 PEM, fx keys fleet-init); resolvers with $FX_FLEET_PUBLIC_KEY "
                     "count only signed records")
    reg.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")
    reg.set_defaults(func=_register)
    al = models_sub.add_parser("alias", help="point NAME@ALIAS at a registered version "
                               "(operator only)")
    al.add_argument("name", metavar="NAME")
    al.add_argument("alias", metavar="ALIAS")
    al.add_argument("version", metavar="VERSION")
    al.add_argument("--fleet-key", metavar="FILE", help="sign the record with this fleet key")
    al.add_argument("--bootstrap", help="HOST:PORT (default: $FX_KAFKA_BOOTSTRAP)")
    al.set_defaults(func=_alias)
