"""``fx ledger prove|consistency|watch``: proofs from, and a monitor of, a node's receipt ledger.

Every command reads ``sys.ledger.<node>`` (or ``--topic``, a copy of it) from the beginning and
audits it (:func:`fx_integer.ledger.audit`). The checkpoints are checked with ``--key``
(the node's public key: base64 as on ``sys.facts``, or hex as in receipts); without it the key
the ledger's first receipt names is used, and the output says so: that proves the ledger is
self-consistent, not who wrote it.
"""

from __future__ import annotations

import argparse
import asyncio
import binascii
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from broker_schema import signatures
from fx_integer import ledger as L

__all__ = ["add_ledger"]


def _bootstrap(args: argparse.Namespace) -> str:
    from fx_kafka.client import bootstrap_of

    return bootstrap_of(args.bootstrap)


def _key(text: str) -> bytes:
    try:
        raw = bytes.fromhex(text)
        signatures.key_type(raw)
        return raw
    except ValueError:
        return signatures.public_key_from_text(text)


def _read(args: argparse.Namespace) -> tuple[L.Audit, list[bytes], str]:
    """The audited ledger, the keys its checkpoints and leaves were checked with, and where they
    came from: ``--fleet-key`` (every key the fleet certified for the node on ``sys.keys``, each
    judged at the broker's append time of the record it signed: revocations and
    ``not_before_us`` honoured), else ``--key`` (repeatable), else the key the first receipt
    names (unauthenticated)."""
    from broker_schema.key_history import ledger_key_judge
    from executor.ledger import read_ledger
    from fx_kafka.keys import fleet_public_keys, read_history

    values = asyncio.run(read_ledger(_bootstrap(args), args.node, topic=args.topic))
    fleet = fleet_public_keys(args.fleet_key) if args.fleet_key else []
    judge: L.KeyJudge | None = None
    if fleet:
        history = asyncio.run(read_history(_bootstrap(args), fleet))
        keys = history.public_keys(args.node)
        if not keys:
            raise ValueError(f"no key of node {args.node!r} is certified by the fleet key on "
                             "sys.keys")
        judge = ledger_key_judge(history, args.node)
        source = (f"the {len(keys)} key(s) the fleet key certified for the node on sys.keys, "
                  "each judged at the append time of what it signed")
    elif args.key:
        keys, source = [_key(k) for k in args.key], "--key"
    else:
        first = next((L.parse_record(v) for _, v, _ in values if _is_leaf(v)), None)
        pk = first["receipt"].get("public_key") if first else None
        if not isinstance(pk, str):
            raise ValueError("no --key and no receipt in the ledger names one")
        keys = [_key(pk)]
        source = "the key its first receipt names (give --key or --fleet-key to pin it)"
    return L.audit(values, args.node, keys, key_problem=judge), keys, source


def _is_leaf(value: bytes) -> bool:
    try:
        return bool(L.parse_record(value)["type"] == "leaf")
    except L.LedgerError:
        return False


def _load_receipts(path: Path) -> list[dict[str, Any]]:
    """Receipts in ``path``: a receipt, a response record (its ``receipt.integer``), a list of
    either, or one per line."""
    text = path.read_text(encoding="utf-8")
    try:
        items: Any = json.loads(text)
    except ValueError:
        items = [json.loads(line) for line in text.splitlines() if line.strip()]
    if not isinstance(items, list):
        items = [items]
    out = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("receipt"), dict):
            item = item["receipt"].get("integer", item["receipt"])
        if not isinstance(item, dict):
            raise ValueError(f"{path}: not a receipt: {str(item)[:80]}")
        out.append(item)
    return out


def _problems(a: L.Audit) -> list[str]:
    return [f"{kind}: {message}" for kind, message in a.problems]


def _prove(args: argparse.Namespace) -> int:
    a, _, source = _read(args)
    cp = a.latest
    if cp is None:
        print("fx ledger prove: the ledger has no valid checkpoint", file=sys.stderr)
        return 1
    bad = 0
    results = []
    for receipt in _load_receipts(Path(args.receipt)):
        index = a.find(receipt)
        if index is not None and index in a.foreign:
            results.append({"seq": receipt.get("seq"), "included": False, "leaf_index": index,
                            "why": "a foreign leaf: the node did not sign it (see "
                                   "ledger_problems)"})
            bad += 1
            continue
        if index is None or index >= cp.size:
            results.append({"seq": receipt.get("seq"), "included": False,
                            "why": "not in the ledger" if index is None else
                            f"leaf {index} is after the latest checkpoint ({cp.size})"})
            bad += 1
            continue
        proof = a.tree.inclusion_proof(index, cp.size)
        ok = L.verify_inclusion(L.leaf_hash(L.leaf_data(receipt)), index, cp.size, proof,
                                cp.root)
        bad += not ok
        results.append({"seq": receipt.get("seq"), "included": ok, "leaf_index": index,
                        "proof": [p.hex() for p in proof]})
    print(json.dumps({"checkpoint": cp.to_json(), "key": source, "receipts": results,
                      "ledger_problems": _problems(a)}, indent=2))
    return 1 if bad or a.problems else 0


def _consistency(args: argparse.Namespace) -> int:
    a, _, source = _read(args)
    cp = a.latest
    if cp is None:
        print("fx ledger consistency: the ledger has no valid checkpoint", file=sys.stderr)
        return 1
    if not 0 <= args.old <= cp.size:
        print(f"fx ledger consistency: --old {args.old} is not in 0..{cp.size}", file=sys.stderr)
        return 2
    old_root = a.tree.root(args.old)
    if args.old_root and bytes.fromhex(args.old_root) != old_root:
        print(json.dumps({"consistent": False, "why": f"fork: the ledger's tree of {args.old} "
                          f"leaves has root {old_root.hex()}, not {args.old_root}"}, indent=2))
        return 1
    proof = a.tree.consistency_proof(args.old, cp.size)
    why = L.check_extends(L.Checkpoint(cp.origin, args.old, old_root), cp, proof)
    print(json.dumps({"old": {"size": args.old, "root": old_root.hex()},
                      "checkpoint": cp.to_json(), "key": source, "consistent": why is None,
                      "why": why, "proof": [p.hex() for p in proof],
                      "ledger_problems": _problems(a)}, indent=2))
    return 1 if why or a.problems else 0


def _watch_once(args: argparse.Namespace, state_path: Path | None) -> list[str]:
    a, _, source = _read(args)
    problems = _problems(a)
    cp = a.latest
    if state_path is not None and state_path.exists():
        seen = json.loads(state_path.read_text())
        prev = L.Checkpoint(seen["origin"], seen["size"], bytes.fromhex(seen["root"]))
        if cp is None:
            problems.append(f"truncation: no checkpoint left, {prev.size} leaves were "
                            "checkpointed")
        else:
            proof = (a.tree.consistency_proof(prev.size, cp.size)
                     if prev.size <= cp.size <= len(a.tree) else [])
            why = L.check_extends(prev, cp, proof)
            if why:
                problems.append(why)
    if state_path is not None and cp is not None and not problems:
        tmp = state_path.with_name(state_path.name + ".tmp")
        tmp.write_text(json.dumps(cp.to_json()) + "\n")
        os.replace(tmp, state_path)
    size = cp.size if cp else 0
    print(json.dumps({"time": int(time.time()), "size": size, "pending": a.pending,
                      "root": cp.root.hex() if cp else None, "key": source, "ok": not problems,
                      "problems": problems}), flush=True)
    return problems


def _watch(args: argparse.Namespace) -> int:
    state = Path(args.state) if args.state else None
    while True:
        problems = _watch_once(args, state)
        if args.once:
            return 1 if problems else 0
        time.sleep(args.interval)


def add_ledger(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx ledger``."""
    ledger = subparsers.add_parser("ledger", help="a node's receipt ledger (sys.ledger.<node>)")
    sub = ledger.add_subparsers(dest="ledger_cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--node", required=True, help="the node id")
        p.add_argument("--bootstrap", help="Kafka bootstrap (default: FX_KAFKA_BOOTSTRAP)")
        p.add_argument("--key", action="append", default=[],
                       help="a public key of the node (base64, or hex), repeatable; default: the "
                            "key the ledger's first receipt names")
        p.add_argument("--fleet-key", action="append", default=[],
                       help="fleet public key: check against every key it certified for the "
                            "node on sys.keys (rotated ones included)")
        p.add_argument("--topic", help="read the ledger from this topic (a copy of it)")

    prove = sub.add_parser("prove", help="inclusion proofs of receipts against the latest "
                                         "checkpoint")
    prove.add_argument("receipt", metavar="RECEIPT_FILE",
                       help="a receipt, a response record, a list of them, or JSON lines")
    common(prove)
    prove.set_defaults(func=_safe(_prove))
    cons = sub.add_parser("consistency", help="prove the latest checkpoint extends the tree of "
                                              "an older size")
    cons.add_argument("--old", type=int, required=True, help="the older tree size")
    cons.add_argument("--old-root", help="the root (hex) remembered for that size")
    common(cons)
    cons.set_defaults(func=_safe(_consistency))
    watch = sub.add_parser("watch", help="monitor: every checkpoint must extend the previous "
                                         "(truncation, forks, gaps)")
    watch.add_argument("--state", help="file remembering the last checkpoint seen")
    watch.add_argument("--once", action="store_true", help="one round; exit 1 on a problem")
    watch.add_argument("--interval", type=float, default=10.0, help="seconds between rounds")
    common(watch)
    watch.set_defaults(func=_safe(_watch))


def _safe(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = fn(args)
        except (ValueError, OSError, binascii.Error) as exc:
            print(f"fx ledger {args.ledger_cmd}: {exc}", file=sys.stderr)
            return 2
        return code
    return run

