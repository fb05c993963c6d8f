"""Session-wide fixtures: one real Kafka broker per test session, and unique workload ids.

The broker is chosen by fx_kafka.testing (FX_KAFKA_BOOTSTRAP, else a local Apache Kafka, else
Redpanda through Docker). With CI=true, no broker is a failure, never a skip.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from fx_kafka.errors import NoBrokerError
from fx_kafka.testing import kafka_for_tests

# CPython 3.11.7 can fail a late ast.parse with "SystemError: AST constructor recursion depth
# mismatch" (fixed in 3.11.8). Hypothesis' pytest plugin imports hypothesis lazily in the terminal
# summary, where pytest's assertion rewriter parses it; importing it here, at collection, keeps
# that parse early and the session's exit code honest.
with contextlib.suppress(ImportError):
    import hypothesis  # noqa: F401


# Chunks are sealed under tenant keys from a local key directory (fx_kafka.tenant_keys): the
# session's tests, and the services they start (which inherit the environment), share one of
# their own, never the user's.
if "FX_TENANT_KEY_DIR" not in os.environ:
    os.environ["FX_TENANT_KEY_DIR"] = tempfile.mkdtemp(prefix="fx-tenant-keys-")
    atexit.register(shutil.rmtree, os.environ["FX_TENANT_KEY_DIR"], True)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a ready broker, started once for the session and stopped after."""
    with contextlib.ExitStack() as stack:
        try:
            bootstrap = stack.enter_context(kafka_for_tests())
        except NoBrokerError as exc:
            if _in_ci():
                pytest.fail(f"CI=true and {exc}", pytrace=False)
            pytest.skip(str(exc))
        yield bootstrap


@pytest.fixture
def unique_workload_id() -> str:
    """A fresh workload id, valid in topic names (``wl.<id>.in`` and so on)."""
    return f"t{uuid.uuid4().hex}"
