"""The ``fx`` commands that the deployment files run are ones the ``fx`` parser accepts; flags
agreed for issue 15 that another branch adds are listed in :data:`PENDING_FLAGS`."""

from __future__ import annotations

import argparse
from functools import cache

from fx_cli.main import build_parser

#: Flags of `fx workload run` that the lease holder's /metrics work (another branch) adds:
#: ``--http-host`` and ``--http-port`` (each with one value). test_pending_flags_not_yet_there
#: fails once the parser knows one of them, so that it is removed here.
PENDING_FLAGS: dict[tuple[str, ...], frozenset[str]] = {
    ("workload", "run"): frozenset({"--http-host", "--http-port"}),
}


@cache
def _parser() -> argparse.ArgumentParser:
    return build_parser()


def _pending_for(argv: list[str]) -> frozenset[str]:
    for prefix, flags in PENDING_FLAGS.items():
        if tuple(argv[: len(prefix)]) == prefix:
            return flags
    return frozenset()


def assert_fx_command(argv: list[str], where: str) -> None:
    """``fx ARGV`` parses (pending flags and their one value set aside)."""
    pending = _pending_for(argv)
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in pending:
            skip = True
            continue
        kept.append(arg)
    try:
        args = _parser().parse_args(kept)
    except SystemExit as exc:
        raise AssertionError(f"{where}: fx {' '.join(argv)} does not parse") from exc
    assert callable(getattr(args, "func", None)), where


def test_pending_flags_not_yet_there() -> None:
    known: list[str] = []
    for prefix, flags in PENDING_FLAGS.items():
        for flag in sorted(flags):
            try:
                _parser().parse_args([*prefix, "m:C", "--id", "w", flag, "1"])
            except SystemExit:
                continue
            known.append(f"fx {' '.join(prefix)} {flag}")
    assert not known, f"the parser knows {known} now: remove them from PENDING_FLAGS"


def test_a_bad_command_is_caught() -> None:
    try:
        assert_fx_command(["executor", "run", "--no-such-flag"], "test")
    except AssertionError:
        return
    raise AssertionError("an unknown flag was accepted")
