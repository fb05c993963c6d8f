"""The broker-facing tests run again against the same broker pass again (issue 27, part 7).

A broker kept across runs (``FX_KAFKA_BOOTSTRAP``, as the README invites) holds every topic,
record and consumer group an earlier run left. A test that names a fixed workload, evaluation,
effect or topic id meets its own leftovers on the second run (``fx shadow show hist1`` once found
``hist1`` in several workloads). This runs a representative subset of the broker-facing test
files twice, in a child pytest, against this session's broker: both runs must pass whole.

The subset is chosen to be cheap (CI's budget) yet to cover each kind of global name: shadow
evaluation ids (``test_shadow``, the failure the issue names), the executor's claims/spec
catch-up over every workload on the broker (``test_claims_sync``), topic names
(``test_topic_describe``) and the holder election's consumer groups (``test_election``).
The whole suite twice: ``FX_KAFKA_BOOTSTRAP=host:port pytest tests/integration`` run two times
(docs/operations.md, "Tests against a long-lived broker")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SUBSET = (
    "tests/integration/workload_sdk/test_shadow.py",
    "tests/integration/executor/test_claims_sync.py",
    "tests/integration/test_topic_describe.py",
    "tests/integration/workload_sdk/test_election.py",
)


def _run(bootstrap: str) -> tuple[int, str]:
    env = {**os.environ, "FX_KAFKA_BOOTSTRAP": bootstrap,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                          if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs", "--tb=short",
         *SUBSET],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500, check=False)
    out = proc.stdout + proc.stderr
    failures = out.find("= FAILURES =")  # the first failure's assertion, then the summary
    return proc.returncode, (out[failures:failures + 5000] + "\n...\n" if failures >= 0
                             else "") + out[-3000:]


def test_broker_facing_subset_passes_twice_on_one_broker(kafka_bootstrap: str) -> None:
    results = []
    for attempt in ("first", "second"):
        rc, out = _run(kafka_bootstrap)
        assert rc == 0, f"{attempt} run against {kafka_bootstrap} failed:\n{out}"
        summary = re.findall(r"(\d+) (passed|failed|skipped|error)", out.splitlines()[-1])
        results.append(dict((k, int(n)) for n, k in summary))
    assert results[0] == results[1], results
    assert results[0].get("passed", 0) > 0 and not results[0].get("skipped"), results
