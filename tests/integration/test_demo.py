"""`make demo` stays working: the demo runs end to end on the session's broker (slow, ~1 min)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_runs_end_to_end(kafka_bootstrap: str) -> None:
    env = dict(os.environ, FX_KAFKA_BOOTSTRAP=kafka_bootstrap)
    done = subprocess.run([sys.executable, "-m", "fx_cli.demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert "demo: OK" in out
    # the receipts are verified against the node's pinned key, not merely checked
    assert "2/2 receipts verified" in out and "NOT AUTHENTICATED" not in out
    # a redacted upload's whole path: replay stops clearly (Redacted, exit 5), why marks it,
    # the audit holds
    assert "$ fx replay -> exit 5: replay stopped:" in out and "is redacted" in out
    assert "$ fx why -> exit 0: REDACTED" in out and "$ fx audit -> exit 0 (holds;" in out
    # it ends with the command that opens the web console on this broker (docs/console.md)
    assert f"fx console --bootstrap {kafka_bootstrap}" in done.stdout.strip().splitlines()[-1]
