"""``sys.keys``: node key certificates signed by a fleet key, read and written; ``fx keys``.

The trust rule is :mod:`broker_schema.key_history` (pure); this module reads the topic into it,
writes certificates and revocations, and gives operators the commands:

- ``fx keys fleet-init --out FILE [--type ed25519|secp256k1]``: a new fleet key (PKCS#8 PEM,
  0600); prints the public key to give verifiers (``--fleet-key``, ``FX_FLEET_PUBLIC_KEY``);
- ``fx keys certify --fleet-key FILE --node N (--public-key B64 | --from-facts)``: certify a
  node's key (``--from-facts`` takes the key the node publishes on ``sys.facts`` now: the
  operator's decision to trust it, at that moment, is what the certificate records);
- ``fx keys revoke --fleet-key FILE --node N --key-id ID [--from-us T] [--reason ...]``;
- ``fx keys list [--fleet-key PUB ...]``: the history as a given fleet key sees it.

The topic is never compacted and has no retention (the history must outlive every receipt it
vouches for); it is created by the first ``certify``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from broker_schema import DecodeError, decode, encode, signatures, topics
from broker_schema.key_history import KeyHistory, build_history
from broker_schema.records import KeyCertRecord, KeyRevokeRecord, Signature
from broker_schema.signatures import KEY_TYPES, SigningKey

__all__ = [
    "FLEET_KEY_ENV",
    "certify",
    "fleet_public_keys",
    "read_history",
    "read_key_records",
    "register",
    "revoke",
]

#: Environment variable holding the fleet public key(s) verifiers trust (comma-separated base64).
FLEET_KEY_ENV = "FX_FLEET_PUBLIC_KEY"


def fleet_public_keys(given: Sequence[str] | None) -> list[bytes]:
    """The fleet public keys from ``given`` (base64 or hex of raw keys, or a PEM private key
    file whose public half is meant), else from ``FX_FLEET_PUBLIC_KEY``; ``ValueError`` for one
    that is not a key."""
    texts = list(given or [])
    if not texts:
        texts = [t for t in os.environ.get(FLEET_KEY_ENV, "").split(",") if t.strip()]
    out: list[bytes] = []
    for text in texts:
        text = text.strip()
        path = Path(text)
        if len(text) < 300 and path.is_file():
            out.append(SigningKey.from_pem(path.read_bytes()).public_key)
            continue
        try:
            raw = bytes.fromhex(text)
            signatures.key_type(raw)
        except ValueError:
            raw = signatures.public_key_from_text(text)
        out.append(raw)
    return out


def _sign(rec: KeyCertRecord | KeyRevokeRecord, fleet: SigningKey
          ) -> KeyCertRecord | KeyRevokeRecord:
    import base64

    value = base64.b64encode(fleet.sign(rec.signing_bytes())).decode("ascii")
    return rec.model_copy(update={"signature": Signature(alg=fleet.key_type, key_id=fleet.key_id,
                                                         value=value)})


def certify(fleet: SigningKey, node_id: str, public_key: bytes, *,
            not_before_us: int = 0, now_us: int | None = None) -> KeyCertRecord:
    """A certificate of ``public_key`` for ``node_id``, signed by ``fleet``."""
    rec = KeyCertRecord(node_id=node_id, public_key=signatures.public_key_text(public_key),
                        key_id=signatures.key_id(public_key), not_before_us=not_before_us,
                        issued_us=now_us if now_us is not None else time.time_ns() // 1000,
                        issuer_key_id=fleet.key_id)
    signed = _sign(rec, fleet)
    assert isinstance(signed, KeyCertRecord)
    return signed


def revoke(fleet: SigningKey, node_id: str, key_id: str, *, from_us: int, reason: str = "",
           now_us: int | None = None) -> KeyRevokeRecord:
    """A revocation of ``node_id``'s key ``key_id`` from ``from_us`` on, signed by ``fleet``."""
    rec = KeyRevokeRecord(node_id=node_id, key_id=key_id, revoked_us=from_us, reason=reason,
                          issued_us=now_us if now_us is not None else time.time_ns() // 1000,
                          issuer_key_id=fleet.key_id)
    signed = _sign(rec, fleet)
    assert isinstance(signed, KeyRevokeRecord)
    return signed


async def read_key_records(bootstrap: str, *, timeout: float = 60.0
                           ) -> tuple[list[tuple[int, KeyCertRecord | KeyRevokeRecord]],
                                      list[tuple[int, str]]]:
    """Every record of ``sys.keys`` in order, and ``(offset, why)`` of those that do not
    decode as a key record; ([], []) when the topic does not exist."""
    from fx_kafka.client import make_consumer, read_partition

    consumer = make_consumer(bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        if topics.KEYS not in await consumer.topics():
            return [], []
        read = await read_partition(consumer, topics.KEYS, timeout=timeout)
    finally:
        await consumer.stop()
    good: list[tuple[int, KeyCertRecord | KeyRevokeRecord]] = []
    bad: list[tuple[int, str]] = []
    for offset, _ts, value in read.records:
        try:
            rec = decode(value)
        except DecodeError as exc:
            bad.append((offset, f"{exc.code}: {exc}"))
            continue
        if isinstance(rec, KeyCertRecord | KeyRevokeRecord):
            good.append((offset, rec))
        else:
            bad.append((offset, f"a {rec.kind} record does not belong on {topics.KEYS}"))
    return good, bad


async def read_history(bootstrap: str, fleet_keys: Sequence[bytes], *,
                       timeout: float = 60.0) -> KeyHistory:
    """The key history on ``sys.keys`` as ``fleet_keys`` see it (undecodable records are in
    ``ignored`` too)."""
    records, bad = await read_key_records(bootstrap, timeout=timeout)
    history = build_history(records, fleet_keys)
    history.ignored.extend(bad)
    history.ignored.sort()
    return history


async def publish(bootstrap: str, rec: KeyCertRecord | KeyRevokeRecord) -> int:
    """Append ``rec`` to ``sys.keys`` (created if missing, never compacted); its offset."""
    from fx_kafka.client import create_topics, make_producer
    from fx_kafka.workload import WORKLOAD_TOPIC_CONFIGS

    await create_topics(bootstrap, [topics.KEYS], configs=WORKLOAD_TOPIC_CONFIGS)
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.KEYS, encode(rec), key=rec.node_id.encode())
        return int(meta.offset)
    finally:
        await producer.stop()


async def _facts_key(bootstrap: str, node_id: str) -> bytes:
    from broker_schema.records import FactsRecord
    from fx_kafka.client import make_consumer, read_partition

    consumer = make_consumer(bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        if topics.FACTS not in await consumer.topics():
            raise ValueError(f"no {topics.FACTS} topic: the node has never started")
        read = await read_partition(consumer, topics.FACTS)
    finally:
        await consumer.stop()
    latest: FactsRecord | None = None
    for _offset, _ts, value in read.records:
        try:
            rec = decode(value)
        except DecodeError:
            continue
        if isinstance(rec, FactsRecord) and rec.node_id == node_id:
            latest = rec
    if latest is None:
        raise ValueError(f"node {node_id!r} publishes no facts on {topics.FACTS}")
    return signatures.public_key_from_text(latest.public_key)


# ------------------------------------------------------------------------------ the commands
def _bootstrap(args: argparse.Namespace) -> str:
    from fx_kafka.client import bootstrap_of

    return bootstrap_of(args.bootstrap)


def _load_fleet(path: str) -> SigningKey:
    try:
        return SigningKey.from_pem(Path(path).read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read the fleet key {path}: {exc}") from None


def _fleet_init(args: argparse.Namespace) -> int:
    key = SigningKey.generate(args.type)
    if not key.write_new(args.out):
        print(f"fx keys fleet-init: {args.out} exists; a fleet key is never overwritten",
              file=sys.stderr)
        return 2
    print(json.dumps({"fleet_public_key": key.public_key_b64, "key_id": key.key_id,
                      "key_type": key.key_type, "file": str(args.out)}, indent=2))
    print(f"give verifiers the public key: --fleet-key {key.public_key_b64} "
          f"(or {FLEET_KEY_ENV}={key.public_key_b64})", file=sys.stderr)
    return 0


def _certify(args: argparse.Namespace) -> int:
    try:
        fleet = _load_fleet(args.fleet_key)
        if args.from_facts:
            public = asyncio.run(_facts_key(_bootstrap(args), args.node))
        else:
            public = fleet_public_keys([args.public_key])[0]
        rec = certify(fleet, args.node, public, not_before_us=args.not_before_us)
    except ValueError as exc:
        print(f"fx keys certify: {exc}", file=sys.stderr)
        return 2
    offset = asyncio.run(publish(_bootstrap(args), rec))
    print(f"certified key {rec.key_id} ({signatures.key_type(public)}) of node {rec.node_id} "
          f"at {topics.KEYS}@{offset}, signed by fleet key {fleet.key_id}")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    try:
        fleet = _load_fleet(args.fleet_key)
        rec = revoke(fleet, args.node, args.key_id, from_us=args.from_us, reason=args.reason)
    except ValueError as exc:
        print(f"fx keys revoke: {exc}", file=sys.stderr)
        return 2
    offset = asyncio.run(publish(_bootstrap(args), rec))
    print(f"revoked key {rec.key_id} of node {rec.node_id} from {rec.revoked_us} us at "
          f"{topics.KEYS}@{offset}")
    return 0


def _list(args: argparse.Namespace) -> int:
    try:
        fleet = fleet_public_keys(args.fleet_key)
    except ValueError as exc:
        print(f"fx keys list: {exc}", file=sys.stderr)
        return 2
    if not fleet:
        print(f"fx keys list: give the fleet public key (--fleet-key, or {FLEET_KEY_ENV}): "
              "without it no certificate can be checked", file=sys.stderr)
        return 2
    history = asyncio.run(read_history(_bootstrap(args), fleet))
    rows = [{"node_id": s.node_id, "key_id": s.key_id,
             "key_type": signatures.key_type(s.public_key),
             "public_key": signatures.public_key_text(s.public_key),
             "not_before_us": s.not_before_us, "issued_us": s.issued_us,
             "revoked_us": s.revoked_us, "reason": s.revoke_reason, "offset": s.offset}
            for spans in history.keys.values() for s in spans]
    if args.json:
        print(json.dumps({"keys": rows, "ignored": history.ignored}, indent=2))
    else:
        for r in rows:
            state = "trusted" if r["revoked_us"] is None else f"revoked from {r['revoked_us']} us"
            print(f"{r['node_id']:<24} {r['key_id']}  {r['key_type']:<9} {state}")
        for offset, why in history.ignored:
            print(f"ignored {topics.KEYS}@{offset}: {why}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx keys``."""
    keys = subparsers.add_parser("keys", help="node key certificates signed by a fleet key "
                                 f"({topics.KEYS})")
    sub = keys.add_subparsers(dest="keys_cmd", required=True)

    def boot(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bootstrap", help="Kafka bootstrap (default: $FX_KAFKA_BOOTSTRAP)")

    init = sub.add_parser("fleet-init", help="create a fleet key (PEM, 0600) and print its "
                          "public key")
    init.add_argument("--out", required=True, help="file to create (never overwritten)")
    init.add_argument("--type", choices=KEY_TYPES, default="ed25519")
    init.set_defaults(func=_fleet_init)
    cert = sub.add_parser("certify", help="certify a node's key with the fleet key")
    cert.add_argument("--fleet-key", required=True, help="the fleet key's PEM file")
    cert.add_argument("--node", required=True, help="the executor node id")
    which = cert.add_mutually_exclusive_group(required=True)
    which.add_argument("--public-key", help="the node's public key (base64 or hex, raw)")
    which.add_argument("--from-facts", action="store_true",
                       help="the key the node publishes on sys.facts now")
    cert.add_argument("--not-before-us", type=int, default=0,
                      help="signatures dated earlier are not covered (default 0: any)")
    boot(cert)
    cert.set_defaults(func=_certify)
    rev = sub.add_parser("revoke", help="revoke a node key from a time on")
    rev.add_argument("--fleet-key", required=True, help="the fleet key's PEM file")
    rev.add_argument("--node", required=True)
    rev.add_argument("--key-id", required=True, help="sha256:<hex> of the key")
    rev.add_argument("--from-us", type=int, default=0,
                     help="what the key signed dated at or after this is not trusted "
                     "(default 0: nothing it ever signed)")
    rev.add_argument("--reason", default="")
    boot(rev)
    rev.set_defaults(func=_revoke)
    lst = sub.add_parser("list", help="the key history as a fleet key sees it")
    lst.add_argument("--fleet-key", action="append",
                     help="fleet public key (base64/hex, or its PEM file); default "
                     f"${FLEET_KEY_ENV}")
    lst.add_argument("--json", action="store_true")
    boot(lst)
    lst.set_defaults(func=_list)
