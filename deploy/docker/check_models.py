"""Refuse a model store that does not hold exactly the pinned models (deploy/docker/models.sha256).

Run at image build time, after ``fx models import`` and ``fx models import-int``::

    python deploy/docker/check_models.py --store /opt/ninelives-fx/models \
        --pins deploy/docker/models.sha256 --fx /opt/ninelives-fx/venv/bin/fx

It runs ``fx models verify`` (every stored file re-hashed against its manifest) and
``fx models list --json``, and exits 1, naming the difference, when a pinned hash is missing or
an unpinned model is present. It runs with the project's venv (it reads hashes with
``broker_schema``, the one home of their spelling).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from broker_schema import is_hash


def read_pins(path: Path) -> dict[str, str]:
    """``{hash: name}`` from a pins file: ``sha256:HEX NAME [source...]`` lines, ``#`` comments."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        digest = fields[0]
        if not is_hash(digest) or len(fields) < 2:
            raise ValueError(f"{path}:{number}: expected a content hash and a NAME, got {raw!r}")
        pins[digest] = fields[1]
    if not pins:
        raise ValueError(f"{path}: no pins")
    return pins


def compare(pins: dict[str, str], listed: list[dict[str, object]]) -> list[str]:
    """The problems of a store whose ``fx models list --json`` rows are ``listed``."""
    have = {str(row["hash"]): str(row.get("name")) for row in listed}
    problems = [f"missing {h} ({name})" for h, name in sorted(pins.items()) if h not in have]
    problems += [f"not pinned {h} ({name})" for h, name in sorted(have.items()) if h not in pins]
    return problems


def main(argv: list[str] | None = None) -> int:
    """Check ``--store`` against ``--pins``; 0 when they match and every file re-hashes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, type=Path)
    parser.add_argument("--pins", required=True, type=Path)
    parser.add_argument("--fx", default="fx", help="the fx command (default: fx on PATH)")
    args = parser.parse_args(argv)
    pins = read_pins(args.pins)
    verify = subprocess.run([args.fx, "models", "verify", "--store", str(args.store)],
                            capture_output=True, text=True, check=False)
    sys.stdout.write(verify.stdout)
    if verify.returncode != 0:
        print(f"check_models: fx models verify failed:\n{verify.stderr}", file=sys.stderr)
        return 1
    listing = subprocess.run([args.fx, "models", "list", "--json", "--store", str(args.store)],
                             capture_output=True, text=True, check=False)
    if listing.returncode != 0:
        print(f"check_models: fx models list failed:\n{listing.stderr}", file=sys.stderr)
        return 1
    problems = compare(pins, json.loads(listing.stdout))
    for p in problems:
        print(f"check_models: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"check_models: {len(pins)} pinned models present and verified in {args.store}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
