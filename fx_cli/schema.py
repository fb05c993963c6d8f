"""``fx schema export DIR``: write JSON Schema for every record kind."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from broker_schema.export import json_schemas


def _export(args: argparse.Namespace) -> int:
    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    docs = json_schemas()
    for name, schema in docs.items():
        (out / name).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    print(f"wrote {len(docs)} schemas to {out}")
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``fx schema``."""
    schema = subparsers.add_parser("schema", help="the wire contract's JSON Schema")
    sub = schema.add_subparsers(dest="schema_cmd", required=True)
    export = sub.add_parser("export", help="write one JSON Schema per record kind into DIR")
    export.add_argument("dir", nargs="?", default="docs/schema")
    export.set_defaults(func=_export)
